"""Shared test body: run a world's cases once per module, then compare each to one process."""

import pytest

from _cases import ATOL, RTOL
from _harness import compare, reference, run_cases


def make_tests(world, cases):
    @pytest.fixture(scope="module")
    def results():
        return run_cases(world, cases)

    @pytest.mark.distributed
    @pytest.mark.parametrize("case", [c for c in cases if c.layout is not None],
                             ids=lambda c: c.name)
    def test_matches_single_process(results, case):
        compare(results[case.name], reference(case.model, case.job), rtol=RTOL, atol=ATOL)

    return results, test_matches_single_process
