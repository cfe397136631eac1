"""The executor's multi-head latent attention on CPU: the module against an independent
reference, parameter counts, training, recomputation, refusals, fp8 wiring, a ``meshplan
run`` of an MLA plan, and the cost model's caveat for MLA under runtime "torch".

Tolerances: the reference is the same math in another order (explicit scores and softmax,
angles recomputed per position), fp32: outputs and gradients agree to 1e-6 absolute (their
entries are ~1e-2); recomputation re-runs identical ops, so its gradients match exactly.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from meshplan.errors import ExecutorError  # noqa: E402
from meshplan.executor.mla import MLAttention  # noqa: E402
from meshplan.executor.model import Transformer, cross_entropy  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

from _mla_models import MLA, MLA_MOE, MLA_NOQ  # noqa: E402

# GPT-style positions: MLA's rotary parts stay unrotated, as Attention's q and k would
MLA_LEARNED = replace(MLA, name="tiny-mla-learned", position_embedding="learned",
                      tied_embeddings=True, head_dim=None)
SPECS = [MLA, MLA_NOQ, MLA_MOE, MLA_LEARNED]
IDS = ["q-latent", "no-q-latent", "moe", "learned-positions"]
ATOL = 1e-6


# ---- an independent reference: DeepSeek-V2 eqs. 9-19 in plain torch ---------------------
def _rms(x, g, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def _rotate(x, base=10000.0):
    """RoPE on x (b, heads, s, d), pairs (i, i + d/2), angle pos · base^(−2i/d)."""
    d, s = x.shape[-1], x.shape[-2]
    out = torch.empty_like(x)
    for pos in range(s):
        for i in range(d // 2):
            a = pos * base ** (-2.0 * i / d)
            x1, x2 = x[..., pos, i], x[..., pos, i + d // 2]
            out[..., pos, i] = x1 * math.cos(a) - x2 * math.sin(a)
            out[..., pos, i + d // 2] = x2 * math.cos(a) + x1 * math.sin(a)
    return out


def reference_mla(spec: ModelSpec, w: dict, x: torch.Tensor) -> torch.Tensor:
    """Multi-head latent attention from the weights ``w`` (name -> tensor)."""
    b, s, _ = x.shape
    nh, dn, dr, dv = (spec.num_heads, spec.qk_nope_head_dim, spec.qk_rope_head_dim,
                      spec.v_head_dim)
    if spec.q_lora_rank is None:
        q = x @ w["q.weight"].T
    else:
        c_q = _rms(x @ w["q_down.weight"].T, w["q_norm.weight"])
        q = c_q @ w["q_up.weight"].T
    q = q.reshape(b, s, nh, dn + dr).permute(0, 2, 1, 3)
    q_nope, q_rope = q[..., :dn], q[..., dn:]
    down = x @ w["kv_down.weight"].T
    c_kv, k_rope = down[..., :spec.kv_lora_rank], down[..., spec.kv_lora_rank:]
    kv = (_rms(c_kv, w["kv_norm.weight"]) @ w["kv_up.weight"].T).reshape(b, s, nh, dn + dv)
    kv = kv.permute(0, 2, 1, 3)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    k_rope = k_rope.unsqueeze(1).expand(b, nh, s, dr)
    if spec.position_embedding == "rope":
        q_rope, k_rope = _rotate(q_rope), _rotate(k_rope)
    scores = (torch.einsum("bhid,bhjd->bhij", q_nope, k_nope)
              + torch.einsum("bhid,bhjd->bhij", q_rope, k_rope)) / math.sqrt(dn + dr)
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("bhij,bhjd->bhid", scores.softmax(-1), v)          # (b, nh, s, dv)
    return y.permute(0, 2, 1, 3).reshape(b, s, nh * dv) @ w["proj.weight"].T


def _attn_and_rope(spec):
    m = Transformer(spec)
    m.init_weights(3)
    with torch.no_grad():        # unit gains would hide a norm applied to the wrong tensor
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    m.reset_buffers()
    return m.layers["0"].attn, m._rope


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_module_matches_reference(spec):
    attn, rope = _attn_and_rope(spec)
    assert isinstance(attn, MLAttention)
    x = torch.randn(2, 9, spec.hidden_size, generator=torch.Generator().manual_seed(2))
    w = {n: p.detach().clone().requires_grad_() for n, p in attn.named_parameters()}
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = reference_mla(spec, w, xr)
    got = attn(xm, rope)
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
    gy = torch.randn(got.shape, generator=torch.Generator().manual_seed(4))
    want.backward(gy)
    got.backward(gy)
    torch.testing.assert_close(xm.grad, xr.grad, rtol=0, atol=ATOL)
    for n, p in attn.named_parameters():
        torch.testing.assert_close(p.grad, w[n].grad, rtol=0, atol=ATOL, msg=lambda m: n + m)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_parameter_count_and_init(spec):
    m = Transformer(spec)
    m.init_weights(0)
    assert sum(p.numel() for p in m.parameters()) == spec.num_params()
    named = {n: p.detach() for n, p in m.named_parameters()}
    # as Attention's: N(0, 0.02) projections, the output projection scaled by 1/√(2L),
    # unit latent-norm gains
    assert named["layers.0.attn.kv_up.weight"].std() == pytest.approx(0.02, rel=0.2)
    assert named["layers.0.attn.proj.weight"].std() == pytest.approx(
        0.02 / math.sqrt(2 * spec.num_layers), rel=0.2)
    assert bool((named["layers.0.attn.kv_norm.weight"] == 1).all())


def _losses(spec, steps, *, recompute="none"):
    torch.manual_seed(0)
    m = Transformer(spec)
    m.init_weights(1)
    for block in m.layers.values():
        block.recompute_block = recompute == "full"
        block.attn.recompute_core = recompute == "selective"
    batch = torch.randint(0, spec.vocab_size, (4, 17), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.0)
    losses, grads = [], None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = cross_entropy(m(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in m.named_parameters()}
        opt.step()
        losses.append(float(loss.detach()))
    return losses, grads


@pytest.mark.parametrize("spec", [MLA, MLA_NOQ, MLA_MOE], ids=IDS[:3])
def test_tiny_mla_model_trains(spec):
    losses, _ = _losses(spec, 15)
    # memorising one batch of random tokens: from ln 64 ≈ 4.16 to well under it
    assert losses[0] == pytest.approx(math.log(spec.vocab_size), abs=0.2)
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recomputation_gives_the_same_gradients(recompute):
    plain, g0 = _losses(MLA, 2)
    again, g1 = _losses(MLA, 2, recompute=recompute)
    assert again == plain
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=0, atol=0, msg=lambda m: n + m)


def test_ring_cp_with_forced_flash_and_mtp_are_refused(monkeypatch):
    from meshplan.executor.context_parallel import RING_KERNEL_ENV
    from meshplan.executor.parallelize import check_layout_runnable
    job = Job(global_batch=8, seq_len=16, precision="fp32")
    # context parallelism runs (tests/distributed/test_context_parallel_world2.py), but
    # not with flash-attention 2 forced on the ring: it wants one head dim for q, k and v
    assert check_layout_runnable(MLA, job, Layout(micro_batch=1, cp=2)) == 8
    monkeypatch.setenv(RING_KERNEL_ENV, "flash")
    with pytest.raises(ExecutorError, match="cp = 2: ring attention: the value head dim 6 "
                                            "differs from the query-key head dim 12 .* "
                                            "MESHPLAN_RING_KERNEL=flash forces it"):
        check_layout_runnable(MLA, job, Layout(micro_batch=1, cp=2))
    assert check_layout_runnable(MLA, job, Layout(micro_batch=1, cp=2,
                                                  cp_style="all-to-all")) == 8
    assert check_layout_runnable(MLA, job, Layout(micro_batch=2, tp=2,
                                                  sequence_parallel=True)) == 4
    with pytest.raises(ExecutorError, match="mtp_layers = 1"):
        Transformer(replace(MLA, mtp_layers=1))


def test_fp8_converts_every_mla_linear():
    from meshplan.executor.fp8 import Fp8Linear, convert_to_fp8
    for spec, per_layer in ((MLA, 5), (MLA_NOQ, 4)):
        m = Transformer(spec)
        m.init_weights(0)
        assert convert_to_fp8(m, "rowwise", device=torch.device("cpu")) == (
            per_layer + 2) * spec.num_layers
        assert isinstance(m.layers["0"].attn.kv_down, Fp8Linear)
        batch = torch.randint(0, spec.vocab_size, (2, 17),
                              generator=torch.Generator().manual_seed(0))
        loss = cross_entropy(m(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        assert torch.isfinite(loss) and m.layers["0"].attn.kv_down.weight.grad is not None


def test_meshplan_run_of_an_mla_plan(tmp_path, monkeypatch):
    from meshplan.executor.planfiles import write_plan_for_layout
    from meshplan.executor.run import main
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(k, raising=False)
    job = Job(global_batch=4, seq_len=16, precision="fp32", runtime="torch")
    plan = write_plan_for_layout(tmp_path / "p.json", MLA_MOE, job, Layout(micro_batch=2))
    out = tmp_path / "r.json"
    assert main(["--plan", str(plan), "--device", "cpu", "--out", str(out), "--steps", "2",
                 "--warmup", "1"]) == 0
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok"
    assert doc["prediction"]["step_time_s"] > 0
    assert len(doc["measured"]["loss_per_step"]) == 3


def test_estimate_cautions_mla_under_runtime_torch():
    """Runtime "torch" prices MLA's memory-bound work as Megatron's fused kernels
    (costmodel/compute.py): the estimate says so; not under "megatron", nor for the same
    model with standard attention."""
    from meshplan.costmodel import estimate
    from meshplan.costmodel.caveats import MLA_TORCH_CAVEAT
    from meshplan.hardware_profiles import Cluster
    cluster = Cluster.preset("dgx-h100", nodes=1)
    mla = ModelSpec(name="mla-lite", num_layers=4, hidden_size=2048, num_heads=16,
                    ffn_hidden_size=8192, vocab_size=32000, max_seq_len=4096,
                    activation="swiglu", norm="rmsnorm", position_embedding="rope",
                    tied_embeddings=False, bias=False, kv_lora_rank=512,
                    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    dense = replace(mla, kv_lora_rank=None, qk_nope_head_dim=None, qk_rope_head_dim=None,
                    v_head_dim=None, head_dim=None)
    layout = Layout(micro_batch=1, tp=2, dp=4)
    for model, runtime, cautioned in ((mla, "torch", True), (mla, "megatron", False),
                                      (dense, "torch", False)):
        job = Job(global_batch=32, seq_len=2048, runtime=runtime)
        caveats = estimate(model, cluster, job, layout).caveats
        assert (MLA_TORCH_CAVEAT in caveats) == cautioned, (model.name, runtime)


def test_calibrate_times_the_mla_layer_and_its_row_lifts_the_caveat(tmp_path):
    """`meshplan calibrate --model` (one process, --quick) times the executor's MLA layer;
    an estimate priced from that row carries no MLA caveat (the row holds the eager ops)."""
    from meshplan.cli import main as cli_main
    from meshplan.costmodel import estimate
    from meshplan.costmodel.caveats import MLA_TORCH_CAVEAT
    from meshplan.hardware_profiles import Cluster
    from meshplan.hardware_profiles.calibrated import apply_profile
    spec = replace(MLA, max_seq_len=32, head_dim=None)
    (tmp_path / "mla.json").write_text(json.dumps(spec.to_dict()))
    out = tmp_path / "p.toml"
    assert cli_main(["calibrate", "--device", "cpu", "--quick", "--model",
                     str(tmp_path / "mla.json"), "--micro-batches", "1", "--seq-len", "32",
                     "--out", str(out), "--no-progress"]) == 0
    plain = Cluster.preset("dgx-h100", nodes=1)
    cluster = apply_profile(plain, out, override=True)
    job, layout = Job(global_batch=2, seq_len=32, runtime="torch"), Layout(micro_batch=1, dp=2)
    assert MLA_TORCH_CAVEAT in estimate(spec, plain, job, layout).caveats
    est = estimate(spec, cluster, job, layout)
    assert est.step_time_s > 0 and MLA_TORCH_CAVEAT not in est.caveats
