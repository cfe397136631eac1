"""Memory corrections of a pipeline rank's peak, read from torch's source and placed by
measurement: gradients that do not exist yet, weights that stay gathered, copies that a
recompute frees, the end-of-step concatenation.

Each method is one term :meth:`meshplan.costmodel.rank_memory.RankMemory.rank_memory_bytes`
adds to (or takes from) the base terms (states + in-flight activations + buffers); each is
registered as a named memory rule (:data:`MEMORY_RULES`) so that an estimate shows what it
moved, and each can be switched off by name (``CorrectionNumbers.without``) where the
tables are built. Their docstrings give the torch mechanism and the measurements.

Measured error, all rules together: per-rank memory within 5 % on 64 of 64 ranks in GPU round
26 (max 3.18 %, docs/benchmarks/accuracy.md).
"""

from __future__ import annotations

from meshplan.costmodel import first_backward
from meshplan.costmodel.corrections import (END_OF_STEP, FIRST_BACKWARD, OUTPUT_PEAK,
                                            Z3_RESIDENT, memory_rule)
from meshplan.costmodel.torch_memory import pipelined_output_peak_bytes


class MemoryReliefs:
    """Mixin of :class:`~meshplan.costmodel.rank_memory.RankMemory` (its fields)."""

    def first_backward_relief_bytes(self, rank: int, layers: int) -> float:
        """Bytes of a rank's gradients and activations that never coexist, because a
        chunk's gradients appear only in its first backward of the step.

        The executor sets gradients to None at each step's start (``zero_grad(set_to_none=
        True)``; pipelined layouts average them after the schedule, without DDP's persistent
        buckets). Walking the rank's operations in the schedule's order
        (:mod:`meshplan.costmodel.first_backward`) gives its true peak; this is how far that
        lies below "most activations in flight + all gradients", which the other terms
        count. The rank's layers are split evenly over its chunks; rank 0's embedding and
        the last rank's output layer go with the chunk that holds them (its first / last).

        GPipe, and 1F1B on a rank whose warm-up covers all m micro-batches, give
        ``min(G, A1)`` (G: the rank's gradients, A1: one micro-batch's activations; on the
        last rank A1 includes the logits the output layer kept, its backward runs first),
        elsewhere 0 under 1F1B. (Until round 8 the logits share was left out; every Llama
        GPipe last stage measured then was over-predicted by 5-9 %. 1F1B: pair14 p05,
        round 14, rank 0 of pp 2 with m = 2 at +5.4 %, its trace peaking at the first
        backward with no gradient allocated.) Interleaved: a chunk whose first backward
        comes after others freed activations adds its gradients on a lower level (round
        15, post hoc: holdout13 v09's ranks 0-2, pp 4, v 2, m 4, measured 1.3, 1.3 and
        1.0 GiB under the prediction without this)."""
        if not self.relief_events or not self.relief_events[rank]:
            return 0.0
        key = (rank, layers)
        out = self._relief.get(key)  # type: ignore[attr-defined]
        if out is None and self.layout.schedule == "zero-bubble":
            out = self._relief[key] = self._zero_bubble_relief(rank, layers)  # type: ignore[attr-defined]
        if out is None:
            # the rank's layers evenly over its chunks (events: backward_event_sums)
            v = self.layout.vpp if self.layout.schedule == "interleaved-1f1b" else 1
            first, last = rank == 0, rank == self.last_rank
            out = self._relief[key] = first_backward.relief_bytes_ends(  # type: ignore[attr-defined]
                self.relief_events[rank], layers / v * self.layer_activation_bytes,
                layers / v * self.relief_layer_grad_bytes,
                first_act=self.embedding_act_bytes if first else 0.0,
                first_grad=self.relief_first_grad_bytes if first else 0.0,
                # one micro-batch's kept logits (GPipe keeps every micro-batch's)
                last_act=self.output_kept_bytes if last else 0.0,
                last_grad=self.relief_last_grad_bytes if last else 0.0)
        return out

    def _zero_bubble_relief(self, rank: int, layers: int) -> float:
        """:meth:`first_backward_relief_bytes` of a zero-bubble rank
        (:func:`first_backward.zero_bubble_relief`): per micro-batch the activations A
        (rank 0's embedding output, the last rank's kept output), on ranks r > 0 the kept
        output gradients K (the last rank's 16-bit logits' gradient with them), and the
        rank's gradients G."""
        act = self._one_microbatch_act_bytes(rank, layers)
        kept = layers * self.wgrad_pending_bytes if rank > 0 else 0.0
        if rank == self.last_rank:
            act += self.output_kept_bytes
            kept += self.logits_grad_bytes if rank > 0 else 0.0
        return first_backward.zero_bubble_relief(self.relief_events[rank], act, kept,
                                                 self._rank_grad_bytes(rank, layers))

    def _rank_grad_bytes(self, rank: int, layers: int) -> float:
        """The gradients ``rank`` allocates in a step: its layers' and the non-layer
        parameters it holds (rank 0's embedding, the last rank's output layer)."""
        return (layers * self.relief_layer_grad_bytes
                + (self.relief_first_grad_bytes if rank == 0 else 0.0)
                + (self.relief_last_grad_bytes if rank == self.last_rank else 0.0))

    def z3_resident_bytes(self, rank: int, layers: int) -> float:
        """ZeRO-3 under torch.distributed.pipelining (GPipe, 1F1B, interleaved; zero-bubble
        under ZeRO-3 is refused, :data:`meshplan.spec.validate.ZB_ZERO3_UNSUPPORTED`): the
        stage turns FSDP2's resharding after backward off for every micro-batch but the
        last (``set_reshard_after_backward(False)``), so a layer's gathered 16-bit weights
        stay from its backward until its next forward reshards them. Right after a
        backward the rank holds all its layers' weights W and one micro-batch's
        activations A1 less; the next forward gives the activations back as it reshards
        the weights layer by layer. The peak gains max(0, W − A1) over the two gathered
        layers the buffers already count. Read from torch's source (2.13).

        Where two backwards follow each other (GPipe; 1F1B's cool-down) the second starts
        with W resident and every gradient allocated, so the peak is W − A1 above "most
        activations in flight + all gradients" — and W − A1 + R above the counted peak when
        the first-backward relief R (:meth:`first_backward_relief_bytes`) lowered that.
        Until round 23 GPipe was left out (its backwards were thought to reshard);
        ``ScheduleGPipe`` passes ``last_backward`` like the others. holdout23 f12 (Llama dp
        2 pp 2 GPipe, full, ZeRO-3, mb 16, post hoc) measured its first stage at 15.66 GiB,
        the same as its ZeRO-2 twins d10 and o12: 14.37 predicted without the term (−8.2 %),
        15.54 with it (−0.8 %). No other measured layout's prediction changes.

        The last rank peaks in its output layer's backward, before its layers' backward
        gathers them: there the weights coexist only with what remains once the output's
        working memory (``output_peak_bytes`` beyond the part shared with a layer's
        backward, :attr:`output_overlap_bytes`) is freed. Measured in round 15 (holdout13,
        post hoc for the last rank): v13's rank 0 (Llama, pp 2, mb 4) 11.19 GiB against
        10.85 predicted with this term (10.05 without), its last rank 15.31 against 16.38
        with the full term and 15.59 with this rule (15.83 in all: with the end-of-step
        receive buffers, :meth:`end_of_step_bytes`, the merge now sets that rank's peak)."""
        if not self.z3_resident_layer_bytes or layers <= 2:
            return 0.0
        extra = max(0.0, (layers - 2) * self.z3_resident_layer_bytes
                    - self._one_microbatch_act_bytes(rank, layers)
                    + self.first_backward_relief_bytes(rank, layers))
        if rank == self.last_rank:
            extra = max(0.0, extra - (self.output_peak_bytes - self.output_overlap_bytes))
        return extra

    def _one_microbatch_act_bytes(self, rank: int, layers: int) -> float:
        """One micro-batch's activations on ``rank``'s layers (and the embedding's on rank
        0): what its backward frees."""
        return layers * self.layer_activation_bytes + (self.embedding_act_bytes
                                                       if rank == 0 else 0.0)

    def end_of_step_bytes(self, layers: int) -> float:
        """The last rank's memory beyond its model states when torch concatenates the kept
        stage outputs at the end of the step (``last_merge_bytes``; 0 where that does not
        apply). Then the rank holds no activations but still its receive buffers
        (``pipeline_recv_buffers``: allocated once, kept for the run; round 15's v09 snapshot
        held all of them, 1.5 GiB, at the step's end). Under full recompute it no longer holds
        autocast's 16-bit weight copies: every layer's recompute (``torch.utils.checkpoint``)
        leaves autocast on the autograd thread, which clears the cast cache (the mechanism of
        round 12), and after the last backward nothing casts again. Round 15: v10/v11 (Llama,
        full) measured 23.80/24.80 GiB at that peak, copies counted 24.55/25.55, without
        23.73/24.73; v02 (GPT, selective: copies kept) 29.10 vs 29.02 with them."""
        if not self.last_merge_bytes:
            return 0.0
        return (self.last_merge_bytes + self.end_recv_bytes
                - layers * self.end_uncached_layer_bytes - self.end_uncached_const_bytes)

    def cast_cache_relief_bytes(self, rank: int, layers: int) -> float:
        """GPipe (or a 1F1B rank that runs every forward first, :data:`meshplan.costmodel.corrections.CAST_CACHE_SCHEDULES`)
        with full recomputation under autocast (runtime "torch", ZeRO-0/1): what a
        rank's peak inside a layer's backward holds less than its model states and buffers
        say.

        The first recompute of a backward (``torch.utils.checkpoint``, on the autograd
        engine's thread) leaves ``torch.autocast`` at nesting 0 there, which clears the
        weight-cast cache every thread shares (the mechanism of round 12 and of
        :meth:`end_of_step_bytes`): from then on only the layer being recomputed holds its
        16-bit copies. The calibrated row's backward working memory (``recompute_buf``,
        peak − allocated after a 2-layer forward, so net of one layer's copies freed) then
        gives the peak after the clear as states + activations + recompute_buf + 2 copies
        of one layer, against states (with every copy) + activations + recompute_buf
        counted; and the peak *before* the clear — every copy alive, the first recomputed
        layer's activations (the layer's saved tensors without recomputation, less its
        input) allocated — bounds the relief from below. The last rank's output layer runs
        its backward before any recompute, with every copy alive: its relief stops where
        the output's working memory sets the peak.

        Both bounds describe the rank's first backward, before which none of its gradients
        exists. A last rank holding two or more micro-batches (GPipe) peaks instead in its
        second backward, with every gradient allocated and the copies already cleared by
        the first's recompute, so on that rank both bounds rise by the gradients the first
        backward had not allocated yet (its gradients less the first-backward relief).
        Round 24, post hoc: the Llama GPipe full-recompute last stages that held 1.3-1.5 GiB
        above their measured peaks (round 19's b14 snapshot: peak in B1) move holdout18 b14
        +6.0 → +0.9 %, holdout20 d09 +5.3 → +0.8, pair12 x16 +5.3 → +0.8, holdout12 u09
        +4.0 → −0.5, holdout8 q12 +3.0 → +0.3 % (and p13, x05, r14, s11 by under a point
        toward 0); no rank moves away from its measurement. A step of one micro-batch has
        no second backward: its only backward is the first on every rank, so the bounds
        rise by the gradients not yet allocated on each rank (round 41, post hoc: x18, Llama
        pp 2 GPipe mb 16, +8.1 / +5.2 → +3.2 / +0.1 %; x04, pp 1 tp 2 SP mb 8, +6.6 →
        −0.3 %; no measured layout of the earlier sets runs one micro-batch with this
        relief). The same rise on the other
        ranks (whose first backward is also gradient-free) took eight GPipe first stages at
        micro-batch 4-8 (b14, d09, u09, r14, s11, q12, x05, x16) from −1.2..+0.6 % to
        −3.9..−7.2 %, so it is the last rank's alone, for a reason not found.

        Read from the round-21 snapshot of holdout21 e11 (Llama dp 2 pp 2 GPipe, full,
        ZeRO-1, micro-batch 16; docs/benchmarks/accuracy.md round 21): its first stage
        held 11.1 GiB after both forwards and still 11.1 after the first backward, which
        allocated the fp32 gradients (3.1 GiB) and freed one micro-batch's inputs (1.5):
        the stage's copies (1.4 GiB) went in that backward. Under GPipe nothing casts again
        before the next step. 1F1B and interleaved clear the cache in every backward too,
        but a forward after a backward casts again (e07's first stage re-casts in each
        forward): applied to every 1F1B rank the rule took the measured stages 2-4 % under
        (e09, s13, q05, z13), so it applies only to ranks that run every forward first
        (round 23, :data:`meshplan.costmodel.corrections.CAST_CACHE_SCHEDULES`: f13, z13's rank 0), not to interleaved
        ones (for a reason not found it over-relieves them), nor to zero-bubble, whose
        W-pass terms (``ZB_FULL_W_TRANSIENT_SETS``) were read off runs with the copies
        counted."""
        c = self.cache_layer_copy_bytes
        if not c or layers < 1 or not (self.cache_cleared_ranks
                                       and self.cache_cleared_ranks[rank]):
            return 0.0
        copies = layers * c + (self.cache_last_copy_bytes if rank == self.last_rank else 0.0)
        before = self.recompute_buf_bytes - self.recomputed_layer_bytes
        output = self.recompute_buf_bytes - self.output_peak_bytes
        if (rank == self.last_rank and self.inflight[rank] >= 2) or self.microbatches == 1:
            unallocated = (self._rank_grad_bytes(rank, layers)
                           - self.first_backward_relief_bytes(rank, layers))
            before += unallocated
            output = max(0.0, output) + unallocated
        relief = min(before, copies - 2 * c)
        if rank == self.last_rank:
            relief = min(relief, output)
        return max(0.0, relief)


MEMORY_RULES = (
    memory_rule(FIRST_BACKWARD, lambda t: any(t.relief_events),
                MemoryReliefs.first_backward_relief_bytes),
    memory_rule(Z3_RESIDENT, lambda t: t.z3_resident_layer_bytes > 0,
                MemoryReliefs.z3_resident_bytes),
    memory_rule(END_OF_STEP, lambda t: t.last_merge_bytes > 0,
                MemoryReliefs.end_of_step_bytes),
    memory_rule(OUTPUT_PEAK, lambda t: pipelined_output_peak_bytes(
        t.job, t.layout, t.model, 1.0) != 1.0, pipelined_output_peak_bytes),
)

__all__ = ["MemoryReliefs", "MEMORY_RULES"]
