"""An MoE model's training state round-trips through a checkpoint and reshards across expert
layouts (2 CPU ranks, gloo, the real runner).

Each rank holds its ep share of every layer's routed experts (dim 0 of the stacked expert
weights) and, under ZeRO-2/3, FSDP2's shard of that share over edp; the optimizer is two
AdamWs (dense weights over dp, experts over edp). A: dp 2 · ep 2 · ZeRO-1 trains 4 steps,
saving at step 2. B resumes it in the same layout: losses equal to A's bit for bit. C resumes
it as dp 2 · ep 1 · ZeRO-3 (the experts whole on each ep rank, FSDP2-sharded over edp 2), D
as tp 2 · etp 2 (each expert's width split over the two ranks): equal to A within rtol 1e-5,
the tolerance of the layout tests. Then tp 2 · etp 2 trains and saves, and one process resumes
its width shards (one process resuming A's ep shards is C's and D's merge of them, not run
again).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import LLAMA_MOE  # noqa: E402
from meshplan.executor.checkpoint import committed_checkpoints  # noqa: E402
from meshplan.executor.launch import run_local  # noqa: E402
from meshplan.executor.planfiles import write_plan_for_layout  # noqa: E402
from meshplan.spec import Job, Layout  # noqa: E402

JOB = Job(global_batch=8, seq_len=16, precision="fp32")
RUN = ["--device", "cpu", "--timeout-s", "120", "--lr", "1e-2"]
STEPS, WARMUP = 3, 1       # 4 optimizer steps in all


def _losses(path: Path):
    m = json.loads(path.read_text())["measured"]
    return m["first_step"], m["loss_per_step"]


@pytest.mark.distributed
@pytest.mark.slow
def test_moe_checkpoint_resumes_in_its_layout_and_reshards_over_ep_and_fsdp(tmp_path):
    def plan(name, layout):
        return write_plan_for_layout(tmp_path / f"{name}.json", LLAMA_MOE, JOB, layout)

    ep2 = plan("ep2", Layout(dp=2, ep=2, zero=1, micro_batch=2))
    ck = tmp_path / "ck"
    a = tmp_path / "a.json"
    assert run_local(ep2, steps=STEPS, warmup=WARMUP, out=a,
                     extra_args=[*RUN, "--checkpoint-dir", str(ck),
                                 "--checkpoint-every", "2"]) == 0
    _, full = _losses(a)
    assert [s for s, _ in committed_checkpoints(ck)] == [2, 4]
    shutil.rmtree(dict(committed_checkpoints(ck))[4])      # each resume starts at step 2

    def resume(name, plan_path):
        here = tmp_path / f"{name}-ck"
        shutil.copytree(ck, here)
        out = tmp_path / f"{name}-out.json"
        assert run_local(plan_path, steps=STEPS, warmup=WARMUP, out=out,
                         extra_args=[*RUN, "--checkpoint-dir", str(here), "--resume"]) == 0
        return _losses(out)

    assert resume("same", ep2) == (2, full[2:])                    # bit for bit
    for name, layout in (("fsdp", Layout(dp=2, zero=3, micro_batch=2)),
                         ("etp", Layout(tp=2, etp=2, sequence_parallel=True, micro_batch=2))):
        start, other = resume(name, plan(name, layout))
        assert start == 2 and other == pytest.approx(full[2:], rel=1e-5), name

    # written from width shards: tp 2 · etp 2 saves, one process resumes
    etp = plan("etp-a", Layout(tp=2, etp=2, micro_batch=2))
    ck, out = tmp_path / "etp-ck", tmp_path / "etp-a-out.json"
    assert run_local(etp, steps=STEPS, warmup=WARMUP, out=out,
                     extra_args=[*RUN, "--checkpoint-dir", str(ck),
                                 "--checkpoint-every", "2"]) == 0
    _, etp_full = _losses(out)
    assert etp_full == pytest.approx(full, rel=1e-5)
    shutil.rmtree(dict(committed_checkpoints(ck))[4])
    start, other = resume("etp-one", plan("etp-one", Layout(micro_batch=4)))
    assert start == 2 and other == pytest.approx(etp_full[2:], rel=1e-5)
