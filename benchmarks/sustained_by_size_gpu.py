"""Does one module's sustained-clock ratio depend on the micro-batch it runs at?

``meshplan calibrate`` measures a module's sustained ratio (its pass back to back over its
queued burst, :mod:`meshplan.calibrate.sustained`) once, on its largest micro-batch without
recomputation, and every row of the module carries it: rows at smaller micro-batches, and
rows the cost model carries to other shapes and sizes (:mod:`meshplan.costmodel.nearest_rows`).
The committed H200 profiles suggest the ratio grows with the rate the work runs at (the same
GPT 1.72 B compiled block: 1.071 at micro-batch 2, 1.111 at 8 in a later calibration;
docs/benchmarks/fp8_checks.md "fp8h40 and fp8h41 from other profiles"). This probe times,
for each model given, each mode and micro-batch, calibrate's own row (queued burst) and its
own sustained loop on one GPU, and writes the ratio beside the achieved rate, with
``nvidia-smi`` sampling the SM clock and power every 100 ms (phase marks in the JSON).

    python benchmarks/sustained_by_size_gpu.py --out $OUT \\
        --model benchmarks/sets/fp8h41/m01.json:1024:2,4,8,16:eager,compiled

``MODEL.json:SEQ:MBS:MODES``; ``--repeat`` times the first point again at the end (drift).
``--device cpu --tiny`` runs the code path on CPU with a small stand-in model (wiring only).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplan.spec import ModelSpec  # noqa: E402


def parse_point(text: str) -> tuple[Path, int, list[int], list[str]]:
    """``MODEL.json:SEQ:MB,MB:MODE,MODE`` -> (path, seq, micro-batches, modes)."""
    try:
        path, seq, mbs, modes = text.rsplit(":", 3)
        out = Path(path), int(seq), [int(v) for v in mbs.split(",")], modes.split(",")
    except ValueError:
        raise SystemExit(f"--model {text!r}: expected MODEL.json:SEQ:MB,MB:eager,compiled")
    bad = [m for m in out[3] if m not in ("eager", "compiled")]
    if bad:
        raise SystemExit(f"--model {text!r}: mode {bad[0]!r} is not eager or compiled")
    return out


def layer_flops(spec: ModelSpec, seq: int, mb: int) -> float:
    """Forward + backward FLOPs of one layer at (seq, mb): 3 × (matmuls + causal core)."""
    from meshplan.costmodel.flops import layer_forward_flops_per_token
    matmul, core = layer_forward_flops_per_token(spec, seq)
    return 3.0 * mb * seq * (matmul + core / 2)


def probe_point(spec: ModelSpec, seq: int, mb: int, compiled: bool, device, *,
                heat_s: float, time_s: float) -> dict:
    """Calibrate's queued row and sustained loop for one (model, seq, mb, mode)."""
    import torch

    from meshplan.calibrate.layer_build import _build, _free
    from meshplan.calibrate.bench_layers import LAYERS_CPU, LAYERS_CUDA
    from meshplan.calibrate.layer_grid import Config
    from meshplan.calibrate.layer_ranks import _Groups
    from meshplan.calibrate.layer_run import _run_layer, _run_sustained
    from meshplan.calibrate.layer_timing import _Queue

    cfg = Config(model=spec, seq_len=seq, tp=1, sequence_parallel=False, micro_batch=mb,
                 compile=compiled)
    layers = LAYERS_CUDA if device.type == "cuda" else LAYERS_CPU
    m, _ = _build(cfg, layers, device, _Groups(1, 0, device.type))
    queue = _Queue(device, lambda v: v) if device.type == "cuda" else None
    vals = _run_layer(cfg, m, layers, device, iters=4, barrier=lambda: None, queue=queue)
    fwd, bwd, fwd_cpu, bwd_cpu = vals[0], vals[1], vals[6], vals[7]
    got = _run_sustained(cfg, m, None, layers, device, burst_pass_s=fwd + bwd,
                         burst_cpu_s=fwd_cpu + bwd_cpu, world=1, heat_s=heat_s,
                         time_s=time_s)
    ratio, info = got if got is not None else (None, {"out_of_memory": True})
    flops = layer_flops(spec, seq, mb)
    del m
    _free(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"model": spec.name, "seq_len": seq, "micro_batch": mb, "compiled": compiled,
            "forward_s": fwd, "backward_s": bwd, "forward_cpu_s": fwd_cpu,
            "backward_cpu_s": bwd_cpu, "burst_tflops": flops / (fwd + bwd) / 1e12,
            "sustained_ratio": ratio, "details": info}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", required=True, type=parse_point,
                    help="MODEL.json:SEQ:MB,MB:eager,compiled (repeatable)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--heat-s", type=float, default=1.5)
    ap.add_argument("--time-s", type=float, default=1.0)
    ap.add_argument("--repeat", action="store_true", help="time the first point again last")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="small stand-in model (CPU wiring)")
    args = ap.parse_args(argv)

    import torch

    from sustained_clock_gpu import _smi, tiny_spec  # beside this script
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    smi = _smi(args.out / "smi.csv") if device.type == "cuda" else None
    points, marks = [], []
    todo = []
    for path, seq, mbs, modes in args.model:
        spec = ModelSpec(**json.loads(path.read_text()))
        if args.tiny:
            spec, seq = tiny_spec(spec), 64
        todo += [(spec, seq, mb, mode == "compiled") for mode in modes for mb in mbs]
    if args.repeat and todo:
        todo.append(todo[0])
    try:
        for i, (spec, seq, mb, compiled) in enumerate(todo):
            tag = f"{spec.name} seq {seq} mb {mb} {'compiled' if compiled else 'eager'}"
            print(f"[{i + 1}/{len(todo)}] {tag}", flush=True)
            marks.append((tag + " start", time.time()))
            try:
                pt = probe_point(spec, seq, mb, compiled, device, heat_s=args.heat_s,
                                 time_s=args.time_s)
            except Exception as exc:  # one failed point (out of memory, compile) keeps the rest
                pt = {"model": spec.name, "seq_len": seq, "micro_batch": mb,
                      "compiled": compiled, "error": f"{type(exc).__name__}: {exc}"[:400]}
            marks.append((tag + " end", time.time()))
            points.append(pt)
            print(f"    ratio {pt.get('sustained_ratio')}  "
                  f"{pt.get('burst_tflops', 0):.0f} TFLOP/s burst", flush=True)
            (args.out / "sustained_by_size.json").write_text(json.dumps(
                {"device": torch.cuda.get_device_name(device) if device.type == "cuda"
                 else "cpu", "torch": torch.__version__, "heat_s": args.heat_s,
                 "time_s": args.time_s, "points": points, "marks": marks}, indent=1))
    finally:
        if smi is not None:
            smi.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
