"""Compiled blocks and the compiled loss over FSDP2 (ZeRO-2 / ZeRO-3 with full recompute, each
block prefetching the next block's all-gather) train like the eager ZeRO-2 run (CPU, gloo,
2 ranks, fp32, tied embeddings: the loss is compiled where tp = 1).

Tolerance: fp32 reassociation by the compiled kernels (as tests/distributed/
test_compile_sp_world2.py): rtol 1e-5 on the losses of three AdamW steps, atol 1e-6 on the
first step's full gradients (entries up to about 1e-2).
"""

import pytest

pytest.importorskip("torch")

from meshplan.spec import Job, Layout  # noqa: E402

from _cases import GPT  # noqa: E402
import torch  # noqa: E402

from _harness import Case, run_cases  # noqa: E402

JOB = Job(global_batch=8, seq_len=16, precision="fp32")
EAGER = Case("gpt-dp2-z2-eager", GPT, JOB, Layout(dp=2, zero=2, micro_batch=2))
# the ZeRO-2 case compiles with Inductor (as on a GPU), the ZeRO-3 one with the session's
# graph-only backend (tests/conftest.py)
COMPILED = [Case("gpt-dp2-z2-compiled", GPT, JOB, Layout(dp=2, zero=2, micro_batch=2,
                                                         compile=True),
                 compile_backend="inductor"),
            Case("gpt-dp2-z3-full-compiled", GPT, JOB,
                 Layout(dp=2, zero=3, micro_batch=2, recompute="full", compile=True))]


@pytest.mark.distributed
def test_compiled_fsdp2_trains_like_eager():
    res = run_cases(2, [EAGER, *COMPILED])
    eager = res[EAGER.name]
    assert "error" not in eager, eager.get("error")
    for case in COMPILED:
        run = res[case.name]
        assert "error" not in run, (case.name, run.get("error"))
        torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(eager["losses"]),
                                   rtol=1e-5, atol=0)
        assert run["grads"].keys() == eager["grads"].keys()
        for name, g in eager["grads"].items():
            assert g.abs().max() > 0, name
            torch.testing.assert_close(run["grads"][name], g, rtol=0, atol=1e-6,
                                       msg=lambda m, n=name, c=case.name: f"{c} {n}: {m}")
