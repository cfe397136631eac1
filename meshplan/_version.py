"""meshplan's version: the installed distribution's (``importlib.metadata``), or, when the
package runs from a source checkout that is not installed, the ``[project]`` version of its
``pyproject.toml``; ``0+unknown`` if neither is there. At the bottom of the import graph (it
imports nothing of meshplan), so that any layer can stamp what it writes with it."""

from __future__ import annotations

import re
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


__version__ = _version()
