"""The GPU-busy check before a run (meshplan/executor/gpu_busy.py), against a stand-in
``nvidia-smi`` on PATH."""

from __future__ import annotations

import os
import stat

from meshplan.executor.gpu_busy import gpu_processes, wait_for_idle_gpus


def _fake_smi(tmp_path, monkeypatch, output: str, rc: int = 0):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s' '{output}'\nexit {rc}\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_processes_on_the_gpus_are_listed(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, "769, 40358\n770, 39368\n")
    assert gpu_processes() == [{"pid": 769, "used_mib": 40358},
                               {"pid": 770, "used_mib": 39368}]
    # still there after the wait: returned, so the run can record them beside its time
    assert wait_for_idle_gpus(timeout_s=0.2, poll_s=0.05) == gpu_processes()


def test_idle_gpus_and_no_nvidia_smi_read_as_no_process(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, "")
    assert gpu_processes() == [] and wait_for_idle_gpus(timeout_s=5) == []
    _fake_smi(tmp_path, monkeypatch, "No devices were found", rc=9)
    assert gpu_processes() == []
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gpu_processes() == []


def test_meshplan_run_warns_when_the_gpus_are_busy(tmp_path, monkeypatch, capsys):
    import meshplan as mp
    from meshplan.executor import launch
    from meshplan.executor.planfiles import write_plan_for_layout
    m = mp.ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64,
                     max_seq_len=16)
    plan = write_plan_for_layout(tmp_path / "plan.json", m,
                                 mp.Job(global_batch=8, seq_len=16, precision="fp32"),
                                 mp.Layout(dp=2), predict=False)
    _fake_smi(tmp_path, monkeypatch, "769, 40358\n")
    # this CPU machine stands in for a GPU node; nothing is launched
    monkeypatch.setattr(launch, "check_machine", lambda plan, **kw: "cuda")
    monkeypatch.setattr(launch, "supervise", lambda cmd, env: (0, ""))
    assert launch.run_local(plan, out=tmp_path / "r.json") == 0
    err = capsys.readouterr().err
    assert ("warning: 1 process(es) already on the GPUs (pid 769: 40358 MiB); the measured "
            "step time will include their load") in err


def test_this_process_and_its_ancestors_are_not_other_processes(tmp_path, monkeypatch):
    # a harness that asked torch for the GPU's name may hold a CUDA context itself
    _fake_smi(tmp_path, monkeypatch, f"{os.getpid()}, 500\n{os.getppid()}, 400\n769, 40358\n")
    assert gpu_processes() == [{"pid": 769, "used_mib": 40358}]
