"""meshplan's version: the installed distribution's (``importlib.metadata``), or, when the
package runs from a source checkout that is not installed, the ``[project]`` version of its
``pyproject.toml``; ``0+unknown`` if neither is there. At the bottom of the import graph (it
imports nothing of meshplan), so that any layer can stamp what it writes with it."""

from __future__ import annotations

import os
import re
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _version() -> str:
    try:
        return version("meshplan")
    except PackageNotFoundError:
        pass
    try:
        text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    except OSError:
        return "0+unknown"
    project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    found = project and re.search(r'^version\s*=\s*"([^"]+)"', project.group(1), re.M)
    return found.group(1) if found else "0+unknown"


ENV_COMMIT = "MESHPLAN_SOURCE_COMMIT"


def source_commit(path: str | Path | None = None) -> str:
    """The commit of the code: the environment's ``MESHPLAN_SOURCE_COMMIT`` where set (whoever
    launches a copied tree names it: ``MESHPLAN_SOURCE_COMMIT=$(git rev-parse --short=12
    HEAD)`` on the copying side — a GPU machine's copy may carry another commit's ``.git``
    under the working tree's files, which git would call that commit ``+dirty``), else the
    git commit of the checkout holding ``path`` (default: this package), abbreviated, with
    ``+dirty`` where tracked files differ from it; ``""`` where there is neither (an
    installed wheel). What calibrate stamps a profile with, so that a later reading can tell
    which executor and cost model produced its rows."""
    named = os.environ.get(ENV_COMMIT, "").strip()
    if named:
        return named
    where = Path(path) if path is not None else Path(__file__).resolve().parent

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(where), *args], capture_output=True,
                             text=True, timeout=10, check=True)
        return out.stdout.strip()
    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{commit}+dirty" if dirty else commit


__version__ = _version()
