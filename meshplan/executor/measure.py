"""Timing, memory and environment measurement, and the measured-vs-predicted comparison.

Step time is taken per optimizer step after the warm-up steps: CUDA events on the
current stream on GPU (the time the GPU spent between the start of one step's work and
the end of it), wall clock on CPU. We report the median (robust to the odd slow step) and
the spread (min, max, 10th/90th percentiles). MFU follows the cost model's convention:
model FLOPs of :func:`meshplan.costmodel.flops.model_flops_per_step` (Narayanan et al.
2021, arXiv 2104.04473, eq. 3; Korthikanti et al. 2022, arXiv 2205.05198, eq. 7) over
step time × GPUs × the GPU profile's dense peak for the job's precision.
"""

from __future__ import annotations

import os
import platform
import resource
import socket
import statistics
import subprocess
import time
from typing import Any

import torch

from meshplan.costmodel.flops import hardware_flops_per_step, model_flops_per_step
from meshplan.executor.child_env import allocator_vars


class StepTimer:
    """Per-step durations: CUDA events on GPU, ``time.perf_counter`` on CPU; and, either way,
    the host's wall time from a step's start to the return of its last call (on GPU: how
    long the CPU took to dispatch the step, blocking included — about the step time when
    the CPU sets the pace, less when it runs ahead of the GPU)."""

    def __init__(self, device: torch.device, phase_memory: bool = False):
        self.cuda = device.type == "cuda"
        #: on GPU with ``phase_memory``: each time point also reads the allocator's peak since
        #: the previous point and resets it, so each phase gets its own peak; the run's peak
        #: is then :attr:`peak_bytes`, the running maximum of every reading (torch's own
        #: ``max_memory_allocated`` only covers the time since the last reset)
        self.memory = phase_memory and self.cuda
        self.peak_bytes = 0.0
        self._device = device
        # per timed step, its time points in order: (phase name, device point, host
        # perf_counter, allocator peak since the previous point or None) — the start
        # (name ""), each mark, the stop (name "")
        self._steps: list[list[tuple[str, Any, float, float | None]]] = []
        self._running: list[tuple[str, Any, float, float | None]] | None = None

    def _point(self, name: str) -> tuple[str, Any, float, float | None]:
        host = time.perf_counter()
        peak = None
        if self.memory:
            # host-side allocator bookkeeping: no device synchronisation
            peak = float(torch.cuda.max_memory_allocated(self._device))
            torch.cuda.reset_peak_memory_stats(self._device)
            self.peak_bytes = max(self.peak_bytes, peak)
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return name, ev, host, peak
        return name, host, host, peak

    def running_peak_bytes(self) -> float:
        """On GPU: the peak allocated bytes of the run so far — the readings' maximum (with
        ``phase_memory``; else none) and the allocator's peak since the last one."""
        return max(self.peak_bytes, float(torch.cuda.max_memory_allocated(self._device)))

    def _elapsed_ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def start(self) -> None:
        self._running = [self._point("")]

    def mark(self, name: str) -> None:
        """End of phase ``name`` of the running step (no-op outside a timed step): the
        phase lasts from the previous mark (or the step's start) to here, on the device's
        timeline (a CUDA event; it includes the device's waits for the CPU) and on the
        host's (wall time to dispatch it)."""
        if self._running is not None:
            self._running.append(self._point(name))

    def stop(self) -> None:
        self._running.append(self._point(""))
        self._steps.append(self._running)
        self._running = None

    def host_durations_s(self) -> list[float]:
        return [pts[-1][2] - pts[0][2] for pts in self._steps]

    def durations_s(self) -> list[float]:
        """All recorded durations (synchronizes the device on GPU)."""
        if self.cuda:
            torch.cuda.synchronize()
        return [self._elapsed_ms(pts[0][1], pts[-1][1]) / 1e3 for pts in self._steps]

    def phase_medians_ms(self) -> dict[str, dict[str, float]]:
        """Per phase (the names given to :meth:`mark`, in step order): the median over the
        timed steps of its device-timeline and host durations, in ms (synchronizes). A name
        marked again within one step (a block's marks, once per micro-batch) is the phase
        ``name #2``, ``name #3``, ... from its second time on."""
        if self.cuda:
            torch.cuda.synchronize()
        dev: dict[str, list[float]] = {}
        host: dict[str, list[float]] = {}
        peak: dict[str, list[float]] = {}
        for pts in self._steps:
            seen: dict[str, int] = {}
            for (_, d0, h0, _), (mark, d1, h1, p1) in zip(pts, pts[1:-1]):
                seen[mark] = seen.get(mark, 0) + 1
                name = mark if seen[mark] == 1 else f"{mark} #{seen[mark]}"
                dev.setdefault(name, []).append(self._elapsed_ms(d0, d1))
                host.setdefault(name, []).append((h1 - h0) * 1e3)
                if p1 is not None:
                    peak.setdefault(name, []).append(p1)
        out = {name: {"device_ms": statistics.median(dev[name]),
                      "host_ms": statistics.median(host[name])} for name in dev}
        for name, values in peak.items():     # the phase's highest peak over the steps
            out[name]["peak_allocated_bytes"] = max(values)
        return out


HOST_PROBE_CALLS = 20_000


