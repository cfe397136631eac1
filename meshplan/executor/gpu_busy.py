"""Whether another process is on this node's GPUs before a run starts (no torch needed).

A run timed beside another process measures that process too. On 2 x H200 (2026-11-30) a
layout that hung left its two ranks spinning both GPUs at 100 % for ten minutes after its
harness had killed their torchrun, and every run after them measured 1.7-3.5x slow
(docs/benchmarks/moe_checks.md "moeh16"). ``meshplan validate`` and the benchmark harnesses wait for
idle GPUs before each run and record whatever is still there beside the measurement.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def gpu_processes() -> list[dict[str, int]]:
    """Other processes on this node's GPUs now, ``{"pid", "used_mib"}`` each
    (``nvidia-smi``); ``[]`` where there is no ``nvidia-smi``. This process and its
    ancestors are left out: a harness that asked torch for the GPU's name may hold a CUDA
    context of its own."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    ours = _self_and_ancestors()
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) not in ours:
            found.append({"pid": int(parts[0]),
                          "used_mib": int(parts[1]) if parts[1].isdigit() else -1})
    return found


def _self_and_ancestors() -> set[int]:
    """This process's pid and its ancestors' (``/proc``; just this pid where there is none)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])   # the field after the state
    return pids


def wait_for_idle_gpus(timeout_s: float = 60.0, poll_s: float = 2.0) -> list[dict[str, int]]:
    """Wait up to ``timeout_s`` for no process to be left on the GPUs; returns those still
    there. A run timed beside another process measures that process too: on 2 x H200
    (2026-11-30) two ranks left by a killed run made every run after them 1.7-3.5x slow."""
    end = time.monotonic() + timeout_s
    busy = gpu_processes()
    while busy and time.monotonic() < end:
        time.sleep(poll_s)
        busy = gpu_processes()
    return busy


__all__ = ["gpu_processes", "wait_for_idle_gpus"]
