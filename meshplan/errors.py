"""Exception types raised by meshplan.

Every error a user can cause derives from :class:`MeshplanError`, so callers can catch
one type; each message names the offending value and what would be valid.
"""

from __future__ import annotations

import difflib
from typing import Iterable


class MeshplanError(ValueError):
    """Base class of every error meshplan raises for bad input or an impossible request."""


class ConfigError(MeshplanError):
    """A model, cluster, job or layout value is invalid or inconsistent."""


class UnknownPresetError(ConfigError):
    """A preset name (model, GPU, cluster) is not known."""


class ProfileError(ConfigError):
    """A hardware-profile TOML file is malformed or incomplete."""


class PlanFileError(MeshplanError):
    """A plan or results file is corrupted, foreign or of an unsupported version."""


class NoFeasiblePlan(MeshplanError):
    """No layout satisfies the constraints; the message explains why and what would help."""

    def __init__(self, message: str, *, min_memory_bytes: float | None = None,
                 usable_memory_bytes: float | None = None, binding: str | None = None,
                 suggestions: tuple[str, ...] = ()):
        super().__init__(message)
        self.min_memory_bytes = min_memory_bytes
        self.usable_memory_bytes = usable_memory_bytes
        self.binding = binding
        self.suggestions = suggestions


class MeshplanWarning(UserWarning):
    """A request meshplan answers, but whose answer may mislead (a sequence longer than the
    model was trained for, say). ``warnings.simplefilter("error", MeshplanWarning)`` makes
    every one an error; the CLI's ``--strict`` does that."""


class ExecutorError(MeshplanError):
    """The executor cannot run a plan as asked (world size, devices, out of memory)."""


def closest_names(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The names in ``choices`` closest to ``name`` (for "did you mean" messages)."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.4)
    return [lowered[h] for h in hits]


def unknown_name_error(kind: str, name: str, choices: Iterable[str]) -> UnknownPresetError:
    """An :class:`UnknownPresetError` that suggests the closest known names."""
    choices = sorted(choices)
    if not isinstance(name, str):
        return UnknownPresetError(f"a {kind} is named by a string, got {name!r}; known "
                                  f"{kind}s: {', '.join(choices)}")
    close = closest_names(name, choices)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return UnknownPresetError(
        f"unknown {kind} {name!r}.{hint} Known {kind}s: {', '.join(choices)}")


def require_positive_int(owner: str, field: str, value: object) -> None:
    """Raise :class:`ConfigError` unless ``value`` is an int >= 1 (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{owner}.{field} must be a positive integer, got {value!r}")


def require_bool(owner: str, field: str, value: object) -> None:
    """Raise :class:`ConfigError` unless ``value`` is True or False."""
    if not isinstance(value, bool):
        raise ConfigError(f"{owner}.{field} must be True or False, got {value!r}")


def require_choice(owner: str, field: str, value: object, choices: Iterable[object]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ConfigError(
            f"{owner}.{field} = {value!r} is not valid; choose one of "
            f"{', '.join(repr(c) for c in choices)}")
