"""benchmarks/draw_holdout.py: the seeded, one-decision-at-a-time draw of a held-out set."""

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import draw_holdout as dh  # noqa: E402
from meshplan.spec import Layout  # noqa: E402


def _pool():
    """Two splits: one with 1 configuration, one with 12 (3 schedules)."""
    pool = [(Layout(dp=4, micro_batch=4), "a")]
    for sched in ("1f1b", "gpipe", "zero-bubble"):
        for mb in (1, 2, 4, 8):
            pool.append((Layout(pp=4, micro_batch=mb, schedule=sched), "b"))
    return pool


def test_pick_is_seeded_and_draws_without_replacement():
    pool = _pool()
    a = dh._pick(random.Random(7), pool, 6)
    b = dh._pick(random.Random(7), pool, 6)
    assert a == b
    assert len({l for l, _ in a}) == 6


def test_pick_chooses_the_split_first_not_the_configuration():
    # uniform over configurations would pick the lone dp-4 layout 1 time in 13; split first
    # picks it half the time
    hits = sum(dh._pick(random.Random(s), _pool(), 1)[0][0].dp == 4 for s in range(400))
    assert 150 < hits < 250


def test_covers_needs_every_schedule_zero_stage_recompute_mode_and_sp():
    full = [Layout(pp=2, schedule="gpipe", recompute="none"),
            Layout(pp=2, schedule="1f1b", recompute="selective", zero=0),
            Layout(pp=2, schedule="interleaved-1f1b", vpp=2, recompute="full", dp=2, zero=1),
            Layout(pp=2, schedule="zero-bubble", dp=2, zero=2),
            Layout(dp=2, tp=2, zero=3, sequence_parallel=True)]
    assert dh.covers(full)
    assert not dh.covers(full[:-1])          # no ZeRO-3, no SP
    assert not dh.covers(full[1:])           # no GPipe


def test_missing_profile_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        dh.main(["--profile", str(tmp_path / "nope.toml"), "--seed", "1"])
    assert e.value.code == 2
    assert "nope.toml: no such file" in capsys.readouterr().err


def test_a_pool_that_cannot_cover_the_space_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(dh, "MAX_ATTEMPTS", 50)
    pool = {"M": [(l, None) for l, _ in _pool()]}      # no interleaved 1F1B, no ZeRO 1-3
    with pytest.raises(SystemExit, match="covers every schedule"):
        dh.draw(pool, 2, seed=1, max_total_s=100.0)


def test_a_drawn_entry_reads_back_as_the_same_layout():
    """draw_holdout prints each layout as a line of layout_sets.toml: the line must load
    back (as layout_sets does) to the layout drawn."""
    import tomllib
    from types import SimpleNamespace
    layout = Layout(dp=2, pp=2, micro_batch=8, schedule="interleaved-1f1b", vpp=3,
                    recompute="selective", zero=1, sequence_parallel=False)
    e = SimpleNamespace(step_time_s=0.4, host_load=0.5, memory_peak_bytes=40 * 2**30)
    text = dh._entry("q01", "gpt-0.54b", layout, e)
    assert text.startswith("    # q01: 0.400 s, CPU 0.50, 40.0 GiB")
    row = tomllib.loads("layouts = [\n" + text + "\n]\n")["layouts"][0]
    assert row.pop("name") == "q01" and row.pop("model") == "gpt-0.54b"
    assert Layout(**row) == layout
