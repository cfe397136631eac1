"""Short layout labels for reports: ``dp64 pp4 tp4 v24 mb2 z2 sp``.

``Layout.short()`` spells every field and the whole stage partition (40 chunks read
``layers 2/2/2/…``), which made report tables overflow and chart labels unreadable. The
label here names only what differs from the defaults, and leaves the stage partition to a
footnote, and only where it is uneven (an even split is what the label already implies).
"""

from __future__ import annotations

from typing import Iterable

from meshplan.spec import Layout

_SCHEDULES = {"gpipe": "gpipe", "zero-bubble": "zb"}   # 1f1b: default; interleaved: v{vpp}
_RECOMPUTE = {"full": "rc-full", "selective": "rc-sel"}


def layout_label(lay: Layout) -> str:
    """``dp{dp} pp{pp} tp{tp}`` (+ ``cp``, ``ep``, ``etp`` when > 1), then ``v{vpp}`` for
    interleaved 1F1B, ``gpipe`` / ``zb`` for the other non-1F1B schedules, ``mb{n}``,
    ``rc-full`` / ``rc-sel``, ``z{zero}``, ``sp`` and ``compiled`` where set."""
    parts = [f"dp{lay.dp}", f"pp{lay.pp}", f"tp{lay.tp}"]
    if lay.cp > 1:
        parts.append(f"cp{lay.cp}" + ("-a2a" if lay.cp_style == "all-to-all" else ""))
    if lay.ep > 1:
        parts.append(f"ep{lay.ep}")
    if lay.etp > 1:
        parts.append(f"etp{lay.etp}")
    if lay.vpp > 1:
        parts.append(f"v{lay.vpp}")
    elif lay.schedule in _SCHEDULES:
        parts.append(_SCHEDULES[lay.schedule])
    parts.append(f"mb{lay.micro_batch}")
    if lay.recompute in _RECOMPUTE:
        parts.append(_RECOMPUTE[lay.recompute])
    parts.append(f"z{lay.zero}")
    if lay.sequence_parallel:
        parts.append("sp")
    if lay.compile:
        parts.append("compiled")
    return " ".join(parts)


def stage_split(lay: Layout) -> str:
    """The layers per (virtual) stage, ``"18/19/20/20/19"``; "" when not given."""
    return "/".join(map(str, lay.stage_layers)) if lay.stage_layers else ""


def is_uneven(split: str) -> bool:
    return len(set(split.split("/"))) > 1 if split else False


def split_marks(splits: Iterable[str]) -> dict[str, str]:
    """A footnote mark (``[1]``, ``[2]``, …) per distinct uneven split, in order of appearance."""
    marks: dict[str, str] = {}
    for s in splits:
        if is_uneven(s) and s not in marks:
            marks[s] = f"[{len(marks) + 1}]"
    return marks


def split_notes(marks: dict[str, str]) -> tuple[str, ...]:
    return tuple(f"{m} layers per pipeline stage: {s}" for s, m in marks.items())


def label_with_split(lay: Layout) -> str:
    """The label, with the stage split in parentheses where it is uneven (running text)."""
    split = stage_split(lay)
    return layout_label(lay) + (f" (layers per stage {split})" if is_uneven(split) else "")


__all__ = ["layout_label", "stage_split", "is_uneven", "split_marks", "split_notes",
           "label_with_split"]
