"""Time of one transformer layer (and of the embedding and logits) on one GPU, per micro-batch.

* GEMMs: FLOPs / (peak × efficiency(FLOPs)), one term per matrix multiply of the layer
  (QKV, attention output, MLP up/gate, MLP down), each with its tensor-parallel shard shape
  (Shoeybi et al. 2019 §3 for the column/row split). Backward = data-gradient +
  weight-gradient GEMMs, twice the forward FLOPs (Narayanan et al. 2021 §5.1).
* Attention core: the QKᵀ and attention-weighted-sum FLOPs (4·b·s²·q_dim/t forward). Fused
  (flash) causal kernels skip the masked half (Dao 2022, arXiv 2205.14135) and run at the
  attention efficiency curve; backward does 2.5× the forward work (recomputing the scores).
  The curve is forward + backward by the forward's executed FLOPs; on H100/H200 datasheet
  profiles it comes from the cuDNN bars of the FlashAttention-3 paper (Shah et al. 2024,
  arXiv 2407.08608, Fig. 5-6; :mod:`meshplan.hardware_profiles.attention_published`), at
  the model's head dim where the figures publish several (head dim 64 runs 0.82-0.87 of
  head dim 128's efficiency at the same FLOPs; ``GPUSpec.attention_efficiency_at``; post
  hoc on the cp40 check, docs/benchmarks/cp_checks.md).
  Sliding-window layers run only the tiles of their band (:mod:`meshplan.costmodel.window`).
  Unfused attention runs the full s² batched GEMMs plus softmax/dropout memory traffic.
* Memory-bound ops (norms, residual adds, activation functions, dropout, RoPE, softmax):
  bytes moved / (HBM bandwidth × efficiency); backward moves about twice the forward bytes.
  Under runtime "torch" the bytes are the executor's eager ops, counted
  (:mod:`meshplan.costmodel.torch_membound`: its fp32 RMSNorm, RoPE, GQA repeat); its
  blocks under ``torch.compile`` (``compiled``: ``Layout.compile`` where no measured row
  times the block) move the fused count instead — TorchInductor fuses each chain of
  element-wise ops between two GEMMs into one generated kernel (Ansel et al. 2024, "PyTorch
  2", ASPLOS, §4) — at the streaming rate of a plain element-wise kernel (the residual
  add's), the GQA repeat of K and V kept as a copy. Measured (post hoc, 1 × H200, the 26
  compiled bf16 runs of fp8h16-fp8h23, docs/benchmarks/fp8_checks.md "Compiled layers without
  their rows"): the datasheet's bf16 error 17.0 → 10.9 % mean, 48.3 → 23.4 % max; held
  out as run on two never-run Llamas (fp8h24, fp8h26): 39.4 → 14.0 % and 31.8 → 11.2 %
  (bf16), 60.6 → 28.9 % and 56.9 → 31.3 % (fp8).
* Full recomputation re-runs the forward in the backward (Korthikanti et al. 2022 §5); a
  compiled block (``compiled``) re-runs ``GPUSpec.compiled_full_rerun_share`` of it — the
  executor checkpoints the block whole and Inductor's min-cut partitioner keeps part of the
  forward's outputs — read off a profile's compiled rows at load (0.67-0.85 on 15 dense H200
  profiles, the datasheet 0.742). Post hoc (docs/benchmarks/fp8_checks.md "The compiled
  block's re-run under full recomputation"): another family's compiled full-recompute arms
  bf16 10.9 → 6.4 %, fp8 14.4 → 11.2 % mean step error over 798 profile pairs; held out as
  run on fp8h46 (a never-run GPT from Llama rows, 1 × H200): 13.3 → 8.8 %, lower on 9 of 9;
  fp8h47 (a Llama from GPT rows, one bf16 arm): 24.5 → 17.3 %, lower on 14 of 14.
* Tensor-parallel collectives (:func:`tp_collectives`): without sequence parallelism two
  all-reduces of the layer's activations per pass (forward: after attention and after the
  MLP, the row-parallel outputs; backward: the conjugate ones, the column-parallel inputs'
  gradients; Shoeybi et al. 2019 §3, the ``f`` / ``g`` operators). With sequence
  parallelism each all-reduce becomes an all-gather and a reduce-scatter of the same total
  volume (RS + AG = AR on the wire, Korthikanti et al. 2022 §4.2.2, Fig. 5): two of each
  per pass, attention and MLP. Megatron's column-parallel linear does not keep the
  all-gathered input: its backward all-gathers it again for the weight gradient, issued
  before the input-gradient GEMM and overlapped with it (Megatron-LM
  megatron/core/tensor_parallel/layers.py, ``LinearWithGradAccumulationAndAsyncCommunication.
  backward``: ``dist_all_gather_func(..., async_op=True)`` then ``grad_output.matmul(weight)``
  then ``handle.wait()``): one more all-gather per column-parallel linear (QKV, MLP up) per
  backward, its own term (``wgrad_gather_s``, ``wgrad_gather_wire_bytes``), exposed beyond
  that GEMM plus the profile's ``overlap_interference`` of what it hides. meshplan's own
  executor (runtime "torch", executor/tensor_parallel.py) lets autograd keep the gathered
  input (``F.linear`` saves it), so it runs no such all-gather. Full recompute reruns the
  forward collectives in backward.
* Embedding and output layer: the vocabulary-parallel embedding sums its partial lookups
  with an all-reduce (sequence parallel: a reduce-scatter, whose backward all-gathers the
  gradient); the output layer's column-parallel GEMM all-gathers its input under sequence
  parallelism (backward: a reduce-scatter of the input gradient, and Megatron's
  weight-gradient all-gather) or, without, all-reduces its input gradient in backward (the
  ``f`` operator); the loss all-reduces three per-token scalars (Shoeybi et al. 2019 §3).

Measured error: analytical layers are checked against published Megatron runs on datasheet
profiles (benchmarks/validate_published.py, docs/benchmarks/published.md: Narayanan et al.
2021 Table 1, 3.4 % mean / 6.3 % max; Korthikanti et al. 2022 Table 5, 4.2 % / 7.9 %;
Megatron-Core H100 2024, 7.4 % / 16.0 %); calibrated profiles replace the layer time by
measured rows (:mod:`.parts`).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costmodel import comm, mla, torch_membound, window
from meshplan.costmodel.memory import activation_bytes_per_element, recomputes_core_attention
from meshplan.spec import Job, ModelSpec
from meshplan.hardware_profiles import Cluster, GPUSpec
from meshplan.hardware_profiles.topology import GroupLink

FLASH_BACKWARD_FACTOR = 2.5  # flash attention backward / forward work (Dao 2022, §3.1)


@dataclass(frozen=True)
class PassCost:
    """Seconds of one pass (forward or backward) split by kind."""

    gemm_s: float = 0.0
    attention_s: float = 0.0
    memory_bound_s: float = 0.0
    tp_comm_s: float = 0.0
    overhead_s: float = 0.0
    zero3_s: float = 0.0
    cp_comm_s: float = 0.0      # context parallelism's exposed exchanges (costmodel.context)
    ep_comm_s: float = 0.0      # expert parallelism's dispatch/combine (costmodel.moe_layer)

    @property
    def total_s(self) -> float:
        return (self.gemm_s + self.attention_s + self.memory_bound_s + self.tp_comm_s
                + self.overhead_s + self.zero3_s + self.cp_comm_s + self.ep_comm_s)

    def __add__(self, o: "PassCost") -> "PassCost":
        return PassCost(self.gemm_s + o.gemm_s, self.attention_s + o.attention_s,
                        self.memory_bound_s + o.memory_bound_s, self.tp_comm_s + o.tp_comm_s,
                        self.overhead_s + o.overhead_s, self.zero3_s + o.zero3_s,
                        self.cp_comm_s + o.cp_comm_s, self.ep_comm_s + o.ep_comm_s)

    def __sub__(self, o: "PassCost") -> "PassCost":
        return self + o.scaled(-1.0)

    def scaled(self, k: float) -> "PassCost":
        return PassCost(self.gemm_s * k, self.attention_s * k, self.memory_bound_s * k,
                        self.tp_comm_s * k, self.overhead_s * k, self.zero3_s * k,
                        self.cp_comm_s * k, self.ep_comm_s * k)


def gemm_s(gpu: GPUSpec, peak_flops: float, flops: float) -> float:
    if flops <= 0:
        return 0.0
    return flops / (peak_flops * gpu.gemm_efficiency(flops))


def kernel_head_dim(model: ModelSpec) -> int | None:
    """The head dim the attention kernel runs at (``GPUSpec.attention_efficiency_at``);
    None for multi-head latent attention, whose query/key and value widths differ: the
    GPU's one curve."""
    return None if model.is_mla else model.head_dim


