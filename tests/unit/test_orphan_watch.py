"""exit_when_orphaned (meshplan/executor/failures.py) on its own: a process whose main thread
is deaf to SIGTERM ends shortly after its parent dies, recording where it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHILD = r'''
import os, signal, sys, threading
from pathlib import Path
from meshplan.executor.failures import exit_when_orphaned
out = Path(sys.argv[1])
exit_when_orphaned(3, out, {"step": 7, "phase": "measure"}, os.getppid(), grace_s=0.5)
print(os.getpid(), flush=True)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
threading.Event().wait()
'''

PARENT = r'''
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE,
                         text=True)
print(child.stdout.readline().strip(), flush=True)
import time
time.sleep(600)
'''


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "zombie" not in state


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc, pidfd")
def test_a_blocked_child_ends_after_its_parent_dies(tmp_path):
    import meshplan
    root = str(Path(meshplan.__file__).resolve().parents[1])
    out = tmp_path / "results.json"
    env = {**os.environ, "PYTHONPATH": root}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(out)],
                              stdout=subprocess.PIPE, text=True, env=env)
    child = int(parent.stdout.readline().strip())
    try:
        assert _alive(child)
        parent.kill()
        parent.wait(timeout=30)
        end = time.monotonic() + 30
        while _alive(child) and time.monotonic() < end:
            time.sleep(0.2)
        assert not _alive(child), "the child outlived its parent by 30 s"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
    doc = json.loads(out.with_name("results.json.rank3.error.json").read_text())
    assert doc["kind"] == "terminated" and doc["step"] == 7
    assert "still blocked" in doc["message"] and "in wait" in doc["stack"]


@pytest.mark.parametrize("raw", ["soon", "-1", "nan"])
def test_a_bad_grace_in_the_environment_is_named(monkeypatch, raw):
    """$MESHPLAN_ORPHAN_GRACE_S (the tests' hook) takes seconds >= 0; anything else is a
    ConfigError naming the variable and its value, not a ValueError from float()."""
    from meshplan.errors import ConfigError
    from meshplan.executor.failures import ORPHAN_GRACE_ENV, ORPHAN_GRACE_S, _orphan_grace_s
    monkeypatch.setenv(ORPHAN_GRACE_ENV, raw)
    with pytest.raises(ConfigError, match=f"{ORPHAN_GRACE_ENV}='{raw}'"):
        _orphan_grace_s()
    monkeypatch.setenv(ORPHAN_GRACE_ENV, "2.5")
    assert _orphan_grace_s() == 2.5
    monkeypatch.delenv(ORPHAN_GRACE_ENV)
    assert _orphan_grace_s() == ORPHAN_GRACE_S
