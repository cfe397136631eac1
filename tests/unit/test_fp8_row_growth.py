"""An fp8 layer row timed at one micro-batch only, asked at another: grown as the fp8 layer
composed on its bf16 rows grows (costmodel.parts.grown_fp8_row), checked on the stored
fp8hN calibrations' own rows (benchmarks/fp8_row_growth.py)."""
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace as NS

from meshplan.costmodel.parts import grown_fp8_row

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def _parts(composed, forward_s, backward_s, row="rowwise, compiled"):
    layer = NS(forward=NS(total_s=forward_s), backward=NS(total_s=backward_s))
    return NS(fp8_composed_s=composed, layer=layer, fp8=NS(row=row))


def test_a_row_timed_at_one_other_micro_batch_grows_as_the_composed_layer():
    row = NS(extended_from=(2,), forward_s=9.0, backward_s=9.0)
    asked = []

    def parts_at(mb):
        asked.append(mb)
        return _parts((1.0, 2.0), 3.0, 4.0)
    # timed at 2: 3.0 / 4.0; composed 1.0 / 2.0 there and 2.0 / 3.0 here
    assert grown_fp8_row(row, 4, (2.0, 3.0), parts_at) == (6.0, 6.0) and asked == [2]


def test_rows_timed_here_or_between_timed_micro_batches_are_read_as_they_are():
    def parts_at(mb):
        raise AssertionError("not asked")
    for ext in ((), (4,), (2, 8)):
        row = NS(extended_from=ext, forward_s=1.5, backward_s=2.5)
        assert grown_fp8_row(row, 4, (2.0, 3.0), parts_at) == (1.5, 2.5)
    # where the timed micro-batch has no composed layer to read, the tables' own growth
    row = NS(extended_from=(2,), forward_s=1.5, backward_s=2.5)
    assert grown_fp8_row(row, 4, (2.0, 3.0), lambda mb: _parts((0.0, 0.0), 3.0, 4.0)) == (
        1.5, 2.5)
    assert grown_fp8_row(row, 4, (2.0, 3.0), lambda mb: _parts((1.0, 2.0), 3.0, 4.0, row="")
                         ) == (1.5, 2.5)


def test_on_the_stored_rows_the_composed_growth_beats_the_bf16_twins():
    import fp8_row_growth
    got = list(fp8_row_growth.cost_model_pairs())
    assert len(got) >= 100           # 166 pairs of 12 fp8h calibrations when written
    err = {j: [abs(r[j] / r[7] - 1) for r in got] for j in (5, 6)}
    assert statistics.mean(err[5]) < 0.75 * statistics.mean(err[6])
    assert max(err[5]) < max(err[6])


def test_the_caveat_names_where_a_grown_row_was_timed():
    from meshplan.costmodel.fp8_rows import row_label
    from meshplan.spec import Job
    job = Job(global_batch=16, seq_len=2048, precision="fp8", fp8_recipe="rowwise")
    at = dict(micro_batch=8, tp=1, sequence_parallel=False, recompute="none", compile=True)
    assert row_label(job, **at).endswith("seq 2048, micro-batch 8")
    assert row_label(job, **at, timed_at=(8,)).endswith("seq 2048, micro-batch 8")
    assert row_label(job, **at, timed_at=(2, 4)).endswith(
        "timed at micro-batch 2, 4, grown to 8")
