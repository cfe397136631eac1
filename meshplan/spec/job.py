"""How much is trained per step and how the framework runs it: :class:`Job`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from meshplan.errors import ConfigError, require_bool, require_choice, require_positive_int
from meshplan.spec._dicts import from_dict
from meshplan.spec.choices import (FP8_RECIPES, MOE_DISPATCHERS, OPTIMIZERS, PRECISIONS,
                                   RECOMPUTE_MODULES, RUNTIMES)


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

    ``precision="fp8"`` runs the transformer layers' linear GEMMs (forward and both backward
    GEMMs) in 8-bit floating point and the rest as bf16; ``fp8_recipe`` says how the fp8
    operands are scaled (docs/fp8.md):

    * ``"tensorwise"`` (default): one scale per tensor from its current amax (dynamic
      scaling, torchao's "tensorwise"); e4m3 forward, e5m2 gradients.
    * ``"delayed"``: one scale per tensor from an amax history of earlier steps
      (TransformerEngine's ``DelayedScaling``); e4m3 forward, e5m2 gradients.
    * ``"rowwise"``: one scale per row of each GEMM operand along its contracted dimension
      (torchao's "rowwise"); e4m3 everywhere.
    * ``"blockwise"``: DeepSeek-V3's 1×128 tiles for activations and gradients, 128×128
      blocks for weights (arXiv 2412.19437 §3.3); e4m3 everywhere.
    * ``"mxfp8"``: OCP microscaling, one power-of-two scale per 32 elements; Blackwell
      GPUs only.

    ``fp8_recipe`` is only meaningful with ``precision="fp8"``; another value with another
    precision is refused rather than ignored.

    ``fp8_param_gather`` (``precision="fp8"``, runtime "megatron"): the transformer linears'
    weights are kept in fp8 and all-gathered in fp8 (Megatron-LM's ``--fp8-param-gather``,
    TransformerEngine's fp8 model parameters, NeMo's ``FP8_PARAMS``): the ZeRO-1/2 parameter
    all-gather and ZeRO-3's per-layer gathers move those weights at 1 byte a parameter, and
    the fp8 weight (with its transpose) takes the place of the 16-bit weight and its fp8
    cache. The executor does not run it.

    ``moe_dispatcher`` (mixture-of-experts models with ep > 1): ``"alltoall"`` (default)
    sends one copy of a token per routed expert (Megatron-Core's
    ``MoEAlltoAllTokenDispatcher``, meshplan's executor); ``"deepep"`` one per expert-parallel
    rank holding any of its experts, and across nodes one per node, forwarded inside the node
    over NVLink (DeepEP, and HybridEP: Megatron-Core's ``--moe-token-dispatcher-type flex``;
    runtime "megatron" only — the executor has no such dispatcher).

    ``cuda_graphs`` (runtime "megatron"): the run captures its layers or its whole step in
    CUDA graphs (Megatron-LM's ``--cuda-graph-impl``, MLPerf's full-iteration graphs), so the
    host replays them instead of launching each kernel: the host's per-layer dispatch of an
    eager MoE layer (docs/costmodel.md, "Megatron's host work per MoE layer") is off the
    step's path. Default False (eager, as Megatron-Bridge's MoE recipes run).

    ``moe_a2a_overlap`` (runtime "megatron"): Megatron-Core's combined 1F1B
    (``--overlap-moe-expert-parallel-comm``, Megatron-Bridge's ``moe_a2a_overlap``): the
    forward of one micro-batch runs beside the backward of another, layer by layer, so each
    direction's expert-parallel all-to-alls run beside the other direction's compute
    (:mod:`meshplan.costmodel.moe_overlap`). Megatron runs it only with ep > 1 and, with
    pp > 1, the interleaved schedule; elsewhere it changes nothing. Default False.

    ``recompute_modules``: what a layout's ``recompute = "selective"`` re-runs in backward
    instead of keeping its outputs (Megatron-Core's ``--recompute-modules``): ``"core_attn"``
    the attention core (Korthikanti et al. 2022's selective recomputation, the default),
    ``"layernorm"`` the two norms (their outputs, the QKV and MLP / router inputs, are not
    kept), ``"moe_act"`` the routed experts' activation function (its output, the second
    expert GEMM's input, is not kept), ``"mla_up_proj"`` multi-head latent attention's query
    and key-value up-projections and RoPE (the attention core's q, k, v are not kept; an MLA
    model only). None = ``("core_attn",)``. Megatron-Bridge's MoE recipes run
    ``("layernorm", "moe_act")``. Runtime "torch" re-runs the attention core only.
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
    fp8_recipe: str = "tensorwise"
    fp8_param_gather: bool = False
    moe_dispatcher: str = "alltoall"
    cuda_graphs: bool = False
    moe_a2a_overlap: bool = False
    recompute_modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        require_positive_int("Job", "global_batch", self.global_batch)
        require_choice("Job", "runtime", self.runtime, RUNTIMES)
        require_positive_int("Job", "seq_len", self.seq_len)
        require_choice("Job", "precision", self.precision, PRECISIONS)
        require_choice("Job", "optimizer", self.optimizer, OPTIMIZERS)
        require_choice("Job", "fp8_recipe", self.fp8_recipe, FP8_RECIPES)
        if self.precision != "fp8" and self.fp8_recipe != FP8_RECIPES[0]:
            raise ConfigError(f"Job.fp8_recipe = {self.fp8_recipe!r} applies only with "
                              f"precision = 'fp8', got precision = {self.precision!r}; use "
                              f"precision='fp8' or leave fp8_recipe at {FP8_RECIPES[0]!r}")
        for f in ("flash_attention", "overlap_dp_comm", "overlap_tp_comm", "fp8_param_gather"):
            require_bool("Job", f, getattr(self, f))
        if self.fp8_param_gather and (self.precision != "fp8" or self.runtime != "megatron"):
            raise ConfigError(f"Job.fp8_param_gather = True needs precision = 'fp8' and runtime "
                              f"= 'megatron' (Megatron-LM's --fp8-param-gather), got precision "
                              f"= {self.precision!r}, runtime = {self.runtime!r}; use "
                              f"fp8_param_gather=False")
        require_choice("Job", "moe_dispatcher", self.moe_dispatcher, MOE_DISPATCHERS)
        if self.moe_dispatcher != MOE_DISPATCHERS[0] and self.runtime != "megatron":
            raise ConfigError(f"Job.moe_dispatcher = {self.moe_dispatcher!r} needs runtime = "
                              f"'megatron' (Megatron-Core's flex dispatcher); runtime = "
                              f"{self.runtime!r} dispatches with all-to-all: use "
                              f"moe_dispatcher='alltoall'")
        require_bool("Job", "cuda_graphs", self.cuda_graphs)
        if self.cuda_graphs and self.runtime != "megatron":
            raise ConfigError(f"Job.cuda_graphs = True needs runtime = 'megatron'; runtime = "
                              f"{self.runtime!r} (meshplan's executor) runs eagerly or "
                              f"compiled (Layout.compile): use cuda_graphs=False")
        require_bool("Job", "moe_a2a_overlap", self.moe_a2a_overlap)
        if self.moe_a2a_overlap and self.runtime != "megatron":
            raise ConfigError(f"Job.moe_a2a_overlap = True needs runtime = 'megatron' "
                              f"(Megatron-Core's combined 1F1B); runtime = {self.runtime!r} "
                              f"(meshplan's executor) waits on each all-to-all: use "
                              f"moe_a2a_overlap=False")
        if self.recompute_modules is not None:
            self._check_recompute_modules()
        if self.tokens is not None and not (isinstance(self.tokens, (int, float))
                                            and self.tokens > 0):
            raise ConfigError(f"Job.tokens must be a positive number, got {self.tokens!r}")

    def _check_recompute_modules(self) -> None:
        mods = self.recompute_modules
        if isinstance(mods, (str, bytes)) or not isinstance(mods, (tuple, list)) or not mods:
            raise ConfigError(f"Job.recompute_modules must be a non-empty list of "
                              f"{', '.join(map(repr, RECOMPUTE_MODULES))} (or None for "
                              f"('core_attn',)), got {mods!r}")
        mods = tuple(mods)
        object.__setattr__(self, "recompute_modules", mods)
        for m in mods:
            require_choice("Job", "recompute_modules entry", m, RECOMPUTE_MODULES)
        if len(set(mods)) != len(mods):
            raise ConfigError(f"Job.recompute_modules {list(mods)} names a module twice")
        if self.runtime == "torch" and mods != ("core_attn",):
            raise ConfigError(f"Job.recompute_modules = {list(mods)} needs runtime = "
                              f"'megatron'; meshplan's executor (runtime 'torch') re-runs the "
                              f"attention core only: use None or ['core_attn']")

    @property
    def selective_modules(self) -> tuple[str, ...]:
        """What ``recompute = "selective"`` re-runs (``recompute_modules``, default the
        attention core)."""
        return self.recompute_modules or ("core_attn",)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def with_precision(self, precision: str, fp8_recipe: str | None = None) -> "Job":
        """This job in ``precision``: fp8 keeps this job's own recipe (and fp8 weight gather)
        unless ``fp8_recipe`` names one; any other precision takes the default recipe and no
        fp8 weight gather, which only fp8 allows."""
        if precision != "fp8":
            return replace(self, precision=precision, fp8_recipe=FP8_RECIPES[0],
                           fp8_param_gather=False)
        return replace(self, precision="fp8", fp8_recipe=fp8_recipe or self.fp8_recipe)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Job":
        return from_dict(cls, data)
