"""benchmarks/memory_peak.py: the live set at the peak of an allocation trace."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from memory_peak import MARKER, block_lifetimes, peak_live_set, site  # noqa: E402

MP = "/x/site-packages/meshplan/executor/model.py"
TORCH = "/x/site-packages/torch/nn/modules/linear.py"


def _a(addr, size, fn="f", line=1, path=MP):
    return {"action": "alloc", "addr": addr, "size": size,
            "frames": [{"filename": TORCH, "line": 9, "name": "forward"},
                       {"filename": path, "line": line, "name": fn}]}


def _f(addr):
    return {"action": "free_completed", "addr": addr}


def test_the_live_set_at_the_peak_is_grouped_by_meshplan_site():
    ev = [_a(1, 100, "weights", 10), _a(2, 50, "act", 20), _a(3, 50, "act", 20), _f(2),
          _a(4, 120, "logits", 30), _f(4), _f(3), _a(5, 10, "late", 40)]
    got = peak_live_set(ev)
    # peak after event 4: blocks 1 (100), 3 (50), 4 (120) = 270
    assert got["peak_bytes"] == 270 and got["complete"]
    assert [(s["site"], s["bytes"], s["blocks"]) for s in got["sites"]] == [
        ("meshplan/executor/model.py:30 logits", 120, 1),
        ("meshplan/executor/model.py:10 weights", 100, 1),
        ("meshplan/executor/model.py:20 act", 50, 1)]


def test_frees_of_blocks_allocated_before_the_trace_mark_it_incomplete():
    got = peak_live_set([_f(9), _a(1, 10)])
    assert not got["complete"] and got["peak_bytes"] == 10


def test_site_falls_back_to_the_first_frame_outside_torch():
    assert site([{"filename": TORCH, "line": 1, "name": "a"},
                 {"filename": "/w/bench.py", "line": 7, "name": "b"}]) == "/w/bench.py:7 b"
    assert site([{"filename": TORCH, "line": 1, "name": "a"}]) == "torch/nn/modules/linear.py:1 a"
    assert site([]) == "?"


def _mark():
    return {"action": "alloc", "addr": 999, "size": 512,
            "frames": [{"filename": "/w/benchmarks/memory_walk.py", "line": 5,
                        "name": MARKER}]}


def _req(addr, frames=()):
    return {"action": "free_requested", "addr": addr, "frames": list(frames)}


def test_block_lifetimes_place_large_blocks_between_markers():
    py = [{"filename": MP, "line": 70, "name": "step"}]
    ev = [_a(1, 4096, "bucket", 56), _mark(), _a(2, 100, "small"), _mark(),
          _a(3, 8192, "rebuilt", 170), _req(1), _f(1), _mark(), _req(3, py), _f(3),
          _a(4, 2048, "never")]
    got = block_lifetimes(ev, min_bytes=1024)
    assert [(b["bytes"], b["alloc_mark"], b["free_mark"]) for b in got] == [
        (4096, 0, 2), (8192, 2, 3), (2048, 3, None)]
    # a free with no Python frame came from a C++ thread (autograd engine, NCCL watchdog)
    assert got[0]["free_site"] == "(no Python frame)"
    assert got[1]["free_site"] == "meshplan/executor/model.py:70 step"
    assert got[2]["site"] == "meshplan/executor/model.py:1 never" and got[2]["free_site"] is None


def test_memory_at_peak_writes_the_live_set_as_a_table():
    """benchmarks/memory_at_peak.py (one plan file under the memory history): its table is
    peak_live_set's sites, largest first, in GiB."""
    from memory_at_peak import summary
    live = peak_live_set([_a(1, 3 * 2**30, "weights", 10), _a(2, 2**30, "act", 20)])
    text = summary(live, max_allocated_bytes=4 * 2**30)
    assert text.splitlines()[:2] == ["max_memory_allocated: 4.00 GiB",
                                     "peak of the recorded trace: 4.00 GiB (complete trace: True)"]
    assert "| 3.000 | 1 | `meshplan/executor/model.py:10 weights` |" in text
    assert text.index("weights") < text.index("act")
