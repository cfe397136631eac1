"""Memory per pipeline rank: base terms plus named corrections.

``rank_memory_bytes(r, N) = N·(layer_state_bytes + layer activations at r's peak) +
const_bytes[r]`` (model states after ZeRO, Rajbhandari et al. 2019 §5; in-flight
activations, Korthikanti et al. 2022 §4 times the schedule's in-flight micro-batches,
:func:`meshplan.costmodel.pipeline.inflight_microbatches`; buffers), then the corrections of
:mod:`meshplan.costmodel.memory_reliefs` (first-backward relief, resident ZeRO-3 weights,
cast-cache relief) and, on the last rank, the output layer's terms and the larger of the
mid-step peak and the end-of-step concatenation.

Measured error: within 5 % on 64 of 64 ranks in round 26 (max 3.18 %), on the model's
measured sets (docs/benchmarks/accuracy.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from meshplan.costmodel.memory_reliefs import MemoryReliefs
from meshplan.costmodel.stage_tables import TablesBase


@dataclass(frozen=True, eq=False, kw_only=True)
class RankMemory(MemoryReliefs, TablesBase):
    """A rank's memory as a function of the layers it holds: N_r·(layer_state_bytes +
    inflight[r]·layer_activation_bytes) + const_bytes[r], then the corrections."""

    layer_state_bytes: float       # weights + grads + optimizer of one layer, after ZeRO
    layer_activation_bytes: float  # stored activations of one layer, one micro-batch
    buffer_bytes: float            # buffers of a rank holding at least one layer
    first_extra_bytes: float       # embedding states + embedding activations (rank 0)
    last_extra_bytes: float        # output layer states + logits (last rank)
    embedding_act_bytes: float     # one micro-batch's embedding output (rank 0)
    logits_bytes: float            # logits held on the last rank (all in-flight ones for GPipe)
    recompute_buf_bytes: float     # working memory of a layer's backward (re-materialized layer)
    output_peak_bytes: float = 0.0  # the output layer's working memory (part of logits_bytes)
    recv_buffers: tuple[float, ...] = ()   # per rank: receive buffers + kept stage outputs
    wgrad_pending: tuple[float, ...] = ()  # per rank: torch_memory.zero_bubble_pending_w
    wgrad_pending_bytes: float = 0.0       # per layer and pending micro-batch
    # runtime.split_backward_rule applies (zero-bubble without full recomputation, runtime
    # "torch"), and then the 16-bit logits' gradient the last rank keeps for its output W
    split_backward: bool = False
    logits_grad_bytes: float = 0.0
    microbatches: float = 0.0       # per step; 0: not capped (_split_sets)
    wgrad_transient_bytes: float = 0.0     # per layer, while a deferred W runs (ranks r > 0)
    last_chunks_bytes: float = 0.0  # last stage: every micro-batch's output kept (runtime torch)
    last_merge_bytes: float = 0.0   # ... and concatenated at the end of the step
    last_states_bytes: float = 0.0  # last rank's non-layer model states (for the end-of-step peak)
    # ... and at that peak (see end_of_step_bytes): the receive buffers, which torch keeps for
    # the whole run, and the autocast weight copies already gone (full recompute)
    end_recv_bytes: float = 0.0
    end_uncached_layer_bytes: float = 0.0
    end_uncached_const_bytes: float = 0.0
    # GPipe or 1F1B, full recomputation under autocast (see cast_cache_relief_bytes): one
    # layer's 16-bit weight copies, the last rank's output-layer copies, and what a layer's
    # recompute allocates beyond its saved input; 0 where that does not apply
    cache_layer_copy_bytes: float = 0.0
    cache_last_copy_bytes: float = 0.0
    cache_cleared_ranks: tuple[bool, ...] = ()  # per rank: every forward before any backward
    recomputed_layer_bytes: float = 0.0
    # runtime "torch": a chunk's gradients are None until its first backward of the step
    # (see first_backward_relief_bytes); gradient bytes per layer, of the first rank's and
    # the last rank's non-layer parameters, and per rank the schedule's memory events
    # (first_backward.backward_event_sums, zero-bubble's zero_bubble_events); 0 / () where
    # that does not apply
    relief_layer_grad_bytes: float = 0.0
    relief_first_grad_bytes: float = 0.0
    relief_last_grad_bytes: float = 0.0
    relief_events: tuple = ()
    # ZeRO-3 under torch's pipeline: a layer's gathered 16-bit weights, which stay
    # from its backward to its next forward (see z3_resident_bytes); 0 where that does not apply
    z3_resident_layer_bytes: float = 0.0
    # MoE models: a dense layer's states and (per in-flight micro-batch) activations less an
    # MoE layer's (costmodel.moe_tables); the dense layers' count per rank comes from the
    # partition (TablesBase.rank_dense_counts)
    dense_delta_state_bytes: float = 0.0
    dense_delta_activation_bytes: float = 0.0

    def dense_bytes(self, rank: int, layers: int, dense: int | None) -> float:
        """What ``dense`` of the rank's ``layers`` being an MoE model's dense layers adds
        (negative where they hold less); ``dense`` None (the planner's per-rank caps, which
        do not know the partition): the most it can add, over 0 .. min(layers, dense
        layers), so that a cap never admits more than ``estimate`` does."""
        if not self.num_dense_layers:
            return 0.0
        per = self.dense_delta_state_bytes + self.inflight[rank] * self.dense_delta_activation_bytes
        if dense is None:
            return max(0.0, min(layers, self.num_dense_layers) * per)
        return dense * per

    @cached_property
    def const_bytes(self) -> tuple[float, ...]:
        """Per rank: memory that does not grow with its layer count (computed once: the
        planner asks for it at every layer count it tries)."""
        return tuple(self.buffer_bytes + (self.first_extra_bytes if r == 0 else 0.0)
                     + (self.last_extra_bytes - self.logits_bytes + self._output_const_bytes
                        if r == self.last_rank else 0.0)
                     + (self.recv_buffers[r] if self.recv_buffers else 0.0)
                     for r in range(self.layout.pp))

    @property
    def _output_const_bytes(self) -> float:
        """The last rank's output-layer memory at its peak that does not grow with its layers
        (the rest: :meth:`output_split_extra_bytes`)."""
        if self.split_backward:     # zero-bubble: output_kept_bytes is one micro-batch's
            return (self.output_kept_bytes
                    + self._split_sets(self.last_rank) * self.logits_grad_bytes)
        return self.logits_bytes - self.output_overlap_bytes - self.output_kept_overlap_bytes

    def _split_sets(self, rank: int) -> float:
        """Micro-batches whose W-pass gradients ``rank`` holds at its peak: its pending
        ones, and under :func:`~meshplan.costmodel.runtime.split_backward_rule` (ranks r > 0) the one whose I just ended."""
        pending = self.wgrad_pending[rank] if self.wgrad_pending else 0.0
        sets = pending + (1.0 if self.split_backward and rank > 0 else 0.0)
        # the micro-batch whose I just ended is one of the pending ones once every
        # micro-batch of the step has run its I (e.g. one micro-batch: F0 I0 W0), so a
        # rank never holds more sets than the step has micro-batches
        return min(sets, self.microbatches) if self.microbatches else sets

    def output_split_extra_bytes(self, layers: int) -> float:
        """Under :func:`~meshplan.costmodel.runtime.split_backward_rule`, the last rank's peak is the larger of the end
        of an I pass (all its layers' kept gradients and the logits' gradient, counted in the
        activations and :attr:`_output_const_bytes`) and the start of one (the output
        layer's working memory, before any layer's gradient exists): this is the part of
        the second beyond the first, 0 when the layers' gradients outweigh it."""
        if not self.split_backward:
            return 0.0
        return max(0.0, self.output_peak_bytes - self.output_overlap_bytes
                   - layers * self.wgrad_pending_bytes - self.logits_grad_bytes)

    @property
    def output_overlap_bytes(self) -> float:
        """The output layer's working memory (loss forward and backward) and a layer's
        backward working memory never coexist — a rank runs one of them at a time, and the
        output's backward ends before its layers' begin — so the last rank holds the larger
        of the two, not their sum."""
        return min(self.output_peak_bytes, self.recompute_buf_bytes)

    @property
    def output_kept_bytes(self) -> float:
        """What the output layer keeps from one micro-batch's loss forward to its backward
        (``logits_bytes`` less the working memory; GPipe's counts every micro-batch's)."""
        kept = self.logits_bytes - self.output_peak_bytes
        if self.layout.schedule == "gpipe":
            kept /= max(self.inflight[self.last_rank], 1.0)
        return kept

    @property
    def output_kept_overlap_bytes(self) -> float:
        """What the output layer keeps for its backward never coexists with a layer's
        backward working memory either: a micro-batch's output backward (which frees what
        its loss forward kept) runs right before its layers' backward on the same rank (1F1B
        and interleaved run a last-chunk forward, its loss and its backward back to back;
        GPipe's other kept micro-batches stay, counted in ``logits_bytes``). So the last rank
        holds max(kept + output working memory, layer backward working memory), not the
        kept bytes on top of the larger; this is the part of ``recompute_buf_bytes`` beyond
        :attr:`output_overlap_bytes` that the kept bytes cover. It matters where a layer's
        backward needs more than the output layer (full recomputation with tp > 1, whose
        output working memory :func:`~meshplan.costmodel.torch_memory.pipelined_output_peak_bytes` lowers).

        Round 24, post hoc from holdout24 g15 (Llama dp 1 pp 2 tp 2, interleaved v 3, full,
        mb 16): its last stage peaked in its last loss forward at 19.67 GiB
        (``diag_stage_memory``: 15.8 before, 1.9 kept after), predicted 20.83 (+5.9 %) with
        the kept 2.58 GiB on top of the 2.68 GiB recompute buffer; 20.11 (+2.2 %) without.
        Over every measured 4-GPU set it moves five last stages, all Llama pp 2 tp 2 full
        (GPipe q12 +3.2 → +3.0, a15 +2.1 → +0.9, e13 +0.8 → −0.6, o14 +2.5 → −0.2 %), and
        no other rank."""
        return max(0.0, min(self.output_kept_bytes,
                            self.recompute_buf_bytes - self.output_overlap_bytes))

    # ---- time ---------------------------------------------------------------------

    def rank_variable_bytes(self, rank: int, layers: int,
                            dense: int = 0) -> tuple[float, float, float]:
        """(activations, embedding/logits, buffers) of a rank holding ``layers`` (``dense``
        of them an MoE model's dense layers); the activations are those coexisting with the
        gradients at the rank's peak (:meth:`first_backward_relief_bytes`)."""
        inflight = self.inflight[rank]
        act = layers * self._layer_act_bytes(rank) + dense * inflight \
            * self.dense_delta_activation_bytes
        if rank == 0:
            act += inflight * self.embedding_act_bytes
        act -= self.first_backward_relief_bytes(rank, layers)
        logit = (self._output_const_bytes + self.last_chunks_bytes
                 + self.output_split_extra_bytes(layers)
                 if rank == self.last_rank else 0.0)
        buf = (self.buffer_bytes - (0.0 if layers else self.recompute_buf_bytes)
               + self.z3_resident_bytes(rank, layers)
               - self.cast_cache_relief_bytes(rank, layers))
        if self.recv_buffers:
            buf += self.recv_buffers[rank]
        end = self.end_of_step_bytes(layers) if rank == self.last_rank else 0.0
        if end > act + logit + buf:
            # the end-of-step concatenation of the kept outputs is this rank's peak: count it
            # as the output part so that states + act + logit + buf is still the peak
            logit = end - act - buf
        return act, logit, buf

    def _layer_act_bytes(self, rank: int) -> float:
        """Activation memory one layer of ``rank`` holds at the rank's peak."""
        pending = self.wgrad_pending[rank] if self.wgrad_pending else 0.0
        return (self.inflight[rank] * self.layer_activation_bytes
                + self._split_sets(rank) * self.wgrad_pending_bytes
                + (self.wgrad_transient_bytes if pending else 0.0))

    def rank_memory_bytes(self, rank: int, layers: int, dense: int | None = None) -> float:
        mem = layers * (self.layer_state_bytes + self._layer_act_bytes(rank)) \
            + self.const_bytes[rank] - self.first_backward_relief_bytes(rank, layers) \
            + self.z3_resident_bytes(rank, layers) \
            - self.cast_cache_relief_bytes(rank, layers) \
            + self.dense_bytes(rank, layers, dense)
        if rank == self.last_rank:
            mem += self.output_split_extra_bytes(layers)
            mem = max(mem + self.last_chunks_bytes, layers * self.layer_state_bytes
                      + self.last_states_bytes + self.end_of_step_bytes(layers))
        return mem

    def peak_memory_bytes(self, stage_layers) -> float:
        dense = self.rank_dense_counts(stage_layers)
        return max(self.rank_memory_bytes(r, n, d) for r, (n, d) in
                   enumerate(zip(self.rank_layers(stage_layers), dense)))

    def max_rank_layers(self, rank: int, capacity_bytes: float) -> int:
        """The most layers ``rank`` can hold within ``capacity_bytes`` (-1: not even 0)."""
        per = self.layer_state_bytes + self._layer_act_bytes(rank)
        const = self.const_bytes[rank]
        if self.rank_memory_bytes(rank, 0) > capacity_bytes:
            return -1
        n = min(self.num_layers, int((capacity_bytes - const) // per) if per > 0
                else self.num_layers)
        while n > 0 and self.rank_memory_bytes(rank, n) > capacity_bytes:
            n -= 1
        while n < self.num_layers and self.rank_memory_bytes(rank, n + 1) <= capacity_bytes:
            n += 1
        return n


__all__ = ["RankMemory"]
