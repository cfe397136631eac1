"""The executor's MoE layer in one process: parameter count, router and load-balancing
gradient against a direct implementation, capacity dropping, grouped GEMM vs loop, and the
expert-parallel rank arithmetic."""

from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")

from meshplan.errors import ExecutorError  # noqa: E402
from meshplan.executor import expert_parallel as epm  # noqa: E402
from meshplan.executor.model import Transformer, cross_entropy  # noqa: E402
from meshplan.executor.moe import GroupedExperts, MoELayer, _grouped_mm_fn  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402

MOE = ModelSpec(name="tiny-moe", num_layers=3, hidden_size=32, num_heads=4, num_kv_heads=2,
                ffn_hidden_size=48, vocab_size=64, max_seq_len=16, activation="swiglu",
                norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False,
                num_experts=4, experts_per_token=2, moe_ffn_hidden_size=24,
                num_shared_experts=1, shared_expert_ffn_hidden_size=16, dense_layers=(0,))
GPT_MOE = ModelSpec(name="tiny-gpt-moe", num_layers=2, hidden_size=32, num_heads=4,
                    vocab_size=64, max_seq_len=16, num_experts=4, experts_per_token=1,
                    router="sigmoid")


@pytest.mark.parametrize("spec", [MOE, GPT_MOE], ids=["swiglu-shared", "gelu-bias-sigmoid"])
def test_parameter_count_matches_modelspec(spec):
    m = Transformer(spec)
    assert sum(p.numel() for p in m.parameters()) == spec.num_params()
    assert isinstance(m.layers["1"].mlp, MoELayer)


def test_executor_refuses_multi_token_prediction():
    # MLA itself runs (tests/unit/test_executor_mla.py); MTP is refused by name
    spec = dataclasses.replace(MOE, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=8,
                               v_head_dim=8, head_dim=None, num_kv_heads=None, mtp_layers=1)
    with pytest.raises(ExecutorError, match="mtp_layers = 1"):
        Transformer(spec)


def _direct_moe(layer: MoELayer, x: torch.Tensor, coeff: float):
    """The layer's math written token by token: output and the load-balancing loss."""
    b, s, h = x.shape
    e, k = layer.num_experts, layer.top_k
    out = torch.zeros_like(x)
    aux = x.new_zeros(())
    ex = layer.experts
    for j in range(b):
        logits = x[j] @ layer.router.weight.T
        probs = torch.sigmoid(logits) if layer.sigmoid else torch.softmax(logits, -1)
        gates, idx = probs.topk(k, -1)
        if layer.norm_topk:
            gates = gates / gates.sum(-1, keepdim=True)
        counts = torch.zeros(e)
        for t in range(s):
            for c in range(k):
                i = int(idx[t, c])
                counts[i] += 1
                hid = ex.w_in[i] @ x[j, t]
                gate, up = hid.chunk(2)
                out[j, t] += gates[t, c] * (ex.w_out[i] @ (torch.nn.functional.silu(gate) * up))
        p = probs / probs.sum(-1, keepdim=True) if layer.sigmoid else probs
        aux = aux + e * ((counts / (k * s)) * p.mean(0)).sum() / b
    if layer.shared is not None:
        out = out + layer.shared(x)
    return out, coeff * aux


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
def test_layer_output_and_balance_loss_gradient_match_a_direct_implementation(router):
    spec = dataclasses.replace(MOE, router=router, router_aux_loss_coeff=0.1)
    torch.manual_seed(0)
    layer = MoELayer(spec)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 6, 32)
    w = torch.randn(2, 6, 32)
    y = layer(x)
    (y * w).sum().backward()                      # the balance loss enters through backward
    got = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    ref_y, aux = _direct_moe(layer, x, 0.1)
    ((ref_y * w).sum() + aux).backward()
    # fp32, different summation order (token by token vs grouped rows): outputs are O(1),
    # so absolute differences of a few 1e-6 are rounding
    scale = float(ref_y.detach().abs().max())
    torch.testing.assert_close(y, ref_y, rtol=1e-5, atol=1e-5 * scale)
    for n, p in layer.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-5,
                                   atol=1e-5 * float(p.grad.abs().max()), msg=n)
    assert got["router.weight"].abs().sum() > 0


