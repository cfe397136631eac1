"""When the CPU, not the GPU, sets the pace: the host-dispatch bound of a step.

PyTorch's CPU queues kernels ahead of the GPU, so a rank cannot finish before its CPU has
dispatched all its work. Where the profile has measured CPU dispatch times (``meshplan
calibrate`` layer tables, queued timing), a rank's step is at least its CPU total plus the
backward path the last micro-batch still travels to it (:meth:`HostDispatch.host_bound_s`);
for small layers on fast GPUs this, not the GPU, sets the step time. A measured mechanism:
docs/benchmarks/accuracy.md rounds 3-16 (its per-action and per-call parts: rounds 8, 10).

Measured error: layouts the model calls host-bound are the least repeatable measured
(−24 % to +36 % over 29 runs of 21 layouts, rounds 8-11), which is why they carry a caveat
(:mod:`meshplan.costmodel.caveats`).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costmodel.stage_tables import TablesBase


@dataclass(frozen=True, eq=False, kw_only=True)
class HostDispatch(TablesBase):
    """CPU dispatch per micro-batch (measured profiles): a layer's forward + backward, the
    embedding's, the output's, and the pipeline schedule's cost per action."""

    cpu_layer_s: float
    cpu_call_s: float             # per chunk and micro-batch, whatever its layers
    cpu_first_s: float
    cpu_last_s: float
    cpu_action_s: float
    cpu_known: bool
    # zero-bubble: a layer's weight-pass CPU dispatch (part of cpu_layer_s; 0: not timed apart)
    cpu_wgrad_layer_s: float = 0.0

    def rank_cpu_s(self, rank: int, layers: int) -> float:
        """CPU seconds to dispatch a rank's share of one step's forward and backward (and,
        zero-bubble, weight-gradient) actions: per micro-batch, its layers' per-layer part,
        each chunk's per-call part (measured on two stack depths, else 0) and the
        schedule's per-action cost."""
        lay = self.layout
        actions = 3 if lay.schedule == "zero-bubble" else 2
        per_mb = (layers * self.cpu_layer_s + lay.vpp * self.cpu_call_s
                  + actions * lay.vpp * self.cpu_action_s)
        if rank == 0:
            per_mb += self.cpu_first_s
        if rank == self.last_rank:
            per_mb += self.cpu_last_s
        return self.num_microbatches * per_mb

    def host_bound_s(self, stage_layers, times: tuple | None = None) -> float:
        """When the CPU, not the GPU, sets the pace (0 without measured CPU times).

        The CPU runs ahead of its GPU (kernel launches and NCCL waits do not block it), so a
        rank's GPU finishes about when its CPU has dispatched everything — except that the
        last micro-batch's backward still has to travel from the last stage to rank r:
        rank r ends no earlier than its CPU total plus the backward (input-gradient) time
        and p2p of every stage before it on that path. With ``v`` chunks per rank only the
        first chunk's path is counted (an approximation). Zero-bubble: the path is the input-
        gradient passes, the weight passes a rank dispatches after its last B are not on it
        (round 10 of docs/benchmarks/accuracy.md; post hoc). ``times``:
        :meth:`stage_times` of ``stage_layers`` where the caller has them already."""
        if not self.cpu_known:
            return 0.0
        _, b, w = times or self.stage_times(stage_layers)  # type: ignore[attr-defined]
        zb = self.layout.schedule == "zero-bubble"
        out, path = 0.0, 0.0
        for r, n in enumerate(self.rank_layers(stage_layers)):
            cpu = self.rank_cpu_s(r, n)
            # zero-bubble rank r dispatches r + 1 deferred weight passes after its last
            # input-gradient pass (pipeline_sim.rank_order): the last micro-batch's B
            # travels on while they are dispatched, so they do not lengthen that path,
            # which ends with rank 0's own last weight pass
            trail = (r + 1) * n * self.cpu_wgrad_layer_s if zb and self.layout.vpp == 1 else 0.0
            end = w[0] if zb and r > 0 else 0.0
            out = max(out, cpu, cpu - min(trail, cpu) + path + end)
            path += (b[r] - w[r] if zb else b[r]) + self.p2p_s
        return out


__all__ = ["HostDispatch"]
