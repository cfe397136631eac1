"""Compiled MoE blocks train like eager ones a whole step at a time (CPU, gloo, 2 ranks,
fp32): the router, dispatch, grouped experts, combine and balance loss at ep 2 over dp 2 and
over tp 2 with sequence parallelism, etp 2, and ring cp 2 with a capacity (the cp path of the
routing, plus the copies per piece of the sequence summed over cp; the dropless model's
router, shared experts and dense layer compile in the other layouts). Why, and the
tolerance: test_compiled_steps_world2.py (the dense layouts).

The models are _cases' tiny MoE models cut to two layers (the Llama one: its dense first
layer and one MoE layer): Dynamo compiles a block per kind of block, not per layer, and the
later MoE layers of the four-layer models only reuse, or recompile with dynamic token
counts, the graphs the first one traced, as one layer's later micro-batches and steps do.
Each layout traced as many graphs of as many calls at two layers as at four (Dynamo's
unique_graphs and calls_captured on rank 0, 2026-12-04); the file took 54 s of CPU, not 63."""

from dataclasses import replace

import pytest

pytest.importorskip("torch")

from meshplan.spec import Job  # noqa: E402

from _cases import GPT_MOE, LLAMA_MOE  # noqa: E402
from _checks import make_compiled_step_tests  # noqa: E402

LLAMA_MOE2 = replace(LLAMA_MOE, num_layers=2)      # dense_layers=(0,): layer 1 is MoE
GPT_MOE2 = replace(GPT_MOE, num_layers=2)
JOB = Job(global_batch=8, seq_len=16, precision="fp32")
LAYOUTS = {"moe-dp2-ep2": (LLAMA_MOE2, dict(dp=2, ep=2)),
           "moe-tp2-sp-ep2": (LLAMA_MOE2, dict(tp=2, sequence_parallel=True, ep=2)),
           "moe-tp2-etp2": (LLAMA_MOE2, dict(tp=2, etp=2)),
           # a capacity at cp 2: the copies per piece of the sequence summed over cp
           "moe-capacity-cp2-ring": (GPT_MOE2, dict(cp=2))}
results, test_compiled_step_trains_like_eager = make_compiled_step_tests(2, LAYOUTS, JOB)
