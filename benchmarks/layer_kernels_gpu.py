"""The kernels of one calibration block, as ``meshplan calibrate`` builds and times it: which
GPU work a layer's forward and backward run, by operator, beside the pieces the analytical
layer (``costmodel.compute.layer_cost``) prices (GEMMs, attention core, memory-bound ops).

Why: layers composed from GPU-alone microbenchmark curves come out 10-25 % below their
measured rows (docs/benchmarks/calibration_checks.md, "Compute microbenchmarks"); the trace names
the work the composition does not count.

    python benchmarks/layer_kernels_gpu.py --out $OUT \\
        --model benchmarks/sets/transfer43/models/t43m06-gpt-mha-0.59b.json --seq 2048 --mb 4
    python benchmarks/layer_kernels_gpu.py --out DIR --device cpu --tiny      # wiring

Writes ``layer_kernels_<model>.json``: per operator (``key_averages`` by aten op) its
self device time per layer per iteration, the layers, iterations, and the queued
forward / backward times of the same block (CUDA events, as calibrate's rows).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from meshplan.spec import ModelSpec  # noqa: E402
from sustained_clock_gpu import calibration_block, tiny_spec  # noqa: E402

ITERS = 3


def trace_block(spec: ModelSpec, seq: int, mb: int, device_name: str, recompute: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from meshplan.calibrate.layer_build import _layer_amp
    from meshplan.calibrate.layer_run import _layer_step, _run_layer
    from meshplan.calibrate.layer_timing import _Queue

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    cfg, layers, m = calibration_block(spec, seq, mb, device, recompute)
    queue = _Queue(device, lambda v: v) if cuda else None
    timed = _run_layer(cfg, m, layers, device, iters=4, barrier=lambda: None, queue=queue)
    _, _, reset, forward, backward = _layer_step(cfg, m, device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with _layer_amp(cfg, device):
        for _ in range(2):
            reset()
            backward(forward())
        if cuda:
            torch.cuda.synchronize(device)
        with profile(activities=acts, record_shapes=True) as prof:
            for _ in range(ITERS):
                reset()
                backward(forward())
            if cuda:
                torch.cuda.synchronize(device)
    def per_layer_ms(e) -> float:
        """An entry's self device time (CPU time on CPU) per layer and iteration."""
        us = (getattr(e, "self_device_time_total", None)
              or getattr(e, "self_cuda_time_total", 0.0)) if cuda else e.self_cpu_time_total
        return us / 1e3 / ITERS / layers

    ops = [{"op": e.key, "count": e.count // ITERS, "device_ms_per_layer": per_layer_ms(e)}
           for e in prof.key_averages() if per_layer_ms(e) > 0]
    ops.sort(key=lambda o: -o["device_ms_per_layer"])
    shaped = [{"op": e.key, "shapes": str(e.input_shapes), "count": e.count // ITERS,
               "device_ms_per_layer": per_layer_ms(e)}
              for e in prof.key_averages(group_by_input_shape=True)
              if e.key.startswith("aten::") and per_layer_ms(e) > 0]
    shaped.sort(key=lambda o: -o["device_ms_per_layer"])
    return {"model": spec.name, "spec": spec.to_dict(), "seq_len": seq, "micro_batch": mb,
            "recompute": recompute, "layers": layers, "iters": ITERS,
            "queued_forward_ms_per_layer": timed[0] * 1e3,
            "queued_backward_ms_per_layer": timed[1] * 1e3,
            "traced_ms_per_layer": sum(o["device_ms_per_layer"] for o in ops
                                       if not o["op"].startswith("ProfilerStep")),
            "ops": ops[:80], "ops_by_shape": shaped[:120]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", type=Path, action="append", default=[])
    ap.add_argument("--seq", type=int, action="append", default=[])
    ap.add_argument("--mb", type=int, action="append", default=[])
    ap.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="a small stand-in of each model")
    args = ap.parse_args(argv)
    if not args.model or not (len(args.model) == len(args.seq) == len(args.mb)):
        ap.error("give --model, --seq and --mb once per model (same counts), got "
                 f"{len(args.model)} / {len(args.seq)} / {len(args.mb)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for path, seq, mb in zip(args.model, args.seq, args.mb):
        spec = ModelSpec.from_dict(json.loads(path.read_text()))
        if args.tiny:
            spec, seq, mb = tiny_spec(spec), 64, 2
        doc = trace_block(spec, seq, mb, args.device, args.recompute)
        (args.out / f"layer_kernels_{spec.name}.json").write_text(json.dumps(doc, indent=1))
        print(f"{spec.name} mb {mb}: queued {doc['queued_forward_ms_per_layer']:.3f} + "
              f"{doc['queued_backward_ms_per_layer']:.3f} ms a layer, traced "
              f"{doc['traced_ms_per_layer']:.3f} ms; top: "
              + ", ".join(f"{o['op']} {o['device_ms_per_layer']:.3f}" for o in doc["ops"][:8]),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
