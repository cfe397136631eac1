"""The registry of named corrections: the numbered ones of :mod:`corrections` and the
memory rules of :mod:`memory_reliefs`, and which of them apply to a layout's tables.

Its own module so that both lists can be read without either importing the other. No
formula of its own: each correction's mechanism and measured error are in the docstring of
the function that computes it (``Correction.mechanism``).
"""

from __future__ import annotations

from functools import lru_cache

from meshplan.costmodel.corrections import CORRECTIONS, Correction
from meshplan.costmodel.memory_reliefs import MEMORY_RULES
from meshplan.costmodel.compiled_block_memory import COMPILED_DENSE_BLOCK_CORRECTION
from meshplan.costmodel.moe_torch_memory import COMPILED_MOE_BLOCK_CORRECTION
from meshplan.costmodel.nearest_rows import NEAREST_SHAPE_CORRECTION


def applied(t) -> tuple[str, ...]:
    """Names of the corrections that apply to a layout's tables ``t`` (registry order)."""
    return tuple(c.name for c in _for_runtime(t.job.runtime) if c.applies(t))


@lru_cache(maxsize=None)
def _for_runtime(runtime: str) -> tuple[Correction, ...]:
    return tuple(c for c in all_corrections() if runtime in c.runtimes)


def all_corrections() -> tuple[Correction, ...]:
    """The registry: the numbered corrections, the memory rules
    (:data:`meshplan.costmodel.memory_reliefs.MEMORY_RULES`, the compiled MoE and dense
    blocks' kept bytes: :mod:`meshplan.costmodel.moe_torch_memory`,
    :mod:`meshplan.costmodel.compiled_block_memory`) and the transfer of measured rows to
    a shape the profile did not time (:mod:`meshplan.costmodel.nearest_rows`)."""
    return CORRECTIONS + MEMORY_RULES + (COMPILED_MOE_BLOCK_CORRECTION,
                                         COMPILED_DENSE_BLOCK_CORRECTION,
                                         NEAREST_SHAPE_CORRECTION)


__all__ = ["all_corrections", "applied"]
