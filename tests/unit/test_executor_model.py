"""The executor's model: shapes, parameter counts, per-name deterministic init, parts."""

import pytest

torch = pytest.importorskip("torch")

from meshplan.spec import ModelSpec  # noqa: E402
from meshplan.executor.model import Transformer  # noqa: E402

GPT = ModelSpec(name="g", num_layers=3, hidden_size=32, num_heads=4, vocab_size=96, max_seq_len=16)
LLAMA = ModelSpec(name="l", num_layers=3, hidden_size=32, num_heads=4, num_kv_heads=2,
                  ffn_hidden_size=48, vocab_size=96, max_seq_len=16, activation="swiglu",
                  norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False)


@pytest.mark.parametrize("spec", [LLAMA], ids=["llama"])
def test_parameter_count_matches_modelspec(spec):
    m = Transformer(spec)
    assert sum(p.numel() for p in m.parameters()) == spec.num_params()


def test_gpt_parameter_count_matches_modelspec():
    # nn.LayerNorm has weight and bias (2h each), as Narayanan eq. 2 counts them
    m = Transformer(GPT)
    assert sum(p.numel() for p in m.parameters()) == GPT.num_params()


@pytest.mark.parametrize("spec", [GPT, LLAMA], ids=["gpt", "llama"])
def test_forward_shape_and_causality(spec):
    m = Transformer(spec)
    m.init_weights(0)
    x = torch.randint(0, spec.vocab_size, (2, 12))
    y = m(x)
    assert y.shape == (2, 12, spec.vocab_size)
    x2 = x.clone()
    x2[:, 8:] = (x2[:, 8:] + 1) % spec.vocab_size     # change only the future
    torch.testing.assert_close(m(x2)[:, :8], y[:, :8], rtol=0, atol=0)


@pytest.mark.parametrize("spec", [GPT, LLAMA], ids=["gpt", "llama"])
def test_parts_are_initialized_like_the_full_model(spec):
    full = Transformer(spec)
    full.init_weights(7)
    whole = dict(full.named_parameters())
    for first, n, emb, logits in ((0, 1, True, False), (1, 1, False, False), (2, 1, False, True)):
        with torch.device("meta"):
            part = Transformer(spec)
        part.keep_part(first, n, embeds_input=emb, computes_logits=logits)
        part.to_empty(device="cpu")
        part.init_weights(7)
        names = [k for k, _ in part.named_parameters()]
        assert all(k.startswith(f"layers.{first}.") or not k.startswith("layers.") for k in names)
        for k, p in part.named_parameters():
            torch.testing.assert_close(p, whole[k], rtol=0, atol=0)


def test_parts_compose_to_the_full_forward():
    full = Transformer(LLAMA)
    full.init_weights(3)
    parts = []
    for first, n, emb, logits in ((0, 2, True, False), (2, 1, False, True)):
        p = Transformer(LLAMA)
        p.keep_part(first, n, embeds_input=emb, computes_logits=logits)
        p.init_weights(3)
        parts.append(p)
    x = torch.randint(0, LLAMA.vocab_size, (2, 10))
    torch.testing.assert_close(parts[1](parts[0](x)), full(x), rtol=1e-6, atol=1e-6)


def test_tied_last_part_keeps_embedding_weight_only_for_the_head():
    p = Transformer(GPT).keep_part(2, 1, embeds_input=False, computes_logits=True)
    assert p.tok_embeddings is not None and p.pos_embeddings is None
    mid = Transformer(GPT).keep_part(1, 1, embeds_input=False, computes_logits=False)
    assert mid.tok_embeddings is None and mid.norm is None and mid.output is None


def _grads(spec, recompute_core, x):
    m = Transformer(spec)
    m.init_weights(0)
    for block in m.layers.values():
        block.attn.recompute_core = recompute_core
    m(x).float().pow(2).mean().backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("spec", [GPT, LLAMA], ids=["gpt", "llama"])
def test_selective_recompute_gives_the_same_gradients(spec):
    x = torch.randint(0, spec.vocab_size, (2, 12))
    plain, recomputed = _grads(spec, False, x), _grads(spec, True, x)
    assert plain.keys() == recomputed.keys()
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], msg=name)


def _casts_around_threaded_backward(forward, is_cast):
    """Under CPU bf16 autocast: run ``forward()``, its backward on another thread (as CUDA's
    autograd engine does), then ``forward()`` again; the storages of the saved tensors that
    ``is_cast`` picks in the first and the second forward, as two sets. The casts themselves
    are kept until the end, so no address is freed and reused between the two."""
    import threading
    seen: list[list] = []

    def pack(t):
        if is_cast(t):
            seen[-1].append(t)
        return t
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            seen.append([])
            first = forward()
        worker = threading.Thread(target=lambda: first.float().sum().backward())
        worker.start()
        worker.join()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            seen.append([])
            forward()
    return tuple({t.untyped_storage().data_ptr() for t in casts} for casts in seen)


def test_selective_recompute_keeps_autocasts_weight_casts():
    """Under autocast, a backward (on another thread, as CUDA's engine runs it) with the
    attention core recomputed must not clear autocast's cast cache: the next micro-batch's
    forward saves the same 16-bit weight casts, not new copies (torch.utils.checkpoint
    would clear it: test_torch_checkpoint_clears_the_cast_cache_from_the_backward_thread)."""
    m = Transformer(LLAMA)
    m.init_weights(0)
    for block in m.layers.values():
        block.attn.recompute_core = True
    weight = m.layers["0"].mlp.fc.weight
    x = torch.randint(0, LLAMA.vocab_size, (2, 12))
    before, after = _casts_around_threaded_backward(
        lambda: m(x),
        lambda t: t.dtype == torch.bfloat16 and t.shape in (weight.shape, weight.t().shape))
    assert before and before == after
    assert weight.grad is not None


def test_torch_checkpoint_clears_the_cast_cache_from_the_backward_thread():
    """Why the executor does not use torch.utils.checkpoint for selective recompute, on the
    installed torch: with a checkpointed region the backward (run on another thread, as
    CUDA's autograd engine does) clears autocast's cache, so the next forward saves a new
    cast of the same weight; without it the cast is reused. Should torch stop doing this,
    the test fails and _RecomputedCore can go."""
    from torch.utils.checkpoint import checkpoint

    lin1, lin2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(selective):
        a = lin1(torch.randn(4, 16, requires_grad=True))
        b = checkpoint(torch.relu, a, use_reentrant=False) if selective else torch.relu(a)
        return lin2(b)

    def is_cast(t):
        return t.dtype == torch.bfloat16 and tuple(t.shape) == (16, 16)

    before, after = _casts_around_threaded_backward(lambda: forward(False), is_cast)
    assert before and before == after
    before, after = _casts_around_threaded_backward(lambda: forward(True), is_cast)
    assert before and after and not before & after
