"""What one executor block compiled by Inductor keeps for its backward (runtime "torch",
``Layout.compile``), and the named memory correction ``compiled_dense_block_kept`` for a
dense layer priced without a measured row.

:func:`meshplan.costmodel.torch_activations.torch_layer_activations` counts what eager
autograd keeps. A block compiled by ``torch.compile`` keeps what Inductor's min-cut
partitioner (``torch/_functorch/partitioners.py``, ``min_cut_rematerialization_partition``)
chooses to save; it re-runs the cheap element-wise ops in the backward instead: the fp32
copies of the norms' inputs (RMSNorm's ``x.float()``, LayerNorm's autocast upcast: 8·h a
token), the RMSNorms' outputs before the gain, SiLU's output (e·f) and one of the two
rotary table casts, and keeps the block's input and the residual after attention (2·e·h) to
re-run the norms from. Under selective recomputation the compiled block runs the attention
core as ``torch.utils.checkpoint`` traced into its graph
(:func:`meshplan.executor.attention_core.recomputed_core`), which keeps neither the core's
output (the output projection's input, e·q) nor its log-sum-exp.

Per token, e the compute dtype's bytes, h the hidden size, q / k the query / key-value
widths, n heads, f the MLP's width, s the sequence length, d the head dimension
(:func:`dense_part_per_token`, :func:`compiled_dense_kept_bytes`):

    e·h·(3 + [f > 0]) + stats + attn + mlp,  plus 2·s·d·e per sequence with rotary

- e·h·(3 + [f > 0]): the block's input, the QKV input, the residual after attention and
  the MLP input (the norms' outputs after their gains);
- stats: the norms' fp32 statistics, RMSNorm's rsqrt 2·4, LayerNorm's mean and rstd 2·8
  (fp32 under CUDA autocast; CPU autocast runs ``layer_norm`` in bf16: 2·4 there);
- attn without recomputation: rotary, grouped K/V: 4·e·q (the rotated Q, K and V expanded
  to the query heads, the output); rotary, multi-head: e·(q + 2k) + 2·e·q + e·k (the fused
  QKV output, which V views, the rotated Q and K, the output); learned positions: the
  fused QKV output e·(q + 2k), the output e·q and, grouped, the expanded K and V (2·e·q);
  and the log-sum-exp 4n. Selective: the fused QKV output and, with rotary, the rotated Q
  and K (e·(q + k)) only;
- mlp: SwiGLU's fc1 output and product 3·e·f; GELU's input and output 2·e·f.

Under full recomputation the checkpointed block keeps its input (e·h, as the eager count)
and no 16-bit weight copy. In fp8 (tensorwise) the count is the bf16 arm's, moved by the
executor's fp8 terms as the eager count is (:func:`with_compiled_dense_memory`). Source:
the saved tensors of one executor block compiled by Inductor on CPU (torch 2.13,
``saved_tensors_hooks``; ``benchmarks/compiled_dense_saved_bytes.py`` for dense blocks,
``benchmarks/compiled_moe_saved_bytes.py`` for MoE ones, whose attention and shared
experts are this dense part with f = the shared experts' width).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from meshplan.costmodel.corrections import Correction, memory_rule
from meshplan.costmodel.memory import activation_bytes_per_element
from meshplan.costmodel.torch_activations import torch_layer_activations
from meshplan.hardware_profiles.corrections import CorrectionNumbers
from meshplan.spec import Job, Layout, ModelSpec

if TYPE_CHECKING:
    from meshplan.costmodel.parts import LayerParts


def dense_part_per_token(model: ModelSpec, job: Job, width: float,
                         recompute: str = "none") -> float:
    """Bytes a token that a compiled block's norms, attention and dense MLP of ``width``
    keep, its input included (module docstring); ``recompute`` "none" or "selective"."""
    e = activation_bytes_per_element(job)
    h, q, kv, n = model.hidden_size, model.q_dim, model.kv_dim, model.num_heads
    rope = model.position_embedding == "rope"
    grouped = model.num_kv_heads < model.num_heads
    stats = 2 * (4 if model.norm == "rmsnorm" else 8)
    qkv_out = e * (q + 2 * kv)
    if recompute == "selective":
        attn = qkv_out + (e * (q + kv) if rope else 0.0)
    elif rope:
        attn = (4 * e * q if grouped else qkv_out + 2 * e * q + e * kv) + 4 * n
    else:
        attn = qkv_out + e * q + (2 * e * q if grouped else 0.0) + 4 * n
    mlp = (model.ffn_matrices + 1 if model.activation == "swiglu" else 2) * e * width
    return e * h * (3 + (1 if width else 0)) + stats + attn + mlp


def rope_table_bytes(model: ModelSpec, job: Job) -> float:
    """The compiled block's one rotary cos / sin cast in the compute dtype, per position."""
    if model.position_embedding != "rope":
        return 0.0
    return 2 * job.seq_len * model.head_dim * activation_bytes_per_element(job)


