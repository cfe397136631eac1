"""Context parallelism over 4 ranks, alone (cp 4) and composed with tp (with and without
sequence parallelism), dp (ZeRO-1, ZeRO-3 over dp × cp) and pp (1F1B with tied embeddings,
interleaved), trains like one process: losses of 3 steps and the first step's full
gradients within rtol 1e-5, atol 1e-6 (_cases.RTOL / ATOL). A dropless MoE model with cp 2 ×
tp 2, its tokens cut over both (with and without sequence parallelism), experts over ep 4
and over ep 2 with dp 2 around it. A model with a capacity (experts drop copies beyond it,
earlier positions first) at cp 2 × tp 2, its tokens cut over both: each rank counts the
copies of every earlier piece of the sequence (executor.moe.sequence_pieces)."""

import pytest

pytest.importorskip("torch")

from _cases import GPT, GPT_MOE, JOB, LLAMA, LLAMA_MOE, L  # noqa: E402
from _checks import make_tests  # noqa: E402
from _harness import Case  # noqa: E402

A2A = "all-to-all"
CP_WORLD4 = [
    Case("cp4-ring-llama-gqa", LLAMA, JOB, L(cp=4)),
    Case("cp4-a2a-gpt", GPT, JOB, L(cp=4, cp_style=A2A)),
    Case("cp2-tp2-sp-ring-llama", LLAMA, JOB, L(cp=2, tp=2, sequence_parallel=True)),
    Case("cp2-tp2-a2a-gpt", GPT, JOB, L(cp=2, tp=2, cp_style=A2A)),
    # learned positions of the sequence-parallel slice of a cp rank's tokens
    Case("cp2-tp2-sp-ring-gpt", GPT, JOB, L(cp=2, tp=2, sequence_parallel=True)),
    Case("cp2-dp2-zero1-ring-llama", LLAMA, JOB, L(cp=2, dp=2, zero=1)),
    Case("cp2-dp2-zero3-ring-gpt", GPT, JOB, L(cp=2, dp=2, zero=3)),
    Case("cp2-pp2-1f1b-ring-gpt-tied", GPT, JOB, L(cp=2, pp=2, schedule="1f1b")),
    Case("cp2-pp2-interleaved-a2a-llama", LLAMA, JOB,
         L(cp=2, pp=2, schedule="interleaved-1f1b", vpp=2, micro_batch=1, cp_style=A2A)),
    Case("cp2-tp2-sp-ring-moe-ep4", LLAMA_MOE, JOB, L(cp=2, tp=2, ep=4,
                                                      sequence_parallel=True)),
    Case("cp2-tp2-ring-moe-ep2", LLAMA_MOE, JOB, L(cp=2, tp=2, ep=2)),
    Case("cp2-dp2-zero1-ring-moe-ep2", LLAMA_MOE, JOB, L(cp=2, dp=2, ep=2, zero=1)),
    Case("cp2-tp2-sp-ring-moe-capacity-ep2", GPT_MOE, JOB, L(cp=2, tp=2, ep=2,
                                                             sequence_parallel=True)),
    Case("cp2-tp2-a2a-moe-capacity", GPT_MOE, JOB, L(cp=2, tp=2, cp_style=A2A)),
]

results, test_matches_single_process = make_tests(4, CP_WORLD4)
