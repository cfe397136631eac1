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
