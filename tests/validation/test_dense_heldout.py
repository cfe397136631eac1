"""The held-out dense rows (``dense_heldout_2026_12.csv``): every published layout is one meshplan
can express. Layouts only: no step time is predicted or compared here (the rows stay unseen by
the cost model until the rule they test is committed)."""

from __future__ import annotations

from meshplan.spec.validate import check_layout

from published_runs import dense_heldout_runs, read_rows


def test_dense_heldout_layouts_expressible():
    runs, left_out = dense_heldout_runs()
    rows = read_rows("dense_heldout_2026_12.csv")
    assert len(runs) + len(left_out) == len(rows)
    assert len(runs) == sum(1 for d in rows if not d["left_out"]) > 0
    assert all(reason for _, reason in left_out)
    for r in runs:
        d = r.row
        gpus = int(d["gpus"])
        assert r.layout.num_gpus == gpus == r.cluster.num_gpus, r.label
        assert (r.layout.tp, r.layout.pp, r.layout.cp, r.layout.dp, r.layout.vpp,
                r.layout.micro_batch) == tuple(
            int(d[k]) for k in ("tp", "pp", "cp", "dp", "vp", "micro_batch")), r.label
        assert (r.job.global_batch, r.job.seq_len, r.job.precision) == (
            int(d["global_batch"]), int(d["seq_len"]), d["precision"]), r.label
        assert r.published == float(d["step_s"]) > 0, r.label
        check_layout(r.model, r.cluster, r.job, r.layout, exact_gpus=True)
