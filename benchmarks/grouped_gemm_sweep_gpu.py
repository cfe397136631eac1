"""Time a grouped-GEMM sweep of the 1-GPU MoE checks' models (each model's two expert GEMMs,
all experts local, at 128 to 16,384 rows a group) and the permutation at several top-k, on
one GPU; rows as ``meshplan calibrate --model`` writes them (``calibrate/bench_moe.py``).

    PYTHONPATH=. python benchmarks/grouped_gemm_sweep_gpu.py --out $OUT/sweep.json

Each model is ``benchmarks/sets/<check>/m01.json`` (default: moeh18-moeh33).
``benchmarks/grouped_gemm_key.py`` reads the output: how one model's calibration prices
another's grouped GEMMs by the curve's key (docs/benchmarks/moe_checks.md, "Grouped GEMMs
keyed by the call").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SWEEP_ROWS = tuple(2 ** i for i in range(7, 15))         # 128 .. 16,384 rows a group
SWEEP_MAX_BYTES = 8 << 30   # inputs, outputs, gradients and weights of one swept GEMM
CHECKS = ("moeh18", "moeh19", "moeh20", "moeh22", "moeh23", "moeh24", "moeh25", "moeh26",
          "moeh27", "moeh28", "moeh29", "moeh30", "moeh31", "moeh32", "moeh33")
PERMUTE_CASES = [(t, k, e) for t in (4096, 16384) for k in (1, 2, 4, 8) for e in (8, 64)]


def sweep_shapes(model):
    """The model's fc1 (h → m·f) and fc2 (f → h), all experts local, at each of
    :data:`SWEEP_ROWS` rows a group whose bf16 tensors fit :data:`SWEEP_MAX_BYTES`."""
    from meshplan.calibrate.bench_moe import GroupedGemmShape
    e, h, f = model.num_experts, model.hidden_size, model.moe_ffn_hidden_size
    return [GroupedGemmShape(e, rows, k, n)
            for k, n in ((h, model.ffn_matrices * f), (f, h)) for rows in SWEEP_ROWS
            if 2 * (2 * e * rows * (k + n) + 2 * e * k * n) <= SWEEP_MAX_BYTES]


def main(argv=None) -> int:
    import torch

    from meshplan.calibrate.bench_moe import bench_grouped_gemm, bench_permute
    from meshplan.spec.resolve import load_model
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checks", default=",".join(CHECKS))
    ap.add_argument("--hidden", type=int, default=2048, help="the permutation cases' hidden")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    device = torch.device("cuda:0")
    out = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "grouped_gemm": {}, "moe_permute": []}
    t0 = time.perf_counter()
    for check in a.checks.split(","):
        model = load_model(str(ROOT / "benchmarks/sets" / check / "m01.json"))
        rows = [bench_grouped_gemm(s, device) for s in sweep_shapes(model)]
        out["grouped_gemm"][check] = rows
        print(f"{check}: {len(rows)} rows, {time.perf_counter() - t0:.0f} s", flush=True)
        torch.cuda.empty_cache()
    for tokens, top_k, experts in PERMUTE_CASES:
        out["moe_permute"].append(bench_permute(tokens, top_k, experts, a.hidden, device))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out} ({out['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
