"""The executor's routed MoE part keeps what :mod:`meshplan.costmodel.moe_torch_memory`
counts: torch's ``saved_tensors_hooks`` around ``MoELayer`` (no shared experts, ep 1, the
grouped GEMM, bf16 under autocast), every saved storage counted once, the weights and the
experts' 16-bit weight copies left out (they are counted with the weights)."""

from __future__ import annotations

import dataclasses

import pytest

import meshplan as mp
from meshplan.costmodel import moe_torch_memory as mtm

torch = pytest.importorskip("torch")

from meshplan.executor.moe import GROUP_ALIGN_ROWS, MoELayer, _grouped_mm_fn  # noqa: E402

BASE = mp.ModelSpec(name="m", num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=4,
                    ffn_hidden_size=128, vocab_size=64, max_seq_len=64, activation="swiglu",
                    norm="rmsnorm", position_embedding="rope", tied_embeddings=False,
                    bias=False, num_experts=4, experts_per_token=2, moe_ffn_hidden_size=96)
B, S = 2, 64


def _kept_bytes(spec: mp.ModelSpec) -> tuple[int, int]:
    """(bytes the layer's forward saves for backward, weights excluded; kept copies)."""
    torch.manual_seed(0)
    layer = MoELayer(spec)
    layer.experts.backend = "grouped"
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(B, S, spec.hidden_size)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    # the experts' 16-bit weight copies the grouped GEMMs keep: counted with the weights
    copies_of = {p.numel() for p in (layer.experts.w_in, layer.experts.w_out)}
    seen: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        weight_copy = t.dim() == 3 and t.numel() in copies_of
        if key not in params and not weight_copy:
            seen[key] = t.untyped_storage().nbytes()
        return t
    copies = []
    route = layer._route

    def spy(*a, **kw):              # the kept copies under a capacity
        out = route(*a, **kw)
        copies.append(B * S * spec.experts_per_token if out[2] is None else int(out[2].sum()))
        return out
    layer._route = spy
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x.requires_grad_())
    return sum(seen.values()), copies[0]


def test_the_padding_constant_is_the_executors():
    assert mtm.GROUP_ALIGN_ROWS == GROUP_ALIGN_ROWS


@pytest.mark.skipif(_grouped_mm_fn() is None, reason="this torch has no grouped_mm")
@pytest.mark.parametrize("change", [
    {}, {"activation": "gelu"}, {"router": "sigmoid"}, {"router_norm_topk": False},
    {"router_aux_loss_coeff": 0.0}, {"bias": True},
    {"activation": "gelu", "router": "sigmoid", "bias": True, "experts_per_token": 1},
    {"capacity_factor": 0.5}], ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "base")
def test_kept_bytes_match_what_the_executor_saves(change):
    spec = dataclasses.replace(BASE, **change)
    got, copies = _kept_bytes(spec)
    tokens = B * S
    job = mp.Job(global_batch=B, seq_len=S, precision="bf16", runtime="torch")
    acts = mtm.routed_activations(spec, job, mp.Layout(micro_batch=B), tokens, rows=copies,
                                  copies=copies)
    # the balance loss's per-sequence sums and counts (a few hundred bytes) are not counted
    assert acts.kept_bytes == pytest.approx(got, rel=0.01), (acts, got)
