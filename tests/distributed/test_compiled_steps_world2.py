"""Compiled blocks whose collectives sit inside the executor's autograd functions train like
eager ones, a whole step at a time (CPU, gloo, 2 ranks, fp32): an MoE model at ep 2 over dp 2
and over tp 2 with sequence parallelism, a dense one at cp 2 with all-to-all (Ulysses) and
ring attention, with selective recompute at tp 2 and pp 2, and under zero-bubble. (tp 2 +
SP on a dense model: test_compile_sp_world2.py.)

Why: under torch 2.11 (the GPU machines') Dynamo traced the experts' all-to-all and the
sequence-parallel reduce-scatter and Ulysses' all-to-all to a zero gradient, so every
compiled ep > 1, tp + SP and Ulysses cp layout trained without part of its backward
(docs/benchmarks/compiled_grads.md). The fix is checked per autograd function by
test_compiled_collective_grads.py; this runs whole compiled steps — for MoE the router,
dispatch, grouped experts, combine, balance loss; the optimizer — against eager ones: the losses of three steps and the first step's full gradients. Run it
under torch 2.11 too whenever the executor changes (CI runs 2.13). Tolerance: fp32
reassociation by the compiled kernels, rtol 1e-5 on losses, atol 1e-6 on gradients (entries
up to ~1e-2), as test_compile_sp_world2.py.
"""

import pytest

pytest.importorskip("torch")

from meshplan.spec import Job, Layout  # noqa: E402

from _cases import GPT_MOE, LLAMA, LLAMA_MOE  # noqa: E402
import torch  # noqa: E402

from _harness import Case, run_cases  # noqa: E402

JOB = Job(global_batch=8, seq_len=16, precision="fp32")
LAYOUTS = {"moe-dp2-ep2": (LLAMA_MOE, dict(dp=2, ep=2)),
           "moe-tp2-sp-ep2": (LLAMA_MOE, dict(tp=2, sequence_parallel=True, ep=2)),
           "moe-tp2-etp2": (LLAMA_MOE, dict(tp=2, etp=2)),
           "moe-cp2-ring": (LLAMA_MOE, dict(cp=2)),
           # a capacity at cp 2: the copies per piece of the sequence summed over cp
           "moe-capacity-cp2-ring": (GPT_MOE, dict(cp=2)),
           "cp2-a2a": (LLAMA, dict(cp=2, cp_style="all-to-all")),
           "cp2-ring": (LLAMA, dict(cp=2)),
           # selective recompute in a compiled block checkpoints the attention core in the
           # block's graph (eager: the executor's autograd Function); also under pp 1f1b
           "tp2-selective": (LLAMA, dict(tp=2, recompute="selective")),
           "pp2-1f1b-selective": (LLAMA, dict(pp=2, schedule="1f1b", recompute="selective")),
           # zero-bubble's split passes keep the graph between B and W: compiled blocks
           # without donated buffers (ParallelTrainer._compile_config); they hung before
           "pp2-zero-bubble": (LLAMA, dict(pp=2, schedule="zero-bubble")),
           "pp2-zero-bubble-selective": (LLAMA, dict(pp=2, schedule="zero-bubble",
                                                     recompute="selective"))}
CASES = [Case(f"{name}-{'compiled' if c else 'eager'}", model, JOB,
              Layout(micro_batch=2, compile=c, **kw))
         for name, (model, kw) in LAYOUTS.items() for c in (True, False)]


@pytest.fixture(scope="module")
def results():
    return run_cases(2, CASES)


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_compiled_step_trains_like_eager(results, name):
    compiled, eager = results[f"{name}-compiled"], results[f"{name}-eager"]
    for run in (compiled, eager):
        assert "error" not in run, run.get("error")
    torch.testing.assert_close(torch.tensor(compiled["losses"]), torch.tensor(eager["losses"]),
                               rtol=1e-5, atol=0)
    assert compiled["grads"].keys() == eager["grads"].keys()
    if name.startswith("moe"):
        assert any("expert" in n for n in eager["grads"]), sorted(eager["grads"])
    for n, g in eager["grads"].items():
        assert g.abs().max() > 0, n                 # every parameter has a gradient to compare
        torch.testing.assert_close(compiled["grads"][n], g, rtol=0, atol=1e-6)
