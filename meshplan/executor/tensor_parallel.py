"""Megatron-style tensor parallelism with plain tensors and explicit collectives.

Shoeybi et al. 2019 (arXiv 1909.08053) §3, Fig. 3: an MLP or attention block is a
column-parallel linear (weight rows split over the tp group) followed by a row-parallel
linear (weight columns split), joined by the conjugate operators

* ``f``: identity forward, all-reduce backward (:func:`copy_to_tp`),
* ``g``: all-reduce forward, identity backward (:func:`reduce_from_tp`).

With sequence parallelism (Korthikanti et al. 2022, arXiv 2205.05198 §4.2.2, Fig. 5)
``f`` becomes an all-gather along the sequence (reduce-scatter backward) and ``g`` a
reduce-scatter (all-gather backward); norms and dropout then run on a 1/tp slice of the
sequence, and the gradients of the parameters that live there (norm gains, row-parallel
biases, positions) are partial sums that :func:`allreduce_sequence_parallel_grads` adds
up over the tp group.

Vocabulary-parallel embedding and cross-entropy: Shoeybi et al. 2019 §3 (last two
paragraphs): the embedding rows and the logits' vocabulary dimension are split over the
tp group; the loss needs only the max, the sum of exponentials and the target logit,
each all-reduced as one number per token.

Activations are ``[batch, seq, hidden]``; the sequence dimension is 1. The operators ``f``
and ``g`` and their sequence-parallel forms live in :mod:`meshplan.executor.tp_collectives`
and stay importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from meshplan.errors import ExecutorError
from meshplan.executor.functional_comm import all_reduce
from meshplan.executor.mla import MLAttention
from meshplan.executor.tp_collectives import (SEQ_DIM, copy_to_tp,  # noqa: F401
                                              gather_from_slices, gather_from_sp,
                                              reduce_from_tp, reduce_scatter_to_sp,
                                              scatter_to_sp, to_compute_dtype)


# ---- how a parameter is cut ----------------------------------------------------------------
@dataclass(frozen=True)
class ShardSpec:
    """A tp-sharded parameter: split along ``dim``; with ``sections`` each section of the
    full tensor (e.g. q | k | v rows) is split separately and the local pieces concatenated."""

    dim: int
    sections: tuple[int, ...] | None = None

    def shard(self, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
        parts = full.split(self.sections, dim=self.dim) if self.sections else (full,)
        return torch.cat([p.chunk(size, dim=self.dim)[rank] for p in parts], dim=self.dim)

    def unshard(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """Inverse of :meth:`shard` given every rank's piece in rank order."""
        size = len(pieces)
        if not self.sections:
            return torch.cat(pieces, dim=self.dim)
        local = [s // size for s in self.sections]
        split = [p.split(local, dim=self.dim) for p in pieces]
        return torch.cat([torch.cat([sp[i] for sp in split], dim=self.dim)
                          for i in range(len(self.sections))], dim=self.dim)


# ---- layers --------------------------------------------------------------------------------
class ColumnParallelLinear(nn.Module):
    """y = x Aᵢᵀ (+ bᵢ) with A's output rows split over tp (Shoeybi et al. 2019, eq. 3).

    Input: full activations (or, with sequence parallelism, this rank's sequence slice,
    all-gathered first). Output: this rank's slice of the features, full sequence.
    ``matmul`` (``F.linear``'s signature) is replaced for fp8 (meshplan.executor.fp8).
    """

    matmul = staticmethod(F.linear)

    def __init__(self, linear: nn.Linear, group, *, sequence_parallel: bool,
                 sections: tuple[int, ...] | None = None):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        self.weight_spec = ShardSpec(0, sections)
        self.weight = nn.Parameter(self.weight_spec.shard(linear.weight.detach(), rank, size).clone())
        self.bias = (nn.Parameter(self.weight_spec.shard(linear.bias.detach(), rank, size).clone())
                     if linear.bias is not None else None)

    def forward(self, x):
        x = to_compute_dtype(x)
        x = gather_from_sp(x, self.group) if self.sequence_parallel else copy_to_tp(x, self.group)
        return self.matmul(x, self.weight, self.bias)   # (b, s, out/tp)


class RowParallelLinear(nn.Module):
    """y = Σᵢ xᵢ Bᵢᵀ + b with B's input columns split over tp (Shoeybi et al. 2019, eq. 3).

    The bias is added once, after the reduction (replicated; partial gradient under SP).
    """

    matmul = staticmethod(F.linear)

    def __init__(self, linear: nn.Linear, group, *, sequence_parallel: bool):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        self.weight_spec = ShardSpec(1)
        self.weight = nn.Parameter(self.weight_spec.shard(linear.weight.detach(), rank, size).clone())
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None

    def forward(self, x):
        y = self.matmul(x, self.weight)              # (b, s, out), partial sum
        y = (reduce_scatter_to_sp(y, self.group) if self.sequence_parallel
             else reduce_from_tp(y, self.group))     # (b, s/tp, out) or (b, s, out)
        # the bias in y's dtype, as nn.Linear under autocast adds it: an fp32 bias would
        # promote the residual stream to fp32 from here on (GPT's, before round 16)
        return y + self.bias.to(y.dtype) if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Embedding rows [r·V/tp, (r+1)·V/tp) on tp rank r; other ids contribute zeros and the
    partial lookups are summed (all-reduce, or reduce-scatter under SP)."""

    def __init__(self, embedding: nn.Embedding, group, *, sequence_parallel: bool):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        vocab = embedding.weight.shape[0]
        self.vocab_start, self.vocab_end = rank * vocab // size, (rank + 1) * vocab // size
        self.weight_spec = ShardSpec(0)
        self.weight = nn.Parameter(self.weight_spec.shard(embedding.weight.detach(), rank, size).clone())

    def forward(self, ids):
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        h = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)  # (b, s, h)
        return (reduce_scatter_to_sp(h, self.group) if self.sequence_parallel
                else reduce_from_tp(h, self.group))


class SequenceSlicePositions(nn.Module):
    """Learned positions for this tp rank's sequence slice (sequence parallelism)."""

    def __init__(self, pos: nn.Embedding, group):
        super().__init__()
        self.group = group
        self.weight = pos.weight

    def positions_for(self, h, positions=None):
        s_local, r = h.shape[1], dist.get_rank(self.group)
        mine = slice(r * s_local, (r + 1) * s_local)
        if positions is not None:          # context parallelism: the cp rank's positions
            return self.weight[positions[mine]]               # (s/tp, h)
        return self.weight[mine]                              # (s/tp, h)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits whose vocabulary is split over tp (fp32 math)."""

    @staticmethod
    def forward(ctx, logits, targets, vocab_start, group):
        # logits: (N, V/tp); targets: (N,)
        logits = logits.float()
        vmax = all_reduce(logits.max(dim=-1).values, group, "max")
        logits = logits - vmax.unsqueeze(-1)
        n_local = logits.shape[-1]
        local_t = targets - vocab_start
        outside = (local_t < 0) | (local_t >= n_local)
        local_t = local_t.masked_fill(outside, 0)
        target_logit = logits.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = logits.exp_()
        sum_exp = exp.sum(dim=-1)
        both = all_reduce(torch.stack((target_logit, sum_exp)), group)   # one for both
        target_logit, sum_exp = both[0], both[1]
        loss = torch.log(sum_exp) - target_logit           # (N,)
        exp.div_(sum_exp.unsqueeze(-1))                    # softmax, kept for backward
        ctx.save_for_backward(exp, local_t, outside)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_t, outside = ctx.saved_tensors
        grad = softmax
        grad.scatter_add_(-1, local_t.unsqueeze(-1), -(~outside).to(grad.dtype).unsqueeze(-1))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None


def vocab_parallel_cross_entropy(logits_local: torch.Tensor, targets: torch.Tensor,
                                 vocab_start: int, group) -> torch.Tensor:
    """Mean cross-entropy; ``logits_local`` (b, s, V/tp) holds vocab rows from ``vocab_start``."""
    losses = _VocabParallelCrossEntropy.apply(logits_local.flatten(0, 1), targets.flatten(),
                                              vocab_start, group)
    return losses.mean()


class VocabParallelHead(nn.Module):
    """Logits for this rank's vocabulary slice from the full (gathered) final hidden state.

    Holds no parameter of its own: the weight is the (tp-sharded) output or tied embedding
    weight of the model it serves.
    """

    def __init__(self, model, group, *, sequence_parallel: bool):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self._model = [model]    # a list: do not register the model as a submodule

    def forward(self, h):
        h = to_compute_dtype(h)
        h = gather_from_sp(h, self.group) if self.sequence_parallel else copy_to_tp(h, self.group)
        return F.linear(h, self._model[0].head_weight())    # (b, s, V/tp)


# ---- apply to a model ------------------------------------------------------------------
def apply_tensor_parallel(model, group, *, sequence_parallel: bool,
                          moe=None) -> dict[str, ShardSpec]:
    """Replace the linears, embedding and head of ``model`` (a :class:`Transformer` or a
    part of one) by their tp versions, slicing the full weights already in place.

    Returns {parameter name: ShardSpec} for the sharded parameters (names unchanged);
    the parameters not listed are replicated over tp. ``moe`` splits an MoE layer's MLP
    (:func:`meshplan.executor.expert_parallel.apply_tensor_parallel_moe`; passed in so that
    the dense tp layers do not import the expert code, which builds on them).
    """
    size = dist.get_world_size(group)
    spec = model.spec
    _check_divisible(spec, size)
    shards: dict[str, ShardSpec] = {}
    for lname, block in model.layers.items():
        attn, mlp = block.attn, block.mlp
        p = f"layers.{lname}."
        if isinstance(attn, MLAttention):
            shards.update(parallelize_mla(attn, group, sequence_parallel=sequence_parallel,
                                          prefix=p + "attn."))
        else:
            sections = (spec.q_dim, spec.kv_dim, spec.kv_dim)
            attn.qkv = ColumnParallelLinear(attn.qkv, group,
                                            sequence_parallel=sequence_parallel,
                                            sections=sections)
            attn.proj = RowParallelLinear(attn.proj, group, sequence_parallel=sequence_parallel)
            attn.num_heads //= size
            attn.num_kv_heads //= size
            shards[p + "attn.qkv.weight"] = attn.qkv.weight_spec
            shards[p + "attn.proj.weight"] = attn.proj.weight_spec
            if spec.bias:
                shards[p + "attn.qkv.bias"] = attn.qkv.weight_spec
        if hasattr(mlp, "experts"):    # an MoE layer: its shared experts, token slicing
            if moe is None:
                raise ExecutorError(
                    f"layer {lname} is an MoE layer: pass moe="
                    f"meshplan.executor.expert_parallel.apply_tensor_parallel_moe")
            shards.update(moe(mlp, group, spec, sequence_parallel=sequence_parallel,
                              prefix=p + "mlp."))
        else:
            shards.update(parallelize_mlp(mlp, group, spec.ffn_hidden_size, spec,
                                          sequence_parallel=sequence_parallel,
                                          prefix=p + "mlp."))
    if model.tok_embeddings is not None:
        model.tok_embeddings = VocabParallelEmbedding(model.tok_embeddings, group,
                                                      sequence_parallel=sequence_parallel)
        shards["tok_embeddings.weight"] = ShardSpec(0)
    if model.output is not None:
        out = model.output
        model.output = nn.Module()
        model.output.weight = nn.Parameter(ShardSpec(0).shard(out.weight.detach(),
                                                               dist.get_rank(group), size).clone())
        shards["output.weight"] = ShardSpec(0)
    if sequence_parallel and model.pos_embeddings is not None:
        model.pos_embeddings = SequenceSlicePositions(model.pos_embeddings, group)
    if model.computes_logits:
        model.head_override = VocabParallelHead(model, group, sequence_parallel=sequence_parallel)
    if sequence_parallel and model.embeds_input and model.tok_embeddings is None:
        raise ExecutorError("internal: a first stage without an input embedding")
    return shards


class EnterTensorParallel(nn.Module):
    """``f`` on its own, for a replicated activation that a tp-split region reads without a
    column-parallel linear of its own (MLA's shared rotary key): identity forward and
    all-reduce backward, or with sequence parallelism all-gather forward, reduce-scatter
    backward (:func:`copy_to_tp`, :func:`gather_from_sp`)."""

    def __init__(self, group, *, sequence_parallel: bool):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel

    def forward(self, x):
        x = to_compute_dtype(x)
        if self.sequence_parallel:    # a split of kv_down's output: gather a packed copy
            return gather_from_sp(x.contiguous(), self.group)
        return copy_to_tp(x, self.group)


def parallelize_mla(attn: MLAttention, group, *, sequence_parallel: bool,
                    prefix: str) -> dict[str, ShardSpec]:
    """Multi-head latent attention over tp (Megatron-Core's ``MLASelfAttention``): the query
    up-projection (or the whole query projection without ``q_lora_rank``) and the key-value
    up-projection column-parallel by heads — their rows go head by head
    (:mod:`meshplan.executor.mla`), so a contiguous 1/tp is whole heads —, ``proj``
    row-parallel; the down-projections and the latent norms stay replicated.

    Gradients of the replicated part: each latent enters the split region through its
    up-projection's ``f`` and the shared rotary key through :class:`EnterTensorParallel`,
    whose backward sums the ranks' partial gradients (each rank's heads' share). Without
    sequence parallelism every rank then holds the whole dL/d(latent) and dL/d(k_rope), so
    the down-projections' and norms' weight gradients come out whole and identical on every
    rank, and nothing more is summed. With it the down-projections and norms run on this
    rank's 1/tp of the sequence (as Megatron-Core's do), so their gradients are partial
    sums over the sequence: :func:`sequence_parallel_param_names` lists them for
    :func:`allreduce_sequence_parallel_grads`."""
    sp = sequence_parallel
    shards: dict[str, ShardSpec] = {}
    for name in ("q_up" if attn.q_lora else "q", "kv_up"):
        layer = ColumnParallelLinear(getattr(attn, name), group, sequence_parallel=sp)
        setattr(attn, name, layer)
        shards[prefix + name + ".weight"] = layer.weight_spec
    attn.proj = RowParallelLinear(attn.proj, group, sequence_parallel=sp)
    shards[prefix + "proj.weight"] = attn.proj.weight_spec
    attn.shared_key_to_tp = EnterTensorParallel(group, sequence_parallel=sp)
    attn.num_heads //= dist.get_world_size(group)
    return shards


def parallelize_mlp(mlp, group, width: int, spec, *, sequence_parallel: bool,
                    prefix: str) -> dict[str, ShardSpec]:
    """An MLP of ``width`` as column-parallel fc (gate | up split section by section) and
    row-parallel proj; returns the ShardSpecs of its sharded parameters."""
    mlp.fc = ColumnParallelLinear(mlp.fc, group, sequence_parallel=sequence_parallel,
                                  sections=(width,) * spec.ffn_matrices
                                  if spec.ffn_matrices > 1 else None)
    mlp.proj = RowParallelLinear(mlp.proj, group, sequence_parallel=sequence_parallel)
    shards = {prefix + "fc.weight": mlp.fc.weight_spec, prefix + "proj.weight": mlp.proj.weight_spec}
    if spec.bias:
        shards[prefix + "fc.bias"] = mlp.fc.weight_spec
    return shards


def sequence_parallel_param_names(model) -> list[str]:
    """Replicated parameters applied to a sequence slice: their grads are partial over tp."""
    names = []
    for name, p in model.named_parameters():
        if "norm" in name or name.startswith("pos_embeddings"):
            names.append(name)
        elif name.endswith("proj.bias"):      # row-parallel biases, added after the reduction
            names.append(name)
        elif name.endswith(("attn.q_down.weight", "attn.kv_down.weight")):
            names.append(name)                # MLA's down-projections (parallelize_mla)
    return names


def allreduce_sequence_parallel_grads(params: list[torch.Tensor], group) -> None:
    """Sum the partial gradients of sequence-parallel parameters over the tp group."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    flat = torch.cat([g.reshape(-1) for g in local])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in local:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n


def _check_divisible(spec, tp: int) -> None:
    checks = (("num_heads", spec.num_heads), ("num_kv_heads", spec.num_kv_heads),
              ("ffn_hidden_size", spec.ffn_hidden_size), ("vocab_size", spec.vocab_size))
    for field, value in checks:
        if value % tp:
            raise ExecutorError(f"tensor parallel size tp={tp} must divide ModelSpec.{field} = "
                                f"{value}; choose tp among the divisors of {value}")


__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "VocabParallelHead", "ShardSpec", "apply_tensor_parallel",
           "vocab_parallel_cross_entropy", "sequence_parallel_param_names",
           "allreduce_sequence_parallel_grads", "copy_to_tp", "reduce_from_tp",
           "gather_from_sp", "reduce_scatter_to_sp", "scatter_to_sp", "gather_from_slices",
           "parallelize_mlp", "parallelize_mla", "EnterTensorParallel"]
