"""Context parallelism over 2 ranks trains like one process (cp = 1): losses of 3 steps and
the first step's full gradients within rtol 1e-5, atol 1e-6 (_cases.RTOL / ATOL), every
replica over cp identical. Both styles, GQA and MHA, RoPE and learned positions, with
recomputation and with ZeRO-3 sharding over the cp ranks; a dropless MoE model with its
experts whole on each cp rank and spread over them (ep 2: the expert mesh folds over cp),
and one with a capacity (which copies drop depends on positions across the cp chunks);
multi-head latent attention, whose value head dim differs from the query-key one, in both
styles."""

from dataclasses import replace

import pytest

pytest.importorskip("torch")

from _cases import GPT, GPT_MOE, JOB, LLAMA, LLAMA_MOE, L  # noqa: E402
from _checks import make_tests  # noqa: E402
from _harness import Case  # noqa: E402
from _mla_models import MLA as _MLA, MLA_NOQ as _MLA_NOQ  # noqa: E402

# multi-head latent attention: v narrower (MLA) and wider (MLA_NOQ) than q and k, so the
# ring's blocks run the math kernel on CPU (the CPU flash kernel wants one head dim)
MLA, MLA_NOQ = (replace(m, vocab_size=128) for m in (_MLA, _MLA_NOQ))

A2A = "all-to-all"
CP_WORLD2 = [
    Case("cp2-ring-llama-gqa", LLAMA, JOB, L(cp=2)),
    Case("cp2-ring-gpt-learned-pos", GPT, JOB, L(cp=2)),
    Case("cp2-a2a-llama-gqa", LLAMA, JOB, L(cp=2, cp_style=A2A)),
    Case("cp2-a2a-gpt", GPT, JOB, L(cp=2, cp_style=A2A)),
    Case("cp2-ring-selective", LLAMA, JOB, L(cp=2, recompute="selective")),
    Case("cp2-ring-full-gpt", GPT, JOB, L(cp=2, recompute="full")),
    Case("cp2-ring-zero3", LLAMA, JOB, L(cp=2, zero=3)),
    Case("cp2-ring-moe", LLAMA_MOE, JOB, L(cp=2)),
    Case("cp2-a2a-moe-ep2", LLAMA_MOE, JOB, L(cp=2, ep=2, cp_style=A2A)),
    Case("cp2-ring-moe-capacity", GPT_MOE, JOB, L(cp=2)),
    Case("cp2-a2a-moe-capacity-ep2", GPT_MOE, JOB, L(cp=2, ep=2, cp_style=A2A)),
    Case("cp2-ring-mla", MLA, JOB, L(cp=2)),
    Case("cp2-ring-mla-noq-selective", MLA_NOQ, JOB, L(cp=2, recompute="selective")),
    Case("cp2-a2a-mla", MLA, JOB, L(cp=2, cp_style=A2A)),
]

results, test_matches_single_process = make_tests(2, CP_WORLD2)
