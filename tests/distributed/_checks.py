"""Shared test bodies: run a world's cases once per module, then compare each to one
process, or each compiled layout to its eager twin."""

import pytest

from _cases import ATOL, RTOL
from _harness import Case, compare, reference, run_cases


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


def make_compiled_step_tests(world, layouts, job):
    """``layouts`` ({name: (model, Layout keywords)}) each compiled and eager in one spawned
    world, the compiled run checked against the eager one: the losses of three steps (rtol
    1e-5) and the first step's full gradients (atol 1e-6; fp32 reassociation by the
    compiled kernels, as tests/distributed/test_compile_sp_world2.py)."""
    import torch

    from meshplan.spec import Layout
    cases = [Case(f"{name}-{'compiled' if c else 'eager'}", model, job,
                  Layout(micro_batch=2, compile=c, **kw))
             for name, (model, kw) in layouts.items() for c in (True, False)]

    @pytest.fixture(scope="module")
    def results():
        return run_cases(world, cases)

    @pytest.mark.distributed
    @pytest.mark.parametrize("name", list(layouts))
    def test_compiled_step_trains_like_eager(results, name):
        compiled, eager = results[f"{name}-compiled"], results[f"{name}-eager"]
        for run in (compiled, eager):
            assert "error" not in run, run.get("error")
        torch.testing.assert_close(torch.tensor(compiled["losses"]),
                                   torch.tensor(eager["losses"]), rtol=1e-5, atol=0)
        assert compiled["grads"].keys() == eager["grads"].keys()
        if name.startswith("moe"):
            assert any("expert" in n for n in eager["grads"]), sorted(eager["grads"])
        for n, g in eager["grads"].items():
            assert g.abs().max() > 0, n             # every parameter has a gradient to compare
            torch.testing.assert_close(compiled["grads"][n], g, rtol=0, atol=1e-6)

    return results, test_compiled_step_trains_like_eager
