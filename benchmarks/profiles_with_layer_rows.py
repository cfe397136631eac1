"""The stored 1-GPU MoE calibrations rewritten as today's calibrate would write them: their
grouped-GEMM rows replaced by the same model's rows timed inside the MoE layer (bf16 and fp8
rowwise: ``grouped_gemm_in_step_gpu.py --layer-rows``), the MoE keys re-derived from the rows
(``calibrate.moe_profile.add_moe_keys``: the grouped curves keyed by the call) and the fp8
casts' block share re-measured under them (``calibrate.moe_only``), for checks priced from a
profile no calibration of today's code wrote (docs/benchmarks/moe_checks.md, "Grouped GEMMs
keyed by the call").

    python benchmarks/profiles_with_layer_rows.py \\
        --rows docs/benchmarks/data/grouped_gemm_in_layer_rows_h200x1_20261202.json \\
        --rows docs/benchmarks/data/grouped_gemm_in_layer_rows_fp8_h200x1_20261203.json \\
        --out /tmp/layer_rows_profiles [--check moeh31]

Each written file keeps its name, so ``moe_profile_transfer.check_name`` still reads its
check; a profile whose check has no such rows is left out.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from grouped_gemm_key import stored_rows  # noqa: E402

from meshplan.calibrate.moe_only import _base_doc, _refit_block_share  # noqa: E402
from meshplan.calibrate.moe_profile import add_moe_keys  # noqa: E402
from meshplan.calibrate.tomlfile import dumps  # noqa: E402
from meshplan.spec.resolve import load_model  # noqa: E402


def layer_rows(paths: list[str]) -> dict[str, list[dict]]:
    """check → its in-layer grouped rows from every file (bf16 and fp8 files together)."""
    out: dict[str, list[dict]] = {}
    for p in paths:
        for check, rows in json.loads(Path(p).read_text())["grouped_gemm"].items():
            out.setdefault(check, []).extend(rows)
    return out


def rewrite(path: str, rows: list[dict], model_path: Path, out: Path) -> dict:
    """Write ``path`` with ``rows`` as its grouped rows and its keys re-derived; returns the
    keys that changed (old, new)."""
    doc, base = _base_doc(path, None)
    before = {k: doc["gpu"].get(k) for k in ("grouped_gemm_key",
                                             "fp8_cast_compiled_block_share")}
    doc.setdefault("measurements", {})["grouped_gemm"] = [dict(r) for r in rows]
    add_moe_keys(doc, base, "cuda")
    doc.setdefault("provenance", {})["layer_rows_rewrite"] = (
        "grouped rows replaced by the model's rows timed inside the MoE layer, keys re-derived "
        "(benchmarks/profiles_with_layer_rows.py)")
    dest = out / Path(path).name
    dest.write_text(dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if _refit_block_share(doc, dest, [load_model(str(model_path))], 1) is not None:
            dest.write_text(dumps(doc))
    return {k: (v, doc["gpu"].get(k)) for k, v in before.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", action="append", required=True,
                    help="grouped_gemm_in_step_gpu.py --layer-rows output (repeatable)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--check", action="append", default=None, help="only these checks")
    a = ap.parse_args(argv)
    rows = layer_rows(a.rows)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for check, (path, _) in stored_rows().items():
        if check not in rows or (a.check and check not in a.check):
            continue
        changed = rewrite(path, rows[check], ROOT / "benchmarks/sets" / check / "m01.json", out)
        print(f"{check}: {Path(path).name} "
              + ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