def hbm_s(gpu: GPUSpec, nbytes: float, op: str = "") -> float:
    """Seconds to move ``nbytes`` at the HBM efficiency of memory-bound ``op`` (the
    profile's measured one for the executor's norms, residual adds and activations, else
    its pooled ``hbm_efficiency``)."""
    eff = gpu.op_hbm_efficiency(op) if op else gpu.hbm_efficiency
    return nbytes / (gpu.hbm_gbps * 1e9 * eff)


@dataclass(frozen=True)
class LayerCost:
    forward: PassCost
    backward: PassCost          # includes recomputation
    recompute: PassCost         # the part of ``backward`` that is recomputed forward work
    wgrad_s: float              # weight-gradient GEMMs inside ``backward`` (zero-bubble's W)
    tp_wire_bytes: float        # bytes each GPU sends for tp collectives, fwd + bwd (+ recompute)
    # Megatron with sequence parallelism: the backward's all-gathers of the column-parallel
    # inputs for their weight gradients (exposed seconds, inside ``backward``; bytes sent)
    wgrad_gather_s: float = 0.0
    wgrad_gather_wire_bytes: float = 0.0
    cp_wire_bytes: float = 0.0      # bytes each GPU sends for context parallelism, fwd + bwd
    ep_wire_bytes: float = 0.0      # ... for expert parallelism (all-to-alls, etp gathers)


