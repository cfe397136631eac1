"""Why calibrated CPU dispatch reads above the executor's own (host-bound layouts, 1 GPU).

On 2026-11-29 (1 × H200, benchmarks/sets/fp8h1) every compiled one-GPU arm's CPU dispatch
was priced 13-30 % above what the executor's host spent per micro-batch in the run, with the
host dispatch probe reading the same speed (10.0 µs) in the calibration and the runs. The
calibration times a row's CPU dispatch *queued*: a spin kernel holds the GPU while the CPU
queues the whole forward and backward of a 2-block stack (``calibrate/layer_timing.py``), so
the launch queue is hundreds of kernels deep; in a host-bound step the GPU keeps up and
the queue stays shallow. This script measures, on one GPU and in one process:

* ``launch``: CPU time per launch of a one-element ``add_`` with the GPU idle (shallow
  queue) and behind a spin with 0-768 launches already queued;
* ``blocks``: the CPU dispatch per layer of the same module (calibrate's own build of the
  executor's blocks, eager and compiled, 2 and ``--deep`` blocks) timed three ways,
  interleaved: *queued* (calibrate's way), *unqueued* (synchronized start, the GPU runs
  while the CPU dispatches) and *steady* (micro-batches back to back without a
  synchronization, as a training step runs them);
* ``runs`` (``--plan``): the executor on plan files, whose results give the host's
  per-phase wall time in a real step.

Usage (device): ``python benchmarks/host_queue_gpu.py --out $OUT/host_queue.json
--model benchmarks/sets/fp8h1/m01.json:4096 --plan benchmarks/plans/host_queue/h01.json``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _host_env() -> dict:
    """CPU model, online CPUs, governor, current clocks and the cgroup's CPU quota."""
    env: dict = {"cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0))}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                env["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mhz = []
    for cpu in range(os.cpu_count() or 0):
        p = Path(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq")
        if p.exists():
            mhz.append(int(p.read_text()) / 1e3)
    env["cur_mhz"] = mhz or None
    for name, path in (("governor", "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
                       ("cpu_max", "/sys/fs/cgroup/cpu.max"), ("loadavg", "/proc/loadavg")):
        try:
            env[name] = Path(path).read_text().strip()
        except OSError:
            env[name] = None
    env["throttle"] = _throttle()
    return env


def _throttle() -> dict | None:
    try:
        return {k: int(v) for k, v in (line.split() for line in
                                       Path("/sys/fs/cgroup/cpu.stat").read_text().splitlines())}
    except (OSError, ValueError):
        return None


def launch_cost(torch, device, queue, reps: int = 7, timed: int = 200) -> list[dict]:
    """µs per ``add_`` launch: GPU idle, and queued behind a spin after ``depth`` launches."""
    x = torch.zeros(1, device=device)
    for _ in range(1000):
        x.add_(1.0)
    torch.cuda.synchronize(device)
    rows = []
    for depth in (None, 0, 128, 384, 768):
        per, failed = [], 0
        for _ in range(reps):
            torch.cuda.synchronize(device)
            e0 = torch.cuda.Event()
            if depth is not None:
                queue.sleep(0.2)
                e0.record()
                for _ in range(depth):
                    x.add_(1.0)
            t0 = time.perf_counter()
            for _ in range(timed):
                x.add_(1.0)
            t1 = time.perf_counter()
            ok = depth is None or not e0.query()
            torch.cuda.synchronize(device)
            if ok:
                per.append((t1 - t0) / timed * 1e6)
            else:
                failed += 1
        rows.append({"queue": "idle" if depth is None else f"spin+{depth}",
                     "us_per_launch": statistics.median(per) if per else None,
                     "samples_us": per, "failed": failed})
        print("launch", rows[-1]["queue"], rows[-1]["us_per_launch"], flush=True)
    return rows


def _time_blocks(torch, forward, backward, reset, device, queue, mode: str, spin_s: float,
                 microbatches: int = 4):
    """(forward CPU s, backward CPU s) of one micro-batch timed ``mode``."""
    reset()
    torch.cuda.synchronize(device)
    if mode in ("queued", "unqueued"):
        e0 = torch.cuda.Event()
        if mode == "queued":
            queue.sleep(spin_s)
        e0.record()
        t0 = time.perf_counter()
        y = forward()
        t1 = time.perf_counter()
        backward(y)
        t2 = time.perf_counter()
        # queued: the GPU must still be spinning when the CPU has dispatched everything
        ok = mode == "unqueued" or not e0.query()
        torch.cuda.synchronize(device)
        return (t1 - t0, t2 - t1) if ok else None
    # steady: micro-batches back to back, the first one not counted
    fs, bs = [], []
    for _ in range(microbatches):
        reset()
        t0 = time.perf_counter()
        y = forward()
        t1 = time.perf_counter()
        backward(y)
        t2 = time.perf_counter()
        fs.append(t1 - t0)
        bs.append(t2 - t1)
        del y
    torch.cuda.synchronize(device)
    return statistics.median(fs[1:]), statistics.median(bs[1:])


def blocks(torch, device, queue, model, seq: int, deep: int, iters: int) -> list[dict]:
    from meshplan.calibrate.layer_build import _build, _free, _layer_amp
    from meshplan.calibrate.layer_grid import Config
    from meshplan.calibrate.layer_ranks import _Groups
    from meshplan.calibrate.layer_run import _layer_step

    out = []
    groups = _Groups(1, 0, "cuda")
    for compiled in (False, True):
        for layers in (2, deep):
            cfg = Config(model=model, seq_len=seq, tp=1, sequence_parallel=False,
                         micro_batch=1, compile=compiled)
            if compiled:
                import torch._dynamo
                torch._dynamo.reset()
            m, _ = _build(cfg, layers, device, groups)
            _, _, reset, forward, backward = _layer_step(cfg, m, device)
            res: dict[str, list] = {"queued": [], "unqueued": [], "steady": []}
            with _layer_amp(cfg, device):
                t = time.perf_counter()
                for _ in range(3):      # warm-up (compiles), synchronized
                    reset()
                    y = forward()
                    backward(y)
                    del y
                torch.cuda.synchronize(device)
                sync_s = (time.perf_counter() - t) / 3
                spin = min(2.0, 1.5 * sync_s + 2e-3)
                for _ in range(iters):
                    for mode in res:
                        v = _time_blocks(torch, forward, backward, reset, device, queue,
                                         mode, spin)
                        if v is not None:
                            res[mode].append(v)
            row = {"compiled": compiled, "layers": layers}
            for mode, vals in res.items():
                if vals:
                    row[mode] = {"forward_ms_per_layer": 1e3 * statistics.median(
                        v[0] for v in vals) / layers, "backward_ms_per_layer": 1e3 *
                        statistics.median(v[1] for v in vals) / layers, "n": len(vals)}
            print("blocks", json.dumps(row), flush=True)
            out.append(row)
            del m, forward, backward, reset
            _free(device)
    return out


def runs(plans: list[str], timeout_s: float) -> list[dict]:
    """Each plan run by the executor (``moe_sync_gpu._run_one``: its results' rank-0 phase
    times, host step and host probe)."""
    from moe_sync_gpu import _run_one
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, plan in enumerate(plans):
            log = Path(tmp) / f"{i}.log"
            r = _run_one(Path(plan), ROOT, Path(tmp) / f"{i}.json", log, timeout_s, None)
            out.append({"plan": plan, **r,
                        "tail": log.read_text()[-2000:] if r["rc"] else None})
            print("run", plan, r["rc"], r["step_time_s"], flush=True)
    return out


def _model_arg(text: str) -> tuple[str, int]:
    path, _, seq = text.rpartition(":")
    if not path or not seq.isdigit() or int(seq) < 1 or not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: expected an existing ModelSpec JSON file "
                                         f"and a sequence length, PATH:SEQ_LEN")
    return path, int(seq)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", action="append", required=True, type=_model_arg,
                    help="ModelSpec JSON:SEQ_LEN (repeatable)")
    ap.add_argument("--deep", type=int, default=16, help="blocks of the deeper stack")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--plan", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=150)
    args = ap.parse_args(argv)

    import torch

    from meshplan.calibrate.layer_timing import _Queue
    from meshplan.executor.measure import host_dispatch_probe_us
    from meshplan.spec import ModelSpec

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    doc: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
                 "host": _host_env(), "probe_us": [host_dispatch_probe_us(device)]}
    queue = _Queue(device, agree=lambda v: v)
    doc["launch"] = launch_cost(torch, device, queue)
    doc["probe_us"].append(host_dispatch_probe_us(device))
    doc["blocks"] = []
    for path, seq in args.model:
        model = ModelSpec.from_dict(json.loads(Path(path).read_text()))
        for row in blocks(torch, device, queue, model, seq, args.deep, args.iters):
            doc["blocks"].append({"model": model.name, "seq_len": seq, **row})
    doc["probe_us"].append(host_dispatch_probe_us(device))
    doc["runs"] = runs(args.plan, args.timeout)
    doc["host_after"] = _host_env()
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
