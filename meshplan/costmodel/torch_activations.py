"""Activation bytes of meshplan's own executor layer (runtime "torch"), tensor by tensor.

Korthikanti et al. 2022's Table 2 (:func:`meshplan.costmodel.memory.layer_activations`)
counts Megatron's fused layer. meshplan's executor (:class:`meshplan.executor.model.Block`)
runs eager PyTorch, whose autograd saves what each operator's backward needs, and no more
(``a * b`` saves ``b`` only if ``a`` needs a gradient): per token, on one tp rank, with e the
compute dtype's bytes, q = query width / tp, k = K/V width / tp, f = ffn width / tp, n =
heads / tp, h the hidden size and d = tp under sequence parallelism (else 1):

- each norm, on its sequence slice: LayerNorm its input, in fp32 under CUDA autocast (which
  runs ``layer_norm`` in fp32) else e·h, plus mean and rstd (8 B); RMSNorm (statistics in
  fp32, :class:`~meshplan.executor.model.RMSNorm`) its fp32 input copy ``x.float()`` (4h),
  its e·h output before the gain, and the fp32 rsqrt (4 B): all over d;
- attention: the QKV linear's input e·h (the full sequence: with sequence parallelism the
  column-parallel linear saves its all-gathered input), the attention output e·q (kept by
  the output projection), the flash kernel's log-sum-exp (4n); then what
  ``scaled_dot_product_attention`` keeps of Q, K, V: a rotated Q (e·q; rotary embedding,
  whose multiplications by cos/sin keep only cos/sin), K and V expanded to the query heads
  (2·e·q, grouped-query: ``repeat_interleave``) or else the rotated K (e·k), and the fused
  QKV output e·(q + 2k) wherever one of Q, K, V is still a view of it (no rotary
  embedding, or multi-head V);
- selective recompute (:class:`~meshplan.executor.model._RecomputedCore`) keeps the core's
  inputs instead: Q and K as the core receives them (rotated: e·(q + k)) and the QKV output
  through V's view; not the expanded K/V nor the log-sum-exp;
- MLP: the up projection's input e·h (full sequence), then GELU's input and output (2·e·f)
  or SwiGLU's fused gate|up output, SiLU's output and the product (4·e·f);
- residual additions keep nothing; full recompute keeps the block input (e·h / d);
- with rotary embedding, per layer and micro-batch, the cos/sin tables cast to the compute
  dtype for Q and for K (4·s·head dim·e).

Checked on CPU against torch's ``saved_tensors_hooks`` for GPT- and Llama-style blocks,
multi-head, grouped-query and multi-query, bf16, tp 1 (tests/unit/test_torch_activations.py),
and on GPU against the calibrated rows of GPT-0.54B / Llama-1.64B (round 26 profile, 4 ×
H200, tp 1-4 with and without SP, none / selective / full): within 1-2.5 % of every ZeRO-0
and FSDP2 row, the residue being the calibration stack's own input, counted once over its two
blocks. Table 2 is 16-47 % below those rows.

A layer's backward also needs working memory beyond what it keeps (``backward_work``): the
gradients of the MLP's widest intermediate and of the layer's input while they overlap
(2·e·f + e·h), and under full recompute the recomputed forward (the layer's kept bytes
without recomputation) with the layer's output and input gradients (2·e·h): measured
GPT-0.54B / Llama-1.64B rows 17.3 / 18.0 and 42.1 / 62.7 bytes per token and hidden unit at
tp 1 against 18 / 18 and 40 / 60 here; at tp > 1 without sequence parallelism the rows hold
up to 16 more (not modelled: the input gradients' all-reduce).
"""

from __future__ import annotations

from meshplan.costmodel.memory import LayerActivations, activation_bytes_per_element
from meshplan.spec import Job, ModelSpec


def _per_token(model: ModelSpec, job: Job, tp: int, sequence_parallel: bool,
               autocast: bool, mlp_width: int | None = None) -> dict[str, float]:
    e = activation_bytes_per_element(job)
    h = model.hidden_size
    q, k = model.q_dim / tp, model.kv_dim / tp
    width = model.ffn_hidden_size if mlp_width is None else mlp_width
    f, n = width / tp, model.num_heads / tp
    d = tp if sequence_parallel else 1
    rope = model.position_embedding == "rope"
    grouped = model.num_kv_heads < model.num_heads
    if model.norm == "rmsnorm":
        norm = (4 * h + e * h + 4) / d
    else:
        norm = ((4 if autocast else e) * h + 8) / d
    qkv_out = e * (q + 2 * k)
    none = e * h + e * q + 4 * n
    none += e * q if rope else 0.0
    none += 2 * e * q if grouped else (e * k if rope else 0.0)
    none += qkv_out if (not rope or not grouped) else 0.0
    selective = e * h + e * q + qkv_out + (e * (q + k) if rope else 0.0)
    # an MoE layer without shared experts has no dense MLP (its routed part: moe_layer)
    mlp = e * h + (4 if model.activation == "swiglu" else 2) * e * f if f else 0.0
    return dict(norms=2 * norm, attn_none=none, attn_selective=selective, mlp=mlp,
                input=e * h / d, grad_work=2 * e * f + e * h, io_grads=2 * e * h / d)


