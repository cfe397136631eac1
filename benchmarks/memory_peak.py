"""What is alive at a rank's memory peak, by the code that allocated it (a library for
``memory_walk.py --snapshot``; no command of its own).

``torch.cuda.memory._record_memory_history`` logs every allocation and free with the Python
stack that made it; :func:`peak_live_set` replays that log, finds the moment the allocated
total was largest and groups the blocks alive then by their allocation site — the first
frame in meshplan's own code, else the first frame outside torch — so that a memory error
of a prediction can be traced to the tensors it missed::

    torch.cuda.memory._record_memory_history(stacks="python", max_entries=2_000_000)
    ... run ...
    summary = peak_live_set(torch.cuda.memory._snapshot()["device_traces"][device_index])

A trace that does not start before the first allocation (the ring buffer overflowed, or
recording began late) misses blocks allocated earlier; ``complete`` is then False and the
figures are only what the trace saw.

:func:`block_lifetimes` follows the large blocks instead: when each was allocated and when
its free was requested, counted in *markers* — tiny allocations made by a function named
:data:`MARKER` (``memory_walk.py`` makes one after every step phase it logs), so that
a block can be placed in the step's phases without clock time in the trace. A free made on
a thread with no Python frames (the autograd engine's device thread, the NCCL watchdog)
has no site: ``"(no Python frame)"``.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

_ALLOC = "alloc"
_FREES = ("free_completed",)
MARKER = "_mark_trace"


def site(frames: Sequence[Mapping[str, Any]]) -> str:
    """The allocation site of a block: its first frame in meshplan's code, else the first
    outside torch's own files, else the innermost frame; ``file:line function``."""
    def label(f):
        path = str(f.get("filename", "?"))
        short = path.split("site-packages/")[-1] if "site-packages/" in path else path
        if "/meshplan/" in short:
            short = "meshplan/" + short.split("/meshplan/", 1)[1]
        return f"{short}:{f.get('line', '?')} {f.get('name', '?')}"
    for f in frames:
        if "/meshplan/" in str(f.get("filename", "")):
            return label(f)
    for f in frames:
        name = str(f.get("filename", ""))
        if "/torch/" not in name and not name.startswith("<"):
            return label(f)
    return label(frames[0]) if frames else "?"


def peak_live_set(events: Iterable[Mapping[str, Any]], top: int = 25) -> dict[str, Any]:
    """Replay allocation ``events`` (a device trace of ``torch.cuda.memory._snapshot()``):
    ``{"peak_bytes", "complete", "events", "sites": [{"bytes", "blocks", "site"}, ...]}``
    with the ``top`` largest sites of the blocks alive at the peak."""
    events = list(events)
    live: dict[int, tuple[int, int]] = {}      # addr -> (size, event index)
    total = peak = 0
    peak_at = -1
    unmatched_frees = 0
    for i, e in enumerate(events):
        act = e.get("action")
        if act == _ALLOC:
            live[e["addr"]] = (int(e["size"]), i)
            total += int(e["size"])
            if total > peak:
                peak, peak_at = total, i
        elif act in _FREES:
            got = live.pop(e["addr"], None)
            if got is None:
                unmatched_frees += 1
            else:
                total -= got[0]
    # the blocks alive right after event peak_at: replay once more up to it
    alive: dict[int, int] = {}
    for i, e in enumerate(events[:peak_at + 1]):
        if e.get("action") == _ALLOC:
            alive[e["addr"]] = i
        elif e.get("action") in _FREES:
            alive.pop(e["addr"], None)
    by_site: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for addr, i in alive.items():
        s = by_site[site(events[i].get("frames", ()))]
        s[0] += int(events[i]["size"])
        s[1] += 1
    sites = sorted(({"bytes": b, "blocks": n, "site": k} for k, (b, n) in by_site.items()),
                   key=lambda r: -r["bytes"])
    return {"peak_bytes": peak, "complete": unmatched_frees == 0, "events": len(events),
            "sites": sites[:top]}


def _is_marker(e: Mapping[str, Any]) -> bool:
    return any(f.get("name") == MARKER for f in e.get("frames", ()))


def block_lifetimes(events: Iterable[Mapping[str, Any]],
                    min_bytes: int) -> list[dict[str, Any]]:
    """Every block of at least ``min_bytes`` in the trace, in allocation order:
    ``{"bytes", "site", "alloc_mark", "free_mark", "free_site"}``. ``alloc_mark`` /
    ``free_mark`` count the :data:`MARKER` allocations before the block's allocation / its
    free request (``None``: never freed in the trace)."""
    marks = 0
    blocks: list[dict[str, Any]] = []            # allocation order
    open_blocks: dict[int, dict[str, Any]] = {}  # addr -> its entry in blocks
    for e in events:
        act = e.get("action")
        if act == _ALLOC:
            if _is_marker(e):
                marks += 1
            elif int(e["size"]) >= min_bytes:
                rec = {"bytes": int(e["size"]), "site": site(e.get("frames", ())),
                       "alloc_mark": marks, "free_mark": None, "free_site": None}
                blocks.append(rec)
                open_blocks[e["addr"]] = rec
        elif act == "free_requested" and e.get("addr") in open_blocks:
            rec = open_blocks.pop(e["addr"])
            frames = e.get("frames", ())
            rec["free_mark"] = marks
            rec["free_site"] = site(frames) if frames else "(no Python frame)"
    return blocks

__all__ = ["MARKER", "block_lifetimes", "peak_live_set", "site"]
