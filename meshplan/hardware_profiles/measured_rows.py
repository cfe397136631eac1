"""The rows of a calibrated profile's measured layer tables and the shape keys that match them.

A :class:`MeasuredLayer` is one transformer layer and a :class:`MeasuredEnd` the embedding or
the output layer, each timed on one GPU at one micro-batch; :func:`layer_shape_key` and
:func:`ends_shape_key` name the shape a row was timed at, :func:`model_from_shape_key` reads it
back. The tables that index these rows, and their lookups:
:mod:`meshplan.hardware_profiles.measured`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshplan.spec import ModelSpec
from meshplan.spec.choices import TORCH_FP8_EXPERT_RECIPES
from meshplan.errors import MeshplanError

ENDS = ("embedding", "output")


def layer_shape_key(model: ModelSpec) -> str:
    """Every ModelSpec field that changes one transformer layer's work or memory. An MoE
    model's key adds its routed and shared experts (:func:`moe_key_suffix`): its rows are
    MoE layers, which a dense model of the same trunk must not read."""
    return _trunk_key(model) + moe_key_suffix(model)


def _trunk_key(model: ModelSpec) -> str:
    return (f"h{model.hidden_size}-f{model.ffn_hidden_size}-q{model.num_heads}"
            f"-kv{model.num_kv_heads}-d{model.head_dim}-{model.activation}-{model.norm}"
            f"-{model.position_embedding}-{'bias' if model.bias else 'nobias'}"
            f"-drop{model.dropout:g}")


def moe_key_suffix(model: ModelSpec) -> str:
    """"" for a dense model; else the MoE layer's routed experts (count, top-k, width),
    shared experts, router and capacity factor, e.g. ``-moe16k2f1408``
    (:func:`model_from_shape_key` reads it back)."""
    if not model.is_moe:
        return ""
    key = f"-moe{model.num_experts}k{model.experts_per_token}f{model.moe_ffn_hidden_size}"
    if model.num_shared_experts:
        key += f"s{model.num_shared_experts}x{model.shared_expert_ffn_hidden_size}"
    if model.router != "softmax":
        key += f"-{model.router}"
    if model.capacity_factor is not None:
        key += f"-cf{model.capacity_factor:g}"
    return key


_SHAPE_KEY = re.compile(
    r"h(?P<h>\d+)-f(?P<f>\d+)-q(?P<q>\d+)-kv(?P<kv>\d+)-d(?P<d>\d+)-(?P<act>[a-z0-9]+)"
    r"-(?P<norm>[a-z]+)-(?P<pos>[a-z]+)-(?P<bias>bias|nobias)-drop(?P<drop>[0-9.]+(?:e-?\d+)?)"
    r"(?:-moe(?P<e>\d+)k(?P<k>\d+)f(?P<fe>\d+)(?:s(?P<s>\d+)x(?P<fs>\d+))?"
    r"(?:-(?P<router>[a-z_]+))?(?:-cf(?P<cf>[0-9.]+))?)?"
    r"(?:-v(?P<v>\d+)-(?P<tied>tied|untied))?$")


def model_from_shape_key(key: str, *, num_layers: int = 1) -> ModelSpec | None:
    """A ModelSpec of the layer (and, for an ends key, vocabulary) shape a row was timed at —
    an MoE layer's experts too (:func:`moe_key_suffix`) — or None for a key this version
    does not read: what :mod:`meshplan.costmodel.nearest_rows` scales another shape's rows
    from."""
    m = _SHAPE_KEY.match(key)
    if m is None:
        return None
    moe = {} if m["e"] is None else dict(
        num_experts=int(m["e"]), experts_per_token=int(m["k"]),
        moe_ffn_hidden_size=int(m["fe"]), router=m["router"] or "softmax",
        capacity_factor=float(m["cf"]) if m["cf"] else None,
        **({} if m["s"] is None else dict(num_shared_experts=int(m["s"]),
                                          shared_expert_ffn_hidden_size=int(m["fs"]))))
    try:
        return ModelSpec(name=key, num_layers=num_layers, hidden_size=int(m["h"]),
                         ffn_hidden_size=int(m["f"]), num_heads=int(m["q"]),
                         num_kv_heads=int(m["kv"]), head_dim=int(m["d"]),
                         vocab_size=int(m["v"] or 32000), activation=m["act"],
                         norm=m["norm"], position_embedding=m["pos"],
                         bias=m["bias"] == "bias", dropout=float(m["drop"]) > 0,
                         tied_embeddings=m["tied"] != "untied", **moe)
    except (MeshplanError, TypeError, ValueError):
        return None


def cast_family(model: ModelSpec) -> str:
    """The layer family a compiled fp8 block's casts fuse by (activation, norm, linear
    bias; ``-moe`` for an MoE layer): ``fp8_cast_compiled_block_share`` is measured and
    read per family (:func:`meshplan.costmodel.fp8_cost.compiled_block_share`). Example: a Llama
    layer is ``"swiglu-rmsnorm-nobias"``, a GPT-2 one ``"gelu-layernorm-bias"``."""
    return (f"{model.activation}-{model.norm}-{'bias' if model.bias else 'nobias'}"
            + ("-moe" if model.is_moe else ""))


def ran_fp8_experts(model: ModelSpec, precision: str, fp8_recipe: str) -> bool:
    """Whether meshplan's executor runs ``model``'s routed experts in fp8 at this precision
    and recipe (:data:`meshplan.spec.choices.TORCH_FP8_EXPERT_RECIPES`): what a calibration
    writes in :attr:`MeasuredLayer.fp8_experts` and what the lookups of fp8 rows ask for."""
    return model.is_moe and precision == "fp8" and fp8_recipe in TORCH_FP8_EXPERT_RECIPES


def ran_cached_expert_weights(model: ModelSpec, precision: str, fp8_recipe: str,
                              zero: int) -> bool:
    """Whether a calibration row of ``model`` times its fp8 routed experts with their weights
    cast beforehand (:attr:`MeasuredLayer.fp8_weights_cached`): as the executor runs a step
    of several micro-batches at ZeRO-0/1
    (:func:`meshplan.costmodel.fp8_experts.expert_weights_cached`), the layouts fp8 plans
    mostly have; the cost model puts the casts back for a layout that casts in every pass."""
    return ran_fp8_experts(model, precision, fp8_recipe) and zero < 2


def ends_shape_key(model: ModelSpec) -> str:
    """The layer key (without an MoE model's experts, which the ends do not hold) plus what
    the embedding and output layer add (vocabulary, tying)."""
    return (f"{_trunk_key(model)}-v{model.vocab_size}"
            f"-{'tied' if model.tied_embeddings else 'untied'}")


@dataclass(frozen=True, kw_only=True)
class MeasuredLayer:
    """One transformer layer, one micro-batch, on one GPU (seconds and bytes per layer)."""

    shape: str                  # layer_shape_key(model)
    seq_len: int
    tp: int
    sequence_parallel: bool
    recompute: str
    micro_batch: int
    zero: int = 0               # 0: parameters local (ZeRO-0/1); 2/3: FSDP2 over ``dp`` ranks
    dp: int = 1
    forward_s: float
    backward_s: float           # includes the recomputation
    activation_bytes: float     # kept from forward to backward
    backward_peak_bytes: float  # working memory of one layer's backward above what is kept
    model: str = ""             # the model it was measured for (information only)
    # zero-bubble's split backward (input gradients, then weight gradients; 0: not measured)
    backward_input_s: float = 0.0
    backward_weight_s: float = 0.0
    # CPU time to dispatch the forward / backward (0: not measured; then forward_s and
    # backward_s are synchronized timings, which are max(CPU, GPU) rather than GPU time)
    forward_cpu_s: float = 0.0
    backward_cpu_s: float = 0.0
    # the split backward's CPU dispatch (0: not measured; then backward_input_s and
    # backward_weight_s are synchronized timings, else GPU-busy ones)
    backward_input_cpu_s: float = 0.0
    backward_weight_cpu_s: float = 0.0
    # the stack the split backward was timed on, and how much its B / W per layer grow per
    # extra layer in a stage (torch's W walks the rest of the stage's graph once per
    # parameter group: CPU time, so these are the CPU fields' growth where those exist;
    # 0: not measured, no growth)
    split_layers: int = 0
    backward_input_depth_s: float = 0.0
    backward_weight_depth_s: float = 0.0
    # where the split was timed queued: its synchronized timing on the same stack, kept for
    # comparison (not used by the cost model; 0: not measured)
    backward_input_sync_s: float = 0.0
    backward_weight_sync_s: float = 0.0
    # CPU dispatch of one forward / backward call that does not grow with the blocks in it
    # (timed on two stack depths); forward_cpu_s / backward_cpu_s are then the per-layer
    # rest. 0: not measured (the per-layer fields then hold it, spread over the stack)
    forward_cpu_fixed_s: float = 0.0
    backward_cpu_fixed_s: float = 0.0
    # the setting's forward / backward CPU dispatch per layer as read on the deeper stack
    # (steady on up to 16 blocks where host-bound, else queued on 4), and that stack's
    # blocks. Stored, not priced: the per-layer fields above are what the estimate reads;
    # pricing a deep stage from this reading is held out (docs/benchmarks/fp8_checks.md,
    # "Pricing the CPU from the deep reading"). 0: not stored (calibrations before 2026-12-06)
    forward_cpu_deep_s: float = 0.0
    backward_cpu_deep_s: float = 0.0
    cpu_deep_layers: int = 0
    # zero-bubble with full recomputation, per layer: what a micro-batch keeps between its
    # B and its W, and what W needs while it runs (measured on the deep split stack,
    # meshplan/calibrate/split_memory.py; 0: not measured, the cost model's constants)
    wgrad_pending_bytes: float = 0.0
    wgrad_transient_bytes: float = 0.0
    # ... the stack they were measured on, and the part of a stage's total that does not
    # grow with its layers (from a second, shallower stack; see wgrad_bytes_at; 0: not
    # measured, the per-layer values then hold at every depth)
    wgrad_memory_layers: int = 0
    wgrad_pending_stage_bytes: float = 0.0
    wgrad_transient_stage_bytes: float = 0.0
    # timed with every block torch.compile'd, as the executor runs Layout.compile (`meshplan
    # calibrate --compile-rows`; compile time kept out of the timed iterations)
    compile: bool = False
    # the precision the executor ran the layer in: "bf16" (every row before fp8 rows), or
    # "fp8" with the executor's fp8 linears of recipe ``fp8_recipe`` (`meshplan calibrate
    # --fp8-rows RECIPE`; casts, amax all-reduces and fp8 GEMMs inside the timed passes)
    precision: str = "bf16"
    fp8_recipe: str = ""
    # the module's pass run back to back over its timed (queued) pass: what a sustained step's
    # lower, power-capped SM clock costs the GPU seconds above (meshplan.calibrate.sustained;
    # 1: not measured). The cost model multiplies the GPU-second fields by it
    sustained_ratio: float = 1.0
    # an MoE layer timed with its experts spread over ``ep`` ranks, the executor's dispatch
    # and combine all-to-alls inside the timed passes (`meshplan calibrate --model M` on
    # more than one GPU; 1: the whole layer on each rank)
    ep: int = 1
    # ep > 1: the load imbalance the row's routing had (the busiest ep rank's routed rows
    # over the mean, per call; meshplan.executor.moe_routing), which its time holds, so the
    # cost model prices only the profile's moe_load_imbalance beyond it (0: not measured)
    routed_imbalance: float = 0.0
    # an MoE layer's fp8 row whose routed experts ran fp8 grouped GEMMs
    # (meshplan.executor.fp8_grouped); False: 16-bit experts, as every fp8 MoE row timed
    # before 2026-12-02 (the cost model no longer reads those: the executor changed)
    fp8_experts: bool = False
    # fp8 experts timed with their weights cast to fp8 once before the timed passes
    # (executor.fp8_grouped.Fp8ExpertWeights, as the executor runs them where
    # costmodel.fp8_experts.expert_weights_cached): the passes hold none of the weights'
    # casts. False: cast in every pass (every fp8 MoE row timed before 2026-12-02 night)
    fp8_weights_cached: bool = False

    @property
    def group(self) -> tuple:
        return (self.shape, self.seq_len, self.tp, self.sequence_parallel, self.recompute,
                self.zero, self.dp if self.zero >= 2 else 1, self.compile, self.precision,
                self.fp8_recipe, self.ep, self.fp8_experts, self.fp8_weights_cached)


@dataclass(frozen=True, kw_only=True)
class MeasuredEnd:
    """The embedding (first stage) or the output (last stage: final norm, logits, loss)."""

    shape: str                  # ends_shape_key(model)
    part: str                   # "embedding" | "output"
    seq_len: int
    tp: int
    sequence_parallel: bool
    micro_batch: int
    forward_s: float
    backward_s: float
    activation_bytes: float     # kept from forward to backward, per micro-batch
    peak_bytes: float           # working memory of forward + backward above what is kept
    model: str = ""
    forward_cpu_s: float = 0.0  # as MeasuredLayer
    backward_cpu_s: float = 0.0
    sustained_ratio: float = 1.0
    # the output layer with the loss torch.compile'd, as Layout.compile runs it at tp = 1
    # (executor.parallelize.compiled_cross_entropy); the head GEMM itself stays eager
    compile: bool = False

    @property
    def group(self) -> tuple:
        return (self.shape, self.part, self.seq_len, self.tp, self.sequence_parallel,
                self.compile)


__all__ = ["cast_family", "ENDS", "MeasuredLayer", "MeasuredEnd", "model_from_shape_key",
           "layer_shape_key",
           "ran_fp8_experts", "ran_cached_expert_weights",
           "ends_shape_key"]