def test_capacity_drops_later_positions_of_a_sequence():
    # all tokens identical: every copy goes to the same k experts; capacity
    # ceil(0.5 · 8 tokens · 2 / 4) = 2 keeps the first 2 positions of each sequence
    spec = dataclasses.replace(MOE, capacity_factor=0.5, num_shared_experts=0,
                               shared_expert_ffn_hidden_size=None)
    torch.manual_seed(1)
    layer = MoELayer(spec)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(1, 1, 32).expand(2, 8, 32).contiguous()
    y = layer(x)
    assert math.ceil(0.5 * 8 * 2 / 4) == 2
    assert y[:, :2].abs().sum() > 0
    torch.testing.assert_close(y[:, 2:], torch.zeros_like(y[:, 2:]), rtol=0, atol=0)


@pytest.mark.skipif(_grouped_mm_fn() is None, reason="this torch has no grouped_mm")
@pytest.mark.parametrize("bias", [False, True])
def test_grouped_gemm_matches_the_loop(bias):
    """The grouped path (with its 8-row group padding, the buffer's slack in the last group)
    against the per-expert loop, on CPU where the installed torch runs grouped_mm (torch
    2.13 does; the executor itself uses it on CUDA bf16 only)."""
    from dataclasses import replace
    torch.manual_seed(2)
    ex = GroupedExperts(replace(MOE, bias=bias))
    for p in ex.parameters():
        torch.nn.init.normal_(p, std=0.3)
    counts = torch.tensor([3, 0, 9, 1])
    x = torch.randn(int(counts.sum()), 32)
    g = torch.randn(x.shape[0], 32)
    try:
        ex.backend = "grouped"
        xa = x.clone().requires_grad_()
        ya = ex(xa, counts)
    except RuntimeError as exc:                       # pragma: no cover - torch-dependent
        pytest.skip(f"grouped_mm does not run on CPU here: {exc}")
    ya.backward(g)
    grads = {n: p.grad.clone() for n, p in ex.named_parameters()}
    ex.zero_grad()
    ex.backend = "loop"
    xb = x.clone().requires_grad_()
    yb = ex(xb, counts)
    yb.backward(g)
    torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-6)
    for n, p in ex.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-6, msg=n)


def test_expert_parts_initialize_like_the_full_model():
    full = Transformer(MOE)
    full.init_weights(5)
    whole = dict(full.named_parameters())
    for rank in range(2):
        with torch.device("meta"):
            part = Transformer(MOE)
        for layer in epm.moe_layers(part):
            layer.experts.keep_experts(2 * rank, 2)
        part.to_empty(device="cpu")
        part.init_weights(5)
        for name, p in part.named_parameters():
            want = whole[name][2 * rank:2 * rank + 2] if ".experts." in name else whole[name]
            torch.testing.assert_close(p, want, rtol=0, atol=0, msg=name)


def test_whole_moe_model_trains_one_step():
    m = Transformer(MOE)
    m.init_weights(0)
    x = torch.randint(0, 64, (2, 12))
    cross_entropy(m(x[:, :-1]), x[:, 1:]).backward()
    assert all(p.grad is not None for p in m.parameters())


# ---- rank arithmetic: the worked example of meshplan.executor.expert_parallel ----------------
STAGES = [list(range(8)), list(range(8, 16))]     # dp 4 × tp 2 per stage, rank order tp-dp-pp


def test_expert_groups_ep4_etp1():
    assert epm.expert_groups(STAGES, 4, 1, "ep") == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                     [8, 9, 10, 11], [12, 13, 14, 15]]
    assert epm.expert_groups(STAGES, 4, 1, "edp") == [[0, 4], [1, 5], [2, 6], [3, 7],
                                                      [8, 12], [9, 13], [10, 14], [11, 15]]
    assert epm.expert_groups(STAGES, 4, 1, "etp") == [[r] for r in range(16)]
    assert epm.expert_coords(6, 4, 1) == (1, 2, 0)


