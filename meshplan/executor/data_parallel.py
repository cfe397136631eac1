"""Data parallelism and the optimizer: ZeRO stages 0-3 (Rajbhandari et al. 2019, arXiv 1910.02054).

* ZeRO-0: every dp rank keeps everything; gradients are all-reduced (averaged) over the
  dp group by ``DistributedDataParallel``, overlapped with the backward pass in buckets.
* ZeRO-1 (P_os): DDP's gradient all-reduce plus
  ``torch.distributed.optim.ZeroRedundancyOptimizer``, which keeps the Adam states of
  1/dp of the parameters on each rank and broadcasts the updated parameters — one
  broadcast per rank's flat bucket (``parameters_as_bucket_view=True``). Without bucket
  views it broadcasts every parameter tensor on its own (read from torch's source), which
  the cost model's one all-gather does not price: GPT-0.54B (292 tensors) at dp 4 ZeRO-1
  ran 12-21 ms a step (about 4 %) slower than predicted in all four measured layouts
  (holdout8 q06, holdout13 v08, holdout20 d04, holdout22 o01; round 23).
* ZeRO-2 (P_os+g) / ZeRO-3 (P_os+g+p): FSDP2 ``fully_shard`` per transformer block and
  at the root on the dp mesh, ``reshard_after_forward`` False / True. Gradients are
  reduce-scattered; with ZeRO-3 the parameters are all-gathered before each use. Each
  block's all-gather is started one block early (explicit forward prefetch,
  :func:`set_forward_prefetch`).

Precision: fp32 on CPU. On GPU, bf16 compute with fp32 master weights: ZeRO-0/1 keep fp32
parameters and run forward/backward under ``torch.autocast(bfloat16)`` (the fp32
parameters are the master copy); ZeRO-2/3 use FSDP2's ``MixedPrecisionPolicy``
(bf16 unsharded parameters, fp32 sharded master parameters and fp32 gradient reduction).
AdamW (Loshchilov & Hutter 2017, arXiv 1711.05101) is ``fused=True`` on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1


def wrap_data_parallel(module: nn.Module, *, zero: int, groups, device: torch.device,
                       bf16: bool, pipelined: bool) -> nn.Module:
    """Return the module the training loop calls (DDP-wrapped, FSDP-sharded or as is).

    Under a pipeline schedule ZeRO-0/1 do not use DDP: its bucket rebuilding fails on the
    schedule's per-micro-batch backward calls (torch 2.13: "rebuilt parameter indices size
    is not same as original model parameters size"); :func:`allreduce_grads` reduces the
    gradients after the schedule instead (not overlapped with the backward pass).
    """
    if zero >= 2:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if bf16 else MixedPrecisionPolicy())
        reshard = zero == 3
        blocks = list(module.layers.values())
        for block in blocks:
            fully_shard(block, mesh=groups.dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(module, mesh=groups.dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
        set_forward_prefetch(module, blocks)
        return module
    if groups.dp > 1 and not pipelined:
        from torch.nn.parallel import DistributedDataParallel as DDP
        # Dynamo's DDPOptimizer would cut each compiled block at DDP's bucket boundaries —
        # under ZeroRedundancyOptimizer's bucket views after every parameter (6 pieces a
        # Llama block). Measured on 1 x H200 (docs/benchmarks/fp8_checks.md, fp8_probe.py): fp8
        # steps 199.6 ms split against 126.4 ms whole, bf16 124.9 against 124.2. Blocks are compiled
        # one by one, so whole blocks still let DDP reduce a block's gradients as its backward ends;
        # and the calibrated compiled rows time whole blocks.
        # bound as ``dynamo``: ``import torch._dynamo`` would make ``torch`` a local name of
        # the whole function, unbound in the FSDP2 branch above
        import torch._dynamo as dynamo
        dynamo.config.optimize_ddp = False
        return DDP(module, process_group=groups.dp_group,
                   device_ids=[device.index] if device.type == "cuda" else None,
                   gradient_as_bucket_view=True)
    return module


def set_forward_prefetch(root: nn.Module, blocks: list[nn.Module]) -> None:
    """FSDP2 explicit forward prefetch: the root and each block start the next block's
    all-gather in their own pre-forward hook.

    Why: without it FSDP2 issues block i+1's all-gather only when the CPU reaches block
    i+1's pre-forward (implicit prefetch), so the gather overlaps block i's compute only
    while the CPU runs ahead of the GPU. In the FSDP2 dp 4 runs of 2026-11-28 (gpt3-1.3b,
    4 × H200) the CPU dispatched the forward about as fast as the GPU ran it (43-55 ms host
    against 54-62 ms device per step), so each block's gather (0.33 ms, 100 MB of bf16
    weights on 4 ranks) could wait behind the CPU. One block ahead is FSDP2's documented
    pattern (``FSDPModule.set_modules_to_forward_prefetch``); it holds one more block's
    unsharded weights while the previous block computes. Activation recompute is not
    affected: FSDP2 prefetches only in the forward pass, not in a recompute during
    backward."""
    if not blocks:
        return
    root.set_modules_to_forward_prefetch([blocks[0]])
    for block, nxt in zip(blocks, blocks[1:]):
        block.set_modules_to_forward_prefetch([nxt])


def allreduce_grads(params: list[nn.Parameter], group, dp: int,
                    bucket_bytes: int = 64 << 20) -> None:
    """Average gradients over the dp group in flat buckets of about ``bucket_bytes``."""
    grads = [p.grad for p in params if p.grad is not None]
    bucket: list[torch.Tensor] = []
    size = 0

    def flush():
        if not bucket:
            return
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, group=group)
        flat.div_(dp)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        bucket.clear()

    for g in grads:
        bucket.append(g)
        size += g.numel() * g.element_size()
        if size >= bucket_bytes:
            flush()
            size = 0
    flush()


def build_optimizer(params: list[nn.Parameter], *, zero: int, groups, device: torch.device,
                    config: OptimizerConfig) -> torch.optim.Optimizer:
    kwargs = dict(lr=config.lr, betas=config.betas, eps=config.eps,
                  weight_decay=config.weight_decay)
    if device.type == "cuda":
        kwargs["fused"] = True
    if zero == 1 and groups.dp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                       process_group=groups.dp_group,
                                       parameters_as_bucket_view=True, **kwargs)
    return torch.optim.AdamW(params, **kwargs)


__all__ = ["OptimizerConfig", "wrap_data_parallel", "set_forward_prefetch", "build_optimizer"]
