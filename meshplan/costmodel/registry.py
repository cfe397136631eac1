"""The registry of named corrections: the numbered ones of :mod:`corrections` and the
memory rules of :mod:`memory_reliefs`, and which of them apply to a layout's tables.

Its own module so that both lists can be read without either importing the other.
"""

from __future__ import annotations

from functools import lru_cache

from meshplan.costmodel.corrections import CORRECTIONS, Correction
from meshplan.costmodel.memory_reliefs import MEMORY_RULES


def applied(t) -> tuple[str, ...]:
    """Names of the corrections that apply to a layout's tables ``t`` (registry order)."""
    return tuple(c.name for c in _for_runtime(t.job.runtime) if c.applies(t))


@lru_cache(maxsize=None)
def _for_runtime(runtime: str) -> tuple[Correction, ...]:
    return tuple(c for c in all_corrections() if runtime in c.runtimes)


def all_corrections() -> tuple[Correction, ...]:
    """The registry: the numbered corrections and the memory rules
    (:data:`meshplan.costmodel.memory_reliefs.MEMORY_RULES`)."""
    return CORRECTIONS + MEMORY_RULES


__all__ = ["all_corrections", "applied"]
