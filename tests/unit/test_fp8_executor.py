"""The executor's fp8 wiring on CPU: training follows bf16, compile traces it, bad requests
are named, ``--precision fp8`` runs a plan end to end."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from meshplan.errors import ExecutorError  # noqa: E402
from meshplan.executor.fp8 import (Fp8Linear, check_layout_fp8,  # noqa: E402
                                   check_recipe_runnable, convert_to_fp8)
from meshplan.executor.model import Transformer, cross_entropy  # noqa: E402
from meshplan.executor.planfiles import write_plan_for_layout  # noqa: E402
from meshplan.executor.run import main  # noqa: E402
from meshplan.executor.run_args import override_precision  # noqa: E402
from meshplan.planner.planfile import load_plan_file  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

TINY = ModelSpec(name="tiny-llama", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                 ffn_hidden_size=128, vocab_size=128, max_seq_len=32, activation="swiglu",
                 norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False)
CPU = torch.device("cpu")
STEPS = 40
#: per-step loss distance from the bf16 run, in nats (1 % of the initial loss of 4.87)
LOSS_ATOL_NATS = 0.05


def _train(recipe: str | None, *, bf16: bool = False) -> list[float]:
    """Memorize one fixed batch (the loss falls ~25×), plain AdamW; fp8 linears if recipe."""
    torch.manual_seed(0)
    batch = torch.randint(0, TINY.vocab_size, (8, 33), generator=torch.Generator().manual_seed(0))
    m = Transformer(TINY)
    m.init_weights(1)
    if recipe is not None:
        assert convert_to_fp8(m, recipe, device=CPU) == 4 * TINY.num_layers
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = cross_entropy(m(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.fixture(scope="module")
def references():
    return _train(None, bf16=True), _train(None)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise", "mxfp8"])
def test_fp8_training_follows_bf16(references, recipe):
    """Each of 40 steps within 0.05 nats of the bf16-autocast run (measured on CPU, torch
    2.13: tensorwise 0.029, rowwise 0.040, blockwise 0.026, mxfp8 0.036; bf16 itself is
    0.013 from fp32), and fp8 is really on (it is not the fp32 run)."""
    bf16, fp32 = references
    fp8 = _train(recipe)
    assert fp8[-1] < fp8[0] / 10
    worst = max(abs(a - b) for a, b in zip(fp8, bf16))
    assert worst <= LOSS_ATOL_NATS, f"{recipe}: {worst:.4f} nats from bf16"
    assert max(abs(a - b) for a, b in zip(fp8, fp32)) > 1e-3


def test_conversion_keeps_parameter_names_and_tensors():
    m = Transformer(TINY)
    m.init_weights(0)
    before = dict(m.named_parameters())
    convert_to_fp8(m, "tensorwise", device=CPU)
    after = dict(m.named_parameters())
    assert list(after) == list(before)
    assert all(after[n] is before[n] for n in before)
    assert isinstance(m.layers["0"].attn.qkv, Fp8Linear)
    assert m.output is not None and not isinstance(m.output, Fp8Linear)   # head stays 16-bit


def test_compile_traces_the_fp8_linear_without_graph_breaks():
    """The autograd.Function traces whole (fullgraph) and gives eager's gradients (the
    aot_eager backend: the graph without Inductor's code generation, for CPU test time)."""
    batch = torch.randint(0, TINY.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    grads = []
    for compiled in (False, True):
        m = Transformer(TINY)
        m.init_weights(2)
        convert_to_fp8(m, "rowwise", device=CPU)
        if compiled:
            for block in m.layers.values():
                block.compile(backend="aot_eager", fullgraph=True)
        cross_entropy(m(batch[:, :-1]), batch[:, 1:]).backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-5, atol=1e-7)


def test_delayed_scaling_and_zero_bubble_are_refused_by_name():
    with pytest.raises(ExecutorError, match="'delayed'.*not run by the executor"):
        check_layout_fp8(Job(global_batch=8, seq_len=16, precision="fp8", fp8_recipe="delayed"),
                         Layout())
    with pytest.raises(ExecutorError, match="zero-bubble"):
        check_layout_fp8(Job(global_batch=8, seq_len=16, precision="fp8"),
                         Layout(pp=2, schedule="zero-bubble"))


@pytest.mark.parametrize("cc,recipe,match", [
    ((9, 0), "mxfp8", "needs Blackwell .*'NVIDIA H100 80GB HBM3' is sm90"),
    ((8, 0), "tensorwise", "compute capability 8.9 or later"),
    ((10, 0), "mxfp8", "not implemented for GPUs"),
])
def test_gpu_recipe_checks(monkeypatch, cc, recipe, match):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    with pytest.raises(ExecutorError, match=match):
        check_recipe_runnable(recipe, torch.device("cuda", 0))


