"""The README's examples run as written: its Python block, and every ``meshplan profiles``,
``estimate`` and ``plan`` line of its command-line block (``run``, ``calibrate`` and
``report`` need torch, GPUs or minutes: the executor, calibration and report tests cover
them). A user's first minutes go through these lines, so an option renamed or a preset
dropped fails here rather than on their machine."""

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from meshplan.cli import main

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
QUICK = ("profiles", "estimate", "plan")


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, re.M | re.S)


def cli_lines() -> list[list[str]]:
    """The ``meshplan`` command lines of the README's bash blocks, continuations joined and
    comments dropped."""
    out = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["meshplan"] and words[1] in QUICK:
                out.append(words[1:])
    return out


LINES = cli_lines()


def test_the_readme_has_the_lines_this_test_runs():
    assert {w[0] for w in LINES} == set(QUICK) and len(LINES) >= 5


# slow: the 128k-token GPT-OSS plan prices about 90,000 configurations (~25 s on 2 cores)
@pytest.mark.slow
@pytest.mark.parametrize("argv", LINES, ids=[" ".join(w[:3]) for w in LINES])
def test_readme_command_runs(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)               # a line may write plan.json (-o)
    assert main(argv) == 0
    out = capsys.readouterr().out
    if argv[0] == "plan":
        assert "best:" in out and "fits" in out
    if argv[0] == "estimate":
        assert "step time" in out


def test_readme_python_block_runs(tmp_path, monkeypatch):
    (code,) = blocks("python")
    monkeypatch.chdir(tmp_path)               # it writes plan.json and launch/
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "plan.json").is_file() and any((tmp_path / "launch").iterdir())
    lines = printed.getvalue().splitlines()
    # est.step_time_s, tokens_per_s, mfu, peak GiB, fits
    _, _, mfu, peak_gib, fits = lines[0].split()
    assert fits == "True" and 0 < float(mfu) < 1 and 0 < float(peak_gib) < 80
    assert lines[1].startswith("TimeBreakdown(") and lines[2].startswith("StageMemory(stage=0")
    assert any(line.split()[:2] == ["gpus", "dp"] for line in lines)      # the plan's table
