"""Selective recompute inside a compiled block: one graph (the attention core checkpointed
in it), eager's gradients, the core's intermediates not kept, and autocast's weight casts of
the eager parts left cached (docs/benchmarks/host.md, section 6)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from meshplan.executor.attention_core import AttentionCore, _RecomputedCore  # noqa: E402
from meshplan.executor.attention_core import recomputed_core  # noqa: E402
from meshplan.executor.model import Transformer, cross_entropy  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402

LLAMA = ModelSpec(name="l", num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2,
                  ffn_hidden_size=40, vocab_size=96, max_seq_len=16, activation="swiglu",
                  norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False)
BATCH = torch.randint(0, 96, (2, 17), generator=torch.Generator().manual_seed(3))


def _grads(recompute: bool, compiled: bool) -> dict:
    m = Transformer(LLAMA)
    m.init_weights(1)
    for block in m.layers.values():
        block.attn.recompute_core = recompute
        if compiled:
            block.compile(backend="aot_eager", fullgraph=True)   # fullgraph: no break
    cross_entropy(m(BATCH[:, :-1]), BATCH[:, 1:]).backward()
    return {n: p.grad for n, p in m.named_parameters()}


def test_a_compiled_block_with_selective_recompute_is_one_graph_with_eagers_gradients():
    import torch._dynamo
    torch._dynamo.reset()
    want = _grads(recompute=False, compiled=False)
    got = _grads(recompute=True, compiled=True)   # fullgraph=True raises on a graph break
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-7)


def _saved(fn, *args) -> list[tuple]:
    """(dtype, bytes) of each tensor the call saves for its backward."""
    saved = []

    def pack(t):
        saved.append((t.dtype, t.numel() * t.element_size()))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return saved


def test_compiled_recompute_keeps_only_the_cores_inputs():
    import torch._dynamo
    torch._dynamo.reset()
    core = AttentionCore()
    q, k, v = (torch.randn(2, 4, 64, 8, requires_grad=True) for _ in range(3))

    def kept(f):
        compiled = torch.compile(lambda a, b, c: f(a * 2, b * 2, c * 2).sum(),
                                 backend="aot_eager", fullgraph=True)
        compiled(q, k, v)                                   # compiles
        return _saved(compiled, q, k, v)
    recomputed = kept(lambda a, b, c: recomputed_core(core, a, b, c))
    plain = kept(core)
    size = q.numel() * q.element_size()
    # the three inputs; beside them at most a generator state the checkpoint keeps (uint8,
    # a few KiB), where the plain core keeps its output and statistics too
    assert [b for d, b in recomputed if d.is_floating_point] == [size] * 3
    assert all(d == torch.uint8 and b < 8192 for d, b in recomputed if not d.is_floating_point)
    assert sum(b for d, b in plain if d.is_floating_point) > 3 * size


def test_eager_recompute_and_other_cores_keep_the_autograd_function(monkeypatch):
    calls = []
    real = _RecomputedCore.apply
    monkeypatch.setattr(_RecomputedCore, "apply", lambda *a: calls.append(a[0]) or real(*a))

    class Ring(AttentionCore):      # a context-parallel core: its own collectives
        pass
    q, k, v = (torch.randn(1, 2, 8, 4, requires_grad=True) for _ in range(3))
    for core in (AttentionCore(), Ring()):
        recomputed_core(core, q, k, v).sum().backward()
    assert [type(c).__name__ for c in calls] == ["AttentionCore", "Ring"]


def test_compiled_recompute_leaves_autocasts_cast_cache_to_the_eager_parts():
    """An eager linear's bf16 weight cast (the output layer's: no block weight has its
    shape), made under autocast, is still cached after a backward on another thread (as
    CUDA's engine runs it) through a compiled block that recomputes its core: the next
    forward saves the same cast."""
    import threading

    import torch._dynamo
    torch._dynamo.reset()
    m = Transformer(LLAMA)
    m.init_weights(0)
    for block in m.layers.values():
        block.attn.recompute_core = True
        block.compile(backend="aot_eager")
    weight = m.output.weight
    x = BATCH[:, :-1]
    seen: list[list] = []

    def pack(t):
        if t.dtype == torch.bfloat16 and t.shape in (weight.shape, weight.t().shape):
            seen[-1].append(t)
        return t
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            seen.append([])
            first = m(x)
        worker = threading.Thread(target=lambda: first.float().sum().backward())
        worker.start()
        worker.join()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            seen.append([])
            m(x)
    before, after = ({t.untyped_storage().data_ptr() for t in casts} for casts in seen)
    assert before and before == after
