"""Does a GPU that idles part of each step keep a higher clock than one busy back to back?

Round 43 (docs/benchmarks/transfer.md, "Round 43 ... after the run") left a question: the
`sustained_clock` correction (rows timed in bursts run at the maximum clock, a back-to-back
loop at the power-capped one) priced data-parallel steps right but pipeline steps, whose
GPUs idle a third to a half of each step in the bubble, 4-6 % slow. If the power limiter
averages over a window longer than a step's idle gaps, a GPU busy a fraction u of the time
draws less on average and is throttled less. This probe measures that directly on one GPU:
the same work run in busy chunks of ``--chunk-ms`` followed by an idle gap, at duty cycles
1.0 ... 0.5, each for ``--seconds``; per phase the median time of one unit of work in the
last part of the phase (CUDA events), with ``nvidia-smi`` sampling SM clock and power
every 100 ms (phase marks in the JSON to line them up). Two kinds of work: a bf16 GEMM
(``--gemm``) and a set's first model's calibration block (forward + backward, as
``benchmarks/sustained_clock_gpu.py`` builds it). Run on the device::

    python benchmarks/duty_cycle_clock_gpu.py --out $OUT --set benchmarks/sets/transfer43

``--device cpu --tiny`` runs the same path on CPU (wiring only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sustained_clock_gpu import _smi, build_block  # noqa: E402


def run_phase(unit, device, duty: float, chunk_s: float, seconds: float) -> dict:
    """``unit`` repeated in busy chunks of about ``chunk_s`` then idle for
    chunk_s × (1 − duty) / duty; the median unit time after the first 40 % of the phase."""
    import torch
    cuda = device.type == "cuda"
    times, starts = [], []
    t_start = time.perf_counter()
    while time.perf_counter() - t_start < seconds:
        c0 = time.perf_counter()
        events = []
        while time.perf_counter() - c0 < chunk_s:
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
            t0 = time.perf_counter()
            unit()
            if cuda:
                b.record()
                events.append((a, b, t0 - t_start))
                if len(events) % 4 == 0:
                    events[-2][1].synchronize()
            else:
                times.append(time.perf_counter() - t0)
                starts.append(t0 - t_start)
        if cuda:
            torch.cuda.synchronize(device)
            for a, b, s in events:
                times.append(a.elapsed_time(b) / 1e3)
                starts.append(s)
        busy = time.perf_counter() - c0
        if duty < 1.0:
            time.sleep(busy * (1.0 - duty) / duty)
    late = [t for t, s in zip(times, starts) if s >= 0.4 * seconds] or times
    return {"duty": duty, "chunk_s": chunk_s, "units": len(times),
            "median_unit_s": statistics.median(late), "first_unit_s": times[0]}


def probe(name: str, unit, device, duties, chunks, seconds, marks) -> dict:
    out = {"work": name, "phases": []}
    for chunk in chunks:
        for duty in duties:
            tag = f"{name}_chunk{int(chunk * 1e3)}ms_duty{duty:.2f}"
            marks.append((tag + "_start", time.time()))
            out["phases"].append(run_phase(unit, device, duty, chunk, seconds))
            marks.append((tag + "_end", time.time()))
            p = out["phases"][-1]
            print(f"{tag}: {p['median_unit_s'] * 1e3:.3f} ms a unit ({p['units']} units)",
                  flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", type=Path, action="append", default=[])
    ap.add_argument("--gemm", type=int, default=8192)
    ap.add_argument("--duties", type=float, nargs="+", default=[1.0, 0.85, 0.67, 0.5])
    ap.add_argument("--chunk-ms", type=float, nargs="+", default=[30.0, 150.0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    if any(not 0 < d <= 1 for d in args.duties):
        ap.error(f"--duties {args.duties}: each must be in (0, 1] (the busy share of a phase)")
    if any(c <= 0 for c in args.chunk_ms) or args.seconds <= 0 or args.gemm <= 0:
        ap.error("--chunk-ms, --seconds and --gemm must be > 0")
    import torch
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    smi = _smi(args.out / "smi.csv") if device.type == "cuda" else None
    marks: list = []
    result: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda"
                    else "cpu", "torch": torch.__version__, "seconds": args.seconds,
                    "works": []}
    chunks = [c / 1e3 for c in args.chunk_ms]
    try:
        n = 256 if args.tiny else args.gemm
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        result["works"].append(probe(f"gemm{n}", lambda: a @ b, device, args.duties, chunks,
                                     args.seconds, marks))
        del a, b
        for set_dir in args.set:
            from meshplan.calibrate.layer_build import _layer_amp
            from meshplan.calibrate.layer_run import _layer_step
            spec, seq, mb, cfg, layers, m = build_block(set_dir, device, args.tiny)
            x, grad, reset, forward, backward = _layer_step(cfg, m, device)

            def unit():
                reset()
                backward(forward())
            with _layer_amp(cfg, device):
                w = probe(spec.name, unit, device, args.duties, chunks, args.seconds, marks)
            w.update(micro_batch=mb, seq_len=seq, layers=layers)
            result["works"].append(w)
            del m, x, grad
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        if smi is not None:
            smi.terminate()
    result["marks"] = marks
    (args.out / "duty_cycle.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out / 'duty_cycle.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
