"""Count what a piece of the executor executes: attention kernel calls (with the query-key
pairs each computes) and the memory traffic of every other op, on any device (CPU tests
and benchmarks/cp_ring_count.py run it on tiny shapes; the counts scale with the shapes).

:class:`OpCounter` is a ``TorchDispatchMode``: it sees each aten op after autograd, so a
forward and its backward are both counted, and records

* attention kernels (flash, cuDNN, memory-efficient and the CPU flash kernel, forward and
  backward): batch, heads, query and key lengths, head dim, causal flag — the pairs a kernel
  computes are q·k, or q(q+1)/2 when causal (square blocks only: every block the executor's
  cores run is square when causal);
* every other op that moves data: the bytes of its tensor inputs read and its outputs
  written, once each. Views and ``empty*`` allocations move nothing; ``*_like`` factories
  read nothing; ``copy_`` does not read its destination, and a ``copy_`` of a view onto
  the same view (what Python's ``a[i] += b`` ends with) moves nothing, as ATen's copy
  returns early there. Other in-place ops read what they write (``a += b`` reads a and
  b); an expanded view's repeated elements are read once. Communication ops (``c10d``)
  are kept apart.

This is a count of what the code asks for, not of what a fused or cached kernel may skip.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def _attention_ops() -> dict:
    names = {"_scaled_dot_product_flash_attention": "forward",
             "_scaled_dot_product_flash_attention_backward": "backward",
             "_scaled_dot_product_flash_attention_for_cpu": "forward",
             "_scaled_dot_product_flash_attention_for_cpu_backward": "backward",
             "_scaled_dot_product_cudnn_attention": "forward",
             "_scaled_dot_product_cudnn_attention_backward": "backward",
             "_scaled_dot_product_efficient_attention": "forward",
             "_scaled_dot_product_efficient_attention_backward": "backward"}
    return {getattr(aten, n).default: d for n, d in names.items() if hasattr(aten, n)}


@dataclass(frozen=True, kw_only=True)
class AttentionCall:
    """One attention kernel call."""
    direction: str           # "forward" | "backward"
    batch: int
    heads: int
    q_len: int
    k_len: int
    head_dim: int
    causal: bool

    @property
    def pairs(self) -> int:
        """Query-key pairs per (sequence, head) the kernel computes."""
        if self.causal:
            return self.q_len * (self.q_len + 1) // 2
        return self.q_len * self.k_len

    @property
    def forward_flops(self) -> float:
        """QKᵀ and PV of the pairs: 4·d FLOPs a pair and head (the backward's work is a
        multiple of it, :data:`meshplan.costmodel.compute.FLASH_BACKWARD_FACTOR`)."""
        return 4.0 * self.head_dim * self.heads * self.batch * self.pairs


def _nbytes(x) -> int:
    """Bytes of the distinct elements a tensor covers (an expanded view's repeats are
    read once)."""
    if isinstance(x, torch.Tensor):
        n = 1
        for size, stride in zip(x.shape, x.stride()):
            n *= size if stride else 1
        return n * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


def _same_data(a: torch.Tensor, b) -> bool:
    return (isinstance(b, torch.Tensor) and a.data_ptr() == b.data_ptr()
            and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype)


class OpCounter(TorchDispatchMode):
    """``with OpCounter() as c: ...`` then ``c.attention`` (list of :class:`AttentionCall`),
    ``c.memory_bytes`` (bytes moved by the other ops), ``c.memory_ops`` (op -> bytes),
    ``c.comm_ops`` (c10d op -> calls)."""

    def __init__(self):
        super().__init__()
        self._attention = _attention_ops()
        self.attention: list[AttentionCall] = []
        self.memory_ops: Counter = Counter()
        self.comm_ops: Counter = Counter()

    @property
    def memory_bytes(self) -> int:
        return sum(self.memory_ops.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.name()
        if func in self._attention:
            self._record_attention(func, args, kwargs)
        elif name.startswith("c10d"):
            self.comm_ops[name] += 1
        elif not func.is_view and "empty" not in name:
            self.memory_ops[name] += self._traffic(func, args, out)
        return out

    def _record_attention(self, func, args, kwargs):
        names = [a.name for a in func._schema.arguments]
        bound = dict(zip(names, args)) | kwargs
        q, k = bound["query"], bound["key"]
        self.attention.append(AttentionCall(
            direction=self._attention[func], batch=q.shape[0], heads=q.shape[1],
            q_len=q.shape[2], k_len=k.shape[2], head_dim=q.shape[3],
            causal=bool(bound.get("is_causal", False))))

    @staticmethod
    def _traffic(func, args, out) -> int:
        written = _nbytes(out)
        if func.name() == "aten::copy_" and _same_data(args[0], args[1]):
            return 0
        if func.name().endswith("_like"):
            return written
        schema = func._schema.arguments
        read = 0
        for i, a in enumerate(args):
            is_dest = (i < len(schema) and schema[i].alias_info is not None
                       and schema[i].alias_info.is_write)
            if is_dest and func.name() == "aten::copy_":
                continue
            read += _nbytes(a)
        return read + written


__all__ = ["AttentionCall", "OpCounter"]