def test_expert_groups_ep2_etp2():
    assert epm.expert_groups(STAGES[:1], 2, 2, "etp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert epm.expert_groups(STAGES[:1], 2, 2, "ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert epm.expert_groups(STAGES[:1], 2, 2, "edp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    with pytest.raises(ExecutorError, match="does not divide the 8 ranks"):
        epm.expert_rank_grid(STAGES[0], 3, 1)


def test_stage_rank_table_reads_the_device_mesh_by_name():
    class Mesh:   # what stage_rank_table reads of a DeviceMesh: names and the rank tensor
        mesh_dim_names = ("dp", "pp", "tp")        # rank order tp-pp-dp
        mesh = torch.arange(16).view(4, 2, 2)
    assert epm.stage_rank_table(Mesh()) == [[0, 1, 4, 5, 8, 9, 12, 13],
                                            [2, 3, 6, 7, 10, 11, 14, 15]]


def test_measured_flops_of_an_moe_model_count_the_active_experts():
    from meshplan.costmodel.moe import moe_model_flops_per_step
    from meshplan.executor.measure import throughput
    from meshplan.spec import Job, Layout
    job, layout = Job(global_batch=4, seq_len=16), Layout(dp=2, ep=2)
    got = throughput(MOE, job, layout, 2.0, None)
    assert got["model_tflops_per_gpu"] == moe_model_flops_per_step(MOE, 4, 16) / 2.0 / 2 / 1e12


@pytest.mark.parametrize("model,layout,match", [
    (dataclasses.replace(MOE, capacity_factor=1.0), dict(tp=3, cp=2),
     r"capacity \(ModelSpec.capacity_factor = 1.0\) at cp = 2: an odd tp = 3"),
    (MOE, dict(dp=3, ep=3), r"ep = 3 must divide the 4 routed experts"),
    (dataclasses.replace(MOE, num_experts=0, experts_per_token=0, moe_ffn_hidden_size=None,
                         num_shared_experts=0, shared_expert_ffn_hidden_size=None,
                         dense_layers=()), dict(dp=2, ep=2), "need a mixture-of-experts model"),
])
def test_executor_refuses_what_its_moe_layers_cannot_run(model, layout, match):
    from meshplan.executor.parallelize import check_layout_runnable
    from meshplan.spec import Job, Layout
    with pytest.raises(ExecutorError, match=match):
        check_layout_runnable(model, Job(global_batch=24, seq_len=16, precision="fp32"),
                              Layout(**layout))


def test_sequence_pieces_follow_positions_over_tp_and_cp():
    from meshplan.executor.moe import sequence_pieces
    # the docstring's example: cp 2, tp 2, 16 tokens; cp rank 1 holds positions 4-7, 8-11
    piece, n = sequence_pieces(4, 1, 2, 1, 2)
    assert piece.tolist() == [2, 2, 2, 2] and n == 4
    # every (tp, cp) rank's tokens, in position order, cover the pieces once each
    for tp, cp, s in ((1, 1, 16), (2, 1, 8), (1, 2, 8), (2, 2, 4), (4, 2, 2), (2, 4, 2)):
        held = {}
        for c in range(cp):
            for t in range(tp):
                got, n = sequence_pieces(s, t, tp, c, cp)
                for p in got.tolist():
                    held.setdefault(p, set()).add((t, c))
        assert sorted(held) == list(range(n)) and all(len(r) == 1 for r in held.values())
    # cp 2 alone: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert sequence_pieces(8, 0, 1, 0, 2)[0].tolist() == [0] * 4 + [3] * 4
    assert sequence_pieces(8, 0, 1, 1, 2)[0].tolist() == [1] * 4 + [2] * 4
    with pytest.raises(ExecutorError, match="tp = 3, cp = 2: a tp slice of 4 tokens"):
        sequence_pieces(4, 0, 3, 0, 2)


@pytest.mark.parametrize("capacity", [False, True])
def test_dispatch_and_combine_match_index_add_with_gradients(capacity):
    """The gather-only permutation (executor/moe.py: ``dispatch``'s backward and ``combine``
    sum each token's copies with ``embedding_bag``) against autograd through
    ``index_select`` / ``index_add``: outputs and the gradients of the tokens, the expert
    outputs and the gates agree to float64 rounding, with and without dropped copies."""
    from meshplan.executor.moe import combine, dispatch, sort_copies
    g = torch.Generator().manual_seed(3)
    n, k, e, h = 12, 3, 5, 7
    experts = torch.rand(n, e, generator=g).topk(k, -1).indices.reshape(-1)
    keep = (torch.rand(n * k, generator=g) > 0.3) if capacity else None
    gates = torch.rand(n * k, generator=g, dtype=torch.float64)
    x = torch.randn(n, h, generator=g, dtype=torch.float64)
    w = torch.randn(n, h, generator=g, dtype=torch.float64)
    scale = torch.randn(h, generator=g, dtype=torch.float64)   # stands in for the experts

    def new(x, gates):
        r = sort_copies(experts, keep, n, k, e)
        return combine(dispatch(x, r) * scale, gates, r)

    def reference(x, gates):
        copies = torch.arange(n * k) if keep is None else keep.nonzero().squeeze(1)
        order = torch.argsort(experts[copies], stable=True)
        copies = copies[order]
        token = copies // k
        out = x.index_select(0, token) * scale
        return torch.zeros(n, h, dtype=x.dtype).index_add(0, token, out * gates[copies, None])

    grads = []
    for f in (new, reference):
        xs, gs = x.clone().requires_grad_(), gates.clone().requires_grad_()
        y = f(xs, gs)
        (y * w).sum().backward()
        grads.append((y.detach(), xs.grad, gs.grad))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    if capacity:     # a dropped copy adds nothing and gets no gradient
        assert float(grads[0][2][~keep].abs().sum()) == 0.0


def test_a_slice_whose_copies_are_all_dropped_gives_zeros():
    """A tp rank's slice can keep no copy under a capacity (the slices before it filled
    every expert): the layer's routed output and the gradients are zero, not an error."""
    from meshplan.executor.moe import combine, dispatch, sort_copies
    experts = torch.tensor([0, 1, 1, 0])
    r = sort_copies(experts, torch.zeros(4, dtype=torch.bool), 2, 2, 2)
    x = torch.randn(2, 3, requires_grad=True)
    gates = torch.rand(4, requires_grad=True)
    y = combine(dispatch(x, r), gates, r)
    y.sum().backward()
    assert float(y.detach().abs().sum()) == 0 and float(x.grad.abs().sum()) == 0
    assert float(gates.grad.abs().sum()) == 0


def test_counts_are_exact_and_int64():
    from meshplan.executor.moe import _count
    values = torch.tensor([3, 0, 3, 3, 1, 0, 3])
    got = _count(values, 5)
    assert got.dtype == torch.long
    assert got.tolist() == torch.bincount(values, minlength=5).tolist()


def test_unpadding_backward_writes_rows_back():
    """``unpad_rows`` (the grouped GEMM's padded output read back by row) has the gradient
    of ``index_select`` without its accumulation: padding rows get zero."""
    from meshplan.executor.moe import group_padding, unpad_rows
    counts = torch.tensor([3, 0, 9, 1])
    dest, padded, total = group_padding(counts, 13)
    assert total % 8 == 0 and int(padded.sum()) == total and len(set(dest.tolist())) == 13
    y = torch.randn(total, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(13, 4, dtype=torch.float64)
    (unpad_rows(y, dest) * w).sum().backward()
    got = y.grad.clone()
    y.grad = None
    (y.index_select(0, dest) * w).sum().backward()
    torch.testing.assert_close(got, y.grad, rtol=0, atol=0)


@pytest.mark.skipif(_grouped_mm_fn() is None, reason="this torch has no grouped_mm")
def test_the_routed_layer_compiles_whole_and_matches_eager():
    """``torch.compile(fullgraph=True)`` takes the layer as the GPU runs it (grouped GEMM,
    bf16): the permutation's autograd functions trace without a graph break, and the
    gradients match eager within bf16 rounding (2 % of each gradient's largest entry)."""
    torch.manual_seed(0)
    layer = MoELayer(MOE).to(torch.bfloat16)
    layer.experts.backend = "grouped"
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    w = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    (layer(x) * w).sum().backward()
    eager = {n: p.grad.float() for n, p in layer.named_parameters()}
    layer.zero_grad()
    (torch.compile(layer, fullgraph=True)(x) * w).sum().backward()
    for n, p in layer.named_parameters():
        torch.testing.assert_close(p.grad.float(), eager[n], rtol=2e-2,
                                   atol=2e-2 * float(eager[n].abs().max()), msg=n)
