"""Compiled blocks whose collectives sit inside the executor's autograd functions train like
eager ones, a whole step at a time (CPU, gloo, 2 ranks, fp32): a dense model at cp 2 with
all-to-all (Ulysses) and ring attention, with selective recompute at tp 2 and pp 2, and
under zero-bubble; the MoE layouts (ep 2 over dp 2 and over tp 2 with sequence parallelism,
etp, cp, a capacity) in test_compiled_moe_steps_world2.py, a world of their own so that the
two files run on both test workers. (tp 2 + SP on a dense model: test_compile_sp_world2.py.)

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

from meshplan.spec import Job  # noqa: E402

from _cases import LLAMA  # noqa: E402
from _checks import make_compiled_step_tests  # noqa: E402

JOB = Job(global_batch=8, seq_len=16, precision="fp32")
LAYOUTS = {"cp2-a2a": (LLAMA, dict(cp=2, cp_style="all-to-all")),
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
results, test_compiled_step_trains_like_eager = make_compiled_step_tests(2, LAYOUTS, JOB)
