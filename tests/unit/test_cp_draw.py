"""benchmarks/cp_draw.py: the held-out context-parallel draw, and the committed cp40 set."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cp_draw  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402
from meshplan.spec.validate import check_layout  # noqa: E402


def test_committed_cp40_is_what_the_seed_draws():
    """The set that ran is the seed's draw (nothing edited by hand after the draw)."""
    committed = json.loads((ROOT / "benchmarks/sets/cp40/set.json").read_text())
    assert cp_draw.draw(40) == committed


def test_committed_cp47_is_the_mla_draw_of_its_seed():
    """--mla: the committed set is the seed's draw, a dense model with DeepSeek's attention
    (one MLA head per drawn head), and the executor takes each layout (MLA at cp 2 too)."""
    from meshplan.executor.parallelize import check_layout_runnable
    committed = json.loads((ROOT / "benchmarks/sets/cp47/set.json").read_text())
    assert cp_draw.draw(47, 2, mla=True) == committed
    model = ModelSpec.from_dict(committed["model"])
    assert model.is_mla and not model.is_moe and model.num_kv_heads == model.num_heads
    assert (model.kv_lora_rank, model.qk_nope_head_dim, model.qk_rope_head_dim,
            model.v_head_dim) == (512, 128, 64, 128)
    styles = {Layout.from_dict(c["layout"]).cp_style for c in committed["cases"]
              if c["layout"]["cp"] > 1}
    assert styles == {"ring", "all-to-all"}
    for case in committed["cases"]:
        job = Job(global_batch=cp_draw.tokens_per_step(2) // case["seq_len"],
                  seq_len=case["seq_len"], precision="bf16", runtime="torch")
        check_layout_runnable(model, job, Layout.from_dict(case["layout"]))


def test_draw_covers_and_admits():
    doc = json.loads((ROOT / "benchmarks/sets/cp40/set.json").read_text())
    model = ModelSpec.from_dict(doc["model"])
    cluster = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=4)
    layouts = [Layout.from_dict(c["layout"]) for c in doc["cases"]]
    assert len(layouts) == cp_draw.N_LAYOUTS
    assert cp_draw.covers(layouts)
    cps = [lay.cp for lay in layouts]
    assert 1 <= cps.count(1) <= 2 and cps.count(2) >= 3 and cps.count(4) >= 3
    for case, lay in zip(doc["cases"], layouts):
        assert lay.num_gpus == 4
        job = Job(global_batch=cp_draw.TOKENS_PER_STEP // case["seq_len"],
                  seq_len=case["seq_len"], precision="bf16", runtime="torch")
        check_layout(model, cluster, job, lay)          # raises if inadmissible
        limit_bytes = cp_draw.MEMORY_SHARE * cluster.gpu.memory_bytes
        assert case["datasheet_peak_gib"] * 2**30 <= limit_bytes * 1.001   # rounded to 0.1


def test_covers_needs_tp_pp_and_both_styles():
    ring = Layout(cp=2, dp=2)
    a2a = Layout(cp=2, dp=2, cp_style="all-to-all")
    tp, pp = Layout(tp=2, dp=2), Layout(pp=2, dp=2)
    assert cp_draw.covers([ring, a2a, tp, pp])
    assert not cp_draw.covers([ring, ring, tp, pp])
    assert not cp_draw.covers([ring, a2a, pp])
    assert not cp_draw.covers([ring, a2a, tp])


def test_existing_set_is_not_redrawn_over(tmp_path):
    out = tmp_path / "set.json"
    out.write_text("{}")
    with pytest.raises(SystemExit, match="exists"):
        cp_draw.main(["--seed", "40", "--out", str(out)])
    assert out.read_text() == "{}"


def test_context_parallel_gpu_reads_the_set_and_refuses_a_bad_one(tmp_path):
    import context_parallel_gpu as cg
    model, cases = cg.load_set(str(ROOT / "benchmarks/sets/cp40/set.json"))
    assert model.name.startswith("c40m") and [c.name for c in cases][0] == "c40-01"
    assert len(cases) == cp_draw.N_LAYOUTS
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": {}}')
    for path in (bad, tmp_path / "missing.json"):
        with pytest.raises(SystemExit, match="not a set written by benchmarks/cp_draw.py"):
            cg.load_set(str(path))


@pytest.mark.parametrize("seed", [44, 45])
def test_committed_two_gpu_sets_are_the_draws_of_their_seeds(seed):
    """cp44 (run) and cp45 (two GPUs): the seed's draw, cp 1 and 2 only, 65,536 tokens a
    step, admissible."""
    committed = json.loads((ROOT / f"benchmarks/sets/cp{seed}/set.json").read_text())
    assert cp_draw.draw(seed, gpus=2) == committed
    assert committed["tokens_per_step"] == cp_draw.tokens_per_step(2) == 65536
    model = ModelSpec.from_dict(committed["model"])
    cluster = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=2)
    layouts = [Layout.from_dict(c["layout"]) for c in committed["cases"]]
    cps = [lay.cp for lay in layouts]
    assert len(layouts) == cp_draw.N_LAYOUTS and set(cps) == {1, 2} and cps.count(1) in (2, 3)
    assert cp_draw.covers(layouts)
    for case, lay in zip(committed["cases"], layouts):
        assert lay.num_gpus == 2
        check_layout(model, cluster, Job(global_batch=65536 // case["seq_len"],
                                         seq_len=case["seq_len"], precision="bf16",
                                         runtime="torch"), lay)


def test_draw_refuses_other_gpu_counts():
    with pytest.raises(SystemExit, match="--gpus 16"):
        cp_draw.draw(44, gpus=16)


def test_eight_gpus_draw_reproduces_the_committed_set():
    """--gpus 8 (issue 42's cp at 8 ranks): cp 1 once, cp 2 twice, cp 4 and 8 the rest, a
    cp × tp layout among them, every peak under 70 % of an H100's memory (either 8-GPU kind
    may run it); the committed gpu8cp42 set is this draw."""
    doc = cp_draw.draw(42, gpus=8)
    lays = [Layout.from_dict(c["layout"]) for c in doc["cases"]]
    cps = [lay.cp for lay in lays]
    assert len(lays) == 8 and all(lay.num_gpus == 8 for lay in lays)
    assert cps.count(1) == 1 and cps.count(2) == 2 and {4, 8} <= set(cps)
    assert any(lay.cp > 1 and lay.tp > 1 for lay in lays) and cp_draw.covers(lays, 8)
    h100 = Cluster.preset("dgx-h100").gpu.memory_bytes
    assert all(c["datasheet_peak_gib"] * 2**30 <= 0.70 * h100 + 0.05 * 2**30
               for c in doc["cases"])
    assert doc["tokens_per_step"] == 262144
    committed = json.loads((ROOT / "benchmarks/sets/gpu8cp42/set.json").read_text())
    assert doc == committed
