"""Python garbage collection during the measured steps: watch it, and optionally take it over.

A full (generation-2) collection walks every container object the process holds — after
``import torch`` several hundred thousand — and costs 15-150 ms of CPU (measured on this
project's 2-core CI machine: 16-154 ms per gen-2 collection in the executor's start-up).
When a step is host-bound, the GPU idles for that long, and in a pipeline or a tp group
every other rank waits too. Whether one lands in a timed step depends on allocation
history, so it shows up as step-to-step and run-to-run spread rather than as a bias.

``auto`` leaves CPython's collector alone and only counts what it does during the timed
steps. ``manual`` does what torchtitan's training loop does (``training.gc_freq``,
default 50 steps: automatic collection off, a generation-1 collection every
``gc_freq`` steps): after the warm-up it collects once, freezes the survivors (model,
optimizer, imports — ``gc.freeze``, so no later collection walks them), disables the
automatic collector, and collects generation 1 every ``period`` steps *inside* the timed
step, so its cost stays in the measurement. Reference cycles made during a step are then
freed only at those collections; tensors are freed by reference counting as before.
"""

from __future__ import annotations

import gc
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from meshplan.errors import ExecutorError

GC_MODES = ("auto", "manual")
DEFAULT_GC_PERIOD_STEPS = 50


@dataclass
class GcWatch:
    """Collections CPython ran while :meth:`watching` was on: count, total and longest."""

    counts: list[int] = field(default_factory=lambda: [0, 0, 0])
    total_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    max_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    _t0: float | None = None
    _on: bool = False

    def _callback(self, phase: str, info: dict) -> None:
        if not self._on:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            g = min(int(info.get("generation", 2)), 2)
            d = time.perf_counter() - self._t0
            self.counts[g] += 1
            self.total_s[g] += d
            self.max_s[g] = max(self.max_s[g], d)
            self._t0 = None

    def start(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        self._on = True

    def stop(self) -> None:
        self._on = False
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        """``{"gen0": {"count", "total_ms", "max_ms"}, ...}`` for results.json."""
        return {f"gen{g}": {"count": self.counts[g], "total_ms": 1e3 * self.total_s[g],
                            "max_ms": 1e3 * self.max_s[g]} for g in range(3)}


class GcPolicy:
    """Applies a :data:`GC_MODES` mode around the executor's step loop.

    Call :meth:`begin_measure` once after the warm-up, :meth:`in_step` inside every timed
    step (it collects when the period comes round, in ``manual``), and :meth:`end` when
    the loop is over (restores the collector whatever happened).
    """

    def __init__(self, mode: str, period_steps: int = DEFAULT_GC_PERIOD_STEPS):
        if mode not in GC_MODES:
            raise ExecutorError(f"--gc {mode!r}: expected one of {', '.join(GC_MODES)}")
        if period_steps < 1:
            raise ExecutorError(f"--gc-period {period_steps}: must be >= 1 step")
        self.mode, self.period_steps = mode, period_steps
        self.watch = GcWatch()
        self._paused = ExitStack()
        self._measured = 0

    def begin_measure(self) -> None:
        if self.mode == "manual":
            self._paused.enter_context(gc_paused())
        self.watch.start()

    def in_step(self) -> None:
        self._measured += 1
        if self.mode == "manual" and self._measured % self.period_steps == 0:
            gc.collect(1)

    def end(self) -> None:
        self.watch.stop()
        self._paused.close()

    def summary(self) -> dict:
        return {"mode": self.mode, "period_steps": self.period_steps, **self.watch.summary()}


@contextmanager
def gc_paused():
    """Automatic collection off inside the block, as in the executor's timed steps under
    ``manual``: collect once, freeze the survivors, disable; restored on exit. Explicit
    ``gc.collect()`` calls inside still run (and skip the frozen objects). ``meshplan
    calibrate`` times its microbenchmarks this way so that their CPU dispatch times carry
    no collector pauses the executor would not have."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def gc_across_ranks(per_rank: list[dict]) -> dict:
    """The busiest rank's collections per generation (a pause on any rank stalls its peers):
    ``{"mode", "period_steps", "gen2": {"count", "total_ms", "max_ms"}, ...}``, each the
    maximum over ranks."""
    if not per_rank:
        return {}
    out = {"mode": per_rank[0]["mode"], "period_steps": per_rank[0]["period_steps"]}
    for g in ("gen0", "gen1", "gen2"):
        out[g] = {k: max(r[g][k] for r in per_rank) for k in ("count", "total_ms", "max_ms")}
    return out


__all__ = ["GC_MODES", "DEFAULT_GC_PERIOD_STEPS", "GcWatch", "GcPolicy", "gc_paused",
           "gc_across_ranks"]
