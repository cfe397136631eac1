"""A short MoE-only calibration: :mod:`meshplan.calibrate.bench_moe`'s rows on one GPU,
written into a copy of an existing profile (or of the built-in GPU's datasheet profile), for
runs too short for a whole ``meshplan calibrate --model`` (about 3 minutes on 4 × H200).

    python -m meshplan.calibrate.moe_only --model moe.json --seq-len 2048 --world 4 \\
        --base-profile docs/benchmarks/data/profiles/profile_h200x4_round26.toml --out p.toml

The result is the base profile with ``grouped_gemm_efficiency`` (and its key; with
``grouped_fp8_gemm_efficiency`` where the GPU runs fp8 grouped GEMMs),
``membound_efficiency["moe-permute"]``, ``host_sync_s`` and ``host_op_dispatch_s``
replaced by this machine's (definitions: :mod:`meshplan.calibrate.moe_profile`), the raw
rows under ``[measurements]`` and the run in ``[provenance] moe_calibration``; where the
base holds compiled fp8 rows of the models, ``fp8_cast_compiled_block_share`` re-measured
under the new curves (it is what those rows take beyond the composed layer); every other
key stays the base profile's. ``--world``: the GPUs the model's layouts will use (the ep
values whose expert shapes are timed); the benchmarks themselves run on one device.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from meshplan.calibrate.layer_grid import micro_batch_sizes
from meshplan.errors import ConfigError


def _base_doc(base_profile: str | None, device) -> tuple[dict[str, Any], Any]:
    """(profile document to extend, base GPUSpec): the file's, else the built-in GPU's
    datasheet profile. The base is the built-in GPU the file extends where it has one, as
    for ``meshplan calibrate``: its dense curves continue the measured grouped curves."""
    import tomllib

    from meshplan.calibrate.profile import build_profile
    from meshplan.calibrate.run import detect_base_gpu
    from meshplan.hardware_profiles import builtin_gpu
    from meshplan.hardware_profiles.calibrated import load_profile
    from meshplan.hardware_profiles.loader import builtin_gpu_names
    if base_profile:
        doc = tomllib.loads(Path(base_profile).read_text())
        prof = load_profile(base_profile)
        return doc, (builtin_gpu(prof.base_gpu) if prof.base_gpu in builtin_gpu_names()
                     else prof.gpu)
    import torch
    if device.type != "cuda":
        raise ConfigError("moe_only on CPU needs --base-profile (a CPU profile from "
                          "`meshplan calibrate --device cpu`): a CPU has no datasheet")
    props = torch.cuda.get_device_properties(device)
    base = builtin_gpu(detect_base_gpu(props.name, props.total_memory))
    return build_profile(measurements={}, base=base, device="cuda", provenance={}), base


def _refit_block_share(doc: dict[str, Any], out: Path, models, world: int) -> float | None:
    """The fp8 casts' compiled block share re-measured on the profile just written, where it
    holds compiled fp8 rows of ``models``: the share is what the rows take beyond the
    composed layer, whose fp8 expert GEMMs the new grouped curves price
    (:mod:`meshplan.calibrate.fp8_block_share`); None (the base's share kept) elsewhere."""
    from meshplan.calibrate.fp8_block_share import measure_from_profile
    share = measure_from_profile(out, list(models), world)
    if share is not None:
        doc["gpu"]["fp8_cast_compiled_block_share"] = share
        doc["measured"] = [*(k for k in doc.get("measured", [])
                             if k != "fp8_cast_compiled_block_share"),
                           "fp8_cast_compiled_block_share"]
    return share


def run(models, *, seq_len: int | None, world: int, out: Path, base_profile: str | None,
        device_kind: str = "auto", quick: bool = False,
        micro_batches: tuple[int, ...] | None = None) -> dict[str, Any]:
    import torch

    from meshplan.calibrate.bench_moe import moe_micro_batches, moe_rows
    from meshplan.calibrate.moe_profile import MOE_ROW_KINDS, add_moe_keys
    from meshplan.calibrate.tomlfile import dumps, write_text_atomic
    if not any(m.num_experts for m in models):
        raise ConfigError(f"moe_only: none of the models {[m.name for m in models]} has "
                          f"routed experts (num_experts > 0)")
    if device_kind == "auto":
        device_kind = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device("cuda:0" if device_kind == "cuda" else "cpu")
    t0 = time.perf_counter()
    doc, base = _base_doc(base_profile, device)
    rows = moe_rows(tuple(models), seq_len, device, world, quick=quick,
                    micro_batches=micro_batches)
    meas = {k: v for k, v in doc.get("measurements", {}).items() if k not in MOE_ROW_KINDS}
    doc["measurements"] = {**meas, **{k: v for k, v in rows.items() if v}}
    keys = add_moe_keys(doc, base, device.type)
    prov = dict(doc.get("provenance", {}))
    prov["moe_calibration"] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "models": ", ".join(m.name for m in models),
        "seq_len": seq_len or 0, "world": world, "base_profile": base_profile or "datasheet",
        "micro_batches": ", ".join(map(str, moe_micro_batches(quick, micro_batches))),
        "keys": keys, "seconds": round(time.perf_counter() - t0, 1),
        "command": " ".join(sys.argv)}
    doc["provenance"] = prov
    write_text_atomic(out, dumps(doc))
    share = _refit_block_share(doc, out, models, world)
    if share is not None:
        keys.append("fp8_cast_compiled_block_share")
        write_text_atomic(out, dumps(doc))
    return {"keys": keys, "gpu": {k: doc["gpu"].get(k) for k in (
        "grouped_gemm_efficiency", "grouped_fp8_gemm_efficiency", "host_sync_s",
        "host_op_dispatch_s")},
        "permute": doc["gpu"].get("membound_efficiency", {}).get("moe-permute"),
        "seconds": prov["moe_calibration"]["seconds"]}


def main(argv=None) -> int:
    from meshplan.spec.resolve import load_model
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True,
                    help="a preset, a Hugging Face config.json or a ModelSpec JSON (repeatable)")
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--world", type=int, default=1, help="GPUs of the layouts to price")
    ap.add_argument("--base-profile", default=None)
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--micro-batches", default=None,
                    help="comma-separated micro-batch sizes the layouts run (the MoE rows are "
                         "timed at 1, 2 and these)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.world < 1:
        ap.error(f"--world {a.world}: must be a positive integer")
    mbs = None
    if a.micro_batches:
        try:
            mbs = micro_batch_sizes(False, tuple(int(x) for x in a.micro_batches.split(",")))
        except (ValueError, ConfigError) as exc:
            ap.error(f"--micro-batches {a.micro_batches!r}: {exc}; give positive integers, "
                     f"e.g. 2,8")
    models = [load_model(m) for m in a.model]
    res = run(models, seq_len=a.seq_len, world=a.world, out=Path(a.out),
              base_profile=a.base_profile, device_kind=a.device, quick=a.quick,
              micro_batches=mbs)
    print(f"wrote {a.out}: {res}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
