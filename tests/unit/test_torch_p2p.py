"""torch's interleaved p2p order (costmodel.torch_p2p); the estimate's use of it is tested in
test_measured_tables.py."""

import random

import pytest

from meshplan.costmodel import torch_p2p
from meshplan.costmodel.pipeline_sim import simulate


def test_lowering_is_torchs_own(load_benchmark):
    """Same compute, sends and receives, in the same order on every rank, as the installed
    torch's ScheduleInterleaved1F1B lowers them (CI: torch 2.13; the device's 2.11 with
    ``python benchmarks/check_torch_lowering.py``)."""
    pytest.importorskip("torch.distributed.pipelining")
    check = load_benchmark("check_torch_lowering")
    for pp, vpp, m in check.SHAPES:
        assert [list(x) for x in torch_p2p.lowered_interleaved(pp, vpp, m)] == \
            check.torch_lowered(pp, vpp, m), (pp, vpp, m)
    assert check.main() == 0


def test_two_ranks_lose_nothing_to_the_order():
    """pp = 2: a rank's only peer is the other rank, so the order costs no compute time:
    the replay is the dependency-only schedule exactly when transfers are free, and a few
    transfer times longer otherwise (one stream serialises them), which the slowed closed
    form covers (why ``applies`` starts at pp = 3)."""
    rng = random.Random(5)
    for m in (2, 4, 8, 16):
        f = [rng.uniform(1e-3, 3e-3) for _ in range(4)]
        b = [rng.uniform(2e-3, 6e-3) for _ in range(4)]
        sim = simulate("interleaved-1f1b", f, b, m, pp=2, vpp=2, p2p_s=0.0).step_time_s
        assert torch_p2p.fifo_step_s(tuple(f), tuple(b), m, 2, 2, 0.0) == pytest.approx(sim)
        p2p = 5e-4
        sim = simulate("interleaved-1f1b", f, b, m, pp=2, vpp=2, p2p_s=p2p).step_time_s
        assert sim <= torch_p2p.fifo_step_s(tuple(f), tuple(b), m, 2, 2, p2p) <= sim + 8 * p2p
    assert not torch_p2p.applies("torch", "interleaved-1f1b", 2, 2, 8, max_microbatches_per_rank=4)


def test_an_early_receive_holds_later_sends_from_pp_3_on():
    """pp = 4, vpp = 2, equal stages: rank 0 posts stage 4's receive after its first
    forward and its sends to rank 1 queue behind it, so the step is longer than the
    dependency-only schedule's, by whole chunk times, not by the p2p time."""
    f, b = [1e-3] * 8, [2e-3] * 8
    for m in (4, 8):
        sim = simulate("interleaved-1f1b", f, b, m, pp=4, vpp=2, p2p_s=0.0).step_time_s
        fifo = torch_p2p.fifo_step_s(tuple(f), tuple(b), m, 4, 2, 0.0)
        assert fifo > sim + 1e-3
    lowered = torch_p2p.lowered_interleaved(4, 2, 8)[0]
    assert lowered[:3] == (("F", 0, 0), ("SEND_F", 0, 0), ("RECV_F", 4, 0))
    # the bound exists only where torch's runtime issues the order
    assert torch_p2p.applies("torch", "interleaved-1f1b", 4, 2, 8, max_microbatches_per_rank=4)
    for args in (("megatron", "interleaved-1f1b", 4, 2, 8), ("torch", "1f1b", 4, 1, 8),
                 ("torch", "interleaved-1f1b", 4, 2, 6)):
        assert not torch_p2p.applies(*args, max_microbatches_per_rank=4)