@dataclass(frozen=True)
class TpCollectives:
    """One layer's tensor-parallel collectives for one micro-batch (see the module docstring)."""

    pass_s: float               # the collectives of one pass (forward, or backward's conjugates)
    pass_wire_bytes: float      # bytes each GPU sends for them
    wgrad_gather_s: float = 0.0           # backward's weight-gradient all-gathers, exposed
    wgrad_gather_wire_bytes: float = 0.0


def tp_collectives(cluster: Cluster, job: Job, tp_link: GroupLink, act_bytes: float, tp: int,
                   sequence_parallel: bool, dgrad_gemm_s: tuple[float, ...],
                   blocks: int = 2) -> TpCollectives:
    """The collectives of one layer's pass over ``act_bytes`` of activations (the full
    sequence); ``dgrad_gemm_s``: the column-parallel linears' input-gradient GEMMs, which
    Megatron's weight-gradient all-gathers overlap. ``blocks``: the tensor-parallel blocks
    (attention and the MLP; 1 in an MoE layer without shared experts, whose routed part
    moves its tokens itself)."""
    if tp <= 1:
        return TpCollectives(0.0, 0.0)
    wire = blocks * comm.wire_bytes_all_reduce(tp, act_bytes)
    if not sequence_parallel:
        return TpCollectives(blocks * comm.all_reduce_s(tp_link, act_bytes), wire)
    ag = comm.all_gather_s(tp_link, act_bytes)
    pass_s = blocks * (ag + comm.reduce_scatter_s(tp_link, act_bytes))
    if not megatron_gathers_for_wgrad(job):
        return TpCollectives(pass_s, wire)
    k = cluster.gpu.overlap_interference
    return TpCollectives(pass_s, wire, sum(comm.exposed(ag, g, k) for g in dgrad_gemm_s),
                         len(dgrad_gemm_s) * comm.wire_bytes_gather(tp, act_bytes))


def megatron_gathers_for_wgrad(job: Job) -> bool:
    """Whether a sequence-parallel column-parallel linear all-gathers its input again in
    backward (Megatron) or kept it from forward (meshplan's executor, runtime "torch")."""
    return job.runtime != "torch"


def sixteen_bit_precision(job: Job) -> str:
    """The precision of the GEMMs fp8 training leaves in 16 bits (attention, the logits) and
    of the layer priced before :mod:`meshplan.costmodel.fp8_cost` moves its linears to fp8:
    bf16 for ``precision="fp8"``, the job's own otherwise."""
    return "bf16" if job.precision == "fp8" else job.precision


