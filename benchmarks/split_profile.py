"""Split a profile calibrated on several models into one profile a model.

    python benchmarks/split_profile.py PROFILE.toml MODEL=OUT.toml [MODEL=OUT.toml ...]

Each output keeps everything the calibration measured (the GPU's curves, overheads,
collectives, corrections: one lease's) and only the layer and end rows of its ``MODEL`` (the
rows' ``model`` field), as if that model alone had been calibrated on that lease; its
provenance gains ``split_from`` (the input's file name) and ``rows_of``. A model's profile
then prices another model from the GPU's curves, not from that model's rows: used by the
two-model checks (benchmarks/two_model_device.sh) to price each model from the other's.
An unknown ``MODEL`` is refused, naming the models the profile holds; an existing ``OUT`` is
not overwritten.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.calibrate.tomlfile import dumps  # noqa: E402


def split(doc: dict, model: str, source: str) -> dict:
    """``doc`` with only ``model``'s layer and end rows (module docstring)."""
    out = dict(doc)
    out["layers"] = [r for r in doc.get("layers", []) if r.get("model") == model]
    out["ends"] = [r for r in doc.get("ends", []) if r.get("model") == model]
    out["provenance"] = {**doc.get("provenance", {}), "split_from": source, "rows_of": model}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("outputs", nargs="+", metavar="MODEL=OUT.toml")
    args = ap.parse_args(argv)
    src = Path(args.profile)
    doc = tomllib.loads(src.read_text())
    models = sorted({r.get("model") for r in doc.get("layers", []) + doc.get("ends", [])
                     if r.get("model")})
    pairs = []
    for spec in args.outputs:
        model, sep, out = spec.partition("=")
        if not sep or not out:
            ap.error(f"{spec!r}: expected MODEL=OUT.toml")
        if model not in models:
            ap.error(f"{model!r} has no rows in {src}; its models: {', '.join(models)}")
        if Path(out).exists():
            ap.error(f"{out} exists: not overwritten")
        pairs.append((model, Path(out)))
    for model, out in pairs:
        part = split(doc, model, src.name)
        out.write_text(dumps(part))
        print(f"{out}: {len(part['layers'])} layer rows, {len(part['ends'])} end rows of {model}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
