"""How much is trained per step and how the framework runs it: :class:`Job`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from meshplan.errors import ConfigError, require_choice, require_positive_int
from meshplan.spec._dicts import from_dict
from meshplan.spec.choices import OPTIMIZERS, PRECISIONS, RUNTIMES


@dataclass(frozen=True, kw_only=True)
class Job:
    """One training step's work, and how the framework runs it.

    ``global_batch`` is in sequences per optimizer step; ``tokens`` (optional) is the
    training run's total, used for time-to-train and cost.

    The last three fields describe the implementation rather than the model:
    ``flash_attention`` (fused attention keeps no s² activations and skips masked
    blocks); ``overlap_dp_comm`` (gradient reduction overlapped with the last
    micro-batch's backward, as PyTorch DDP/FSDP and Megatron-Core do; Megatron-LM of
    2021 reduced after the backward pass); ``overlap_tp_comm`` (not by default).

    ``runtime`` says whose conventions the step follows (see docs/costmodel.md):

    * ``"megatron"`` (default): 16-bit weights and gradients, fp32 master weights inside the
      optimizer (ZeRO's 2 + 2 + 12 bytes per parameter); ZeRO-1/2 reduce-scatter gradients
      and all-gather 16-bit weights once per step; ZeRO-3 gathers per layer.
    * ``"torch"``: plain PyTorch as meshplan's executor runs it — fp32 parameters and
      gradients with bf16 compute (``torch.autocast`` for ZeRO-0/1, whose weight casts are
      cached for the step; FSDP2 ``MixedPrecisionPolicy`` for ZeRO-2/3), 4 + 4 + 8 bytes per
      parameter; fp32 gradient reduction (DDP buckets; after the schedule when pipelined);
      ZeRO-1 = DDP all-reduce + ``ZeroRedundancyOptimizer`` broadcasts of the updated fp32
      shards; ZeRO-2/3 = FSDP2, which gathers and reduce-scatters every micro-batch.
    """

    global_batch: int
    seq_len: int
    precision: str = "bf16"
    optimizer: str = "adam"
    tokens: float | None = None
    flash_attention: bool = True
    overlap_dp_comm: bool = True
    overlap_tp_comm: bool = False
    runtime: str = "megatron"

    def __post_init__(self) -> None:
        require_positive_int("Job", "global_batch", self.global_batch)
        require_choice("Job", "runtime", self.runtime, RUNTIMES)
        require_positive_int("Job", "seq_len", self.seq_len)
        require_choice("Job", "precision", self.precision, PRECISIONS)
        require_choice("Job", "optimizer", self.optimizer, OPTIMIZERS)
        if self.tokens is not None and not (isinstance(self.tokens, (int, float))
                                            and self.tokens > 0):
            raise ConfigError(f"Job.tokens must be a positive number, got {self.tokens!r}")

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Job":
        return from_dict(cls, data)
