"""Memory per GPU: model states (weights, gradients, optimizer) and activations.

Sources:
* Activations per layer: Korthikanti et al. 2022, "Reducing Activation Recomputation in
  Large Transformer Models", arXiv 2205.05198, §4 and Table 2. The terms are kept one by
  one so that GQA (smaller K/V), SwiGLU (three ffn-wide tensors), fused attention (no s²
  tensors) and no-dropout models follow from the same bookkeeping; for a GPT layer with
  dropout and unfused attention they add up to Table 2 exactly.
* Model states: mixed-precision Adam keeps 2 (weights) + 2 (gradients) + 12 (fp32 master
  weights, momentum, variance) bytes per parameter; ZeRO stages 1/2/3 shard the optimizer
  state / + gradients / + weights over the data-parallel group (Rajbhandari et al. 2019,
  "ZeRO", arXiv 1910.02054, §5 and Table 1).

Measured error: Table 2 to the byte for every configuration it lists, and ZeRO's Table 1
model states to the table's rounding (tests/validation/test_published.py). The published
training runs report no memory, so runtime "megatron" per-rank peaks are unmeasured; runtime
"torch" (meshplan's executor) counts its own tensors instead
(:mod:`meshplan.costmodel.torch_activations`, :mod:`meshplan.costmodel.torch_memory`), within
5 % on 64 of 64 ranks in GPU round 26 (docs/benchmarks/accuracy.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshplan.spec import Job, ModelSpec

MASK_BYTES = 1  # dropout masks are stored as bytes (Korthikanti 2022 §4.1)


def recomputes_core_attention(spec) -> bool:
    """Whether selective recomputation re-runs the attention core: ``"core_attn"`` among
    ``spec.selective_modules`` (a :class:`~meshplan.spec.Job`'s ``recompute_modules``, the
    attention core by default, or a :class:`LayerActivations`' copy of them). Says nothing
    about whether the layout recomputes selectively: callers check ``recompute``."""
    return "core_attn" in spec.selective_modules


def activation_bytes_per_element(job: Job) -> int:
    """16-bit activations under mixed precision, 32-bit in fp32 training."""
    return 4 if job.precision == "fp32" else 2


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one transformer layer keeps for backward, for one micro-batch on one GPU."""

    replicated_bytes: float   # kept whole on every tp rank unless sequence parallel
    sharded_bytes: float      # split over tp ranks (already divided)
    attention_core_bytes: float  # the s² terms, dropped by selective recompute (already divided)
    input_bytes: float        # the layer input: all full recompute keeps
    norm_output_bytes: float = 0.0  # the two norms' outputs, inside replicated_bytes
    selective_modules: tuple[str, ...] = ("core_attn",)   # what selective re-runs (Job)
    # multi-head latent attention's q, k, v, inside sharded_bytes (already divided):
    # what "mla_up_proj" re-makes instead of keeping (meshplan.costmodel.mla)
    mla_up_proj_bytes: float = 0.0

    def stored(self, recompute: str) -> float:
        if recompute == "full":
            return self.input_bytes
        kept = self.replicated_bytes + self.sharded_bytes + self.attention_core_bytes
        if recompute == "selective":
            if recomputes_core_attention(self):
                kept -= self.attention_core_bytes
            if "layernorm" in self.selective_modules:
                kept -= self.norm_output_bytes
            if "mla_up_proj" in self.selective_modules:
                kept -= self.mla_up_proj_bytes
        return kept

    @property
    def full_bytes(self) -> float:
        """Everything a layer's forward leaves for backward (the recompute working set)."""
        return self.replicated_bytes + self.sharded_bytes + self.attention_core_bytes


def layer_activations(model: ModelSpec, job: Job, micro_batch: int, tp: int,
                      sequence_parallel: bool, mlp_width: int | None = None) -> LayerActivations:
    """Activation bytes of one layer (Korthikanti et al. 2022, §4.1-4.2, Table 2).

    GPT check (a = heads, e = 2 bytes): replicated = LayerNorm inputs 4sbh + QKV and MLP
    inputs 4sbh (the norms' outputs, which ``Job.recompute_modules`` "layernorm" re-runs
    instead: Megatron-Core's ``--recompute-modules layernorm``) + two dropout masks 2sbh =
    10sbh; sharded = Q, K, V 6sbh + projection input 2sbh + GeLU input and output 16sbh =
    24sbh/t; attention core = softmax output 2as²b +
    its dropout mask as²b + dropout output 2as²b = 5as²b/t.

    ``mlp_width``: the dense MLP's width (None: ``ffn_hidden_size``; an MoE layer passes its
    shared experts' total width, 0 without; the routed part is :mod:`meshplan.costmodel.
    moe_layer`'s). Multi-head latent attention keeps its own tensors (:mod:`.mla`).
    """
    e = activation_bytes_per_element(job)
    s, b, h = job.seq_len, micro_batch, model.hidden_size
    sb = s * b
    t = tp
    drop = model.dropout
    f = model.ffn_hidden_size if mlp_width is None else mlp_width
    replicated = sb * h * (2 * e + 2 * e) + (2 * sb * h * MASK_BYTES if drop else 0)
    mlp = e * f * (3 if model.activation == "swiglu" else 2)
    up_proj = 0.0
    if model.is_mla:
        from meshplan.costmodel import mla
        rep, split = mla.kept_elements(model, 1)
        replicated += sb * e * rep
        sharded = sb * (e * split + mlp)
        up_proj = sb * e * mla.up_proj_output_elements(model, 1)
    else:
        sharded = sb * (e * (model.q_dim + 2 * model.kv_dim)     # Q, K, V
                        + e * model.q_dim                        # attention output = out-proj input
                        + mlp)
    if job.flash_attention:
        # Fused attention keeps only the log-sum-exp of each row (fp32) besides its output.
        core = 4.0 * sb * model.num_heads
    else:
        a_s2b = model.num_heads * s * s * b
        core = e * a_s2b + ((MASK_BYTES + e) * a_s2b if drop else 0)
    norm_outputs = 2 * e * sb * h         # the QKV and MLP inputs, within ``replicated``
    if sequence_parallel:
        replicated /= t
        norm_outputs /= t
    layer_input = e * sb * h / (t if sequence_parallel else 1)
    return LayerActivations(replicated, sharded / t, core / t, layer_input, norm_outputs,
                            job.selective_modules, up_proj / t)


def split_backward_kept_grad_bytes(model: ModelSpec, job: Job, micro_batch: int, tp: int,
                                   sequence_parallel: bool, *, fp32_norm_output: bool
                                   ) -> float:
    """Bytes of output gradients one layer keeps from a zero-bubble input-gradient pass (I)
    to its deferred weight-gradient pass (W), for one micro-batch on one GPU.

    torch.distributed.pipelining's ``stage_backward_input`` runs the stage's backward for
    its inputs only (``retain_graph=True``) and keeps, through a pre-hook on every autograd
    node where a parameter's gradient path meets the input's, that node's output gradient
    for ``stage_backward_weight``. Per layer those nodes are the four matmuls (QKV, attention
    out-projection, MLP up/gate and down; the row-parallel ones before their reduction, so
    over the full sequence even with sequence parallelism), the two norms' gain and, with
    sequence parallelism, the row-parallel biases added after the reduce-scatter (without
    it the bias add's gradient is the matmul's own tensor: the all-reduce's backward hands
    it on as is). Their gradients have the shapes and dtypes of the outputs: 16-bit, except
    a LayerNorm's under autocast (fp32). On CPU this matches what torch keeps to the byte,
    tp 1 and 2, with and without SP (tests/unit/test_split_memory.py).

    Check (round 24's memory walk of holdout9 r08, GPT-0.54B pp 2 tp 2 SP, mb 4): each I
    of the last stage left 2.1 GiB beyond what its micro-batch's forward kept and its W
    freed 4.8 GiB (2.4 activations, 0.39 logits gradient); this gives 17h bytes per token
    and layer (matmuls 11h, LayerNorms 4h, biases 2h) = 2.0 GiB over its 12 layers.
    """
    e = activation_bytes_per_element(job)
    s, b, h, t = job.seq_len, micro_batch, model.hidden_size, tp
    matmul_out = ((model.q_dim + 2 * model.kv_dim) / t + h
                  + model.ffn_matrices * model.ffn_hidden_size / t + h)
    slice_tokens = s * b / (t if sequence_parallel else 1)
    norm = 2 * h * slice_tokens * (4 if fp32_norm_output and model.norm == "layernorm" else e)
    bias = 2 * h * slice_tokens * e if model.bias and t > 1 and sequence_parallel else 0.0
    return s * b * matmul_out * e + norm + bias


def logits_bytes(model: ModelSpec, job: Job, micro_batch: int, tp: int) -> float:
    """Last stage: vocab-parallel logits (16-bit) and their fp32 copy for the cross-entropy.

    Megatron's vocab-parallel cross-entropy upcasts the logits shard to fp32
    (Shoeybi et al. 2019 §3; Korthikanti et al. 2022 §4.3 counts the output layer's 4sbv/t).
    """
    e = activation_bytes_per_element(job)
    return job.seq_len * micro_batch * model.vocab_size / tp * (e + 4)


@dataclass(frozen=True)
class StateBytesPerParam:
    weights: float
    grads: float
    optimizer: float


def state_bytes_per_param(job: Job) -> StateBytesPerParam:
    """Bytes per parameter before sharding (ZeRO Table 1: K = 12 for mixed-precision Adam).

    ``runtime="torch"`` keeps fp32 parameters and gradients and computes in 16 bits
    (torch.autocast / FSDP2 mixed precision): 4 + 4 + 8 bytes with Adam, like fp32 training.
    """
    return _state_bytes(job.precision, job.optimizer, job.runtime)


@lru_cache(maxsize=None)
def _state_bytes(precision: str, optimizer: str, runtime: str = "megatron") -> StateBytesPerParam:
    if precision == "fp32" or runtime == "torch":
        opt = 8.0 if optimizer == "adam" else 4.0   # Adam m, v / SGD momentum
        return StateBytesPerParam(4.0, 4.0, opt)
    opt = 12.0 if optimizer == "adam" else 8.0      # fp32 master + m, v / + momentum
    return StateBytesPerParam(2.0, 2.0, opt)


#: bytes of a weight kept and all-gathered in fp8 (``Job.fp8_param_gather``)
FP8_PARAM_BYTES = 1.0


def param_gather_bytes(job: Job, params: float, fp8_params: float = 0.0) -> float:
    """Bytes of ``params`` 16-bit weights as a ZeRO parameter all-gather moves them (runtime
    "megatron"); with ``Job.fp8_param_gather`` the ``fp8_params`` of them that are fp8
    linears' weights move at 1 byte (Megatron-LM ``--fp8-param-gather``: "keep the compute
    param in fp8 ... and perform the param all-gather in fp8")."""
    per = state_bytes_per_param(job).weights
    if job.fp8_param_gather:
        return (params - fp8_params) * per + fp8_params * FP8_PARAM_BYTES
    return params * per


def compute_weight_bytes_per_param(job: Job) -> float:
    """Bytes of the 16-bit copy of a weight that compute uses when the stored weight is fp32
    (``runtime="torch"``: autocast's cached cast for ZeRO-0/1, FSDP2's unsharded parameter
    for ZeRO-2/3); 0 when compute uses the stored weight itself."""
    if job.runtime == "torch" and job.precision != "fp32":
        return float(activation_bytes_per_element(job))
    return 0.0


def model_state_bytes(params: float, job: Job, zero: int, dp: int) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes on one GPU holding ``params`` parameters.

    ZeRO (Rajbhandari et al. 2019, Table 1): stage 1 shards the optimizer state (4P + 12P/N_d
    with mixed-precision Adam), stage 2 also the gradients (2P + 14P/N_d), stage 3 also the
    weights (16P/N_d).
    """
    per = state_bytes_per_param(job)
    w, g, o = params * per.weights, params * per.grads, params * per.optimizer
    if zero >= 1:
        o /= dp
    if zero >= 2:
        g /= dp
    # FSDP2 (runtime "torch") shards the stored weights for ZeRO-2 too; it differs from
    # ZeRO-3 only in keeping the gathered 16-bit weights from forward to backward.
    if zero >= 3 or (zero == 2 and job.runtime == "torch"):
        w /= dp
    return w, g, o


def stage_params(model: ModelSpec, layers: int, tp: int, *, first: bool, last: bool,
                 pp: int) -> float:
    """Parameters one GPU of a pipeline stage holds.

    Matmul weights and column-parallel biases are split over tp; norms and row-parallel
    biases are replicated (Shoeybi et al. 2019 §3). The embedding is vocab-parallel on the
    first stage; the last stage holds the output layer, which for tied embeddings is a copy
    of the embedding kept in sync by an all-reduce (Narayanan et al. 2021 §4, Megatron).
    """
    per_layer, vh, pos, norm = _param_parts(model, tp)
    n = layers * per_layer
    if first:
        n += vh + pos
    if last:
        n += norm
        if not model.tied_embeddings or not first:
            n += vh
    return n


@lru_cache(maxsize=1024)
def _param_parts(model: ModelSpec, tp: int) -> tuple[float, float, float, float]:
    """(per-layer params on one tp rank, vocab shard, position embedding, final norm).

    An MoE model's layer here is an MoE layer without its routed experts (attention, norms,
    shared experts split over tp, the replicated router): the experts are sharded by ep·etp
    and their states by edp (:mod:`meshplan.costmodel.moe_tables`), its dense layers differ
    by :func:`dense_layer_extra_params`."""
    h = model.hidden_size
    norm = h * (2 if model.norm == "layernorm" else 1)
    pos = model.max_seq_len * h if model.position_embedding == "learned" else 0
    if model.is_moe:
        per_layer = layer_tp_params(model, tp, model.num_shared_experts
                                    * (model.shared_expert_ffn_hidden_size or 0)) \
            + model.router_params()
        return per_layer, model.vocab_size * h / tp, pos, norm
    col_bias = (model.q_dim + 2 * model.kv_dim + model.ffn_matrices * model.ffn_hidden_size
                if model.bias else 0)
    row_bias = 2 * h if model.bias else 0
    per_layer = (model.layer_matmul_params() + col_bias) / tp + row_bias + 2 * norm
    return per_layer, model.vocab_size * h / tp, pos, norm


def layer_tp_params(model: ModelSpec, tp: int, mlp_width: int) -> float:
    """A layer's attention, norms and a dense MLP of ``mlp_width`` on one tp rank (matmuls
    and column-parallel biases split, norms, MLA's latent norms and row-parallel biases
    replicated; Shoeybi et al. 2019 §3)."""
    h = model.hidden_size
    norm = h * (2 if model.norm == "layernorm" else 1)
    mlp = (model.ffn_matrices + 1) * h * mlp_width
    col_bias = (model.q_dim + 2 * model.kv_dim + model.ffn_matrices * mlp_width
                if model.bias else 0)
    row_bias = (h + (h if mlp_width else 0)) if model.bias else 0
    latent_norms = (model.kv_lora_rank + (model.q_lora_rank or 0)) if model.is_mla else 0
    return ((model.attention_matmul_params() + mlp + col_bias) / tp + row_bias + 2 * norm
            + latent_norms)


@lru_cache(maxsize=1024)
def dense_layer_extra_params(model: ModelSpec, tp: int) -> float:
    """An MoE model's dense layer (``dense_layers``) less its MoE layer without experts, on
    one tp rank: the dense MLP instead of the shared experts and the router."""
    return layer_tp_params(model, tp, model.ffn_hidden_size) - _param_parts(model, tp)[0]
