"""The built-in GPU and cluster tables (``data/*.toml``) as parsed TOML, read once.

Apart from :mod:`meshplan.hardware_profiles.loader`, which turns them into specs, so that
:mod:`meshplan.hardware_profiles.gpu` can read them (to name the GPUs that have a precision)
without importing the loader that imports it."""

from __future__ import annotations

import sys
from functools import lru_cache
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@lru_cache(maxsize=None)
def builtin_table(filename: str) -> dict[str, Any]:
    """``data/<filename>`` parsed (e.g. ``"gpus.toml"``, ``"clusters.toml"``)."""
    with resources.files("meshplan.hardware_profiles").joinpath("data", filename).open("rb") as fh:
        return tomllib.load(fh)


__all__ = ["builtin_table"]