def torch_layer_activations(model: ModelSpec, job: Job, micro_batch: float, tp: int,
                            sequence_parallel: bool, *, autocast: bool = True,
                            mlp_width: int | None = None) -> LayerActivations:
    """One executor layer's kept bytes for one micro-batch on one GPU (module docstring),
    as a :class:`~meshplan.costmodel.memory.LayerActivations`: ``stored("selective")`` is
    what selective recompute keeps, ``stored("none")`` (= ``full_bytes``) what no
    recomputation keeps, ``stored("full")`` the block input. ``autocast``: ZeRO-0/1 under
    the torch runtime (FSDP2 runs bf16 without autocast). ``mlp_width``: the dense MLP's
    width (None: ``ffn_hidden_size``; an MoE layer's shared experts, 0 without)."""
    t = _per_token(model, job, tp, bool(sequence_parallel and tp > 1), autocast, mlp_width)
    tokens = job.seq_len * micro_batch
    # rotary's cos/sin in the compute dtype, cast once per Q and K (apply_rope) and kept by
    # the multiplications: per sequence position, not per token of the micro-batch
    tables = (4 * job.seq_len * model.head_dim * activation_bytes_per_element(job)
              if model.position_embedding == "rope" else 0.0)
    selective = tokens * (t["norms"] + t["attn_selective"] + t["mlp"]) + tables
    none = tokens * (t["norms"] + t["attn_none"] + t["mlp"]) + tables
    return LayerActivations(replicated_bytes=tokens * t["norms"],
                            sharded_bytes=selective - tokens * t["norms"],
                            attention_core_bytes=none - selective,
                            input_bytes=tokens * t["input"])


def torch_backward_work(model: ModelSpec, job: Job, micro_batch: float, tp: int,
                        sequence_parallel: bool, recompute: str, *,
                        autocast: bool = True, mlp_width: int | None = None) -> float:
    """Working memory of one executor layer's backward beyond what it keeps (module
    docstring): the overlapping gradients, and under full recompute the recomputed forward
    with the layer's output and input gradients."""
    sp = bool(sequence_parallel and tp > 1)
    t = _per_token(model, job, tp, sp, autocast, mlp_width)
    tokens = job.seq_len * micro_batch
    if recompute == "full":
        acts = torch_layer_activations(model, job, micro_batch, tp, sp, autocast=autocast,
                                       mlp_width=mlp_width)
        return acts.full_bytes + tokens * t["io_grads"]
    return tokens * t["grad_work"]


def torch_output_bytes(model: ModelSpec, job: Job, micro_batch: float, tp: int,
                       compiled: bool = False) -> tuple[float, float]:
    """The executor's output layer for one micro-batch: (kept, working) bytes.

    ``cross_entropy`` upcasts the 16-bit logits (``logits.float()``) and its log-softmax
    keeps its fp32 output (4 B per token and vocabulary entry on this rank); the 16-bit
    logits are no operator's saved tensor. While the loss runs, the 16-bit logits and their
    fp32 copy coexist with it (e + 4 B); on one rank its backward's fp32 gradient and the
    log-softmax's input gradient (2·4 B). Measured rows (round 26, GPT-0.54B and
    Llama-1.64B): kept 4.2-4.6 B at tp 1 and 4.3-6.6 B at tp 2-4, working 8 B at tp 1 and
    6 B at tp 2-4, per token and vocabulary entry; Megatron's count (4 + e as kept,
    nothing working) is half their sum.

    ``compiled`` (``Layout.compile`` at tp 1: the executor's ``compiled_cross_entropy``):
    the fused loss keeps the 16-bit logits for its backward and writes their 16-bit
    gradient, nothing fp32 of logit size: e B kept, e B working. The H200 profiles'
    compiled output rows against their eager twins (fp8h2, fp8h3, fp8h21; 1-8 sequences):
    kept 0.52-0.57 and working 0.25 of the eager row's, as e / 4 and e / 8 have it. A
    profile with only the eager row reads it at this share (:mod:`.parts`): post hoc on
    fp8h36 +17..+56 % -> within 0.7 % on six of eight arms; held out on fp8h38 (1 x H200),
    within 4.8 % on six of six, against two of six without (docs/benchmarks/fp8_checks.md)."""
    e = activation_bytes_per_element(job)
    sbv = job.seq_len * micro_batch * model.vocab_size / tp
    if compiled and tp == 1:
        return e * sbv, e * sbv
    return 4 * sbv, (8 if tp == 1 else 4 + e) * sbv


__all__ = ["torch_layer_activations", "torch_backward_work", "torch_output_bytes"]
