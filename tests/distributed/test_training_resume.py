"""Checkpoint, kill, resume through the real runner (torchrun, 2 CPU ranks, gloo).

A: dp 2 · ZeRO-1 trains 6 steps without a break. B: the same with a checkpoint every 2
steps, and rank 1 SIGKILLed at step 5. C: resumes B's newest committed checkpoint in the
same layout — its losses must equal A's bit for bit (same operations in the same order,
AdamW's state restored exactly). D: resumes the same checkpoint as one process (another
layout and world size) — equal to A within rtol 1e-5, the tolerance the layout tests use.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402
from meshplan.executor.checkpoint import committed_checkpoints  # noqa: E402
from meshplan.executor.launch import run_local  # noqa: E402
from meshplan.executor.planfiles import write_plan_for_layout  # noqa: E402

M = ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2,
              ffn_hidden_size=64, vocab_size=64, max_seq_len=16, activation="swiglu",
              norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False)
JOB = Job(global_batch=8, seq_len=16, precision="fp32")
RUN = ["--device", "cpu", "--timeout-s", "60", "--lr", "1e-2"]
STEPS, WARMUP = 5, 1       # 6 optimizer steps in all


def _losses(path):
    m = json.loads(path.read_text())["measured"]
    return m["first_step"], m["loss_per_step"]


@pytest.mark.distributed
@pytest.mark.slow
def test_kill_resume_same_and_other_layout(tmp_path, monkeypatch):
    plan2 = write_plan_for_layout(tmp_path / "dp2.json", M, JOB, Layout(dp=2, zero=1,
                                                                        micro_batch=2))
    plan1 = write_plan_for_layout(tmp_path / "one.json", M, JOB, Layout(micro_batch=4))
    a = tmp_path / "a.json"
    assert run_local(plan2, steps=STEPS, warmup=WARMUP, out=a, extra_args=RUN) == 0
    first, full = _losses(a)
    assert first == 0 and len(full) == STEPS + WARMUP

    ck = tmp_path / "ck"
    monkeypatch.setenv("MESHPLAN_EXECUTOR_INJECT", "1:5:kill")
    b = tmp_path / "b.json"
    assert run_local(plan2, steps=STEPS, warmup=WARMUP, out=b,
                     extra_args=[*RUN, "--checkpoint-dir", str(ck),
                                 "--checkpoint-every", "2"]) != 0
    monkeypatch.delenv("MESHPLAN_EXECUTOR_INJECT")
    err = json.loads(b.read_text())["error"]
    assert err["summary"].startswith("rank 1 died") and "SIGKILL" in err["summary"], err
    steps = [s for s, _ in committed_checkpoints(ck)]
    # the step-4 save may still have been in flight when rank 1 died: then step 2 is the
    # newest committed one, and the half-written step 4 is ignored
    assert steps in ([2], [2, 4]), steps
    kept = tmp_path / "ck_copy"
    shutil.copytree(ck, kept)

    c = tmp_path / "c.json"
    assert run_local(plan2, steps=STEPS, warmup=WARMUP, out=c,
                     extra_args=[*RUN, "--checkpoint-dir", str(ck), "--resume"]) == 0
    start, resumed = _losses(c)
    assert start == steps[-1] and resumed == full[start:]          # bit for bit
    doc = json.loads(c.read_text())
    assert doc["measured"]["resumed_from"]["step"] == start
    # --resume alone keeps saving every 2 steps, as the run it continues did
    saved = [s["step"] for s in doc["measured"]["checkpoints"]["saves"]]
    assert saved == [s for s in (4, 6) if s > start], saved

    d = tmp_path / "d.json"
    r = subprocess.run([sys.executable, "-m", "meshplan.executor.run", "--plan", str(plan1),
                        "--out", str(d), "--steps", str(STEPS), "--warmup", str(WARMUP),
                        *RUN, "--checkpoint-dir", str(kept), "--resume"],
                       capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    start_d, other = _losses(d)
    assert start_d == start
    assert other == pytest.approx(full[start:], rel=1e-5)
    assert "a different one" in r.stderr


@pytest.mark.distributed
def test_a_crash_while_committing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """One process: it dies while committing the step-4 checkpoint (after DCP wrote it,
    before the rename); step 2 stays the newest, resuming from it works, and the next
    commit removes the half-written directory."""
    plan1 = write_plan_for_layout(tmp_path / "one.json", M, JOB, Layout(micro_batch=4))
    ck = tmp_path / "ck"
    base = [sys.executable, "-m", "meshplan.executor.run", "--plan", str(plan1), *RUN,
            "--steps", str(STEPS), "--warmup", str(WARMUP), "--checkpoint-dir", str(ck),
            "--checkpoint-every", "2"]
    r = subprocess.run([*base, "--out", str(tmp_path / "x.json")], capture_output=True,
                       text=True, timeout=300,
                       env={**_env(), "MESHPLAN_EXECUTOR_INJECT": "0:4:crash-in-checkpoint"})
    assert r.returncode == 9, r.stderr[-3000:]
    assert [s for s, _ in committed_checkpoints(ck)] == [2]
    half = [p.name for p in ck.iterdir() if ".tmp-" in p.name]
    assert len(half) == 1 and half[0].startswith("step-00000004.tmp-")
    assert (ck / half[0] / ".metadata").is_file()    # written, but never committed
    r = subprocess.run([*base, "--resume", "--out", str(tmp_path / "y.json")],
                       capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "y.json").read_text())["measured"]["first_step"] == 2
    assert [s for s, _ in committed_checkpoints(ck)] == [2, 4, 6]
    assert not [p for p in ck.iterdir() if ".tmp-" in p.name]
    saves = json.loads((tmp_path / "y.json").read_text())["measured"]["checkpoints"]["saves"]
    assert [s["step"] for s in saves] == [4, 6]
    assert all(s["bytes"] > 0 and s["write_s"] > 0 and s["stage_s_max"] >= 0 for s in saves)


def _env():
    import os
    from pathlib import Path

    import meshplan
    env = {k: v for k, v in os.environ.items() if k != "MESHPLAN_EXECUTOR_INJECT"}
    root = str(Path(meshplan.__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(k, None)
    return env