def linear_copy_bytes(model: ModelSpec, job: Job, width: float) -> float:
    """The 16-bit copies of the QKV, output and MLP (``width``) weights a compiled block
    casts once per call under autocast and saves (bf16; fp8's linears read the fp32 weight
    or its fp8 cast: none)."""
    if job.precision == "fp8":
        return 0.0
    h = model.hidden_size
    linears = h * (model.q_dim + 2 * model.kv_dim) + model.q_dim * h \
        + (model.ffn_matrices + 1) * h * width
    return activation_bytes_per_element(job) * linears


def compiled_dense_kept_bytes(model: ModelSpec, job: Job, tokens: float,
                              recompute: str = "none") -> float:
    """What one dense executor block compiled by Inductor keeps per micro-batch of
    ``tokens`` tokens, its input included and its 16-bit weight copies apart
    (:func:`linear_copy_bytes`); "full": the checkpointed block's input."""
    if recompute == "full":
        return tokens * model.hidden_size * activation_bytes_per_element(job)
    return (tokens * dense_part_per_token(model, job, model.ffn_hidden_size, recompute)
            + rope_table_bytes(model, job))


def with_compiled_kept(parts: "LayerParts", recompute: str, d: float, copies: float,
                       inp: float, kept_d: float | None = None) -> "LayerParts":
    """A layer's parts with the kept bytes of its compiled block (shared by
    ``compiled_dense_block_kept`` and :func:`meshplan.costmodel.moe_torch_memory.
    with_compiled_block_memory`). ``d`` = C − E: the compiled block's bytes without
    recomputation (its input included) less the composed eager count's; ``copies`` its
    16-bit weight copies, ``inp`` its input; ``kept_d`` (default ``d``) the change of what
    the layer keeps at its recompute mode (selective: C_s − E_s). Without or with selective
    recomputation the kept bytes move by ``kept_d`` and hold the copies; under full
    recomputation the backward's working memory (the recomputed forward) moves by D less
    the input already kept, the copies with it (the one layer being recomputed). The
    weights then count no 16-bit copy (``kept_weight_copies``)."""
    kept_d = d if kept_d is None else kept_d
    if recompute == "full":
        return replace(parts, full_act_bytes=parts.full_act_bytes + d + copies,
                       backward_buf_bytes=max(0.0, parts.backward_buf_bytes + d - inp + copies),
                       kept_weight_copies=bool(copies))
    return replace(parts, activation_bytes=max(0.0, parts.activation_bytes + kept_d + copies),
                   full_act_bytes=parts.full_act_bytes + d + copies,
                   kept_weight_copies=bool(copies))


# ---- compiled dense blocks (named memory correction) -------------------------------------
COMPILED_DENSE_BLOCK = "compiled_dense_block_kept"


