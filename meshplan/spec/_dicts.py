"""Building a spec dataclass from a plain dict (plan files, JSON, TOML)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping

from meshplan.errors import ConfigError


def from_dict(cls, data: Mapping[str, Any]):
    """Build a spec dataclass from a dict, naming unknown or missing keys."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{cls.__name__} needs a mapping, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{cls.__name__} has no field(s) {', '.join(unknown)}; "
                          f"valid fields: {', '.join(sorted(known))}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"{cls.__name__}: {exc}") from None
