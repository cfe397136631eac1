"""What :func:`meshplan.costmodel.estimate` returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    """Peak memory of one GPU of pipeline stage ``stage`` (bytes)."""

    stage: int
    layers: int                 # transformer layers on this pipeline rank (all its chunks)
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float    # saved activations of the in-flight micro-batches
    embedding_logits_bytes: float  # logits / loss buffers on the last stage, embedding grads
    buffers_bytes: float        # communication buffers, ZeRO-3 gathered layers, recompute working set
    inflight_microbatches: float

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activations_bytes + self.embedding_logits_bytes + self.buffers_bytes)

    @property
    def model_state_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes


@dataclass(frozen=True, kw_only=True)
class TimeBreakdown:
    """Where one optimizer step's time goes on the critical path (seconds).

    ``compute_s`` + the communication terms + ``bubble_s`` + ``optimizer_s`` = step time.
    The per-op terms (gemm, attention, memory-bound) split ``compute_s``; TP and PP
    communication are the exposed parts on the slowest pipeline rank's path.
    """

    gemm_s: float
    attention_s: float
    memory_bound_s: float
    overhead_s: float
    tp_comm_s: float
    pp_comm_s: float
    bubble_s: float
    dp_comm_exposed_s: float
    dp_comm_total_s: float
    zero3_gather_s: float
    optimizer_s: float

    @property
    def compute_s(self) -> float:
        return self.gemm_s + self.attention_s + self.memory_bound_s + self.overhead_s

    @property
    def total_s(self) -> float:
        return (self.compute_s + self.tp_comm_s + self.pp_comm_s + self.bubble_s
                + self.dp_comm_exposed_s + self.zero3_gather_s + self.optimizer_s)


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """Predicted memory and speed of one layout (see DESIGN.md for the formulas' sources)."""

    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    memory_peak_bytes: float
    usable_memory_bytes: float
    fits: bool
    memory: tuple[StageMemory, ...]
    time: TimeBreakdown
    comm_bytes: dict[str, float]          # per GPU per step, by collective: tp, pp, dp, zero3
    comm_bytes_by_link: dict[str, float]  # per GPU per step: nvlink, network
    num_microbatches: int
    num_gpus: int
    stage_forward_s: tuple[float, ...] = field(default=())   # per micro-batch, per virtual stage
    stage_backward_s: tuple[float, ...] = field(default=())
    model_flops_per_step: float = 0.0
    hardware_flops_per_step: float = 0.0

    @property
    def memory_peak_gib(self) -> float:
        return self.memory_peak_bytes / 2**30

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["memory"] = [dict(asdict(m), total_bytes=m.total_bytes) for m in self.memory]
        d["time"] = dict(asdict(self.time), compute_s=self.time.compute_s)
        d["stage_forward_s"] = list(self.stage_forward_s)
        d["stage_backward_s"] = list(self.stage_backward_s)
        return d