def linear_shapes(model: ModelSpec, job: Job, micro_batch: int, tp: int,
                  mlp_width: int | None = None
                  ) -> tuple[tuple[tuple[float, float, float], str], ...]:
    """The linears of a layer as ((m, k, n) tensor-parallel shard, "column" | "row"):
    QKV and MLP up (+ gate) column-parallel, attention output and MLP down row-parallel
    (Shoeybi et al. 2019 §3); each GEMM is 2·m·k·n FLOPs. Multi-head latent attention's
    projections (:mod:`meshplan.costmodel.mla`, the output row-parallel) replace QKV and
    the output; ``mlp_width`` the MLP's width (None: ``ffn_hidden_size``; 0: no dense MLP,
    an MoE layer without shared experts)."""
    tokens = job.seq_len * micro_batch
    h, t = model.hidden_size, tp
    f = model.ffn_hidden_size if mlp_width is None else mlp_width
    if model.is_mla:
        proj = mla.gemm_shapes(model, tokens, t)
        attn = tuple((s, "row" if i == len(proj) - 1 else "column") for i, s in enumerate(proj))
    else:
        attn = (((tokens, h, (model.q_dim + 2 * model.kv_dim) / t), "column"),    # QKV
                ((tokens, model.q_dim / t, h), "row"))                            # attention out
    mlp = (((tokens, h, model.ffn_matrices * f / t), "column"),    # MLP up (+ gate)
           ((tokens, f / t, h), "row")) if f else ()               # MLP down
    return attn + mlp


def linear_params(model: ModelSpec, job: Job, tp: int, mlp_width: int | None = None) -> float:
    """Weights of a layer's linears on one tp rank (:func:`linear_shapes`' k·n summed)."""
    return float(sum(k * n for (_, k, n), _ in linear_shapes(model, job, 1, tp, mlp_width)))


