"""The mixture-of-experts layer of the executor's model: router, token permutation, experts
as grouped GEMMs, dispatch and combine over the expert-parallel group.

Router (Switch, Fedus et al. 2021, arXiv 2101.03961 §2.1; sigmoid gates as DeepSeek-V3,
arXiv 2412.19437 §2.1.2): logits = x W_rᵀ in fp32, probabilities softmax(logits) or
sigmoid(logits), the top-k experts by probability, gate values the top-k probabilities,
rescaled to sum to 1 with ``router_norm_topk`` (Mixtral, Qwen3-MoE, DeepSeek-V3).

Load-balancing loss: Switch eqs. 4-6 extended to top-k as Megatron-Core's
``switch_load_balancing_loss_func``, L = α·E·Σᵢ fᵢ·Pᵢ with fᵢ the share of the k·T routed
copies sent to expert i and Pᵢ the mean (normalised) probability of i — computed per
sequence and averaged over sequences, as DeepSeek-V2's expert-level balance loss
(arXiv 2405.04434 eqs. 23-25) and DeepSeek-V3's sequence-wise loss (eqs. 17-20). Per
sequence, a batch's gradient does not depend on how it is cut into micro-batches, dp ranks
or tp slices, so every layout trains exactly like one process. The loss value is not added
to the reported loss: its gradient is injected at the layer output during backward
(Megatron-Core's MoEAuxLossAutoScaler), which also works on pipeline stages that never see
the loss; ``aux_grad_scale`` is α over whatever the trainer divides the loss by.

Capacity (GShard, Lepikhin et al. 2020, arXiv 2006.16668 §2.2; Switch eq. 3): with
``capacity_factor`` cf each expert takes at most C = ceil(cf·T·k/E) of a sequence's copies,
earlier positions first; a dropped copy contributes nothing (the token keeps its residual).
Per sequence too, so the same copies are dropped under any ep, tp, cp or micro-batching (a
rank counts the copies of every earlier piece of the sequence: :func:`sequence_pieces`).

Dispatch and combine (GShard §2.2; Megatron-Core's MoEAlltoAllTokenDispatcher): the kept
copies are sorted by expert; the counts per expert are exchanged with ``all_to_all_single``
over the ep group, then the rows (uneven splits); the received rows are regrouped from
(source, expert) to (expert, source) order, run through this rank's experts, and returned
the same way; the combine adds g·expert(x) over each token's copies.

Token movement (:mod:`meshplan.executor.moe_permute`): the copies sorted by expert, gathered,
padded per group and summed back per token without atomic adds.

Experts: weights stacked [E_local, ...] and run as one grouped GEMM
(``torch.nn.functional.grouped_mm``, or ``torch._grouped_mm`` where only that exists: CUDA,
bf16, compute capability 9.0+), each group padded to 8 rows because the weight-gradient
GEMM runs along the token dimension (torchtitan pads the same way); elsewhere a loop over
the local experts.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from meshplan.errors import ExecutorError
from meshplan.executor.fp8_grouped import (FP8_GROUP_ALIGN_ROWS, Fp8ExpertWeights,
                                           fp8_grouped_linear)
from meshplan.executor.functional_comm import all_to_all
from meshplan.executor.mlp import MLP, seeded_normal
from meshplan.executor.moe_permute import (GROUP_ALIGN_ROWS, SortedCopies, _count,  # noqa: F401
                                           _expert_major_index, _rank_within_key, combine,
                                           dispatch, group_padding, pad_rows, sort_copies,
                                           unpad_rows)
from meshplan.spec import ModelSpec


def _grouped_mm_fn():
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def grouped_mm_usable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the fast grouped GEMM applies: the installed torch has it (2.8+), the device is
    a CUDA GPU of compute capability 9.0+ and the compute dtype is bf16."""
    return (_grouped_mm_fn() is not None and device.type == "cuda" and dtype == torch.bfloat16
            and torch.cuda.get_device_capability(device) >= (9, 0))


