"""Do calibrated layer rows run faster than the same blocks in a sustained training step?

Issue 36's lead (docs/benchmarks/transfer.md, "rc44, rc45, rc47"): rc47's GPT steps ran
3-6 % slower than predicted from their own calibrated rows, and the SM clock sampled during
the calibration's timed bursts (median 1,800 MHz) was above the clock of the sustained
steps (1,613 MHz, software power cap). A row is timed as ``meshplan calibrate`` times it
(:func:`meshplan.calibrate.layer_run._run_layer`: each iteration queued behind a spin
kernel after a synchronize, so the GPU computes well under half of the time), a training
step keeps it busy back to back. This probe times, per model of a set, the same built
blocks three ways on one GPU:

1. ``burst``     — calibrate's own row timing (queued, 4 iterations);
2. ``sustained`` — forward + backward back to back for ``--seconds``, CUDA events around
   each iteration, the medians of the first second and of the rest reported apart;
3. ``sustained`` again with every parameter's gradient set to None before each iteration
   (a step's only backward when it has one micro-batch: nothing to accumulate into);
4. ``burst`` again (the GPU has cooled in between: the probe returns to the first reading?).

plus a plain bf16 GEMM (``--gemm``) in a 50 ms burst against a sustained loop, with
``nvidia-smi`` sampling SM clock and power every 100 ms beside all of it (phase marks in
the JSON to line them up). Run on the device::

    python benchmarks/sustained_clock_gpu.py --out $OUT \
        --set benchmarks/sets/rc47 --set benchmarks/sets/rc44 --set benchmarks/sets/rc45

``--device cpu --tiny`` runs the same code path on CPU with a small model (wiring only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplan.spec import ModelSpec  # noqa: E402


def _model_and_mb(set_dir: Path, tiny: bool) -> tuple[ModelSpec, int, int]:
    """The set's first model, its sequence length and its largest no-recompute micro-batch."""
    data = json.loads((set_dir / "set.json").read_text())
    entry = data["models"][0]
    spec = ModelSpec(**entry["spec"])
    seq = int(entry["job"]["seq_len"])
    mbs = [lay["micro_batch"] for lay in entry["layouts"] if lay["recompute"] == "none"]
    mb = max(mbs) if mbs else max(lay["micro_batch"] for lay in entry["layouts"])
    if tiny:
        spec, seq, mb = tiny_spec(spec), 64, 2
    return spec, seq, mb


def tiny_spec(spec: ModelSpec) -> ModelSpec:
    """A small stand-in of ``spec`` (its family, tiny widths) for CPU wiring runs at seq 64."""
    return replace(spec, hidden_size=128, num_heads=4, num_kv_heads=4, ffn_hidden_size=256,
                   head_dim=32, vocab_size=512, max_seq_len=64)


def calibration_block(spec: ModelSpec, seq: int, mb: int, device, recompute: str = "none"):
    """``spec``'s calibration block as ``meshplan calibrate`` builds it at tp 1: (cfg, layers,
    module)."""
    from meshplan.calibrate.bench_layers import LAYERS_CPU, LAYERS_CUDA
    from meshplan.calibrate.layer_build import _build
    from meshplan.calibrate.layer_grid import Config
    from meshplan.calibrate.layer_ranks import _Groups

    cfg = Config(model=spec, seq_len=seq, tp=1, sequence_parallel=False, micro_batch=mb,
                 recompute=recompute)
    layers = LAYERS_CUDA if device.type == "cuda" else LAYERS_CPU
    m, _ = _build(cfg, layers, device, _Groups(1, 0, device.type))
    return cfg, layers, m


def build_block(set_dir: Path, device, tiny: bool):
    """The set's first model's calibration block (no recomputation, its largest
    no-recompute micro-batch): (spec, seq, mb, cfg, layers, module)."""
    spec, seq, mb = _model_and_mb(set_dir, tiny)
    return (spec, seq, mb, *calibration_block(spec, seq, mb, device))


