"""A minimal TOML writer for calibration profiles, and an atomic file write.

The standard library reads TOML (``tomllib``) but cannot write it; profiles only need
strings, numbers, booleans, lists of numbers / number pairs, tables and arrays of
tables, so this writer covers exactly that (TOML 1.0, https://toml.io/en/v1.0.0) and
re-parses its own output before anything reaches the disk.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from meshplan.errors import ProfileError
from meshplan.planner.planfile import new_temp_file


def _scalar(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x, where) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_scalar(x, where)}" for k, x in v.items()) + " }"
    raise ProfileError(f"cannot write {type(v).__name__} value {v!r} at {where} to TOML")


def _key(k: str) -> str:
    bare = k and all(c.isalnum() or c in "-_" for c in k)
    return k if bare else json.dumps(k)


def _is_table_array(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, Mapping) for x in v)


def dumps(doc: Mapping[str, Any]) -> str:
    """Serialize nested dicts; sub-dicts become ``[tables]``, lists of dicts ``[[arrays]]``."""
    out: list[str] = []
    _emit(doc, [], out)
    text = "\n".join(out).strip() + "\n"
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # a writer bug, never the user's input
        raise ProfileError(f"internal error: generated TOML does not parse: {exc}") from None
    return text


def _emit(table: Mapping[str, Any], path: list[str], out: list[str]) -> None:
    simple = [(k, v) for k, v in table.items()
              if not (isinstance(v, Mapping) and not _inline(v)) and not _is_table_array(v)]
    for k, v in simple:
        out.append(f"{_key(k)} = {_scalar(v, '.'.join(path + [k]))}")
    for k, v in table.items():
        if isinstance(v, Mapping) and not _inline(v):
            out.append("")
            out.append(f"[{'.'.join(_key(p) for p in path + [k])}]")
            _emit(v, path + [k], out)
    for k, v in table.items():
        if _is_table_array(v):
            for item in v:
                out.append("")
                out.append(f"[[{'.'.join(_key(p) for p in path + [k])}]]")
                _emit(item, path + [k], out)


def _inline(v: Mapping[str, Any]) -> bool:
    """Small flat mappings (e.g. ``peak_tflops``) are written inline."""
    return bool(v) and all(isinstance(x, (int, float, str, bool)) for x in v.values()) \
        and len(v) <= 8


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half.

    The text goes to a temporary file in the same directory, is flushed and fsync'ed, and
    replaces ``path`` with ``os.replace`` (atomic on POSIX and Windows for one volume). Any
    failure or interruption (KeyboardInterrupt included) removes the temporary file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temp_file(path)   # the user's umask, not mkstemp's 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
