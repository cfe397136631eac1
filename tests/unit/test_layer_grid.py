"""`meshplan calibrate --layer-grid`: stand-in layer shapes whose rows a model that was not
timed borrows (meshplan/calibrate/generic_layers.py, costmodel/nearest_rows.py)."""

import pytest

from meshplan.calibrate.generic_layers import (CPU_LAYER_MODELS, GENERIC_LAYER_MODELS,
                                               layer_grid_models)
from meshplan.costmodel.nearest_rows import family
from meshplan.spec import Job, Layout, ModelSpec


def test_grid_covers_both_families_at_two_widths_and_splits_over_tp_2():
    fams = {family(m) for m in GENERIC_LAYER_MODELS}
    assert len(fams) == 2                                         # GPT and Llama
    for f in fams:
        widths = sorted(m.hidden_size for m in GENERIC_LAYER_MODELS if family(m) == f)
        assert widths == [1792, 3072]
    for m in GENERIC_LAYER_MODELS:
        assert m.num_heads % 2 == 0 and m.num_kv_heads % 2 == 0 and m.vocab_size % 2 == 0
    assert {family(m) for m in CPU_LAYER_MODELS} == fams           # CPU: same families
    assert layer_grid_models("cuda") == GENERIC_LAYER_MODELS
    assert layer_grid_models("cpu") == CPU_LAYER_MODELS


def test_child_argv_passes_layer_grid():
    import argparse

    from meshplan.commands.calibrate import add_arguments, child_argv
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert "--layer-grid" in child_argv(p.parse_args(["--layer-grid", "--nproc", "2"]))
    assert "--layer-grid" not in child_argv(p.parse_args(["--nproc", "2"]))


def test_layer_grid_profile_lends_each_family_its_own_rows(tmp_path):
    pytest.importorskip("torch")
    from meshplan.cli import main as cli_main
    from meshplan.costmodel import estimate
    from meshplan.hardware_profiles import Cluster
    from meshplan.hardware_profiles.calibrated import apply_profile, load_profile
    out = tmp_path / "grid.toml"
    assert cli_main(["calibrate", "--device", "cpu", "--quick", "--layer-grid",
                     "--micro-batches", "1", "--out", str(out), "--no-progress"]) == 0
    prof = load_profile(str(out))
    timed = {r.shape for r in prof.gpu.measured.layers}
    assert len(timed) == 2
    assert prof.provenance["layer_grid"] == "grid-gpt-tiny, grid-llama-tiny"
    cluster = apply_profile(Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1), str(out),
                            override=True)
    job = Job(global_batch=4, seq_len=32)
    for style, kernel in (("llama", "swiglu-rmsnorm-rope"), ("gpt", "gelu-layernorm-learned")):
        untimed = ModelSpec.preset("llama3-8b" if style == "llama" else "gpt-1.7b")
        untimed = ModelSpec(name=f"untimed-{style}", num_layers=4, hidden_size=96,
                            num_heads=6, num_kv_heads=2, ffn_hidden_size=256, vocab_size=128,
                            max_seq_len=32, activation=untimed.activation, norm=untimed.norm,
                            position_embedding=untimed.position_embedding,
                            tied_embeddings=untimed.tied_embeddings, bias=untimed.bias)
        est = estimate(untimed, cluster, job, Layout(micro_batch=1))
        borrowed = [c for c in est.caveats if "was not timed" in c]
        assert len(borrowed) == 1 and kernel in borrowed[0], est.caveats


def test_rows_ablation_as_run_matches_the_rounds_repredict():
    """benchmarks/rows_ablation.py's unablated variant is the same re-prediction that
    transfer_round.py reports, and removing every row gives the analytical layer."""
    import json
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    import rows_ablation
    import transfer_round as tr
    doc = json.loads((root / "docs/benchmarks/data/transfer41_accuracy.json").read_text())
    doc["records"] = [r for r in doc["records"] if r["name"] in ("x02", "x22")]
    errs = rows_ablation.ablate(doc, "dgx-h200")
    assert set(errs) == set(rows_ablation.VARIANTS)
    by_model = {}
    for r in doc["records"]:
        by_model.setdefault(doc["profiles"][r["model"]], []).append(r["name"])
    again = {}
    for prof in by_model:
        for r in tr.repredict(doc, str(root / prof), "NVIDIA H200"):
            if doc["profiles"][r["model"]] == prof:
                again[r["name"]] = r["step_time_error_pct"]
    assert errs["as run"] == pytest.approx([again[r["name"]] for r in doc["records"]])
    assert all(n != a for n, a in zip(errs["no rows"], errs["as run"]))
