"""Expert parallelism trains like one process: MoE models under ep 1, 2 and 4 and etp 2
with dp, tp (with and without sequence parallelism), pp (GPipe, 1F1B, interleaved,
zero-bubble), ZeRO 0-3 and full recomputation give the single-process losses of 3 steps and
first-step gradients, rtol 1e-5 / atol 1e-6 as the dense layouts (tests/distributed/_cases.py), in
one spawned group of 4 ranks. The reference is one process, ep 1, the whole batch at once:
the per-sequence balance loss and capacity make routing independent of the cut."""

import pytest

pytest.importorskip("torch")

from meshplan.spec import Job, Layout  # noqa: E402

from _harness import Case  # noqa: E402
from _cases import GPT_MOE, LLAMA_MOE  # noqa: E402
from _checks import make_tests  # noqa: E402

JOB = Job(global_batch=8, seq_len=16, precision="fp32")
JOB16 = Job(global_batch=16, seq_len=16, precision="fp32")


def L(**kw):
    return Layout(micro_batch=kw.pop("micro_batch", 2), **kw)


MOE_WORLD4 = [
    Case("moe-dp4-ep1", LLAMA_MOE, JOB, L(dp=4)),
    Case("moe-dp4-ep2", LLAMA_MOE, JOB, L(dp=4, ep=2, micro_batch=1)),
    Case("moe-dp4-ep4-zero2", LLAMA_MOE, JOB, L(dp=4, ep=4, zero=2)),
    Case("moe-dp2-tp2-sp-ep2-zero1", LLAMA_MOE, JOB, L(dp=2, tp=2, ep=2, zero=1,
                                                        sequence_parallel=True)),
    Case("moe-dp2-pp2-ep2-1f1b", LLAMA_MOE, JOB, L(dp=2, pp=2, ep=2, micro_batch=1)),
    Case("moe-gpt-tp2-pp2-ep2-capacity-full", GPT_MOE, JOB,
         L(tp=2, pp=2, ep=2, schedule="gpipe", recompute="full")),
    Case("moe-gpt-dp4-ep4-capacity-zero1", GPT_MOE, JOB, L(dp=4, ep=4, zero=1)),
    # FSDP2 over an expert data-parallel group of 2 (ZeRO-3 reshards the experts too)
    Case("moe-gpt-dp4-ep2-capacity-zero3", GPT_MOE, JOB, L(dp=4, ep=2, zero=3)),
    # split input/weight backward passes around the all-to-alls
    Case("moe-dp2-pp2-ep2-zero-bubble", LLAMA_MOE, JOB16, L(dp=2, pp=2, ep=2,
                                                            schedule="zero-bubble")),
    Case("moe-dp2-pp2-ep2-interleaved-zero3", LLAMA_MOE, JOB16,
         L(dp=2, pp=2, ep=2, zero=3, schedule="interleaved-1f1b", vpp=2)),
    # expert tensor parallelism: each expert's width over etp 2 (over tp, and over dp)
    Case("moe-dp2-tp2-sp-ep2-etp2", LLAMA_MOE, JOB, L(dp=2, tp=2, ep=2, etp=2,
                                                       sequence_parallel=True)),
    Case("moe-dp4-ep2-etp2-zero3", LLAMA_MOE, JOB, L(dp=4, ep=2, etp=2, zero=3)),
    Case("moe-dp4-etp2-zero1", LLAMA_MOE, JOB, L(dp=4, etp=2, zero=1)),
    Case("moe-tp2-pp2-etp2-1f1b", LLAMA_MOE, JOB, L(tp=2, pp=2, etp=2, micro_batch=1)),
    Case("moe-dp2-pp2-etp2-zero-bubble", LLAMA_MOE, JOB16, L(dp=2, pp=2, etp=2,
                                                             schedule="zero-bubble")),
    # biased experts: b_in cut with the width, b_out added once to the summed outputs
    Case("moe-gpt-dp2-tp2-etp2-capacity", GPT_MOE, JOB, L(dp=2, tp=2, etp=2)),
    Case("moe-gpt-dp4-ep2-etp2-zero2", GPT_MOE, JOB, L(dp=4, ep=2, etp=2, zero=2)),
]

results, test_matches_single_process = make_tests(4, MOE_WORLD4)
