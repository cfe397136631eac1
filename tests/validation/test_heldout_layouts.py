"""The rows gathered on 2026-12-05 as hold-outs (``moe_heldout_2026_12.csv``,
``moe_user_reports_2026_12.csv``, ``dense_heldout_2026_12.csv``): every published layout is
one meshplan can express, as its row prints it. Layouts only: no step time is predicted or
compared here (the rows stayed unseen by the cost model until the rule they tested was
committed; their errors are in docs/benchmarks/published.md)."""

from __future__ import annotations

import pytest

from meshplan.spec.validate import check_layout

from published_runs import (dense_heldout_runs, moe_heldout_runs, moe_user_report_runs,
                            read_rows)

MOE_KEYS = ("tp", "pp", "cp", "ep", "etp", "vp", "micro_batch")
SETS = {
    "moe_heldout_2026_12.csv": (moe_heldout_runs, MOE_KEYS),
    "moe_user_reports_2026_12.csv": (moe_user_report_runs, MOE_KEYS + ("zero",)),
    "dense_heldout_2026_12.csv": (dense_heldout_runs, ("tp", "pp", "cp", "dp", "vp",
                                                       "micro_batch")),
}
LAYOUT_FIELDS = {"vp": "vpp"}


@pytest.mark.parametrize("name", sorted(SETS))
def test_heldout_layouts_expressible(name):
    loader, keys = SETS[name]
    runs, left_out = loader()
    rows = read_rows(name)
    assert len(runs) + len(left_out) == len(rows)
    assert len(runs) == sum(1 for d in rows if not d.get("left_out")) > 0
    assert all(reason for _, reason in left_out)
    for r in runs:
        d = r.row
        assert r.layout.num_gpus == int(d["gpus"]) == r.cluster.num_gpus, r.label
        assert tuple(getattr(r.layout, LAYOUT_FIELDS.get(k, k)) for k in keys) == tuple(
            int(d[k]) for k in keys), r.label
        assert (r.job.global_batch, r.job.seq_len, r.job.precision) == (
            int(d["global_batch"]), int(d["seq_len"]), d["precision"]), r.label
        if "overlap_dp_comm" in d:
            assert r.job.overlap_dp_comm == (d["overlap_dp_comm"] == "True"), r.label
        # the files print the step to 4 decimals (the MoE set's derived from tokens/s)
        step = d.get("step_s") or d.get("step_s_derived")
        assert r.published == pytest.approx(float(step), rel=1e-4) and r.published > 0, \
            r.label
        check_layout(r.model, r.cluster, r.job, r.layout, exact_gpus=True)
