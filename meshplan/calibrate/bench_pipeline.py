"""The fixed cost of one pipeline action (a stage's forward or backward of one micro-batch).

The executor's real pipeline — :func:`meshplan.executor.mesh.build_mesh` and
:class:`meshplan.executor.parallelize.ParallelTrainer` with ``torch.distributed.pipelining``'s
1F1B schedule — runs a tiny model (hidden 64, two layers per stage, 32 tokens) over all
ranks of the calibration world, so its compute is negligible and the step time is the
schedule's own cost: Python dispatch of each action, the p2p send/receive of activations
and gradients, the schedule's bookkeeping.

With ``pp`` stages and ``m`` micro-batches, 1F1B's critical path has ``m + pp − 1`` slots,
each holding one forward and one backward action (Narayanan et al. 2021, arXiv 2104.04473
§2.2.1: the pipeline bubble is ``(pp − 1)`` slots of forward + backward), so one action
costs ``step / (2 · (m + pp − 1))``. The tiny layers' own dispatch is in that figure too; the
model is run with 2 and with 4 layers per stage and the cost extrapolated to 0 layers
(``2·a(2) − a(4)``), which is the schedule's cost alone: the cost model adds it to the CPU
time of each action, next to the layers' measured CPU dispatch.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from meshplan.calibrate.bench_overhead import tiny_spec
from meshplan.calibrate.stats import two_depth_fit
from meshplan.spec import Job, Layout
from meshplan.errors import ConfigError

SEQ_LEN = 32


def action_seconds(step_s: float, microbatches: int, pp: int) -> float:
    """Seconds per pipeline action of a 1F1B step that took ``step_s``."""
    return step_s / (2 * (microbatches + pp - 1))


def bench_pipeline_action_s(device, world: int, *, warmup: int = 3, steps: int = 10
                            ) -> dict[str, Any]:
    """Collective over the world (world >= 2); returns the row ``{"kind":
    "pipeline_action_s", "seconds", "step_seconds", "pp", "microbatches", "per_layer_s"}``."""
    import torch.distributed as dist
    if world < 2 or not dist.is_initialized() or dist.get_world_size() != world:
        raise ConfigError(f"the pipeline benchmark needs an initialized process group of "
                          f"world size >= 2 (pp = world), got world {world}")
    m = 2 * world
    step2 = _tiny_step_s(device, world, 2, warmup, steps)
    step4 = _tiny_step_s(device, world, 4, warmup, steps)
    action, per_layer = extrapolate_action(step2, step4, m, world)
    return {"kind": "pipeline_action_s", "seconds": action, "step_seconds": step2,
            "pp": world, "microbatches": m, "per_layer_s": per_layer}


def extrapolate_action(step2_s: float, step4_s: float, microbatches: int, pp: int
                       ) -> tuple[float, float]:
    """(seconds per action at 0 layers, seconds per layer per action) from the steps of the
    2- and 4-layers-per-stage runs; both clamped at 0 (timing noise can invert them)."""
    fixed, per_layer = two_depth_fit(2, action_seconds(step2_s, microbatches, pp),
                                     4, action_seconds(step4_s, microbatches, pp))
    return max(0.0, fixed), max(0.0, per_layer)


def _tiny_step_s(device, world: int, layers_per_stage: int, warmup: int, steps: int) -> float:
    """Median 1F1B step seconds of the tiny model (the slowest rank's)."""
    import torch
    import torch.distributed as dist

    from meshplan.executor.mesh import build_mesh
    from meshplan.executor.parallelize import ParallelTrainer
    m = 2 * world
    spec = tiny_spec(None, layers_per_stage * world)
    layout = Layout(pp=world, schedule="1f1b", micro_batch=1)
    job = Job(global_batch=m, seq_len=SEQ_LEN)
    groups = build_mesh(layout, device.type, tied_embeddings=spec.tied_embeddings)
    trainer = ParallelTrainer(spec, job, layout, groups, device)
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(0, spec.vocab_size, (m, SEQ_LEN + 1), generator=gen).to(device)
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        trainer.step(batch)
    times = []
    for _ in range(steps):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        trainer.step(batch)
        sync()
        times.append(time.perf_counter() - t0)
    # the slowest rank sets the pace of a pipeline
    t = torch.tensor([statistics.median(times)], dtype=torch.float64,
                     device=device if cuda else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    del trainer
    return float(t.item())


__all__ = ["bench_pipeline_action_s", "action_seconds", "extrapolate_action"]
