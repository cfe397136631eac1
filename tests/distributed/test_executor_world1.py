"""Every layout of world size 1 trains like one process (losses of 3 steps, first-step grads)."""

import pytest

pytest.importorskip("torch")

from _cases import WORLD1  # noqa: E402
from _checks import make_tests  # noqa: E402

results, test_matches_single_process = make_tests(1, WORLD1)
