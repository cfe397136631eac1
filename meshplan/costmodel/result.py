"""What :func:`meshplan.costmodel.estimate` returns: step time, throughput, MFU, memory per
pipeline rank, the time breakdown, communication volume, caveats and the corrections that
applied. Containers only — no formula here; units are in the field names (``_s``,
``_bytes``), and the formulas and measured errors are those of
:mod:`meshplan.costmodel.estimate`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple


class AppliedCorrection(NamedTuple):
    """A named correction (:mod:`meshplan.costmodel.corrections`) that applied to an
    estimate, and how much it moved the step time and the peak memory (the estimate less
    the same estimate with that correction switched off)."""

    name: str
    step_time_delta_s: float
    memory_delta_bytes: float


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


class StageMemories(Sequence):
    """The per-stage memory rows of an Estimate, turned into :class:`StageMemory` objects
    only when read (the planner evaluates many estimates and reads few of them)."""

    __slots__ = ("_rows", "_items")

    def __init__(self, rows: Sequence[tuple]):
        self._rows = tuple(rows)
        self._items: tuple[StageMemory, ...] | None = None

    def _all(self) -> tuple[StageMemory, ...]:
        if self._items is None:
            names = [f.name for f in fields(StageMemory)]
            self._items = tuple(StageMemory(**dict(zip(names, row))) for row in self._rows)
        return self._items

    def __getitem__(self, i):
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self):
        return iter(self._all())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __repr__(self) -> str:
        return f"StageMemories({list(self._all())!r})"


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
    # the GPUs waiting for the CPU to dispatch work (measured CPU dispatch exceeds the GPU
    # critical path; profiles with CPU times only, see costmodel.estimate)
    host_wait_s: float = 0.0
    # runtime "torch" pipelines: the busiest rank's compute slowed by its p2p kernels
    # (the torch_p2p_slowdown correction, costmodel.corrections)
    pp_interference_s: float = 0.0
    # runtime "torch", FSDP2 over dp alone: the measured per-step GPU time the layer rows
    # do not hold (the fsdp2_dp_only_step correction, costmodel.corrections)
    fsdp_step_s: float = 0.0
    # context parallelism's exchanges left exposed (ring K/V beyond the block attention, or
    # the all-to-alls), and expert parallelism's dispatch/combine all-to-alls (and etp
    # gathers), on the busiest rank
    cp_comm_s: float = 0.0
    ep_comm_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return self.gemm_s + self.attention_s + self.memory_bound_s + self.overhead_s

    @property
    def tail_s(self) -> float:
        """What follows the pipeline (and any wait for the CPU) on the step's critical path:
        exposed data-parallel communication and the optimizer step."""
        return self.dp_comm_exposed_s + self.optimizer_s

    @property
    def total_s(self) -> float:
        return (self.compute_s + self.tp_comm_s + self.pp_comm_s + self.bubble_s
                + self.dp_comm_exposed_s + self.zero3_gather_s + self.optimizer_s
                + self.host_wait_s + self.pp_interference_s + self.fsdp_step_s
                + self.cp_comm_s + self.ep_comm_s)


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
    memory: Sequence[StageMemory]         # per pipeline rank
    time: TimeBreakdown
    comm_bytes: dict[str, float]          # per GPU per step, by collective: tp, pp, dp, zero3
    comm_bytes_by_link: dict[str, float]  # per GPU per step: nvlink, network
    num_microbatches: int
    num_gpus: int
    stage_forward_s: tuple[float, ...] = field(default=())   # per micro-batch, per virtual stage
    stage_backward_s: tuple[float, ...] = field(default=())
    stage_wgrad_s: tuple[float, ...] = field(default=())    # weight-gradient part of backward
    p2p_s: float = 0.0                                      # one activation send between stages
    pipeline_s: float = 0.0                                 # first forward to last backward
    model_flops_per_step: float = 0.0
    hardware_flops_per_step: float = 0.0
    # the CPU's dispatch of one step on its critical path (costmodel.estimate's
    # LayerTables.host_bound_s); 0 where the profile has no measured CPU times
    host_dispatch_s: float = 0.0
    # what the prediction rests on that measurements have shown to be weak (plain sentences)
    caveats: tuple[str, ...] = field(default=())
    # the named empirical corrections that applied, each with how much it moved the step
    # time and the peak memory (costmodel.corrections; docs/costmodel.md)
    corrections: tuple[AppliedCorrection, ...] = field(default=())

    @property
    def host_load(self) -> float:
        """CPU dispatch over GPU time (``host_dispatch_s / pipeline_s``): ≥ 1 means the CPU
        sets the step; 0.8-1 leaves little headroom (the profile's ``host_near_load``);
        0 without measured CPU times."""
        return self.host_dispatch_s / self.pipeline_s if self.pipeline_s > 0 else 0.0

    @property
    def moved_corrections(self) -> tuple[AppliedCorrection, ...]:
        """The corrections that moved this estimate's step time or peak memory (those that
        applied with no effect left out), as ``meshplan estimate`` and reports list them."""
        return tuple(c for c in self.corrections if c.step_time_delta_s or c.memory_delta_bytes)

    @property
    def memory_peak_gib(self) -> float:
        return self.memory_peak_bytes / 2**30

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("memory", "time")}
        d["comm_bytes"] = dict(self.comm_bytes)
        d["comm_bytes_by_link"] = dict(self.comm_bytes_by_link)
        d["memory"] = [dict(asdict(m), total_bytes=m.total_bytes) for m in self.memory]
        d["time"] = dict(asdict(self.time), compute_s=self.time.compute_s)
        d["stage_forward_s"] = list(self.stage_forward_s)
        d["stage_backward_s"] = list(self.stage_backward_s)
        d["stage_wgrad_s"] = list(self.stage_wgrad_s)
        d["caveats"] = list(self.caveats)
        d["corrections"] = [c._asdict() for c in self.corrections]
        d["host_load"] = self.host_load
        return d