class GroupedExperts(nn.Module):
    """Routed experts ``first .. first + count - 1`` of a layer, weights stacked:
    ``w_in`` [count, m·f, h] (SwiGLU's gate | up, or fc1), ``w_out`` [count, h, f]; with
    expert tensor parallelism (:meth:`keep_width`) this rank's 1/etp of every expert's
    width f, as a dense MLP under tp (``w_in`` column-parallel per section, ``w_out``
    row-parallel): the layer adds the etp ranks' partial outputs up."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.swiglu = spec.activation == "swiglu"
        self.first, self.count, self.total = 0, spec.num_experts, spec.num_experts
        f, h = spec.moe_ffn_hidden_size, spec.hidden_size
        self.w_in = nn.Parameter(torch.empty(self.count, spec.ffn_matrices * f, h))
        self.w_out = nn.Parameter(torch.empty(self.count, h, f))
        self.b_in = nn.Parameter(torch.empty(self.count, spec.ffn_matrices * f)) if spec.bias else None
        self.b_out = nn.Parameter(torch.empty(self.count, h)) if spec.bias else None
        self.backend = "auto"     # "auto" | "loop" | "grouped"
        self.fp8 = None           # an fp8.Fp8Plan: fp8 grouped GEMMs (executor/fp8_grouped.py)
        self.fp8_weights = None   # (w_in's, w_out's) Fp8ExpertWeights: cast once a step
        self.etp_rank, self.etp = 0, 1
        self.sections = spec.ffn_matrices

    def width_spec(self, name: str):
        """How parameter ``name`` (stacked over the experts) is cut over etp: a
        :class:`~meshplan.executor.tensor_parallel.ShardSpec` — ``w_in``'s rows and ``b_in``
        per section, ``w_out``'s columns — or None for ``b_out``, whole on every etp rank
        (added once, to the summed outputs: :meth:`MoELayer._local_experts`)."""
        from meshplan.executor.tensor_parallel import ShardSpec
        per_section = ShardSpec(1, (self.w_out.shape[2] * self.etp,) * self.sections)
        return {"w_in": per_section, "b_in": per_section, "w_out": ShardSpec(2)}.get(name)

    def keep_width(self, rank: int, size: int) -> None:
        """Keep this etp rank's 1/size of every expert's width (meta device, after
        :meth:`keep_experts`)."""
        if size == 1:
            return
        for name in ("w_in", "b_in", "w_out"):
            p, spec = getattr(self, name), self.width_spec(name)
            if p is not None:
                setattr(self, name, nn.Parameter(spec.shard(p.detach(), rank, size).clone()))
        self.etp_rank, self.etp = rank, size

    def cache_fp8_weights(self, *, backend: str | None = None) -> list[Fp8ExpertWeights]:
        """Cast ``w_in`` and ``w_out`` to fp8 once a step instead of in every pass (fp8
        experts only; the caller refreshes the returned casts whenever the weights change:
        :class:`~meshplan.executor.fp8_grouped.Fp8ExpertWeights`; ``backend`` the
        ``torch.compile`` backend of its casts, None eager)."""
        if self.fp8 is None:
            raise ExecutorError("internal: cache_fp8_weights on experts that do not run fp8")
        self.fp8_weights = (Fp8ExpertWeights(self.w_in, self.fp8, backend=backend),
                            Fp8ExpertWeights(self.w_out, self.fp8, backend=backend))
        return list(self.fp8_weights)

    def _out_bias(self):
        """``b_out`` where the experts add it themselves (etp 1); with etp > 1 the layer adds
        it after summing the partial outputs."""
        return self.b_out if self.etp == 1 else None

    def keep_experts(self, first: int, count: int) -> None:
        """Keep only experts first .. first + count - 1 (call on the meta device, before the
        weights are materialised)."""
        for name in ("w_in", "w_out", "b_in", "b_out"):
            p = getattr(self, name)
            if p is not None:
                setattr(self, name, nn.Parameter(p[first:first + count].detach().clone()))
        self.first, self.count = first, count

    @torch.no_grad()
    def init_expert_weights(self, seed: int, prefix: str, std: float, proj_std: float) -> None:
        """Expert g's weights drawn from (seed, name, g), whichever rank holds it."""
        for e in range(self.count):
            g = self.first + e
            for name, s in (("w_in", std), ("w_out", proj_std)):
                p = getattr(self, name)
                full = list(p.shape[1:])
                if self.etp > 1:
                    d = self.width_spec(name).dim - 1
                    full[d] *= self.etp
                w = seeded_normal(tuple(full), s, seed, f"{prefix}.{name}.{g}", p.device,
                                  p.dtype)
                if self.etp > 1:
                    w = self.width_spec(name).shard(w.unsqueeze(0), self.etp_rank,
                                                    self.etp)[0]
                p[e].copy_(w)
        for b in (self.b_in, self.b_out):
            if b is not None:
                b.zero_()

    def _act(self, h: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.gelu(h, approximate="tanh")

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows ``x`` grouped by expert, ``counts[e]`` rows for local expert e."""
        dtype = (torch.get_autocast_dtype(x.device.type)
                 if torch.is_autocast_enabled(x.device.type) else self.w_in.dtype)
        grouped = self.fp8 is not None or self.backend == "grouped" or (
            self.backend == "auto" and grouped_mm_usable(x.device, dtype))
        return self._grouped(x, counts, dtype) if grouped else self._loop(x, counts)

    # eager under torch.compile: the row counts are data, so a compiled loop breaks its graph
    # at .tolist() and recompiles for every new count until dynamo's limit sends the frame
    # eager anyway (the compiled-steps test compiled 66 graphs, most of them this loop's)
    @torch.compiler.disable
    def _loop(self, x, counts):
        outs, b_out = [], self._out_bias()
        for e, rows in enumerate(x.split(counts.tolist())):
            h = F.linear(rows, self.w_in[e], None if self.b_in is None else self.b_in[e])
            outs.append(F.linear(self._act(h), self.w_out[e],
                                 None if b_out is None else b_out[e]))
        return torch.cat(outs)

    def _grouped(self, x, counts, dtype):
        align = GROUP_ALIGN_ROWS if self.fp8 is None else FP8_GROUP_ALIGN_ROWS
        dest, padded, total = group_padding(counts, x.shape[0], align)
        xp = pad_rows(x.to(dtype), dest, total)
        offs = torch.cumsum(padded, 0).to(torch.int32)
        if self.fp8 is None:
            cached = (None, None)

            def mm(a, w, c):
                return _grouped_mm_fn()(a, w.to(dtype).transpose(-2, -1), offs=offs)
        else:
            cached = self.fp8_weights or (None, None)

            def mm(a, w, c):
                return fp8_grouped_linear(a, w, offs, self.fp8, c)
        h = mm(xp, self.w_in, cached[0])
        if self.b_in is not None:
            h = h + torch.repeat_interleave(self.b_in.to(dtype), padded, dim=0, output_size=total)
        y = mm(self._act(h), self.w_out, cached[1])
        b_out = self._out_bias()
        if b_out is not None:
            y = y + torch.repeat_interleave(b_out.to(dtype), padded, dim=0, output_size=total)
        return unpad_rows(y, dest)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows with uneven splits; backward sends the gradients back.
    Functional (:mod:`meshplan.executor.functional_comm`): filling a buffer in place cost
    the experts their gradients when compiled under torch 2.11."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return all_to_all(x, group, out_splits, in_splits)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return all_to_all(grad, ctx.group, in_splits, out_splits), None, None, None


class _AuxLossGrad(torch.autograd.Function):
    """Identity on the layer output; in backward, d(scale·aux)/d(aux) = scale flows into the
    router (Megatron-Core's MoEAuxLossAutoScaler)."""

    @staticmethod
    def forward(ctx, y, aux, scale):
        ctx.scale = scale
        ctx.save_for_backward(aux)
        return y

    @staticmethod
    def backward(ctx, grad):
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


def sequence_pieces(s: int, tp_rank: int, tp: int, cp_rank: int, cp: int, *,
                    device=None) -> tuple[torch.Tensor, int]:
    """(the piece of the whole sequence each of this rank's ``s`` tokens lies in, the number
    of pieces): the sequence cut into equal runs of positions such that each lies whole on
    one (tp, cp) rank, in sequence order. A cp rank holds chunks r and 2·cp−1−r of 2·cp
    (:func:`meshplan.executor.data.shard_sequence`) and a tp rank the t-th 1/tp of those
    tokens (sequence parallelism's slice); a piece is a chunk, or the tp slice where that
    is shorter.

    Example: cp 2, tp 2, a 16-token sequence: chunks of 4; cp rank 1 holds positions 4-7
    and 8-11, its tp rank 1 the second half of that, positions 8-11: piece 2 of 4."""
    local = s * tp                                  # this cp rank's tokens of a sequence
    chunk = local // 2 if cp > 1 else local
    length = min(chunk, s)
    if (cp > 1 and local % 2) or chunk % length or s % length:
        raise ExecutorError(f"MoE capacity at tp = {tp}, cp = {cp}: a tp slice of {s} tokens "
                            f"straddles the cp chunks of {chunk}; use tp = 1 or an even tp")
    j = tp_rank * s + torch.arange(s, device=device)    # index among the cp rank's tokens
    if cp > 1:
        first = j < chunk
        which = torch.where(first, torch.full_like(j, cp_rank),
                            torch.full_like(j, 2 * cp - 1 - cp_rank))
        j = which * chunk + j % chunk                   # the position in the sequence
    return j // length, local * cp // length


class MoELayer(nn.Module):
    """An MoE layer's MLP: shared experts (one MLP of width S·f_s) plus routed experts.

    Parallel settings, installed by :mod:`meshplan.executor.expert_parallel`: ``ep_group``
    (None: all experts local), ``tp_group`` with ``slice_tokens`` (tp > 1 without sequence
    parallelism: the routed part runs on this rank's 1/tp of the sequence) or
    ``sequence_parallel`` (the input already is this rank's slice), ``cp_group`` (cp > 1:
    the input is this cp rank's chunks of each sequence).
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.num_experts, self.top_k = spec.num_experts, spec.experts_per_token
        self.sigmoid, self.norm_topk = spec.router == "sigmoid", spec.router_norm_topk
        self.capacity_factor = spec.capacity_factor
        self.router = nn.Linear(spec.hidden_size, spec.num_experts, bias=spec.bias)
        self.experts = GroupedExperts(spec)
        self.shared = (MLP(spec, spec.num_shared_experts * spec.shared_expert_ffn_hidden_size)
                       if spec.num_shared_experts else None)
        self.aux_grad_scale = spec.router_aux_loss_coeff
        self.ep_group = None
        self.tp_group = None
        self.slice_tokens = False
        self.sequence_parallel = False
        self.cp_group = None
        self.etp_group = None
        self.routing = None     # a moe_routing.RoutedRows the runner attaches at ep > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (b, s, h), or this tp rank's (b, s/tp, h) with sequence parallelism
        if self.slice_tokens:
            from meshplan.executor.tensor_parallel import gather_from_slices, scatter_to_sp
            y = gather_from_slices(self._routed(scatter_to_sp(x, self.tp_group)), self.tp_group)
        else:
            y = self._routed(x)
        return y if self.shared is None else y + self.shared(x)

    # ---- routing ---------------------------------------------------------------------
    def _tp_split(self) -> bool:
        return self.tp_group is not None and (self.slice_tokens or self.sequence_parallel)

    def _route(self, x2d: torch.Tensor, b: int, s: int):
        """Gate values and experts of every copy (N·k), the kept-copy mask (or None) and
        the load-balancing loss of these b sequence slices of s tokens.

        Where a sequence's tokens are cut over ranks (tp slices, cp chunks) the counts per
        (sequence, expert) are added up over them, so the balance loss and the capacity see
        the whole sequence. Each rank's loss is then its tokens' share of the sequence's
        (the probabilities summed over its tokens): shares over tp are summed with the
        routers' gradients (the trainer adds them up), shares over cp are averaged with every
        replicated parameter's, hence × cp."""
        e, k = self.num_experts, self.top_k
        with torch.autocast(device_type=x2d.device.type, enabled=False):
            bias = None if self.router.bias is None else self.router.bias.float()
            logits = F.linear(x2d.float(), self.router.weight.float(), bias)     # (N, E)
        probs = torch.sigmoid(logits) if self.sigmoid else torch.softmax(logits, dim=-1)
        gates, idx = probs.topk(k, dim=-1)                                      # (N, k)
        if self.norm_topk:
            gates = gates / gates.sum(-1, keepdim=True)
        seq = torch.arange(x2d.shape[0], device=x2d.device) // s
        key = (seq.unsqueeze(1) * e + idx).reshape(-1)          # (sequence, expert) per copy
        tp = dist.get_world_size(self.tp_group) if self._tp_split() else 1
        cp = 1 if self.cp_group is None else dist.get_world_size(self.cp_group)
        seq_len = s * tp * cp
        keep = None
        if self.capacity_factor is None:
            full = self._whole_sequence_counts(_count(key, b * e), tp, cp)
        else:   # the capacity's counts per piece of the sequence also give the whole's
            before, full = self._copies_before(key, b, s, tp, cp)
            keep = before < math.ceil(self.capacity_factor * seq_len * k / e)
        aux = None
        if torch.is_grad_enabled() and self.aux_grad_scale > 0:
            p = probs / probs.sum(-1, keepdim=True) if self.sigmoid else probs
            p_sum = p.view(b, s, e).sum(1)                                      # (b, E)
            aux = (full.view(b, e).to(p_sum.dtype) * p_sum).sum(-1) * (e * cp
                                                                       / (seq_len ** 2 * k))
            aux = aux.mean()
        return gates.reshape(-1), idx.reshape(-1), keep, aux

    def _whole_sequence_counts(self, counts: torch.Tensor, tp: int, cp: int) -> torch.Tensor:
        """This rank's copies per (sequence, expert) summed over the tp slices and cp chunks
        of each sequence."""
        for group, n in ((self.tp_group, tp), (self.cp_group, cp)):
            if n > 1:
                every = counts.new_empty((n * counts.numel(),))
                dist.all_gather_into_tensor(every, counts.contiguous(), group=group)
                counts = every.view(n, -1).sum(0)
        return counts

    def _copies_before(self, key: torch.Tensor, b: int, s: int, tp: int,
                       cp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """For each copy (``key``: its (sequence, expert)), how many copies of the same key
        sit at earlier positions of the whole sequence, on any tp or cp rank; and the
        copies per key in the whole sequence. Each rank's tokens are cut into the
        sequence's pieces (:func:`sequence_pieces`); the copies per (piece, key) are summed
        over the tp and cp groups (each piece lies on one rank), so a copy's count is its
        rank among its piece's copies of its key plus the copies of that key in every
        earlier piece."""
        tp_rank = dist.get_rank(self.tp_group) if tp > 1 else 0
        cp_rank = dist.get_rank(self.cp_group) if cp > 1 else 0
        piece, pieces = sequence_pieces(s, tp_rank, tp, cp_rank, cp, device=key.device)
        width = b * self.num_experts
        # copies are token-major (token t's k experts), tokens sequence-major
        pkey = piece.repeat(b).repeat_interleave(self.top_k) * width + key
        local = _count(pkey, pieces * width)
        every = local.clone()
        for group, n in ((self.tp_group, tp), (self.cp_group, cp)):
            if n > 1:
                dist.all_reduce(every, group=group)
        every = every.view(pieces, width)
        before = (every.cumsum(0) - every).reshape(-1)
        return _rank_within_key(pkey, local) + before[pkey], every.sum(0)

    def _routed(self, x: torch.Tensor) -> torch.Tensor:
        from meshplan.executor.tensor_parallel import to_compute_dtype
        x = to_compute_dtype(x)      # 16-bit rows through the all-to-alls under autocast
        b, s, h = x.shape
        x2d = x.reshape(b * s, h)
        gates, experts, keep, aux = self._route(x2d, b, s)
        r = sort_copies(experts, keep, b * s, self.top_k, self.num_experts)
        out = self._run_experts(dispatch(x2d, r), r.counts)
        y = combine(out, gates, r)
        if aux is not None:
            y = _AuxLossGrad.apply(y, aux, self.aux_grad_scale)
        return y.view(b, s, h)

    def _local_experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows sorted by local expert (``counts`` per expert) through this rank's experts.
        With etp > 1 each rank of the etp group holds 1/etp of every expert's width: the
        group's rows are gathered (an all-to-all sending this rank's rows to every rank),
        run through the local width in (expert, source) order, and each rank gets back the
        sum of the partial outputs of its own rows (an all-to-all returning each source's
        part, then a sum) — Megatron-Core's all-gather / reduce-scatter around its expert
        tensor parallel MLP, with uneven row counts."""
        group = self.etp_group
        if group is None:
            return self.experts(rows, counts)
        n = dist.get_world_size(group)
        every = counts.new_empty((n * counts.numel(),))
        dist.all_gather_into_tensor(every, counts.contiguous(), group=group)
        every = every.view(n, -1)
        sizes = every.sum(1).tolist()
        mine = sizes[dist.get_rank(group)]
        got = _AllToAll.apply(rows.repeat(n, 1), sizes, [mine] * n, group)
        order = _expert_major_index(every, sum(sizes))
        out = unpad_rows(self.experts(unpad_rows(got, order), every.sum(0)),
                         torch.argsort(order))
        back = _AllToAll.apply(out, [mine] * n, sizes, group)
        y = back.view(n, mine, back.shape[-1]).sum(0)     # mine may be 0
        if self.experts.b_out is not None:
            # each rank's own rows: its b_out gradient is a partial sum over the etp group
            # (expert_parallel.ETP_SUMMED_PARAMS: the trainer adds them up)
            y = y + torch.repeat_interleave(self.experts.b_out.to(y.dtype), counts, dim=0,
                                            output_size=mine)
        return y

    def _run_experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows sorted by expert (``counts`` per expert, all E) through their experts,
        wherever those live in the ep group; returns the outputs in the same order."""
        group = self.ep_group
        if group is None or dist.get_world_size(group) == 1:
            return self._local_experts(rows, counts)
        ep = dist.get_world_size(group)
        send = counts.view(ep, self.num_experts // ep)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        # the one synchronisation of the layer: all_to_all_single takes its splits as
        # host integers (both read back together)
        in_splits, out_splits = torch.stack([send.sum(1), recv.sum(1)]).tolist()
        if self.routing is not None and not torch.compiler.is_compiling():
            self.routing.add(sum(out_splits))    # the rows this rank computes: ρ as run
        got = _AllToAll.apply(rows, out_splits, in_splits, group)
        regroup = _expert_major_index(recv, sum(out_splits))
        # both reorders are permutations: unpad_rows' backward writes each row back by
        # index instead of index_select's accumulating (atomic) index_add
        out = self._local_experts(unpad_rows(got, regroup), recv.sum(0))
        back = unpad_rows(out, torch.argsort(regroup))
        return _AllToAll.apply(back, in_splits, out_splits, group)


# the token movement's names stay importable from here (meshplan.executor.moe_permute)
__all__ = ["MoELayer", "GroupedExperts", "GROUP_ALIGN_ROWS", "SortedCopies", "combine",
           "dispatch", "group_padding", "grouped_mm_usable", "pad_rows", "sort_copies",
           "unpad_rows"]
