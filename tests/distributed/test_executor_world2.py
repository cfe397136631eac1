"""Every layout of world size 2 trains like one process (losses of 3 steps, first-step grads)."""

import pytest

pytest.importorskip("torch")

from _cases import WORLD2  # noqa: E402
from _checks import make_tests  # noqa: E402

results, test_matches_single_process = make_tests(2, WORLD2)


@pytest.mark.distributed
def test_hand_written_tp_matches_dtensor(results):
    """Column/row-parallel linears (with and without sequence parallelism) and the
    vocab-parallel embedding give DTensor parallelize_module's outputs and gradients."""
    r = results["dtensor-reference"]
    assert "error" not in r, r.get("error")
    diffs = r["dtensor"]
    assert len(diffs) == 10
    bad = {k: v for k, v in diffs.items() if v > 1e-6}
    assert not bad, f"hand-written TP differs from DTensor: {bad}"
