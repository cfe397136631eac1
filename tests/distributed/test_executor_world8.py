"""Every layout of world size 8 trains like one process (losses of 3 steps, first-step grads)."""

import pytest

pytest.importorskip("torch")

from _cases import WORLD8  # noqa: E402
from _checks import make_tests  # noqa: E402

results, test_matches_single_process = make_tests(8, WORLD8)
