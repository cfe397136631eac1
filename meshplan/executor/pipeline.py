"""Pipeline stages and schedules from ``torch.distributed.pipelining``.

Which layers a stage owns comes from the layout's ``stage_layers`` (or the cost model's
default split). With interleaving, virtual stage ``c`` lives on pipeline rank ``c % pp``
(Narayanan et al. 2021, arXiv 2104.04473 §2.2.2, Fig. 4).

Schedules: GPipe (Huang et al. 2019, arXiv 1811.06965), 1F1B (PipeDream-Flush; Narayanan
et al. 2021 §2.2.1), interleaved 1F1B (§2.2.2) and zero-bubble. For "zero-bubble" we use
``ScheduleInterleavedZeroBubble`` with one stage per rank: it is ZB1P of Qi et al. 2023
(arXiv 2401.10241), which splits each backward into input- and weight-gradient parts and
fills the 1F1B bubble with the weight parts (ZB-H1's idea); it exists in torch 2.11 and
2.13. ``ScheduleZBVZeroBubble`` needs two V-placed stages per rank, which a layout with
vpp = 1 does not describe.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.spec import Layout, ModelSpec, default_stage_layers
from meshplan.spec.validate import ZB_ZERO3_UNSUPPORTED, zero_bubble_under_zero3
from meshplan.errors import ExecutorError


@dataclass(frozen=True)
class PartSpec:
    """One virtual pipeline stage: its index and the layers it owns."""

    stage_index: int
    num_stages: int
    first_layer: int
    num_layers: int

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1


def stage_layer_counts(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    stages = layout.pp * layout.vpp
    counts = layout.stage_layers or default_stage_layers(model.num_layers, stages)
    if sum(counts) != model.num_layers:
        raise ExecutorError(f"Layout.stage_layers {list(counts)} sums to {sum(counts)}, but the "
                            f"model has num_layers = {model.num_layers}")
    return tuple(counts)


def local_parts(model: ModelSpec, layout: Layout, pp_rank: int) -> list[PartSpec]:
    """The virtual stages pipeline rank ``pp_rank`` runs, in order."""
    if layout.pp == 1:
        return [PartSpec(0, 1, 0, model.num_layers)]
    counts = stage_layer_counts(model, layout)
    starts = [sum(counts[:c]) for c in range(len(counts))]
    n = len(counts)
    return [PartSpec(c, n, starts[c], counts[c]) for c in range(pp_rank, n, layout.pp)]


def check_schedule(layout: Layout, num_microbatches: int) -> None:
    """Reject what the torch schedules cannot run, before anything is allocated."""
    if layout.pp == 1:
        return
    if zero_bubble_under_zero3(layout.schedule, layout.zero, layout.dp, layout.pp):
        raise ExecutorError(ZB_ZERO3_UNSUPPORTED)
    m, p = num_microbatches, layout.pp
    if layout.schedule == "1f1b" and m < p:
        raise ExecutorError(f"schedule '1f1b' needs at least pp = {p} micro-batches per step, got "
                            f"{m}; raise Job.global_batch or lower micro_batch / dp")
    if layout.schedule in ("interleaved-1f1b", "zero-bubble"):
        rounds = max(1, m // p)
        if m % rounds:
            raise ExecutorError(
                f"schedule {layout.schedule!r} needs the number of micro-batches ({m}) to be a "
                f"multiple of max(1, m // pp) = {rounds}; use a multiple of pp = {p}")


def build_schedule(layout: Layout, stages: list, num_microbatches: int, loss_fn):
    from torch.distributed import pipelining as pl
    if layout.schedule == "gpipe":
        return pl.ScheduleGPipe(stages[0], num_microbatches, loss_fn=loss_fn)
    if layout.schedule == "1f1b":
        return pl.Schedule1F1B(stages[0], num_microbatches, loss_fn=loss_fn)
    if layout.schedule == "interleaved-1f1b":
        return pl.ScheduleInterleaved1F1B(stages, num_microbatches, loss_fn=loss_fn)
    if layout.schedule == "zero-bubble":
        return pl.ScheduleInterleavedZeroBubble(stages, num_microbatches, loss_fn=loss_fn)
    raise ExecutorError(f"unknown schedule {layout.schedule!r}")


def build_stage(module, part: PartSpec, *, device, group):
    """A ``PipelineStage``; shapes are inferred from the first micro-batch.

    (Static ``input_args``/``output_args`` made torch 2.13 drop the gradient sent back
    to the first stage, so we let the stage infer them; the round costs one p2p exchange
    of metadata on the first step only.)
    """
    from torch.distributed.pipelining import PipelineStage
    return PipelineStage(module, part.stage_index, part.num_stages, device, group=group)


__all__ = ["PartSpec", "local_parts", "stage_layer_counts", "check_schedule",
           "build_schedule", "build_stage"]
