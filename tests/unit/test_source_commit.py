"""meshplan._version.source_commit: the checkout's commit calibrate stamps a profile with."""

import re
import subprocess
from pathlib import Path

import pytest

from meshplan._version import source_commit

ROOT = Path(__file__).resolve().parents[2]


def _git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
                        "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(cwd)})


def test_a_checkout_gives_its_commit_and_marks_changed_tracked_files(tmp_path, monkeypatch):
    monkeypatch.delenv("MESHPLAN_SOURCE_COMMIT", raising=False)
    try:
        _git("init", "-q", cwd=tmp_path)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git here")
    (tmp_path / "a.txt").write_text("one\n")
    _git("add", "a.txt", cwd=tmp_path)
    _git("commit", "-q", "-m", "one", cwd=tmp_path)
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=tmp_path,
                          capture_output=True, text=True, check=True).stdout.strip()
    assert source_commit(tmp_path) == head and re.fullmatch(r"[0-9a-f]{12}", head)
    (tmp_path / "b.txt").write_text("untracked files do not count\n")
    assert source_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("two\n")
    assert source_commit(tmp_path) == f"{head}+dirty"
    # a name given by whoever launched the code wins over the checkout's (a GPU machine's
    # copy can hold another commit's .git)
    monkeypatch.setenv("MESHPLAN_SOURCE_COMMIT", "0123456789ab")
    assert source_commit(tmp_path) == "0123456789ab"


def test_no_checkout_gives_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("MESHPLAN_SOURCE_COMMIT", raising=False)
    assert source_commit(tmp_path) == ""


def test_a_copied_tree_takes_the_commit_its_copier_names(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_SOURCE_COMMIT", " 0123456789ab+dirty\n")
    assert source_commit(tmp_path) == "0123456789ab+dirty"


def test_calibrate_stamps_the_commit_where_it_runs_from_a_checkout(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.delenv("MESHPLAN_SOURCE_COMMIT", raising=False)
    import torch

    from meshplan.calibrate.run import CalibrateOptions, provenance
    doc = provenance(torch.device("cpu"), CalibrateOptions(out="x.toml"), 1)
    commit = source_commit()
    assert doc.get("meshplan_commit", "") == commit
    if (ROOT / ".git").exists():
        assert commit
