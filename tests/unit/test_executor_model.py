"""The executor's model: shapes, parameter counts, per-name deterministic init, parts."""

import pytest

torch = pytest.importorskip("torch")

from meshplan.costmodel.specs import ModelSpec  # noqa: E402
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