def one_compiled_graph(job: Job, layout: Layout) -> bool:
    """Where the compiled-block rules were read: runtime "torch", ``Layout.compile`` with the
    block one graph on one rank (tp = cp = ep = etp = 1, no data parallelism: left off,
    below), ZeRO < 2, under 1F1B: one stage, or pp > 1 stages (each block
    still one graph on its rank; each micro-batch in flight keeps its own kept bytes and
    16-bit copies, as the composition counts them). Not GPipe, interleaved or zero-bubble
    (the copies' lifetime with their micro-batches in flight or deferred weight gradients
    unchecked).

    pp > 1 (1F1B), POST HOC (2026-12-05; read on committed data, no new run): the
    datasheet's peak memory of the compiled pp 2 arms of the 2-GPU checks fp8h4, fp8h6-14
    and moeh4, moeh6-11, moeh16 (H200; 28 arms, void compiled tp + SP / ep arms apart,
    compiled_grads.md), with the rules at pp 2 against without: mean absolute error
    6.3 → 2.0 %, within 5 %: 13 → 25 of 28, no arm more than 1.5 points worse (fp8h11
    u01 bf16, full recomputation, +0.4 → −1.9 %); per rank (the dense sets' two stages,
    40 ranks) 6.9 → 1.4 %, within 5 %: 20 → 40 (``docs/benchmarks/moe_checks.md``, "The
    compiled-block memory rules beyond one rank"). Left off by the same test: dp > 1 under
    DDP (28 arms, 5.2 → 1.5 %, but the 4-GPU check of 2026-11-28's f01 fp8 arm +1.3 →
    −8.7 %), FSDP2 (the build prices its own kept bytes: 2 of 25 arms move), tp > 1 (no
    arm that is not void)."""
    return (job.runtime == "torch" and layout.compile
            and layout.tp == layout.cp == layout.ep == layout.etp == layout.dp == 1
            and layout.schedule == "1f1b" and layout.zero < 2)


def compiled_dense_applies(model: ModelSpec, job: Job, layout: Layout,
                           numbers: CorrectionNumbers) -> bool:
    """Whether :func:`with_compiled_dense_memory` prices a dense layer composed without a
    measured row: one compiled graph (:func:`one_compiled_graph`), recompute none,
    selective or full, bf16 or fp8 with the tensorwise recipe (the one the
    fp8 GPU rows it was checked on ran), the executor's dense block family read on CPU
    (RMSNorm + rotary + SwiGLU without biases, or LayerNorm + learned positions + GELU,
    with or without biases; no dropout, sliding window, MLA or multi-token prediction)."""
    family = ((model.norm == "rmsnorm" and model.position_embedding == "rope"
               and model.activation == "swiglu" and not model.bias)
              or (model.norm == "layernorm" and model.position_embedding == "learned"
                  and model.activation == "gelu"))
    return (one_compiled_graph(job, layout) and not model.is_moe
            and numbers.enabled(COMPILED_DENSE_BLOCK)
            and (job.precision == "bf16"
                 or (job.precision == "fp8" and job.fp8_recipe == "tensorwise"))
            and layout.recompute in ("none", "selective", "full") and family
            and not model.dropout and model.sliding_window is None and not model.is_mla
            and not model.mtp_layers)


