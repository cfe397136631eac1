"""Calibrate's compute microbenchmarks timed two ways on one GPU: synchronized (the stream
idle when each forward + backward starts: max(GPU, CPU dispatch)) and queued behind a spin
kernel (GPU alone; ``calibrate.timing.time_fn(queued=True)``), each shape both ways back to
back, with the ``[gpu]`` keys ``meshplan calibrate`` would write from each.

Why: a profile's memory-bound efficiencies (RMSNorm 0.05, LayerNorm 0.14, residual add 0.37
of HBM on round 43's H200 profiles) price a layer composed from curves 20-30 % above its own
measured row (t43m06 at micro-batch 4: 1.70 / 3.64 ms forward / backward against 1.30 /
3.00); their timings bracket one op's forward and backward through autograd, 0.3-0.6 ms,
about what the host takes to launch them.

    python benchmarks/queued_microbench_gpu.py --out $OUT                # 1 GPU, ~1 minute
    python benchmarks/queued_microbench_gpu.py --out DIR --device cpu --quick   # wiring
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.spec import ModelSpec  # noqa: E402

#: the round-43 models whose layers composed from curves missed their rows
MODELS = ("t43m06-gpt-mha-0.59b", "t43m04-llama-mha-2.68b")


def shapes_for(device: str, quick: bool):
    from meshplan.calibrate import shapes
    gemms = set(shapes.default_gemm_shapes(quick, device))
    attn = set(shapes.default_attention_shapes(quick, device))
    for name in MODELS[: 1 if quick else None]:
        m = ModelSpec.from_dict(json.loads(
            (ROOT / "benchmarks/sets/transfer43/models" / f"{name}.json").read_text()))
        seq = 256 if quick else m.max_seq_len
        gemms.update(shapes.model_gemm_shapes(m, seq, max_tp=1))
        attn.update(shapes.model_attention_shapes(m, seq, max_tp=1))
    if quick:
        gemms = {g for g in gemms if g.m * g.k * g.n <= 2 ** 27}
        attn = {a for a in attn if a.batch * a.seq * a.heads * a.head_dim <= 2 ** 20}
    return sorted(gemms), sorted(attn), shapes.membound_elements(quick, device)


def run(device_name: str, quick: bool) -> dict:
    import torch
    from meshplan.calibrate import bench_compute as bc
    from meshplan.calibrate.profile import build_profile
    from meshplan.hardware_profiles import builtin_gpu
    device = torch.device(device_name)
    gemms, attn, numel = shapes_for(device.type, quick)
    rows = {mode: {"gemm": [], "attention": [], "membound": []} for mode in ("sync", "queued")}
    t0 = time.perf_counter()
    for g in gemms:
        for mode in rows:
            rows[mode]["gemm"].append(bc.bench_gemm(g, device, queued=mode == "queued"))
    for a in attn:
        for mode in rows:
            rows[mode]["attention"].append(bc.bench_attention(a, device, queued=mode == "queued"))
    for mode in rows:
        rows[mode]["membound"] = bc.bench_membound(numel, device, queued=mode == "queued",
                                                   as_run=True)
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "seconds": time.perf_counter() - t0, "modes": {}}
    base = None
    if device.type == "cuda":
        from meshplan.calibrate.run import detect_base_gpu
        props = torch.cuda.get_device_properties(device)
        base = builtin_gpu(detect_base_gpu(props.name, props.total_memory))
    for mode, r in rows.items():
        # the keys a --queued-microbench calibration writes from these rows (synchronized
        # ones beside them for comparison)
        keys = (build_profile(measurements=r, base=base, device=device.type,
                              provenance={})["gpu"] if base is not None else {})
        out["modes"][mode] = {"rows": r, "gpu": {k: keys[k] for k in (
            "gemm_efficiency", "attention_efficiency", "hbm_efficiency",
            "membound_efficiency", "optimizer_gbps") if k in keys}}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="small shapes (CPU wiring)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = run(args.device, args.quick)
    (args.out / "queued_microbench.json").write_text(json.dumps(doc, indent=1))
    for mode, d in doc["modes"].items():
        mb = ", ".join(f"{r['op']} {r['model_bytes'] / r['seconds'] / 1e9:.0f}"
                       for r in d["rows"]["membound"])
        print(f"{mode}: membound GB/s {mb}")
    for kind in ("gemm", "attention"):
        for s, q in zip(doc["modes"]["sync"]["rows"][kind], doc["modes"]["queued"]["rows"][kind]):
            label = {k: v for k, v in s.items() if k not in ("seconds", "iters")}
            print(f"{kind} {label}: sync {s['seconds'] * 1e3:.3f} ms, "
                  f"queued {q['seconds'] * 1e3:.3f} ms")
    print(f"wrote {args.out / 'queued_microbench.json'} in {doc['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
