"""Zero-bubble's gradients appear in a rank's first W: a step of few micro-batches peaks
before any exists (:func:`meshplan.costmodel.first_backward.zero_bubble_relief`)."""
import pytest

from meshplan.costmodel.first_backward import (zero_bubble_events, zero_bubble_order,
                                               zero_bubble_relief)
from meshplan.costmodel.tables import layer_tables
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec


def _torch_order(pp, m, rank):
    """torch's own action list for ScheduleInterleavedZeroBubble, one stage per rank."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    sched = object.__new__(schedules.ScheduleInterleavedZeroBubble)
    sched.n_local_stages, sched.pp_group_size, sched._n_microbatches = 1, pp, m
    sched.number_of_rounds = max(1, m // pp)
    sched.microbatches_per_round = m // sched.number_of_rounds
    kind = {schedules._ComputationType.FORWARD: "F",
            schedules._ComputationType.BACKWARD_INPUT: "I",
            schedules._ComputationType.BACKWARD_WEIGHT: "W"}
    return tuple((kind[a.computation_type], a.microbatch_index)
                 for a in sched._calculate_single_rank_operations(rank) if a is not None)


@pytest.mark.parametrize("pp,m", [(2, 1), (2, 2), (2, 4), (2, 8), (4, 2), (4, 4), (4, 8),
                                  (4, 16)])
def test_order_is_torchs(pp, m):
    for rank in range(pp):
        assert zero_bubble_order(pp, m, rank) == _torch_order(pp, m, rank)


def _brute(pp, m, rank, A, K, G):
    acts = kept = 0
    on = False
    most = peak = 0.0
    for kind, _ in zero_bubble_order(pp, m, rank):
        if kind == "W":
            level = acts * A + kept * K + (G if on else 0.0)
            peak = max(peak, level + (0.0 if on else max(0.0, G - A - K)))
            acts, kept, on = acts - 1, kept - (1 if rank else 0), True
            continue
        acts += kind == "F"
        kept += kind == "I" and rank > 0
        most = max(most, acts * A + kept * K)
        peak = max(peak, acts * A + kept * K + (G if on else 0.0))
    return most + G - peak


@pytest.mark.parametrize("pp,m", [(2, 1), (2, 2), (2, 8), (4, 3), (4, 4), (4, 8)])
def test_events_give_the_brute_force_relief(pp, m):
    for rank in range(pp):
        for A, K, G in [(1.0, 0.3, 0.8), (1.0, 0.3, 2.5), (0.2, 0.1, 1.0)]:
            got = zero_bubble_relief(zero_bubble_events(pp, m, rank), A, K, G)
            assert got == pytest.approx(_brute(pp, m, rank, A, K, G))


def test_few_microbatches_relieve_the_gradients_many_do_not():
    A, K, G = 1.0, 0.25, 0.6
    # m = 1, pp 2: F0 I0 W0 on both ranks, the peak before W0 allocates anything
    assert zero_bubble_relief(zero_bubble_events(2, 1, 1), A, K, G) == pytest.approx(G)
    assert zero_bubble_relief(zero_bubble_events(2, 1, 0), A, K, G) == pytest.approx(G)
    # gradients larger than what the first W frees: only that much is relieved
    assert zero_bubble_relief(zero_bubble_events(2, 1, 1), A, K, 3.0) == pytest.approx(A + K)
    # m = 8: the steady state returns to the largest state with every gradient allocated
    for rank in range(2):
        assert zero_bubble_relief(zero_bubble_events(2, 8, rank), A, K, G) == 0.0


MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
CLUSTER = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=2)


def _tables(global_batch, recompute="selective"):
    return layer_tables(MODEL, CLUSTER, Job(global_batch=global_batch, seq_len=1024,
                                            runtime="torch"),
                        Layout(pp=2, micro_batch=4, schedule="zero-bubble", recompute=recompute))


def test_cost_model_drops_the_gradients_of_a_one_microbatch_step_only():
    one, many = _tables(4), _tables(64)          # m = 1 and m = 16
    layers = 4
    grads = layers * one.relief_layer_grad_bytes + one.relief_last_grad_bytes
    assert grads > 0
    assert one.first_backward_relief_bytes(1, layers) == pytest.approx(grads)
    assert one.first_backward_relief_bytes(0, layers) == pytest.approx(
        layers * one.relief_layer_grad_bytes + one.relief_first_grad_bytes)
    assert many.first_backward_relief_bytes(0, layers) == 0.0
    assert many.first_backward_relief_bytes(1, layers) == 0.0
    # full recomputation prices its W from measured sets: not walked
    assert not _tables(4, "full").relief_events
