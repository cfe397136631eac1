"""`meshplan run` on a machine that cannot run the plan, stopped mid-run, and a hung rank.

* A 256-GPU plan on this CPU-only machine is refused before anything starts, pointing to
  the launch scripts (issue 37: it used to start 256 workers and leave 141 behind).
* The launcher stopped with SIGTERM, or killed with SIGKILL, mid-run: no process of the run
  survives (torchrun gets the signal or PDEATHSIG, the ranks die with torchrun).
* A rank that hangs: the others time out after --timeout-s, every rank exits, and the
  results file names the hung rank.
* torchrun itself SIGKILLed (as ``subprocess.run(timeout=...)`` in a harness does) while a
  rank is blocked in native code, deaf to SIGTERM (as a device sync waiting for a hung
  collective is): both ranks end within seconds, not after --timeout-s, and the blocked
  one records where it was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

import meshplan as mp  # noqa: E402
from meshplan.cli import main as cli_main  # noqa: E402
from meshplan.errors import ExecutorError  # noqa: E402
from meshplan.executor.launch import run_local  # noqa: E402
from meshplan.executor.planfiles import write_plan_for_layout  # noqa: E402

M = mp.ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64,
                 max_seq_len=16)
JOB = mp.Job(global_batch=8, seq_len=16, precision="fp32")


def _processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (this test's own temporary paths)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((line for line in (d / "status").read_text().splitlines()
                          if line.startswith("State:")), "")
        except OSError:
            continue
        if text in cmd and "zombie" not in state:
            found.append(int(d.name))
    return found


def test_a_plan_for_many_nodes_is_refused_here(tmp_path, capsys):
    cluster = mp.Cluster.preset("dgx-h100", nodes=32)
    plan = write_plan_for_layout(tmp_path / "plan.json", M,
                                 mp.Job(global_batch=256, seq_len=16, precision="fp32"),
                                 mp.Layout(dp=256), cluster, predict=False)
    with pytest.raises(ExecutorError, match=r"256 GPUs = 32 nodes of 8.*--launch-dir"):
        run_local(plan, out=tmp_path / "r.json", extra_args=["--device", "cpu"])
    assert cli_main(["run", str(plan)]) == 2
    assert "--launch-dir" in capsys.readouterr().err
    assert not _processes_mentioning(str(tmp_path)) and not (tmp_path / "r.json").exists()
    # the scripts it points to, from the plan file
    assert cli_main(["run", str(plan), "--launch-dir", str(tmp_path / "l"),
                     "--launcher", "slurm"]) == 0
    assert "#SBATCH --nodes=32" in (tmp_path / "l" / "run_slurm.sbatch").read_text()


def test_no_gpu_and_no_device_is_refused(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    plan = write_plan_for_layout(tmp_path / "plan.json", M, JOB, mp.Layout(dp=2),
                                 predict=False)
    with pytest.raises(ExecutorError, match="no GPU.*--device cpu"):
        run_local(plan, out=tmp_path / "r.json")


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    plan = write_plan_for_layout(tmp_path / "plan.json", M, JOB, mp.Layout(dp=2),
                                 predict=False)
    log = tmp_path / "launcher.log"
    import meshplan
    root = str(Path(meshplan.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root}
    env.pop("MESHPLAN_EXECUTOR_INJECT", None)
    with open(log, "w") as err:       # the launcher keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "meshplan.cli", "run", str(plan),
                                 "--device", "cpu", "--out", str(tmp_path / "r.json"), *extra],
                                stdout=subprocess.DEVNULL, stderr=err, env=env,
                                start_new_session=True)
    return proc, log


def _wait_for(pred, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.distributed
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_stopping_the_launcher_leaves_no_process(tmp_path, sig):
    proc, log = _start(tmp_path, "--steps", "100000", "--warmup", "1")
    try:
        assert _wait_for(lambda: "step 1: loss" in log.read_text(), 180), log.read_text()[-3000:]
        ranks = [p for p in _processes_mentioning(str(tmp_path)) if p != proc.pid]
        assert len(ranks) >= 3          # torchrun and its two ranks
        proc.send_signal(sig)
        proc.wait(timeout=120)
        assert _wait_for(lambda: not _processes_mentioning(str(tmp_path)), 90), \
            f"survivors: {_processes_mentioning(str(tmp_path))}\n{log.read_text()[-3000:]}"
    finally:
        for pid in _processes_mentioning(str(tmp_path)):
            os.kill(pid, signal.SIGKILL)
    if sig == signal.SIGTERM:
        assert proc.returncode != 0 and "stopped by SIGTERM" in log.read_text()


@pytest.mark.distributed
@pytest.mark.slow
def test_a_hung_rank_is_named_and_every_rank_exits(tmp_path):
    # the whole wait is this timeout; steps 0-2 of the tiny model take milliseconds, so a
    # short one still separates the hung rank from ranks merely slow to reach a collective
    timeout_s = 4
    plan = write_plan_for_layout(tmp_path / "plan.json", M, JOB, mp.Layout(dp=2),
                                 predict=False)
    import meshplan
    root = str(Path(meshplan.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root, "MESHPLAN_EXECUTOR_INJECT": "1:3:hang"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "meshplan.cli", "run", str(plan), "--device",
                        "cpu", "--out", str(tmp_path / "r.json"), "--steps", "6", "--warmup",
                        "1", "--timeout-s", str(timeout_s)],
                       capture_output=True, text=True, env=env, timeout=300)
    took = time.monotonic() - t0
    assert r.returncode != 0
    doc = json.loads((tmp_path / "r.json").read_text())
    summary = doc["error"]["summary"]
    assert summary.startswith("rank 1 stopped responding (hung) at step 3"), \
        (summary, r.stderr[-3000:])
    assert f"rank 0 timed out after {timeout_s} s" in summary
    hung = next(e for e in doc["error"]["ranks"] if e["rank"] == 1)
    assert hung["kind"] == "terminated" and "maybe_inject_failure" in hung["stack"]
    # the timeout, torchrun noticing and stopping rank 1, start-up: well under a minute more
    assert took < timeout_s + 90, took
    assert not _processes_mentioning(str(tmp_path))


@pytest.mark.distributed
def test_a_rank_blocked_in_a_collective_ends_when_its_torchrun_is_killed(tmp_path):
    from meshplan.executor.failures import ORPHAN_GRACE_ENV, error_file
    # the production grace (10 s) is idle waiting here; the watch is the same with 2 s
    grace_s = 2.0
    plan = write_plan_for_layout(tmp_path / "plan.json", M, JOB, mp.Layout(dp=2),
                                 predict=False)
    import meshplan
    root = str(Path(meshplan.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root, "MESHPLAN_EXECUTOR_INJECT": "0:3:block",
           ORPHAN_GRACE_ENV: str(grace_s)}
    out = tmp_path / "r.json"
    log = tmp_path / "torchrun.log"
    with open(log, "w") as fh:
        torchrun = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node=2", "-m", "meshplan.executor.run", "--plan", str(plan),
             "--out", str(out), "--steps", "6", "--warmup", "1", "--device", "cpu",
             "--timeout-s", "900"], stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        # a step's loss is logged once the next has started: rank 0 blocks as step 3 starts
        assert _wait_for(lambda: "step 1: loss" in log.read_text(), 180), \
            log.read_text()[-3000:]
        # rank 1 only has to finish step 2 and enter step 3's collective: milliseconds
        time.sleep(2)
        torchrun.kill()
        torchrun.wait(timeout=30)
        t0 = time.monotonic()
        assert _wait_for(lambda: not _processes_mentioning(str(tmp_path)),
                         grace_s + 45), \
            f"survivors: {_processes_mentioning(str(tmp_path))}\n{log.read_text()[-3000:]}"
        assert time.monotonic() - t0 < grace_s + 45
    finally:
        for pid in _processes_mentioning(str(tmp_path)):
            os.kill(pid, signal.SIGKILL)
    blocked = json.loads(error_file(out, 0).read_text())
    assert blocked["kind"] == "terminated" and "still blocked" in blocked["message"], blocked
    assert blocked["step"] == 3 and "maybe_inject_failure" in blocked["stack"], blocked
    # rank 1 waits for rank 0 in a gloo collective: its handler ran, or it was ended so too
    waiting = json.loads(error_file(out, 1).read_text())
    assert waiting["kind"] == "terminated" and waiting["step"] == 3, waiting
