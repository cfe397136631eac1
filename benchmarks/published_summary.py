"""Summary lines of ``benchmarks/validate_published.py`` and its section modules
(``published_fp8.py``): a set's mean and max absolute step-time error, and its signed range."""

from __future__ import annotations


def span(errs: list[float]) -> str:
    """The signed range of a group's errors, e.g. ``−4.3..+5.4 %``."""
    if len(errs) == 1:
        return f"{errs[0]:+.1f} %".replace("-", "−")
    return f"{min(errs):+.1f}..{max(errs):+.1f} %".replace("-", "−")


def summarize(name: str, errs: list[float]) -> str:
    """``name: mean absolute error M%, max X% (N runs)`` of signed errors in percent."""
    absd = [abs(e) for e in errs]
    return (f"{name}: mean absolute error {sum(absd) / len(absd):.1f}%, "
            f"max {max(absd):.1f}% ({len(errs)} run{'s' if len(errs) != 1 else ''})")


def summarize_signed(name: str, errs: list[float]) -> str:
    """:func:`summarize` followed by the signed range (:func:`span`)."""
    return f"{summarize(name, errs)}, {span(errs)}"


def by_group(runs, errs: list[float], key) -> dict[str, list[float]]:
    """The signed errors of ``runs`` (paired with ``errs``) grouped by ``key(run)``, the groups
    in the order their first run comes."""
    groups: dict[str, list[float]] = {}
    for r, e in zip(runs, errs):
        groups.setdefault(key(r), []).append(e)
    return groups
