"""What zero-bubble's split backward keeps and needs, measured on a stack of blocks.

torch.distributed.pipelining splits a stage's backward into B (``stage_backward_input``:
input gradients) and W (``stage_backward_weight``: weight gradients, deferred). Between the
two a micro-batch keeps more than its activations, and while W runs it needs more again.
With full recomputation (non-reentrant checkpointing) both depend on the block's
structure: W makes one ``torch.autograd.grad`` call per parameter group, every call re-runs
the block's forward, and what a call does not consume stays until the stage's graph is
freed. An emulation on CPU (``benchmarks/emulate_split_memory.py``: bf16 autocast,
stacks of 2/6/12 blocks of the validation models' structure scaled down) gave a W
transient of 2.3-2.9 no-recompute activation sets per layer for GPT-style blocks
(biases, LayerNorm, GELU) and 3.4-3.9 for Llama-style ones (RMSNorm, SwiGLU), falling
with the stack's depth; on 4 × H200 a Llama stage measured 4.1
(``ZB_FULL_W_TRANSIENT_SETS`` in :mod:`meshplan.costmodel.estimate`) and GPT stages
2.2-3.0 on 4 × H100 (round 10). So it is measured per model rather than taken as one
constant.

:func:`split_memory_per_layer` runs one fresh forward, B and W on the given module and
returns per layer (bytes):

* ``pending``: live after B − live before the forward − the stage's output, output
  gradient and input gradient − the blocks' inputs, the stage's own included (which
  checkpointing keeps and the cost model counts as activations): what one micro-batch
  waiting for its W adds;
* ``transient``: peak during W − live before W.

On CUDA from the caching allocator's counters; on CPU, which has none, from
:class:`LiveBytes`, which follows every tensor storage an operator creates.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable


def _live_bytes_mode():
    """A ``TorchDispatchMode`` counting the bytes of live storages created inside it."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveBytes(TorchDispatchMode):
        """Bytes of the storages operators created inside the mode that are still alive
        (and the peak): a storage counts from its first tensor until the last tensor seen
        on it dies (tensors made by autograd's C++ side without passing an operator are
        not seen; views of a seen storage are). Under gloo a collective's buffer counts until
        the backend's worker thread drops its reference, which can come after the caller's
        wait returns, so with tp > 1 on CPU a reading can be one buffer off (CPU only: on
        CUDA the allocator's counters are read)."""

        def __init__(self):
            super().__init__()
            self.cur = self.peak = 0
            self._bytes: dict[int, int] = {}
            self._refs: dict[int, int] = {}

        def _seen(self, t) -> None:
            s = t.untyped_storage()
            key, n = s.data_ptr(), s.nbytes()
            if n == 0:
                return
            if key in self._bytes:
                self._refs[key] += 1
            else:
                self._bytes[key], self._refs[key] = n, 1
                self.cur += n
                self.peak = max(self.peak, self.cur)

            def gone(key=key):
                if key in self._refs:
                    self._refs[key] -= 1
                    if self._refs[key] == 0:
                        del self._refs[key]
                        self.cur -= self._bytes.pop(key)
            weakref.finalize(t, gone)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self._seen(t)
            return out

        def reset_peak(self) -> None:
            self.peak = self.cur

    return LiveBytes()


class _Reader:
    """live() / reset_peak() / peak() on CUDA (allocator) or CPU (:class:`LiveBytes`)."""

    def __init__(self, device):
        import torch
        self.torch, self.device = torch, device
        self.cuda = device.type == "cuda"
        self.mode = None if self.cuda else _live_bytes_mode()

    def __enter__(self):
        if self.mode is not None:
            self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self.mode is not None:
            self.mode.__exit__(*exc)
        return False

    def live(self) -> float:
        if self.cuda:
            return float(self.torch.cuda.memory_allocated(self.device))
        return float(self.mode.cur)

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.mode.reset_peak()

    def peak(self) -> float:
        if self.cuda:
            return float(self.torch.cuda.max_memory_allocated(self.device))
        return float(self.mode.peak)


def split_memory_per_layer(module, make_input: Callable[[], Any], layers: int, device
                           ) -> tuple[float, float]:
    """(pending, transient) bytes per layer of zero-bubble's split backward of ``module``
    (``layers`` blocks; see the module docstring); (0, 0) where this torch has no split
    backward. ``make_input()`` returns a fresh stage input that requires grad; call it under
    the autocast context the stage runs in."""
    from meshplan.calibrate.bench_split import split_functions
    import torch
    fns = split_functions()
    if fns is None:
        return 0.0, 0.0
    backward_input, backward_weight = fns
    params = list(module.parameters())
    for p in params:      # later micro-batches accumulate into existing gradients
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    module(make_input())   # fills autocast's weight-copy cache, which is no micro-batch's
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with _Reader(device) as mem:
        before = mem.live()
        x = make_input()
        y = module(x)                                      # (mb, s, h)
        gy = torch.randn_like(y)
        grads_in, groups = backward_input([y], [gy], [x], iter(params))
        hidden = x.numel() * x.element_size()          # one block's input
        own = sum(t.numel() * t.element_size() for t in (y, gy, *grads_in) if t is not None)
        pending = max(0.0, mem.live() - before - own - layers * hidden) / layers
        mem.reset_peak()
        before_w = mem.live()
        backward_weight(iter(params), groups)
        transient = max(0.0, mem.peak() - before_w) / layers
        del x, y, gy, grads_in, groups
    return pending, transient


__all__ = ["split_memory_per_layer"]