def test_precision_override_drops_the_other_precisions_prediction(tmp_path):
    job = Job(global_batch=4, seq_len=16, precision="bf16")
    path = write_plan_for_layout(tmp_path / "p.json", TINY, job, Layout(micro_batch=2))
    plan = load_plan_file(path)
    plan = type(plan)(**{**vars(plan), "prediction": {"step_time_s": 1.0}})
    assert override_precision(plan, None, None) is plan
    assert override_precision(plan, "bf16", None) is plan
    fp8 = override_precision(plan, "fp8", "rowwise")
    assert (fp8.job.precision, fp8.job.fp8_recipe, fp8.prediction) == ("fp8", "rowwise", {})
    with pytest.raises(ExecutorError, match="--fp8-recipe rowwise needs --precision fp8"):
        override_precision(plan, None, "rowwise")


def _run_fp8(tmp_path, monkeypatch, spec: ModelSpec, recipe: str):
    """``meshplan run`` of a one-process CPU plan of ``spec`` with ``--precision fp8``:
    (the plan file, the results document)."""
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(k, raising=False)
    job = Job(global_batch=4, seq_len=16, precision="fp32")
    plan = write_plan_for_layout(tmp_path / "p.json", spec, job, Layout(micro_batch=2))
    out = tmp_path / "r.json"
    rc = main(["--plan", str(plan), "--device", "cpu", "--out", str(out), "--steps", "2",
               "--warmup", "1", "--precision", "fp8", "--fp8-recipe", recipe])
    assert rc == 0
    return plan, json.loads(out.read_text())


def test_run_with_precision_fp8_end_to_end(tmp_path, monkeypatch):
    plan, doc = _run_fp8(tmp_path, monkeypatch, TINY, "rowwise")
    assert doc["status"] == "ok"
    # rowwise: a recipe the cost model prices under runtime "torch" on the plan's H100
    assert (doc["job"]["precision"], doc["job"]["fp8_recipe"]) == ("fp8", "rowwise")
    # the plan's bf16 prediction is dropped; the run's own job (fp8) is predicted instead,
    # under the executor's runtime
    from meshplan.costmodel import estimate
    p = load_plan_file(plan)
    fp8_job = Job.from_dict({**doc["job"], "runtime": "torch"})
    assert doc["prediction"]["step_time_s"] == pytest.approx(
        estimate(p.model, p.cluster, fp8_job, p.layout).step_time_s)
    assert len(doc["measured"]["loss_per_step"]) == 3


TINY_MOE = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                     ffn_hidden_size=128, vocab_size=128, max_seq_len=32, activation="swiglu",
                     norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False,
                     num_experts=4, experts_per_token=2, moe_ffn_hidden_size=32,
                     num_shared_experts=1, shared_expert_ffn_hidden_size=64)


@pytest.mark.parametrize("shared,name", [(1, "rowwise"), (0, "rowwise"), (1, "blockwise")])
def test_moe_blocks_run_attention_shared_and_routed_experts_in_fp8(shared, name):
    """An MoE block: attention's and the shared experts' linears become fp8, the routed
    experts' grouped GEMMs too under the recipe the grouped kernel takes (rowwise; blockwise
    keeps them 16-bit), the router stays 16-bit; the converted model
    trains (was an AttributeError on the MoE layer's missing ``fc``)."""
    from dataclasses import replace
    spec = replace(TINY_MOE, num_shared_experts=shared,
                   shared_expert_ffn_hidden_size=64 if shared else None)
    torch.manual_seed(0)
    m = Transformer(spec)
    m.init_weights(1)
    experts = name != "blockwise"
    assert convert_to_fp8(m, name, device=CPU) == (2 + 2 * shared + 2 * experts) \
        * spec.num_layers
    for block in m.layers.values():
        assert isinstance(block.attn.qkv, Fp8Linear)
        assert type(block.mlp.router) is torch.nn.Linear
        assert (block.mlp.experts.fp8 is not None) == experts
        if shared:
            assert isinstance(block.mlp.shared.fc, Fp8Linear)
    batch = torch.randint(0, spec.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    loss = cross_entropy(m(batch[:, :-1]), batch[:, 1:])
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for n, p in m.named_parameters() if "experts" in n)


def test_run_an_moe_plan_with_precision_fp8(tmp_path, monkeypatch):
    _, doc = _run_fp8(tmp_path, monkeypatch, TINY_MOE, "tensorwise")
    assert doc["status"] == "ok" and doc["job"]["precision"] == "fp8"
    assert len(doc["measured"]["loss_per_step"]) == 3
