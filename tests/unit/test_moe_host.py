"""The host terms of an MoE layer (meshplan/costmodel/moe_host.py): the executor's operator
counts against torch on CPU, the sync counts, and what the terms add to an estimate."""

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

import meshplan as mp  # noqa: E402
from meshplan.costmodel import moe_host  # noqa: E402

BASE = mp.ModelSpec(name="t", num_layers=2, hidden_size=64, num_heads=4, vocab_size=256,
                    max_seq_len=64, activation="swiglu", norm="rmsnorm",
                    position_embedding="rope", tied_embeddings=False, bias=False,
                    num_experts=8, experts_per_token=2, moe_ffn_hidden_size=32)


def _counter():
    """A dispatch mode counting the aten operators run under it (``.n``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))
    return Count()


def _count(spec, autocast=False):
    from meshplan.executor.moe import MoELayer

    torch.manual_seed(0)
    layer = MoELayer(spec)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.02)
    layer.experts.backend = "grouped"
    dtype = torch.float32 if autocast else torch.bfloat16
    layer.to(dtype)
    x = torch.randn(2, 16, 64, dtype=dtype, requires_grad=True)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with ctx:
        layer(x)                      # warm
        with _counter() as f:
            y = layer(x)
    with _counter() as b:
        y.backward(torch.ones_like(y))
    return f.n, b.n


@pytest.mark.parametrize("change,autocast", [
    ({}, False), ({"router_norm_topk": False}, False), ({"router_aux_loss_coeff": 0.0}, False),
    ({"router": "sigmoid"}, False), ({"bias": True}, False), ({}, True)])
def test_routed_operator_counts_match_torch(change, autocast):
    import torch.nn.functional as F
    if getattr(F, "grouped_mm", None) is None and getattr(torch, "_grouped_mm", None) is None:
        pytest.skip("this torch has no grouped_mm")
    spec = replace(BASE, **change)
    got = _count(spec, autocast)
    want = moe_host.routed_ops(spec, mp.Layout(), autocast=autocast)
    assert want[0] == got[0]
    # backward: autograd's node order varies by one or two operators between runs
    assert abs(want[1] - got[1]) <= 2


def _ep2_worker(rank, world, init_method, out_dir):
    import torch.distributed as dist

    from _gloo import write_rank_result
    from meshplan.executor.moe import MoELayer
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    group = dist.new_group([0, 1])
    counts = {}
    for kind in ("1", "2", "etp2", "cp2"):
        torch.manual_seed(0)
        layer = MoELayer(BASE)
        for q in layer.parameters():
            torch.nn.init.normal_(q, std=0.02)
        if kind == "2":   # as expert_parallel installs it: this rank's half of the experts
            layer.experts.keep_experts(rank * 4, 4)
            layer.ep_group = group
        elif kind == "etp2":    # this rank's half of every expert's width
            layer.experts.keep_width(rank, 2)
            layer.etp_group = group
        elif kind == "cp2":
            layer.cp_group = group
        layer.experts.backend = "grouped"
        layer.to(torch.bfloat16)
        torch.manual_seed(1 + rank)
        x = torch.randn(2, 16, 64, dtype=torch.bfloat16, requires_grad=True)
        layer(x)                       # warm
        f, b = _counted(layer, x)
        counts[kind] = [f, b]
    write_rank_result(out_dir, rank, counts)


def _counted(layer, x):
    with _counter() as f:
        y = layer(x)
    with _counter() as b:
        y.backward(torch.ones_like(y))
    return f.n, b.n


def test_expert_parallel_operator_counts_match_torch_on_two_ranks(tmp_path):
    """ROUTED_OPS_EP / _ETP / _CP: what ep = 2 (the splits' exchange, both all-to-alls and
    the regrouping), etp = 2 (the counts' all-gather, the rows' gather and return, the
    partial sums) and cp = 2 (the counts' all-gather) add to the routed part's operators,
    counted on two gloo ranks against ep = etp = cp = 1."""
    import torch.nn.functional as F
    if getattr(F, "grouped_mm", None) is None and getattr(torch, "_grouped_mm", None) is None:
        pytest.skip("this torch has no grouped_mm")
    from _gloo import run_gloo_ranks
    got = run_gloo_ranks(_ep2_worker, 2, tmp_path)
    want = {k: moe_host.routed_ops(BASE, mp.Layout(dp=2, **kw), autocast=False)
            for k, kw in (("1", {}), ("2", dict(ep=2)), ("etp2", dict(etp=2)),
                          ("cp2", dict(cp=2)))}
    for rank in got:
        for k, (f, b) in want.items():
            assert rank[k][0] == f, k
            # backward: autograd's node order varies by one or two operators between runs
            assert abs(rank[k][1] - b) <= 2, k


def test_sync_counts_from_the_executor_code():
    assert moe_host.torch_syncs(BASE, mp.Layout(dp=2)) == 0
    assert moe_host.torch_syncs(BASE, mp.Layout(dp=2, etp=2)) == 1
    assert moe_host.torch_syncs(BASE, mp.Layout(dp=4, ep=2, etp=2)) == 2
    assert moe_host.torch_syncs(BASE, mp.Layout(dp=2, ep=2)) == 1
    assert moe_host.torch_syncs(replace(BASE, capacity_factor=1.25), mp.Layout(dp=2, ep=2)) == 2
    assert moe_host.torch_syncs(replace(BASE, capacity_factor=1.25), mp.Layout(dp=2)) == 1


def test_the_executor_layer_reads_nothing_back_at_ep_1():
    """No device-to-host read in the routed forward or backward at ep = 1 without a capacity
    factor (what torch_syncs counts): ``aten._local_scalar_dense`` (``.item()``,
    ``int(t)``), ``aten.nonzero``, a copy to the CPU or ``bincount`` (on CUDA it reads its
    input's min and max) never runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from meshplan.executor.moe import MoELayer

    class Reads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    layer = MoELayer(BASE).to(torch.bfloat16)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.02)
    layer.experts.backend = "grouped"
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    with Reads() as seen:
        layer(x).backward(torch.ones(2, 16, 64, dtype=torch.bfloat16))
    reads = [n for n in seen.names if n.split(".")[0] in
             ("_local_scalar_dense", "nonzero", "bincount", "item")]
    assert not reads
    # ... while a capacity factor's kept copies are one nonzero
    capped = MoELayer(replace(BASE, capacity_factor=1.25)).to(torch.bfloat16)
    capped.experts.backend = "grouped"
    with Reads() as seen:
        capped(x)
    assert [n for n in seen.names if n.startswith("nonzero")] == ["nonzero.default"]


def test_host_terms_lengthen_the_step_only_with_host_numbers():
    m = mp.ModelSpec(name="moe", num_layers=4, hidden_size=1024, num_heads=8, vocab_size=32000,
                     max_seq_len=2048, activation="swiglu", norm="rmsnorm",
                     position_embedding="rope", tied_embeddings=False, bias=False,
                     num_experts=8, experts_per_token=2, moe_ffn_hidden_size=704)
    job = mp.Job(global_batch=16, seq_len=2048, precision="bf16", runtime="torch")
    lay = mp.Layout(dp=4, ep=4, micro_batch=2, zero=1)
    cl = mp.Cluster.preset("dgx-h200", nodes=1, gpus_per_node=4)
    assert cl.gpu.host_sync_s > 0 and cl.gpu.host_op_dispatch_s > 0
    with_host = mp.estimate(m, cl, job, lay).step_time_s
    bare = cl.replace(gpu=replace(cl.gpu, host_sync_s=0.0, host_op_dispatch_s=0.0))
    without = mp.estimate(m, bare, job, lay).step_time_s
    # at least the sync latencies: 1 per layer forward at ep > 1, 4 layers, 2 micro-batches
    assert with_host - without >= 1 * 4 * 2 * cl.gpu.host_sync_s
    # Megatron: one sync per layer forward (its host work per layer switched off: that one is
    # tested with the correction, test_costmodel_moe_wiring.py)
    no_work = replace(cl.gpu.corrections, megatron_moe_layer_host_ops=0.0)
    meg_cl = cl.replace(gpu=replace(cl.gpu, corrections=no_work))
    meg = mp.estimate(m, meg_cl, replace(job, runtime="megatron"), lay).step_time_s
    meg0 = mp.estimate(m, bare, replace(job, runtime="megatron"), lay).step_time_s
    assert meg - meg0 == pytest.approx(
        4 * 2 * (cl.gpu.host_sync_s + cl.gpu.host_op_dispatch_s), rel=0.05)


def test_executor_moe_layouts_no_gpu_has_timed_say_so():
    """etp > 1 and cp > 1 of an MoE model under runtime "torch" (run by the executor since
    2026-12-01, checked on CPU ranks only) carry a caution; runtime "megatron" and the
    timed layouts do not."""
    from meshplan.costmodel.caveats import MOE_UNTIMED_TORCH_CAVEAT
    head = MOE_UNTIMED_TORCH_CAVEAT.split("{")[0]
    m = replace(mp.ModelSpec.preset("mixtral-8x7b"), max_seq_len=32768)
    job = mp.Job(global_batch=64, seq_len=32768, runtime="torch")
    c = mp.Cluster.preset("dgx-h100", nodes=4)

    def said(layout, j=job):
        return sorted(x.split(" under")[0] for x in mp.estimate(m, c, j, layout).caveats
                      if x.startswith(head))
    kw = dict(tp=4, ep=8, dp=2, zero=1, micro_batch=1, recompute="full",
              sequence_parallel=True)
    assert said(mp.Layout(cp=4, etp=4, **kw)) == ["MoE with cp = 4", "MoE with etp = 4"]
    assert said(mp.Layout(cp=4, **kw)) == ["MoE with cp = 4"]
    assert said(mp.Layout(**{**kw, "dp": 8})) == []
    assert said(mp.Layout(cp=4, etp=4, **kw), replace(job, runtime="megatron")) == []