def layer_cost(model: ModelSpec, cluster: Cluster, job: Job, *, micro_batch: int, tp: int,
               sequence_parallel: bool, recompute: str, tp_link: GroupLink,
               mlp_width: int | None = None, compiled: bool = False) -> LayerCost:
    """Forward and backward time of one transformer layer on one GPU for one micro-batch.

    ``mlp_width``: the dense MLP's width (None: ``ffn_hidden_size``); an MoE layer passes
    its shared experts' total width (0 without), its routed part being priced by
    :mod:`meshplan.costmodel.moe_layer`. Multi-head latent attention's projections and core
    come from :mod:`meshplan.costmodel.mla`. ``compiled``: the executor's block under
    ``torch.compile`` (``Layout.compile``, runtime "torch"): its memory-bound work at the
    fused count (module docstring)."""
    gpu = cluster.gpu
    compiled = compiled and job.runtime == "torch"
    peak = gpu.peak_flops(sixteen_bit_precision(job))
    e = activation_bytes_per_element(job)
    s, b, h, t = job.seq_len, micro_batch, model.hidden_size, tp
    tokens = s * b
    f = model.ffn_hidden_size if mlp_width is None else mlp_width

    # GEMMs, tensor-parallel shards: (m, k, n) -> 2mkn FLOPs each.
    linears = linear_shapes(model, job, micro_batch, tp, mlp_width)
    shapes = tuple(shape for shape, _ in linears)
    n_attn = len(shapes) - (2 if f else 0)
    fwd_gemm = sum(gemm_s(gpu, peak, 2.0 * m * k * n) for m, k, n in shapes)

    # Attention core.
    heads = model.num_heads / t
    if model.is_mla:
        core_flops = b * s * s * mla.pair_flops(model, t)
    else:
        core_flops = 4.0 * b * s * s * model.head_dim * heads
    if job.flash_attention:
        # causal: masked blocks skipped; sliding-window layers skip all but their band
        # (meshplan.costmodel.window), each kind at the efficiency of its own FLOPs
        head_dim = kernel_head_dim(model)
        fwd_attn = sum(share * executed / (peak * gpu.attention_efficiency_at(executed, head_dim))
                       for share, executed in ((share, core_flops * frac)
                                               for share, frac in window.layer_mix(model, s)))
        bwd_attn = fwd_attn * FLASH_BACKWARD_FACTOR
        softmax_bytes = 0.0
    else:
        fwd_attn = 2 * gemm_s(gpu, peak, core_flops / 2)     # QKᵀ and PV batched GEMMs
        bwd_attn = 2 * fwd_attn
        per = heads * s * s * b                              # score elements per GPU
        softmax_bytes = per * e * 2 + (per * (e * 2 + 1) if model.dropout else 0)

    # Memory-bound traffic of the forward pass, in bytes, each op at its own measured
    # efficiency where the profile has one (the executor's unfused fp32 RMSNorm ran at a
    # sixth of LayerNorm's bandwidth on 4 x H200; calibrate/profile.py)
    seq_shard = t if sequence_parallel else 1
    hidden_elems = tokens * h / seq_shard
    other = 0.0
    if model.dropout:
        other += hidden_elems * (2 * e + 1) * 2              # two residual dropouts
    act_in = (2 if model.activation == "swiglu" else 1) * tokens * f / t
    rope = 0.0
    if model.position_embedding == "rope" and model.is_mla:
        rope = tokens * mla.rope_elements(model, t) * e
    elif model.position_embedding == "rope":
        rope = 2 * tokens * (model.q_dim + model.kv_dim) / t * e
    other += softmax_bytes
    if job.runtime == "torch" and not model.is_mla and not compiled:
        # the executor's eager ops, counted (meshplan.costmodel.torch_membound); the core's
        # GQA repeat runs with the attention kernel
        fwd_mb, bwd_mb, core_f, core_b = torch_membound.eager_layer_s(
            model, gpu, tokens=tokens, tp=t, sequence_parallel=sequence_parallel,
            mlp_width=f, e=e)
        fwd_mb, bwd_mb = fwd_mb + hbm_s(gpu, other), bwd_mb + 2 * hbm_s(gpu, other)
        fwd_attn, bwd_attn = fwd_attn + core_f, bwd_attn + core_b
    else:
        # the fused count; a compiled executor block runs Inductor's generated element-wise
        # kernels, not the eager ops the profile's per-op efficiencies timed: each at the
        # streaming rate of a plain element-wise kernel (the residual add's)
        def op(name: str) -> str:
            return "residual-add" if compiled else name
        latent_norms = (hbm_s(gpu, tokens * mla.latent_norm_elements(model) * e,
                              op(model.norm)) if model.is_mla else 0.0)
        fwd_mb = (hbm_s(gpu, hidden_elems * e * 4, op(model.norm))         # two norms
                  + latent_norms
                  + hbm_s(gpu, hidden_elems * e * 6, op("residual-add"))  # two residual adds
                  + hbm_s(gpu, (act_in + tokens * f / t) * e, op(model.activation))
                  + hbm_s(gpu, other + rope, op("")))
        bwd_mb = 2 * fwd_mb
        if compiled and not model.is_mla:
            # the executor's GQA repeat of K and V stays a copy in the compiled graph
            core = torch_membound.gqa_repeat_bytes(model, tokens=tokens, tp=t, e=e)
            copy = hbm_s(gpu, core, "residual-add")
            fwd_attn, bwd_attn = fwd_attn + copy, bwd_attn + copy

    # Tensor-parallel collectives: attention's and the MLP's, per pass.
    act_bytes = tokens * h * e
    column = (shapes[0], shapes[n_attn]) if f else (shapes[0],)
    tpc = tp_collectives(cluster, job, tp_link, act_bytes, t, sequence_parallel,
                         tuple(gemm_s(gpu, peak, 2.0 * m * k * n) for m, k, n in column),
                         blocks=2 if f else 1)
    tp_pass, wire_pass = tpc.pass_s, tpc.pass_wire_bytes
    if job.overlap_tp_comm:
        tp_pass_exposed = max(0.0, tp_pass - 0.5 * fwd_gemm)
    else:
        tp_pass_exposed = tp_pass

    overhead = gpu.layer_overhead_s / 3  # calibrated fixed cost, 1/3 forward, 2/3 backward
    forward = PassCost(fwd_gemm, fwd_attn, fwd_mb, tp_pass_exposed, overhead)
    backward = PassCost(2 * fwd_gemm, bwd_attn, bwd_mb, tp_pass_exposed + tpc.wgrad_gather_s,
                        2 * overhead)
    if recompute == "full":
        # a compiled block's backward re-runs only part of its forward (the partitioner
        # saves the rest: GPUSpec.compiled_full_rerun_share, read off the profile's rows)
        rc = forward.scaled(gpu.compiled_full_rerun_share or 1.0) if compiled else forward
        wire = 3 * wire_pass
    elif recompute == "selective":
        # what job.recompute_modules re-runs: the attention core (Korthikanti et al. 2022
        # §5), the two norms (memory-bound, their forward traffic again), MLA's
        # up-projections and RoPE (meshplan.costmodel.mla)
        mods = job.selective_modules
        rc = PassCost()
        if recomputes_core_attention(job):
            rc += PassCost(attention_s=fwd_attn, memory_bound_s=hbm_s(gpu, softmax_bytes))
        if "layernorm" in mods:
            rc += PassCost(memory_bound_s=hbm_s(gpu, hidden_elems * e * 4, model.norm))
        if "mla_up_proj" in mods and model.is_mla:
            rc += PassCost(gemm_s=sum(gemm_s(gpu, peak, 2.0 * m * k * n)
                                      for m, k, n in mla.up_proj_shapes(model, tokens, t)),
                           memory_bound_s=hbm_s(gpu, rope))
        wire = 2 * wire_pass
    else:
        rc = PassCost()
        wire = 2 * wire_pass
    return LayerCost(forward, backward + rc, rc, fwd_gemm, wire, tpc.wgrad_gather_s,
                     tpc.wgrad_gather_wire_bytes)


