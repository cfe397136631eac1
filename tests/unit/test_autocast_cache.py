"""Autocast's weight casts kept by in-flight micro-batches under selective recompute
(meshplan/costmodel/autocast_cache.py)."""
import threading
from dataclasses import replace

import pytest

from meshplan.costmodel.autocast_cache import extra_cast_copies, live_cast_generations
from meshplan.costmodel.estimate import estimate, layer_tables
from meshplan.costmodel.memory import stage_params
from meshplan.costmodel.pipeline import inflight_microbatches
from meshplan.costmodel.specs import Job, Layout, ModelSpec
from meshplan.hardware_profiles import Cluster

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
JOB = Job(global_batch=16, seq_len=1024, runtime="torch")
CLUSTER = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)


def test_generations_by_schedule():
    # 1F1B, pp 2, rank 0: F0 F1 | B0 F2 — micro-batches 1 and 2 saved different casts
    assert live_cast_generations("1f1b", 2, 1, 8, 0) == 2.0
    assert live_cast_generations("1f1b", 2, 1, 8, 1) == 1.0
    # GPipe: every forward before the first backward, one cast
    assert live_cast_generations("gpipe", 4, 1, 16, 0) == 1.0
    # interleaved pp 2 vpp 2, m 8 (holdout6 j12): 2.5 and 1.5 copies of the rank's layers,
    # as measured on 2 × H100 (docs/benchmarks/accuracy.md, round 12)
    assert live_cast_generations("interleaved-1f1b", 2, 2, 8, 0) == 2.5
    assert live_cast_generations("interleaved-1f1b", 2, 2, 8, 1) == 1.5
    # outside GPipe every in-flight micro-batch was forwarded after a different backward
    for schedule, pp, vpp, m in (("1f1b", 4, 1, 16), ("interleaved-1f1b", 4, 2, 16),
                                 ("zero-bubble", 4, 1, 16)):
        for r in range(pp):
            assert live_cast_generations(schedule, pp, vpp, m, r) == \
                pytest.approx(inflight_microbatches(schedule, pp, vpp, m, r))
    # ... though with vpp 3 two chunks' casts can share a generation at the peak
    for r in range(4):
        assert 1.0 <= live_cast_generations("interleaved-1f1b", 4, 3, 12, r) <= \
            inflight_microbatches("interleaved-1f1b", 4, 3, 12, r)
    assert live_cast_generations("interleaved-1f1b", 4, 3, 12, 0) == pytest.approx(14 / 3)


def test_only_autocast_with_selective_recompute_under_a_pipeline():
    args = ("1f1b", 2, 1, 8)
    assert extra_cast_copies("torch", "bf16", 0, "selective", *args) == (1.0, 0.0)
    assert extra_cast_copies("torch", "bf16", 1, "selective", *args) == (1.0, 0.0)
    for runtime, precision, zero, recompute in (("torch", "bf16", 0, "none"),
                                                ("torch", "bf16", 0, "full"),
                                                ("torch", "bf16", 2, "selective"),  # FSDP2
                                                ("torch", "fp32", 0, "selective"),
                                                ("megatron", "bf16", 0, "selective")):
        assert extra_cast_copies(runtime, precision, zero, recompute, *args) == (0.0, 0.0)
    assert extra_cast_copies("torch", "bf16", 0, "selective", "1f1b", 1, 1, 8) == (0.0,)


def test_estimate_counts_the_extra_casts_per_layer():
    lay = Layout(pp=2, micro_batch=1, schedule="1f1b", recompute="selective")
    t = layer_tables(MODEL, CLUSTER, JOB, lay)
    per_layer = stage_params(MODEL, 1, 1, first=False, last=False, pp=2) * 2    # bf16
    assert t.cast_extra == (1.0, 0.0)
    assert t.layer_cast_bytes == pytest.approx(per_layer)
    base = replace(t, cast_extra=())
    assert t.rank_memory_bytes(0, 4) - base.rank_memory_bytes(0, 4) == \
        pytest.approx(4 * per_layer)
    assert t.rank_memory_bytes(1, 4) == pytest.approx(base.rank_memory_bytes(1, 4))
    est = estimate(MODEL, CLUSTER, JOB, lay)
    # the estimate's rows are the tables' (the casts count as activations: saved tensors)
    est = estimate(MODEL, CLUSTER, JOB, lay)
    assert est.memory[0].total_bytes == pytest.approx(t.rank_memory_bytes(0, 4))
    assert est.memory[0].activations_bytes == pytest.approx(t.rank_variable_bytes(0, 4)[0])
    assert t.rank_variable_bytes(0, 4)[0] - base.rank_variable_bytes(0, 4)[0] == \
        pytest.approx(4 * per_layer)


def test_torch_clears_the_cast_cache_from_the_backward_thread():
    """The mechanism, on the installed torch: with a checkpointed region the backward
    (run on another thread, as CUDA's autograd engine does) clears autocast's cache, so the
    next forward saves a new cast of the same weight; without it the cast is reused."""
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint

    lin1, lin2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(x, selective):
        a = lin1(x)
        b = checkpoint(torch.relu, a, use_reentrant=False) if selective else torch.relu(a)
        return lin2(b)

    def casts_saved(selective):
        seen: list[list] = []    # the casts themselves: no address is freed and reused

        def pack(t):
            if t.dtype == torch.bfloat16 and tuple(t.shape) == (16, 16):
                seen[-1].append(t)
            return t
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                seen.append([])
                first = forward(torch.randn(4, 16, requires_grad=True), selective)
            worker = threading.Thread(target=lambda: first.sum().backward())
            worker.start()
            worker.join()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                seen.append([])
                forward(torch.randn(4, 16, requires_grad=True), selective)
        return [{t.untyped_storage().data_ptr() for t in casts} for casts in seen]

    before, after = casts_saved(selective=False)
    assert before and before == after
    before, after = casts_saved(selective=True)
    assert before and after and not before & after