def _sustained(forward, backward, reset, device, seconds: float) -> dict:
    """Forward + backward back to back for ``seconds``; one CUDA event pair per iteration."""
    import torch
    cuda = device.type == "cuda"
    events, cpu_marks, mids = [], [], []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        reset()
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            em = torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        y = forward()
        if cuda:
            em.record()
            mids.append(em)
        backward(y)
        del y
        if cuda:
            e1.record()
            events.append((e0, e1))
            if len(events) % 8 == 0:
                # keep the CPU at most a few iterations ahead, so "first second" means it
                events[-4][1].synchronize()
        cpu_marks.append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize(device)
        times = [a.elapsed_time(b) / 1e3 for a, b in events]
        fwd = [a.elapsed_time(m) / 1e3 for (a, _), m in zip(events, mids)]
        starts = [0.0]
        for a, b in zip(events, events[1:]):
            starts.append(starts[-1] + a[0].elapsed_time(b[0]) / 1e3)
        span = events[0][0].elapsed_time(events[-1][1]) / 1e3
    else:
        times = cpu_marks
        starts = [sum(cpu_marks[:i]) for i in range(len(cpu_marks))]
        span = sum(cpu_marks)
        fwd = [0.0] * len(times)
    first = [t for t, s in zip(times, starts) if s < 1.0]
    rest = [t for t, s in zip(times, starts) if s >= 1.0]
    thirds = [times[i * len(times) // 3:(i + 1) * len(times) // 3] for i in range(3)]
    late = [i for i, st in enumerate(starts) if st >= 1.0] or list(range(len(times)))
    return {"iterations": len(times), "span_s": span,
            "after_first_second_forward_median_s": statistics.median(fwd[i] for i in late),
            "after_first_second_backward_median_s": statistics.median(
                times[i] - fwd[i] for i in late),
            "gpu_busy_fraction": sum(times) / span if span else 0.0,
            "first_second_median_s": statistics.median(first) if first else None,
            "after_first_second_median_s": statistics.median(rest) if rest else None,
            "thirds_median_s": [statistics.median(t) if t else None for t in thirds]}


def probe_model(set_dir: Path, device, seconds: float, tiny: bool, marks: list) -> dict:
    import torch

    from meshplan.calibrate.layer_build import _free, _layer_amp
    from meshplan.calibrate.layer_run import _layer_step, _run_layer
    from meshplan.calibrate.layer_timing import _Queue

    spec, seq, mb, cfg, layers, m = build_block(set_dir, device, tiny)
    queue = _Queue(device, lambda v: v) if device.type == "cuda" else None
    out: dict = {"set": set_dir.name, "model": spec.name, "seq_len": seq, "micro_batch": mb,
                 "layers": layers}

    def burst(tag):
        marks.append((tag + "_start", time.time()))
        vals = _run_layer(cfg, m, layers, device, iters=4, barrier=lambda: None, queue=queue)
        marks.append((tag + "_end", time.time()))
        return {"forward_s_per_layer": vals[0], "backward_s_per_layer": vals[1],
                "pass_s_per_layer": vals[0] + vals[1]}

    out["burst_before"] = burst(f"{set_dir.name}_burst1")
    x, grad, reset, forward, backward = _layer_step(cfg, m, device)
    marks.append((f"{set_dir.name}_sustained_start", time.time()))
    with _layer_amp(cfg, device):
        out["sustained"] = _sustained(forward, backward, reset, device, seconds)
    marks.append((f"{set_dir.name}_sustained_end", time.time()))
    for key in ("first_second_median_s", "after_first_second_median_s"):
        v = out["sustained"][key]
        out["sustained"][key.replace("_median_s", "_pass_s_per_layer")] = (
            v / layers if v is not None else None)
    params = [q for q in m.parameters() if q.requires_grad]

    def reset_noacc():
        # a step's first backward (m = 1): no gradient to accumulate into
        reset()
        for q in params:
            q.grad = None
    marks.append((f"{set_dir.name}_noacc_start", time.time()))
    with _layer_amp(cfg, device):
        out["sustained_no_accumulation"] = _sustained(forward, backward, reset_noacc, device,
                                                      seconds)
    marks.append((f"{set_dir.name}_noacc_end", time.time()))
    out["burst_after"] = burst(f"{set_dir.name}_burst2")
    b = out["burst_before"]["pass_s_per_layer"]
    s = out["sustained"]["after_first_second_pass_s_per_layer"]
    out["sustained_over_burst"] = s / b if (s and b) else None
    del m, x, grad
    _free(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def probe_gemm(device, n: int, seconds: float, marks: list) -> dict:
    import torch

    from meshplan.calibrate.timing import time_fn
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    marks.append(("gemm_burst_start", time.time()))
    burst = time_fn(lambda: a @ b, device=device).median_s
    marks.append(("gemm_sustained_start", time.time()))
    res = _sustained(lambda: a @ b, lambda y: None, lambda: None, device, seconds)
    marks.append(("gemm_sustained_end", time.time()))
    s = res["after_first_second_median_s"]
    return {"n": n, "burst_s": burst, "sustained": res,
            "sustained_over_burst": s / burst if s else None,
            "burst_tflops": 2 * n ** 3 / burst / 1e12}


def _smi(path: Path):
    try:
        return subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,"
             "clocks_throttle_reasons.active", "--format=csv,noheader", "-lms", "100"],
            stdout=path.open("w"), stderr=subprocess.DEVNULL)
    except (OSError, FileNotFoundError):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", action="append", required=True, type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--gemm", type=int, default=8192, help="GEMM size, 0 = skip")
    ap.add_argument("--cool-s", type=float, default=5.0, help="idle between probes")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="small stand-in model (CPU wiring)")
    args = ap.parse_args(argv)
    if not args.seconds > 1.0:
        ap.error(f"--seconds {args.seconds:g}: the sustained clock is read after each "
                 "phase's first second; give more than 1 (default 8)")
    if args.cool_s < 0 or args.gemm < 0:
        ap.error(f"--cool-s {args.cool_s:g} and --gemm {args.gemm} must be >= 0")

    import torch
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    smi = _smi(args.out / "smi.csv") if device.type == "cuda" else None
    marks: list = [("start", time.time())]
    result: dict = {"device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                               else "cpu"),
                    "torch": torch.__version__, "seconds": args.seconds, "models": []}
    try:
        for set_dir in args.set:
            time.sleep(args.cool_s)
            r = probe_model(set_dir, device, args.seconds, args.tiny, marks)
            print(f"{r['model']}: burst {r['burst_before']['pass_s_per_layer'] * 1e3:.3f} ms"
                  f" / sustained {r['sustained']['after_first_second_pass_s_per_layer'] * 1e3:.3f}"
                  f" ms a layer (ratio {r['sustained_over_burst']:.3f}); burst again "
                  f"{r['burst_after']['pass_s_per_layer'] * 1e3:.3f} ms", flush=True)
            result["models"].append(r)
        if args.gemm:
            time.sleep(args.cool_s)
            n = args.gemm if device.type == "cuda" else min(args.gemm, 256)
            g = probe_gemm(device, n, args.seconds, marks)
            print(f"gemm {n}: burst {g['burst_s'] * 1e3:.3f} ms, sustained ratio "
                  f"{g['sustained_over_burst']:.3f}", flush=True)
            result["gemm"] = g
    finally:
        marks.append(("end", time.time()))
        result["marks"] = marks
        if smi is not None:
            smi.terminate()
        (args.out / "sustained_clock.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
