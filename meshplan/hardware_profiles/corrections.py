"""The numbers of the cost model's empirical corrections, as a GPU profile carries them.

What each correction does, where it applies and why is :mod:`meshplan.costmodel.
corrections`; this module only holds its numbers. Built-in values come from
``data/corrections.toml``, one table per correction with the machine and date they were
read on; a calibrated profile's ``[corrections]`` table (flat: key = value) replaces them
key by key, and ``meshplan calibrate`` writes that table (docs/calibrate.md says which keys
it measures and which it carries over as these defaults).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from meshplan.errors import ProfileError

BUILTIN_FILE = "corrections.toml"
# the provenance fields of a data-file table (everything else in it is a number)
_PROVENANCE = ("machine", "date", "rounds")


@dataclass(frozen=True, kw_only=True)
class CorrectionNumbers:
    """Every correction's numbers (see :mod:`meshplan.costmodel.corrections` for each).

    ``disabled``: corrections switched off by name (what :func:`meshplan.costmodel.
    estimate` uses to tell how much each moved a prediction); ``source``: where the numbers
    came from, for reports; ``step_duty``: not a number of the profile but the state of an
    estimate (the busy share of the step it priced)."""

    torch_p2p_slowdown_per_op: float
    torch_p2p_slowdown_vpp_exponent: float
    torch_p2p_slowdown_max: float
    torch_p2p_order_max_microbatches_per_rank: int
    zb_full_pending_sets: float
    zb_full_w_transient_sets: float
    zb_full_w_forward_passes: float
    fsdp2_dp_only_step_s: float
    host_bound_caveat_share: float
    host_near_load: float
    host_balanced_load: float
    cp_ring_interference: float
    moe_load_imbalance: float
    megatron_moe_layer_host_ops: float
    sustained_clock_share: float
    sustained_power_exponent: float
    sustained_idle_power_share: float
    disabled: frozenset = frozenset()
    source: str = ""
    # the GPU's busy share of the step, as the cost model found it (meshplan.costmodel.
    # estimate sets it for the sustained clock's second pass; never read from a profile)
    step_duty: float = 1.0

    def enabled(self, name: str) -> bool:
        return name not in self.disabled

    def without(self, name: str) -> "CorrectionNumbers":
        return replace(self, disabled=self.disabled | {name})

    def to_table(self) -> dict[str, Any]:
        """The flat ``[corrections]`` table of a profile file."""
        out: dict[str, Any] = {k: getattr(self, k) for k in NUMBER_KEYS}
        out["source"] = self.source
        return out


NUMBER_KEYS = tuple(f.name for f in fields(CorrectionNumbers)
                    if f.name not in ("disabled", "source", "step_duty"))
_INT_KEYS = ("torch_p2p_order_max_microbatches_per_rank",)
# shares of a whole, below 1 (the idle GPU draws less than the limit: duty_scale divides by
# 1 - (1 - u) * share)
_BELOW_ONE_KEYS = ("sustained_idle_power_share",)


@lru_cache(maxsize=None)
def _data_file() -> dict[str, Any]:
    with resources.files("meshplan.hardware_profiles").joinpath(
            "data", BUILTIN_FILE).open("rb") as fh:
        return tomllib.load(fh)


def builtin_number(key: str) -> float:
    """One number of the data file, whichever table holds it."""
    for table in _data_file().values():
        if key in table:
            return table[key]
    raise ProfileError(f"built-in {BUILTIN_FILE} has no key {key!r}")


def builtin_provenance() -> dict[str, dict[str, str]]:
    """{table: {machine, date, rounds, keys}} of the data file (for docs and reports)."""
    return {name: {**{k: str(t.get(k, "")) for k in _PROVENANCE},
                   "keys": ", ".join(k for k in t if k not in _PROVENANCE)}
            for name, t in _data_file().items()}


@lru_cache(maxsize=None)
def builtin_corrections() -> CorrectionNumbers:
    """The built-in numbers, each from the data file's table for its correction."""
    return corrections_from_table({k: builtin_number(k) for k in NUMBER_KEYS},
                                  f"built-in {BUILTIN_FILE}",
                                  source=f"built-in defaults ({BUILTIN_FILE})")


def corrections_from_table(table: Mapping[str, Any], where: str, *,
                           base: CorrectionNumbers | None = None,
                           source: str | None = None) -> CorrectionNumbers:
    """``base`` (the built-in numbers if None) with the keys of ``table`` replaced; errors
    name the file, the key and what is valid."""
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key == "source":
            if not isinstance(value, str):
                raise ProfileError(f"{where}: key 'source' must be a string, got {value!r}")
            continue
        if key not in NUMBER_KEYS:
            raise ProfileError(f"{where}: unknown correction key {key!r}; known: "
                               f"{', '.join(NUMBER_KEYS)}")
        kind = int if key in _INT_KEYS else (int, float)
        if not isinstance(value, kind) or isinstance(value, bool) or value < 0:
            raise ProfileError(f"{where}: correction key {key!r} must be a non-negative "
                               f"{'integer' if key in _INT_KEYS else 'number'}, got {value!r}")
        if key in _BELOW_ONE_KEYS and value >= 1:
            raise ProfileError(f"{where}: correction key {key!r} must be in [0, 1) (the idle "
                               f"GPU's power over its limit), got {value!r}")
        values[key] = value if key in _INT_KEYS else float(value)
    src = source if source is not None else str(table.get("source", where))
    if base is None:
        missing = [k for k in NUMBER_KEYS if k not in values]
        if missing:
            if where.startswith("built-in"):
                raise ProfileError(f"{where}: missing correction keys {missing}")
            base = builtin_corrections()
        else:
            return CorrectionNumbers(**values, source=src)
    return replace(base, **values, source=src)


__all__ = ["CorrectionNumbers", "NUMBER_KEYS", "builtin_corrections", "builtin_number",
           "builtin_provenance", "corrections_from_table"]