def embedding_cost(model: ModelSpec, cluster: Cluster, job: Job, *, micro_batch: int, tp: int,
                   sequence_parallel: bool, tp_link: GroupLink) -> tuple[PassCost, PassCost]:
    """First stage: vocab-parallel embedding lookup, summed over tp ranks by an all-reduce
    (identity backward), or with sequence parallelism a reduce-scatter whose backward
    all-gathers the gradient (Shoeybi et al. 2019 §3; Korthikanti et al. 2022 §4.2.2)."""
    e = activation_bytes_per_element(job)
    nbytes = job.seq_len * micro_batch * model.hidden_size * e
    mb = hbm_s(cluster.gpu, 2 * nbytes)
    c = c_bwd = 0.0
    if tp > 1:
        if sequence_parallel:
            c, c_bwd = comm.reduce_scatter_s(tp_link, nbytes), comm.all_gather_s(tp_link, nbytes)
        else:
            c = comm.all_reduce_s(tp_link, nbytes)
    return (PassCost(memory_bound_s=mb, tp_comm_s=c),
            PassCost(memory_bound_s=2 * mb, tp_comm_s=c_bwd))


def logits_cost(model: ModelSpec, cluster: Cluster, job: Job, *, micro_batch: int, tp: int,
                sequence_parallel: bool, tp_link: GroupLink) -> tuple[PassCost, PassCost, float]:
    """Last stage: final norm, vocab-parallel output GEMM and cross-entropy.

    Returns (forward, backward, weight-gradient seconds inside backward). The loss needs
    three small all-reduces of per-token scalars over tp (max, sum-exp, target logit). The
    GEMM's input is all-gathered under sequence parallelism (backward: reduce-scatter of
    its gradient, and Megatron's weight-gradient all-gather, overlapped with the
    input-gradient GEMM), else its gradient is all-reduced in backward.
    """
    gpu = cluster.gpu
    peak = gpu.peak_flops(sixteen_bit_precision(job))
    e = activation_bytes_per_element(job)
    tokens = job.seq_len * micro_batch
    h = model.hidden_size
    fwd_gemm = gemm_s(gpu, peak, 2.0 * tokens * h * model.vocab_size / tp)
    logits = tokens * model.vocab_size / tp
    # fp32 cross-entropy: write logits, upcast, max, exp-sum, loss (Megatron's vocab-parallel CE).
    fwd_mb = hbm_s(gpu, logits * (e + 4 * 3) + tokens * h * e * 2 / (tp if sequence_parallel else 1))
    bwd_mb = hbm_s(gpu, logits * (4 * 2 + e))
    c = 3 * comm.all_reduce_s(tp_link, tokens * 4) if tp > 1 else 0.0
    c_bwd = 0.0
    if tp > 1 and sequence_parallel:
        c += comm.all_gather_s(tp_link, tokens * h * e)
        head = tp_collectives(cluster, job, tp_link, tokens * h * e, tp, True, (fwd_gemm,))
        c_bwd = comm.reduce_scatter_s(tp_link, tokens * h * e) + head.wgrad_gather_s
    elif tp > 1:
        c_bwd = comm.all_reduce_s(tp_link, tokens * h * e)
    fwd = PassCost(gemm_s=fwd_gemm, memory_bound_s=fwd_mb, tp_comm_s=c)
    bwd = PassCost(gemm_s=2 * fwd_gemm, memory_bound_s=bwd_mb, tp_comm_s=c_bwd)
    return fwd, bwd, fwd_gemm