def host_dispatch_probe_us(device: torch.device, calls: int = HOST_PROBE_CALLS) -> float:
    """The host's dispatch speed now: wall time per ``add_`` call on a one-element tensor
    on ``device``, in µs, with the device idle before and after (about 0.2 s on a GPU host).

    Why: layouts whose CPU dispatch sets the step are priced with CPU times calibrated
    earlier, and on the lent VM hosts the CPU's speed moves between runs — this probe read
    9.65 and 16.17 µs three minutes apart on one 2 × H100 host (round 13). Recording it
    with every run (and in a calibrated profile's provenance) lets a host-bound miss be
    compared with the host's speed at the time."""
    x = torch.zeros(1, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    for _ in range(min(calls, 1000)):   # warm the dispatcher's caches
        x.add_(1.0)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        x.add_(1.0)
    sync(device)
    return (time.perf_counter() - t0) / calls * 1e6


def summarize(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    v = sorted(values)

    def q(p: float) -> float:
        i = p * (len(v) - 1)
        lo, hi = int(i), min(int(i) + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (i - lo)

    med = statistics.median(v)
    return {"median": med, "min": v[0], "max": v[-1], "p10": q(0.1), "p90": q(0.9),
            "spread_pct": 100.0 * (q(0.9) - q(0.1)) / med if med else 0.0, "n": len(v)}


def peak_memory(device: torch.device) -> dict[str, float | None]:
    """Peak bytes of this process: CUDA caching allocator on GPU, max RSS on CPU."""
    if device.type == "cuda":
        return {"allocated_bytes": float(torch.cuda.max_memory_allocated(device)),
                "reserved_bytes": float(torch.cuda.max_memory_reserved(device))}
    # Linux reports ru_maxrss in KiB; it is the whole process, not only tensors.
    return {"allocated_bytes": None,
            "reserved_bytes": float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}


def environment(device: torch.device, world_size: int) -> dict[str, Any]:
    env: dict[str, Any] = {
        "device": device.type, "world_size": world_size, "torch": torch.__version__,
        "python": platform.python_version(), "host": socket.gethostname(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if device.type == "cuda":
        env["gpu_name"] = torch.cuda.get_device_name(device)
        env["gpu_count"] = torch.cuda.device_count()
        env["cuda"] = torch.version.cuda
        try:
            env["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # NCCL missing from this build
            env["nccl"] = None
        env["driver"] = _driver_version()
        env["allocator"] = allocator_vars(os.environ)
    else:
        env["gpu_name"] = None
        env["cpu"] = platform.processor() or platform.machine()
        env["cpu_count"] = os.cpu_count()
    return env


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def throughput(model, job, layout, step_time_s: float | None, peak_flops: float | None,
               ) -> dict[str, float | None]:
    """tokens/s, model and hardware TFLOP/s per GPU and MFU for a median step time."""
    if not step_time_s:
        return {"tokens_per_s": None, "model_tflops_per_gpu": None,
                "hardware_tflops_per_gpu": None, "mfu": None, "hfu": None}
    n = layout.num_gpus
    if model.is_moe:     # the dense formulas would count every expert
        from meshplan.costmodel.moe import moe_model_flops_per_step
        mf = moe_model_flops_per_step(model, job.global_batch, job.seq_len)
        hf = moe_model_flops_per_step(model, job.global_batch, job.seq_len,
                                      recompute=layout.recompute)
    else:
        mf = model_flops_per_step(model, job.global_batch, job.seq_len)
        hf = hardware_flops_per_step(model, job.global_batch, job.seq_len, layout.recompute)
    return {"tokens_per_s": job.tokens_per_step / step_time_s,
            "model_tflops_per_gpu": mf / step_time_s / n / 1e12,
            "hardware_tflops_per_gpu": hf / step_time_s / n / 1e12,
            "mfu": mf / step_time_s / n / peak_flops if peak_flops else None,
            "hfu": hf / step_time_s / n / peak_flops if peak_flops else None}


def error_pct(measured: float | None, predicted: float | None) -> float | None:
    """(predicted - measured) / measured in %: positive = the cost model over-predicts."""
    if measured is None or predicted is None or not measured:
        return None
    return 100.0 * (predicted - measured) / measured


COMPARED = ("step_time_s", "tokens_per_s", "mfu", "memory_peak_bytes")


def comparison(measured: dict[str, Any], prediction: dict[str, Any]) -> dict[str, float | None]:
    return {k: error_pct(measured.get(k), _num(prediction.get(k))) for k in COMPARED}


def _num(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def format_table(measured: dict[str, Any], prediction: dict[str, Any],
                 errors: dict[str, float | None]) -> str:
    """predicted | measured | error for step time, tokens/s, MFU, peak memory (worst rank)."""
    def fmt(key, v):
        if v is None:
            return "-"
        if key == "memory_peak_bytes":
            return f"{v / 2**30:.2f} GiB"
        if key == "mfu":
            return f"{100 * v:.1f} %"
        if key == "step_time_s":
            return f"{v * 1e3:.1f} ms"
        return f"{v:,.0f}"

    labels = {"step_time_s": "step time", "tokens_per_s": "tokens/s", "mfu": "MFU",
              "memory_peak_bytes": "peak memory (worst rank)"}
    rows = [("", "predicted", "measured", "error")]
    for k in COMPARED:
        e = errors.get(k)
        rows.append((labels[k], fmt(k, _num(prediction.get(k))), fmt(k, measured.get(k)),
                     "-" if e is None else f"{e:+.1f} %"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [" | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                        enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


__all__ = ["StepTimer", "host_dispatch_probe_us", "summarize", "peak_memory", "environment",
           "throughput", "error_pct", "comparison", "format_table"]
