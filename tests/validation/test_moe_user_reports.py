"""The MoE user-report rows (``moe_user_reports_2026_12.csv``): every layout is one meshplan can
express. Layouts only: no step time is predicted or compared here."""

from __future__ import annotations

from meshplan.spec.validate import check_layout

from published_runs import moe_user_report_runs, read_rows


def test_user_report_layouts_expressible():
    runs, left_out = moe_user_report_runs()
    rows = read_rows("moe_user_reports_2026_12.csv")
    assert len(runs) + len(left_out) == len(rows)
    assert len(runs) == sum(1 for d in rows if not d["left_out"]) > 0
    for r in runs:
        d = r.row
        gpus = int(d["gpus"])
        assert r.layout.num_gpus == gpus == r.cluster.num_gpus, r.label
        assert (r.layout.tp, r.layout.pp, r.layout.cp, r.layout.ep, r.layout.etp,
                r.layout.vpp, r.layout.micro_batch, r.layout.zero) == tuple(
            int(d[k]) for k in ("tp", "pp", "cp", "ep", "etp", "vp", "micro_batch",
                                "zero")), r.label
        assert (r.job.global_batch, r.job.seq_len, r.job.precision) == (
            int(d["global_batch"]), int(d["seq_len"]), d["precision"]), r.label
        assert r.job.overlap_dp_comm == (d["overlap_dp_comm"] == "True"), r.label
        assert r.published == float(d["step_s"]) > 0, r.label
        check_layout(r.model, r.cluster, r.job, r.layout, exact_gpus=True)
