"""benchmarks/memory_peak.py: the live set at the peak of an allocation trace."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from memory_peak import peak_live_set, site  # noqa: E402

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
