"""benchmarks/diag_pipeline_fifo.py: torch's lowered pipeline replayed (round 5 diagnostic)."""

import pytest

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def diag(load_benchmark):
    mod = load_benchmark("diag_pipeline_fifo")
    try:
        mod.lowered(2, 2, 4, "interleaved-1f1b")
    except (AttributeError, TypeError) as exc:   # a private torch API: may move
        pytest.skip(f"this torch lowers schedules differently: {exc}")
    return mod


@pytest.mark.parametrize("schedule,vpp", [("interleaved-1f1b", 2), ("zero-bubble", 1)])
def test_replay_runs_every_action_and_fifo_never_helps(diag, schedule, vpp):
    times = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
    busy = 8 * vpp * 3.0                       # F + B, or F + I + W, per chunk: 3
    free = diag.simulate(2, vpp, 8, schedule, lambda s, k: times[k], 0.01, fifo=False)
    fifo = diag.simulate(2, vpp, 8, schedule, lambda s, k: times[k], 0.01, fifo=True)
    assert busy < free <= fifo + 1e-9
    # interleaved bubble: (pp - 1) * (F + B) of one chunk, 1F1B's of a whole stage / v
    if schedule == "interleaved-1f1b":
        assert free - busy == pytest.approx(3.0, abs=0.1)
