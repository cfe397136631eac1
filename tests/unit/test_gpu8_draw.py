"""benchmarks/gpu8_draw.py: the 8-GPU held-out draw of issue 42 and the committed gpu8_42 set."""

import json
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import draw_holdout as dh  # noqa: E402
import draw_models as dm  # noqa: E402
import gpu8_draw as g8  # noqa: E402
import layout_sets as ls  # noqa: E402
from meshplan.costmodel import estimate  # noqa: E402
from meshplan.costmodel.measured import layer_shape_key  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402
from meshplan.spec.validate import check_layout  # noqa: E402

SET = ROOT / "benchmarks" / "sets" / "gpu8_42"
DOC = json.loads((SET / "set.json").read_text())
ENTRIES = [(m, x) for m in DOC["models"] for x in m["layouts"]]
ROUND26 = ROOT / "docs/benchmarks/data/profiles/profile_h200x4_round26.toml"


def _layout(x: dict) -> Layout:
    return Layout.from_dict({k: v for k, v in x.items()
                             if k not in ("name", "families") and not k.startswith("screen_")})


LAYOUTS = [_layout(x) for _, x in ENTRIES]


def test_models_are_the_seeds_draws_in_order():
    """Each kept model is the draw its name numbers (gNNmKK: the KK-th draw of the seed)."""
    rng = random.Random(DOC["seed"])
    draws = [dm.draw_model(rng, f"g42m{i + 1:02d}", min_params=3e9, max_params=6e9,
                           layer_multiple=8) for i in range(20)]
    for m in DOC["models"]:
        k = int(m["name"][len("g42m"):len("g42m") + 2])
        assert draws[k - 1].to_dict() == m["spec"]
        assert json.loads((SET / "models" / f"{m['name']}.json").read_text()) == m["spec"]
        listed = json.loads((SET / "layouts" / f"{m['name']}.json").read_text())
        assert [x["name"] for x in listed] == [x["name"] for x in m["layouts"]]
    kept = {m["name"] for m in DOC["models"]}
    rejected = {r[0] for r in DOC["rejected_models"]}
    last = max(int(n[len("g42m"):len("g42m") + 2]) for n in kept)
    assert kept | rejected == {d.name for d in draws[:last]}


def test_set_covers_the_issues_families_and_the_protocol():
    assert len(LAYOUTS) >= 16 and len(DOC["models"]) >= 2
    assert all(l.num_gpus == 8 for l in LAYOUTS)
    assert g8.covers8(LAYOUTS)
    for name, has in g8.FAMILIES.items():
        assert any(has(l) for l in LAYOUTS), name
    assert {g8.model_family(ModelSpec.from_dict(m["spec"])) for m in DOC["models"]} == \
        {"gpt", "llama"}
    assert all(l.cp == 1 and l.ep == 1 for l in LAYOUTS)   # not modelled yet


def test_covers8_needs_every_family():
    for name, has in g8.FAMILIES.items():
        assert not g8.covers8([l for l in LAYOUTS if not has(l)]), name


def test_models_were_never_run_and_allow_tp8():
    known = dm.known_shapes(except_set="gpu8_42")
    for m in DOC["models"]:
        spec = ModelSpec.from_dict(m["spec"])
        assert layer_shape_key(spec) not in known
        assert spec.num_layers % 8 == 0 and 3e9 <= spec.num_params() <= 6e9
        assert spec.num_heads % 8 == 0 and spec.num_kv_heads % 8 == 0


def test_calibration_sizes_are_each_models_smallest_and_largest():
    for m in DOC["models"]:
        mbs = [x["micro_batch"] for x in m["layouts"]]
        assert m["calibrate_micro_batches"] == sorted({min(mbs), max(mbs)})


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e[1]["name"])
def test_every_layout_is_accepted_and_fits_an_80gb_h100(entry):
    m, x = entry
    model, job, layout = ModelSpec.from_dict(m["spec"]), Job.from_dict(m["job"]), _layout(x)
    assert job.global_batch * job.seq_len == DOC["tokens_per_step"]
    h100 = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=8)
    check_layout(model, h100, job, layout)
    parallelize = pytest.importorskip("meshplan.executor.parallelize")
    parallelize.check_layout_runnable(model, job, layout)
    est = estimate(model, h100, job, layout)
    assert est.fits and x["screen_memory_gib"] <= 60
    assert x["screen_host_proxy"] <= DOC["screen_max_host_load"]
    assert x["families"] == g8.families_of(layout)


def test_host_proxy_reproduces_the_models_own_host_load_where_it_has_cpu_rows():
    """On round 26's models and profile (CPU rows of exactly these shapes) the proxy's
    borrowed-row formula gives what Estimate.host_load gives, within ±0.25 (observed
    −0.14..+0.21, mean +0.02, over holdout22-25 when written)."""
    rows = g8.CpuRows(ROUND26)
    cluster = apply_profile(ls.gpu_cluster("NVIDIA H200", 4), ROUND26)
    diffs = []
    for name in ("holdout22", "holdout23", "holdout24", "holdout25"):
        for _, model, layout in ls.SETS[name]:
            job = ls.SET_JOBS[name]
            est = estimate(model, cluster, job, layout)
            diffs.append(g8.host_load_proxy(rows, model, job, layout, est) - est.host_load)
    assert len(diffs) == 64
    assert max(abs(d) for d in diffs) <= 0.25
    assert abs(sum(diffs) / len(diffs)) <= 0.05


def test_fsdp_rows_at_a_tp_not_timed_are_composed_from_the_plain_row():
    """4-GPU profiles have no FSDP row at tp 4 (tp 4 × dp 2 needs 8 ranks): the plain tp 4
    row plus what FSDP2 adds at tp 2."""
    rows = g8.CpuRows(ROUND26)
    z3 = Layout(dp=2, tp=4, zero=3, micro_batch=4, recompute="selective")
    plain = Layout(dp=2, tp=4, zero=0, micro_batch=4, recompute="selective")
    fsdp2 = rows.layer_s("llama", Layout(dp=2, tp=2, zero=3, micro_batch=4,
                                         recompute="selective"))
    plain2 = rows.layer_s("llama", Layout(dp=2, tp=2, micro_batch=4, recompute="selective"))
    got, base = rows.layer_s("llama", z3), rows.layer_s("llama", plain)
    assert got[0] == pytest.approx(base[0] + max(0.0, fsdp2[0] - plain2[0]))
    # tp 8 borrows the tp 4 rows
    assert rows.layer_s("gpt", Layout(tp=8, micro_batch=4)) == \
        rows.layer_s("gpt", Layout(tp=4, dp=2, micro_batch=4))


def test_a_profile_without_cpu_rows_cannot_screen(tmp_path):
    p = tmp_path / "generic.toml"
    p.write_text('schema = "meshplan.profile"\n')
    with pytest.raises(SystemExit, match="no layer rows with CPU dispatch times"):
        g8.CpuRows(p)


def test_draw_takes_the_coverage_predicate():
    pools = {"m": [(l, type("E", (), {"step_time_s": 0.1})()) for l in LAYOUTS]}
    with pytest.raises(SystemExit, match="covers nothing"):
        def nothing(_):
            """nothing"""
            return False
        dh.draw(pools, 4, 0, 100.0, covers=nothing)
