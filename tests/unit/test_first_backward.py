"""The walk that finds which gradients a pipeline rank has not allocated at its peak."""
import pytest

from meshplan.costmodel.first_backward import (backward_event_sums, backward_events,
                                               relief_bytes, relief_bytes_ends)


def _walk_peak(schedule, pp, v, m, rank, act, grad):
    """Brute force over every operation (no de-duplication), for comparison."""
    from meshplan.costmodel.pipeline_sim import rank_order
    counts, seen, peak, most = [0] * v, [False] * v, 0.0, 0.0
    for kind, c, _ in rank_order(schedule, pp, v, m, rank):
        if kind == 0:
            counts[c] += 1
            most = max(most, sum(n * act[i] for i, n in enumerate(counts)))
        else:
            level = sum(n * act[i] for i, n in enumerate(counts)) + sum(
                grad[i] for i in range(v) if seen[i])
            peak = max(peak, level + (0.0 if seen[c] else max(0.0, grad[c] - act[c])))
            counts[c] -= 1
            seen[c] = True
    return most + sum(grad) - peak


def test_a_gpipe_or_1f1b_rank_walks_as_the_first_rank_of_a_pipeline_as_deep_as_its_rest():
    """backward_event_sums computes a GPipe rank once per micro-batch count and a 1F1B rank
    once per (pipeline depth left, micro-batches): their walks are the same."""
    for pp in range(1, 13):
        for m in range(1, 30):
            for r in range(pp):
                assert backward_events("1f1b", pp, 1, m, r) == \
                    backward_events("1f1b", pp - r, 1, m, 0)
                assert backward_events("gpipe", pp, 1, m, r) == \
                    backward_events("gpipe", 1, 1, m, 0)
                assert backward_event_sums("1f1b", pp, 1, m, r) == \
                    backward_event_sums("1f1b", pp - r, 1, m, 0)


@pytest.mark.parametrize("schedule,pp,v,m", [
    ("gpipe", 4, 1, 6), ("1f1b", 2, 1, 2), ("1f1b", 4, 1, 8), ("interleaved-1f1b", 4, 2, 4),
    ("interleaved-1f1b", 4, 8, 64), ("interleaved-1f1b", 2, 3, 8), ("gpipe", 2, 1, 3),
    ("interleaved-1f1b", 8, 4, 24), ("interleaved-1f1b", 4, 3, 5), ("1f1b", 8, 1, 3)])
def test_the_reduced_events_give_the_walk_for_uniform_chunks_with_ends(schedule, pp, v, m):
    """relief_bytes_ends on backward_event_sums equals relief_bytes on the full events for
    equal chunks plus the ends on the first and last chunk (one chunk: both on it), with
    the states that can never be the peak dropped."""
    import random
    rng = random.Random(7)
    for rank in range(pp):
        ev, sums = backward_events(schedule, pp, v, m, rank), \
            backward_event_sums(schedule, pp, v, m, rank)
        assert len(sums[0]) <= len(ev[0]) and len(sums[1]) <= len(ev[1])
        for i in range(60):
            a, g, fa, fg, la, lg = (rng.uniform(0, 2) * (i % 3 != 1 or k < 2)
                                    for k in range(6))       # every third without ends
            act, grad = [a] * v, [g] * v
            act[0] += fa
            grad[0] += fg
            act[-1] += la
            grad[-1] += lg
            assert relief_bytes_ends(sums, a, g, fa, fg, la, lg) == pytest.approx(
                relief_bytes(ev, act, grad), abs=1e-12)


@pytest.mark.parametrize("schedule,pp,v,m", [
    ("gpipe", 4, 1, 6), ("1f1b", 4, 1, 2), ("1f1b", 4, 1, 8),
    ("interleaved-1f1b", 4, 2, 4), ("interleaved-1f1b", 4, 3, 8),
    ("interleaved-1f1b", 2, 2, 8)])
def test_de_duplicated_events_give_the_brute_force_peak(schedule, pp, v, m):
    act, grad = [1.0 + 0.25 * c for c in range(v)], [1.7 - 0.3 * c for c in range(v)]
    for rank in range(pp):
        ev = backward_events(schedule, pp, v, m, rank)
        assert relief_bytes(ev, act, grad) == pytest.approx(
            max(0.0, _walk_peak(schedule, pp, v, m, rank, act, grad)))


def test_one_chunk_gives_min_of_gradients_and_one_micro_batch_where_all_forwards_run_first():
    A, G = 2.0, 3.0
    # GPipe: every rank runs all forwards first
    for rank in range(4):
        assert relief_bytes(backward_events("gpipe", 4, 1, 8, rank), [A], [G]) == min(A, G)
    # 1F1B, pp 4, m 2: ranks 0-2 have a warm-up covering both micro-batches, rank 3 does not
    got = [relief_bytes(backward_events("1f1b", 4, 1, 2, r), [A], [G]) for r in range(4)]
    assert got == [min(A, G)] * 3 + [0.0]
    # steady-state 1F1B: a forward follows the first backward, the peak holds everything
    assert relief_bytes(backward_events("1f1b", 4, 1, 16, 0), [A], [G]) == 0.0


def test_interleaved_rank_running_all_forwards_first_never_holds_later_chunks_gradients():
    """v09 of holdout13 (round 15): pp 4, v 2, m 4, rank 0 runs all 8 chunk forwards, then
    chunk 1's four backwards, then chunk 0's: chunk 0's gradients arrive after 4 A left."""
    A, G = 0.375, 0.70
    ev = backward_events("interleaved-1f1b", 4, 2, 4, 0)
    assert relief_bytes(ev, [A, A], [G, G]) == pytest.approx(2 * G - (G - A))
    # rank 2's warm-up (6 chunks) leaves one forward after its first backward: still chunk
    # 0's gradients only come once four backwards of chunk 1 ran
    assert relief_bytes(backward_events("interleaved-1f1b", 4, 2, 4, 2), [A, A], [G, G]) \
        == pytest.approx(G)
    # many micro-batches: the steady state holds every gradient with the most activations
    assert relief_bytes(backward_events("interleaved-1f1b", 4, 2, 32, 0), [A, A], [G, G]) \
        == pytest.approx(0.0, abs=1e-12)


def test_steady_state_collapses_so_the_events_do_not_grow_with_the_micro_batches():
    few = backward_events("interleaved-1f1b", 8, 4, 64, 0)
    many = backward_events("interleaved-1f1b", 8, 4, 512, 0)
    assert [len(x) for x in many] == [len(x) for x in few]
    assert len(many[1]) < 2 * 512 * 4 // 20     # vs one event per backward


def test_forwards_first_is_true_where_no_forward_follows_the_first_backward():
    from meshplan.costmodel.first_backward import forwards_first
    assert all(forwards_first("gpipe", 4, 1, 8, r) for r in range(4))
    # 1F1B pp 2 m 2: rank 0 runs F0 F1 B0 B1 (GPipe's order), rank 1 F0 B0 F1 B1
    assert [forwards_first("1f1b", 2, 1, 2, r) for r in range(2)] == [True, False]
    # pp 4 m 4 (holdout16 z13): only rank 0's warm-up covers every micro-batch
    assert [forwards_first("1f1b", 4, 1, 4, r) for r in range(4)] == [True, False, False, False]
    assert not forwards_first("1f1b", 2, 1, 16, 0)
    # interleaved: v09's rank 0 (pp 4, v 2, m 4) runs all eight chunk forwards first
    assert forwards_first("interleaved-1f1b", 4, 2, 4, 0)
    assert not forwards_first("interleaved-1f1b", 4, 2, 4, 3)
