"""Layout.compile from the plan file, --compile, --candidate and the checkpoint arguments
(one process, CPU; torch.compile itself is replaced by a recorder — compiling on a 2-core CI
machine would take minutes and is the GPU benchmark's business)."""

import json

import pytest

pytest.importorskip("torch")

from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402
from meshplan.executor.planfiles import write_plan_for_layout  # noqa: E402
from meshplan.executor.run import EXIT_BAD_INPUT, main  # noqa: E402
from meshplan.planner.planfile import save_plan_file  # noqa: E402

M = ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64,
              max_seq_len=16)
JOB = Job(global_batch=4, seq_len=16, precision="fp32")
RUN = ["--device", "cpu", "--steps", "1", "--warmup", "0"]


@pytest.fixture(autouse=True)
def no_torchrun_env(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def compiled(monkeypatch):
    from meshplan.executor.model import Block
    calls = []
    monkeypatch.setattr(Block, "compile", lambda self, *a, **k: calls.append(self))
    return calls


@pytest.mark.parametrize("in_plan,flag", [(True, False), (False, True), (False, False)])
def test_compile_comes_from_the_plan_or_the_flag(tmp_path, compiled, in_plan, flag):
    plan = write_plan_for_layout(tmp_path / "p.json", M, JOB,
                                 Layout(micro_batch=2, compile=in_plan))
    assert json.loads(plan.read_text())["layout"]["compile"] is in_plan   # written
    out = tmp_path / "r.json"
    assert main(["--plan", str(plan), "--out", str(out), *RUN]
                + (["--compile"] if flag else [])) == 0
    want = in_plan or flag
    assert len(compiled) == (M.num_layers if want else 0)
    assert json.loads(out.read_text())["layout"]["compile"] is want       # what ran


def test_candidate_runs_an_alternative(tmp_path, capsys):
    best, other = Layout(micro_batch=2), Layout(micro_batch=1)
    from meshplan.hardware_profiles import Cluster
    job = Job(global_batch=4, seq_len=16, precision="fp32", runtime="torch")  # kept as planned
    plan = save_plan_file(tmp_path / "p.json", M, Cluster.preset("dgx-h100"), job, best, {},
                          [{"layout": best.to_dict(), "prediction": {}},
                           {"layout": other.to_dict(), "prediction": {"step_time_s": 1.0}}])
    out = tmp_path / "r.json"
    assert main(["--plan", str(plan), "--out", str(out), *RUN, "--candidate", "1"]) == 0
    doc = json.loads(out.read_text())
    assert doc["layout"]["micro_batch"] == 1 and doc["prediction"] == {"step_time_s": 1.0}
    assert main(["--plan", str(plan), "--out", str(tmp_path / "x.json"), *RUN,
                 "--candidate", "2"]) == EXIT_BAD_INPUT
    assert "2 candidates (valid: 0..1)" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--resume"], "need --checkpoint-dir DIR"),
    (["--checkpoint-every", "2"], "need --checkpoint-dir DIR"),
    (["--checkpoint-dir", "{tmp}/ck"], "does nothing; add --checkpoint-every N"),
    (["--checkpoint-dir", "{tmp}/ck", "--resume"], "no committed checkpoint in"),
    (["--checkpoint-dir", "{tmp}/ck", "--checkpoint-every", "-1"], "must be >= 0"),
])
def test_checkpoint_arguments_are_checked_first(tmp_path, capsys, args, message):
    plan = write_plan_for_layout(tmp_path / "p.json", M, JOB, Layout(micro_batch=2))
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert main(["--plan", str(plan), "--out", str(tmp_path / "r.json"), *RUN, *args]) \
        == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_resume_refuses_another_model(tmp_path, capsys):
    plan = write_plan_for_layout(tmp_path / "p.json", M, JOB, Layout(micro_batch=2))
    ck = tmp_path / "ck"
    assert main(["--plan", str(plan), "--out", str(tmp_path / "a.json"), *RUN,
                 "--checkpoint-dir", str(ck), "--checkpoint-every", "1"]) == 0
    import dataclasses
    wider = dataclasses.replace(M, hidden_size=64)
    other = write_plan_for_layout(tmp_path / "q.json", wider, JOB, Layout(micro_batch=2))
    assert main(["--plan", str(other), "--out", str(tmp_path / "b.json"), *RUN, "--steps", "3",
                 "--checkpoint-dir", str(ck), "--resume"]) == EXIT_BAD_INPUT
    assert "another model (hidden_size: 32 there, 64 here)" in capsys.readouterr().err
    assert main(["--plan", str(plan), "--out", str(tmp_path / "c.json"), *RUN, "--seed", "5",
                 "--checkpoint-dir", str(ck), "--resume", "--steps", "3"]) == EXIT_BAD_INPUT
    assert "--seed 0" in capsys.readouterr().err