def with_compiled_dense_memory(parts: "LayerParts", model: ModelSpec, job: Job,
                               layout: Layout) -> "LayerParts":
    """Named memory correction ``compiled_dense_block_kept``: a dense layer that
    ``Layout.compile`` runs as one compiled graph, priced without a measured row, keeps what
    the compiled block keeps (:func:`compiled_dense_kept_bytes`, module docstring), not the
    eager count (:func:`~meshplan.costmodel.torch_activations.torch_layer_activations`),
    and its 16-bit weight copies go with its kept bytes (:func:`with_compiled_kept`), not
    with the weights: held per layer as before without or with selective recomputation,
    one layer's under full recomputation, where before every layer's were held all step.

    Per token against the eager count (bf16): without recomputation −8·h (the norms' fp32
    input copies) + 2·e·h (the block's input and the residual) − 2·e·h·[RMSNorm] (the norms'
    outputs before the gain) − e·f·[SwiGLU] (SiLU's output), and −2·s·d·e per sequence (a
    rotary cast); selective recomputation also −e·q (the attention output, which the
    compiled checkpoint re-runs; the eager count keeps it for the output projection). E.g.
    Llama h 160, q 4×64, kv 2, f 224 on CPU: 4,824 B a token kept against the eager 6,680
    (tests/unit/test_compiled_dense_saved_bytes.py, byte for byte).

    Checked against the compiled bf16 GPU rows (tp 1) of the stored 1-GPU dense profiles
    (H200; ``benchmarks/compiled_dense_saved_bytes.py --rows``, the per-token slope between
    a shape's micro-batches): without recomputation within 0.1 % on 17 of 18 block shapes
    (fp8h2's of 2026-11-29: +2.3 %), where the eager count reads 13-42 % above (GPT-style
    13-18 %, Llama-style 37-42 %); selective recomputation within 0.1 % on every profile
    from fp8h21 (2026-12-01) on (10 shapes), where the eager count reads 22-51 % above; the
    earlier profiles' selective rows (fp8h1-3, fp8h16-20) read 5-8 % above the formula,
    by about e·q a token: the attention output, presumably kept by the executor of then
    (its selective core through ``_RecomputedCore`` inside the compiled block).

    Measured effect, POST HOC (2026-12-05; the checks the overestimate was found on): the
    datasheet's peak memory of the dense 1-GPU checks fp8h16-fp8h53 (H200), 122 bf16
    compiled arms, mean absolute error 9.0 → 0.9 % (within 5 %: 22 → 120): no
    recomputation +2.5..+12.2 % mean by micro-batch (1-16) → −0.7..−0.3 %, selective
    +3.1..+14.4 % → −2.2..−0.7 % (min −5.5 %: the earlier profiles' sets), full
    +6.4..+10.0 % → −1.4..−0.1 % (one arm +5.7 %). Without or with selective
    recomputation all of it is the layers' kept bytes (L·(C − E), growing with the
    micro-batch; the copies move from the weights to the kept bytes unchanged); under full
    recomputation all of it is the weights' 16-bit copies, (L − 1) layers' too many.

    fp8 (tensorwise): the compiled block's count in the bf16 arm, moved by the executor's
    fp8 terms (:func:`meshplan.costmodel.fp8_cost.torch_memory`: the 16-bit linear inputs
    the partitioner recomputes), as the composed eager count was; no 16-bit copies. Not
    read on CPU (no fp8 GEMMs there), but the norms, SiLU and rotary ops the partitioner
    re-runs are the bf16 block's, and the composition reads the compiled fp8 GPU rows
    (tensorwise, tp 1) within 0.1 % a token on 7 of 9 shapes without recomputation (fp8h1
    +0.4 %, fp8h2 −1.3 %: 2026-11-29) and on the 2 selective shapes from fp8h21 on (the 7
    earlier ones' rows 7-15 % above). POST HOC on the same checks, 99 fp8 compiled arms:
    8.2 → 0.6 % mean (within 5 %: 48 → 98; none +3.0..+16.7 % → −0.6..+0.4 % mean by
    micro-batch, selective +3.9..+19.7 % → −2.2..−0.5 %, full recomputation −0.3..+0.6 % →
    −0.3..+0.5 %).
    Step times do not move. A profile with the model's compiled dense rows is read as
    before (the rows hold all this)."""
    tokens = job.seq_len * layout.micro_batch
    eager = torch_layer_activations(model, job, layout.micro_batch, 1, False)
    d = compiled_dense_kept_bytes(model, job, tokens) - eager.full_bytes
    kept_d = (compiled_dense_kept_bytes(model, job, tokens, layout.recompute)
              - eager.stored(layout.recompute)) if layout.recompute == "selective" else d
    inp = tokens * model.hidden_size * activation_bytes_per_element(job)
    copies = linear_copy_bytes(model, job, model.ffn_hidden_size)
    return with_compiled_kept(parts, layout.recompute, d, copies, inp, kept_d)


def compiled_kept_rule(name: str, applies: Callable, effect: Callable) -> Correction:
    """The named memory rule of a compiled block priced without a measured layer row:
    ``applies(model, job, layout, corrections)``, and the profile timed no row of the
    layer (a measured row already holds what the block keeps)."""
    def without_row(t) -> bool:
        return applies(t.model, t.job, t.layout, t.cluster.gpu.corrections) \
            and "layer" not in t.parts.measured
    return memory_rule(name, without_row, effect)


COMPILED_DENSE_BLOCK_CORRECTION = compiled_kept_rule(
    COMPILED_DENSE_BLOCK, compiled_dense_applies, with_compiled_dense_memory)

__all__ = ["COMPILED_DENSE_BLOCK", "COMPILED_DENSE_BLOCK_CORRECTION", "compiled_dense_applies",
           "compiled_dense_kept_bytes", "compiled_kept_rule", "dense_part_per_token",
           "linear_copy_bytes", "one_compiled_graph", "rope_table_bytes",
           "with_compiled_dense_memory", "with_compiled_kept"]
