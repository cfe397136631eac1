"""benchmarks/draw_moe.py: random realistic MoE decoders, and the committed moeh1 draw."""

import json
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import draw_moe as dmoe  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402


def _draws(seed, n, **kw):
    rng = random.Random(seed)
    return [dmoe.draw_moe_model(rng, f"m{i}", **kw) for i in range(n)]


def test_draw_is_seeded():
    assert _draws(3, 5) == _draws(3, 5)
    assert _draws(3, 5) != _draws(4, 5)


@pytest.mark.parametrize("model", _draws(38, 30), ids=lambda m: m.name)
def test_every_draw_is_a_released_kind_of_moe(model):
    h = model.hidden_size
    assert 1024 <= h <= 2560 and model.num_heads % model.num_kv_heads == 0
    e, k = model.num_experts, model.experts_per_token
    # fine-grained segmentation: for some granularity g of this expert count, the top-k is
    # g or 2g (at most 8) and each expert is a 2.5-4 x hidden MLP's width over g (±128)
    assert any(k in (g, min(8, 2 * g))
               and 2.5 * h / g - 128 <= model.moe_ffn_hidden_size <= 4.0 * h / g + 128
               for g in dmoe.EXPERTS_GRANULARITY[e])
    assert 1 <= k <= 8 and k < e
    assert model.num_shared_experts in (0, 1)
    assert model.num_layers % 4 == 0 and model.num_moe_layers == model.num_layers
    assert 1.0e9 <= model.num_params() <= 3.0e9
    assert model.num_active_params() < model.num_params()
    assert ModelSpec.from_dict(model.to_dict()) == model


def test_bounds_are_checked():
    with pytest.raises(SystemExit):
        dmoe.main(["--seed", "1", "--min-params", "3e9", "--max-params", "1e9"])


def test_the_committed_moeh1_model_is_seed_3801s_first_draw():
    committed = ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks" / "sets" / "moeh1" / "m01.json").read_text()))
    assert committed == dmoe.draw_moe_model(random.Random(3801), "m01")


def test_the_committed_moeh3_draw_model_and_layouts():
    """moeh3 (2026-11-29): seed 3803's model, and six distinct layouts drawn from the same
    seed — the set the committed plans ran."""
    import moe_sync_gpu as msg
    committed = ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks" / "sets" / "moeh3" / "m01.json").read_text()))
    assert committed == dmoe.draw_moe_model(random.Random(3803), "m01")
    drawn = msg.draw_layouts(3803)
    assert drawn == msg.draw_layouts(3803) and drawn != msg.draw_layouts(3804)
    names = [n for n, _ in drawn]
    assert len(set(names)) == len({lay for _, lay in drawn}) == 6
    assert names == ["mb8-compiled", "mb4-selective-compiled", "mb16-full-compiled",
                     "mb16-compiled", "mb2-selective", "mb2-compiled"]
    plans = json.loads((ROOT / "benchmarks" / "plans" / "moeh3_h200x1" / "predictions.json")
                       .read_text())
    assert list(plans["layouts"]) == names and plans["set"] == "drawn-3803"


def test_the_committed_moeh4_draw_model_and_two_gpu_layouts():
    """moeh4 (2026-11-29): seed 3804's model, eight distinct two-GPU layouts drawn from the
    same seed with every parallel shape present — the set the committed plans ran."""
    import moe_sync_gpu as msg
    committed = ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks" / "sets" / "moeh4" / "m01.json").read_text()))
    assert committed == dmoe.draw_moe_model(random.Random(3804), "m01")
    drawn = msg.draw_layouts(3804, count=8, gpus=2)
    assert drawn == msg.SETS["drawn2-3804"]
    layouts = [lay for _, lay in drawn]
    assert len(set(layouts)) == 8 and all(lay.num_gpus == 2 for lay in layouts)
    shapes = {(lay.dp, lay.tp, lay.pp, lay.ep) for lay in layouts}
    assert shapes == {(2, 1, 1, 1), (2, 1, 1, 2), (1, 2, 1, 1), (1, 2, 1, 2), (1, 1, 2, 1)}
    assert all(lay.sequence_parallel for lay in layouts if lay.tp == 2)
    plans = json.loads((ROOT / "benchmarks" / "plans" / "moeh4_h200x2" / "predictions.json")
                       .read_text())
    assert list(plans["layouts"]) == [n for n, _ in drawn] and plans["set"] == "drawn2-3804"


def test_draw_layouts_refuses_other_gpu_counts():
    import moe_sync_gpu as msg
    with pytest.raises(ValueError, match="one, two, four or eight GPUs"):
        msg.draw_layouts(1, gpus=3)


def test_eight_gpu_set_is_the_seed_draw_and_runnable():
    """gpu8moe42 (issue 42's ep at 8 ranks, drawn 2026-11-30): seed 4242's model and sixteen
    distinct 8-rank layouts with every EIGHT_GPU_SHAPES shape, ep 4 and 8 only, each one the
    executor accepts for the model at its job (128 sequences of 2048)."""
    import moe_sync_gpu as msg
    from meshplan.executor.parallelize import check_layout_runnable
    from meshplan.spec import Job
    model = ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks" / "sets" / "gpu8moe42" / "m01.json").read_text()))
    assert model == dmoe.draw_moe_model(random.Random(4242), "m01", min_hidden=2048,
                                        max_params=6e9)
    drawn = msg.SETS["drawn8-4242"]
    assert drawn == msg.draw_layouts(4242, count=16, gpus=8, micro_batches=(4,))
    layouts = [lay for _, lay in drawn]
    assert len(set(layouts)) == 16 and all(lay.num_gpus == 8 for lay in layouts)
    assert {lay.ep for lay in layouts} == {1, 4, 8}
    assert len({(lay.dp, lay.tp, lay.pp, lay.ep) for lay in layouts}) == len(
        msg.EIGHT_GPU_SHAPES)
    job = Job(global_batch=128, seq_len=2048, precision="bf16", runtime="torch")
    for lay in layouts:
        check_layout_runnable(model, job, lay)


def test_repredict_prices_every_measured_layout_of_a_committed_run(capsys):
    """``moe_sync_gpu.py repredict`` (POST HOC): a row per measured layout, its as-run
    prediction as committed, and the summary lines."""
    import moe_sync_gpu as msg
    data = ROOT / "docs" / "benchmarks" / "data" / "moe_drawn_h200x2_moeh4_20261129.json"
    assert msg.main(["repredict", "--results", str(data)]) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("| `") for line in out.splitlines()) == 8
    assert "| `tp2-ep2-mb1` | 4.469 | 4.101 (-8.2 %)" in out
    assert "as run: mean 12.8 %, max 21.0 % (8 layouts)" in out and "today: mean" in out


@pytest.mark.usefixtures("no_grad_accumulation")
def test_repredict_one_arm_of_a_check_with_a_later_sustained_ratio(capsys):
    """``repredict --arm bf16 --sustained-from P`` (POST HOC, fp8h19): the check's data file
    holds each arm's results under its name; the compiled bf16 rows, which carried no
    sustained-clock ratio as run, take the later calibration's and price slower, while the
    fp8 rows keep their own ratio and their arms their price. A name the file lacks is
    refused with what it holds. (The compiled selective rows, timed before 2026-12-01 16:40
    by the earlier executor, are not read (hardware_profiles.stale_rows): those arms are
    priced from eager rows and the bf16 pair at recompute none, so the full-recompute arms
    are the ones that show the ratio.)"""
    import moe_sync_gpu as msg
    data = str(ROOT / "docs/benchmarks/data/fp8_h200x1_fp8h19_20261201.json")
    later = str(ROOT / "docs/benchmarks/data/profiles/profile_h200x1_fp8h19_check_20261201.toml")

    def today(arm: str, *extra: str) -> dict[str, float]:
        assert msg.main(["repredict", "--results", data, "--arm", arm, *extra]) == 0
        rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()
                if line.startswith("| `")]
        assert len(rows) == 4
        return {r[0]: float(r[3].split()[0]) for r in rows}
    for arm in ("bf16", "fp8"):
        plain, later_ratio = today(arm), today(arm, "--sustained-from", later)
        if arm == "bf16":
            assert all(later_ratio[k] >= v for k, v in plain.items())
            assert all(later_ratio[k] > v for k, v in plain.items() if "full" in k)
        else:     # the fp8 full rows read as timed (the selective ones derive from bf16 pairs)
            assert all(later_ratio[k] == v for k, v in plain.items() if "full" in k)
    with pytest.raises(SystemExit, match=r"--arm 'fp16': not in .* \['bf16', 'fp8'\]"):
        msg.main(["repredict", "--results", data, "--arm", "fp16"])
    with pytest.raises(SystemExit, match=r"--sustained-from 'nope.toml': .*does not exist"):
        msg.main(["repredict", "--results", data, "--arm", "bf16", "--sustained-from",
                  "nope.toml"])


def test_the_committed_moeh5_draw_model_and_four_gpu_candidates():
    """moeh5 (2026-11-29, for the next 4-GPU lease): seed 3805's model at hidden ≥ 2048, and
    sixteen distinct 4-GPU candidates drawn from the same seed, every shape present, all at
    micro-batch 2 and runnable by the executor."""
    import dataclasses

    import moe_sync_gpu as msg
    from meshplan.executor.parallelize import check_layout_runnable
    committed = ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks" / "sets" / "moeh5" / "m01.json").read_text()))
    assert committed == dmoe.draw_moe_model(random.Random(3805), "m01", max_params=4e9,
                                            min_hidden=2048)
    assert committed.hidden_size >= 2048
    drawn = msg.draw_layouts(3805, count=16, gpus=4)
    assert drawn == msg.SETS["drawn4-3805"]
    layouts = [lay for _, lay in drawn]
    assert len(set(layouts)) == 16 and all(lay.num_gpus == 4 for lay in layouts)
    assert {lay.micro_batch for lay in layouts} == {2}
    shapes = {(lay.dp, lay.tp, lay.pp, lay.ep) for lay in layouts}
    assert shapes == {(4, 1, 1, 1), (4, 1, 1, 2), (4, 1, 1, 4), (2, 2, 1, 2), (2, 2, 1, 4),
                      (2, 1, 2, 2), (1, 2, 2, 1)}
    job = dataclasses.replace(msg.JOB, seq_len=4096, global_batch=32)
    for lay in layouts:
        check_layout_runnable(committed, job, lay)


def test_draw_moe_min_hidden_keeps_the_default_draws_and_refuses_out_of_range():
    assert dmoe.draw_moe_model(random.Random(3803), "m01") == dmoe.draw_moe_model(
        random.Random(3803), "m01", min_hidden=dmoe.HIDDEN_RANGE[0])
    with pytest.raises(SystemExit):
        dmoe.main(["--seed", "1", "--min-hidden", "4096"])


def test_plans_gpu_unknown_name_is_one_line_naming_the_known_gpus(tmp_path):
    """``plans --gpu`` with a name no built-in GPU has stops with one line that names it and
    the known GPUs (as ``price_plans.py --gpu`` does), before any plan file is written."""
    import moe_sync_gpu as msg
    with pytest.raises(SystemExit) as exc:
        msg.main(["plans", "--set", "drawn-3878c", "--model",
                  str(ROOT / "benchmarks" / "sets" / "moeh67h100" / "m01.json"),
                  "--global-batch", "16", "--gpu", "H999", "--profile", "",
                  "--out", str(tmp_path / "plans")])
    assert "--gpu: unknown GPU 'H999'" in str(exc.value)
    assert "H100-SXM5-80GB" in str(exc.value)
    assert not (tmp_path / "plans" / "predictions.json").exists()


def test_plans_gpu_bound_keeps_the_first_layouts_predicted_gpu_bound(tmp_path):
    """``plans --gpu-bound N``: in the set's order, the first N layouts the profile predicts
    to fit with CPU dispatch ≤ 0.75 of their GPU time get plan files; those passed over are
    recorded with the reason."""
    import moe_sync_gpu as msg
    profile = ROOT / "docs" / "benchmarks" / "data" / "profiles" / \
        "profile_h200x2_moeh4_20261129.toml"
    assert msg.main(["plans", "--set", "drawn2-3804", "--model",
                     str(ROOT / "benchmarks" / "sets" / "moeh4" / "m01.json"),
                     "--global-batch", "16", "--profile", str(profile), "--gpu-bound", "2",
                     "--out", str(tmp_path)]) == 0
    preds = json.loads((tmp_path / "predictions.json").read_text())
    assert len(preds["layouts"]) == 2
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(
        [f"{n}.json" for n in preds["layouts"]] + ["predictions.json"])
    assert preds["excluded"] and all("GPU's time" in r or "not to fit" in r
                                     for r in preds["excluded"].values())
    # the host-bound tp 2 layouts of moeh4 are among the excluded, passed over in order
    assert "tp2-mb1-selective" in preds["excluded"]
    order = [n for n, _ in msg.SETS["drawn2-3804"]]
    last = max(order.index(n) for n in preds["layouts"])
    assert all(order.index(n) < last for n in preds["excluded"])


def test_the_committed_fp8h5_draw_model_and_four_gpu_layouts():
    """fp8h5 (2026-11-29, for the next 4-GPU lease): seed 4105's first dense model and six
    4-GPU layouts drawn from the same seed, one per shape, micro-batch 8, runnable."""
    import dataclasses

    import draw_models as dm
    import fp8_device as f8
    from meshplan.executor.parallelize import check_layout_runnable
    from meshplan.spec import Job
    committed = ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks" / "sets" / "fp8h5" / "m01.json").read_text()))
    assert committed == dm.draw_model(random.Random(4105), "m01", min_params=1.0e9,
                                      max_params=2.5e9)
    drawn = f8.draw_four_gpu_layouts(4105)
    assert [n for n, _ in drawn] == [f"q0{i}" for i in range(1, 7)]
    assert all(dict(f8.LAYOUTS)[n] == lay for n, lay in drawn)
    layouts = [lay for _, lay in drawn]
    assert {(lay.dp, lay.tp, lay.pp, lay.zero) for lay in layouts} == {
        (4, 1, 1, 1), (4, 1, 1, 3), (2, 2, 1, 1), (2, 2, 1, 2), (2, 1, 2, 1), (1, 2, 2, 0)}
    assert {lay.micro_batch for lay in layouts} == {8}
    for prec in ("bf16", "fp8"):
        job = Job(global_batch=64, seq_len=1024, runtime="torch", precision=prec,
                  **({"fp8_recipe": "tensorwise"} if prec == "fp8" else {}))
        for lay in layouts:
            check_layout_runnable(committed, job, dataclasses.replace(lay, compile=True))


def test_the_committed_fp8h6_draw_model_and_two_gpu_layouts():
    """fp8h6 (2026-11-29 night, for a 2-GPU lease): the first of seed 4106's models with tp 2
    admissible and hidden >= 2048, and four two-GPU layouts at micro-batch 2, runnable; the
    fp8h4 draw (k01-k04) unchanged by the new options."""
    import dataclasses

    import draw_models as dm
    import fp8_device as f8
    from meshplan.executor.parallelize import check_layout_runnable
    from meshplan.spec import Job
    rng = random.Random(4106)
    models = [dm.draw_model(rng, f"m{i:02d}", min_params=1.0e9, max_params=2.5e9)
              for i in (1, 2, 3)]
    committed = ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks" / "sets" / "fp8h6" / "m01.json").read_text()))
    assert committed == models[2]
    assert models[0].num_kv_heads % 2 and models[1].hidden_size < 2048   # why not those
    drawn = f8.draw_two_gpu_layouts(4106, micro_batches=(2,), prefix="n")
    assert [n for n, _ in drawn] == ["n01", "n02", "n03", "n04"]
    assert all(dict(f8.LAYOUTS)[n] == lay for n, lay in drawn)
    assert {lay.micro_batch for _, lay in drawn} == {2}
    assert f8.draw_two_gpu_layouts(4104) == [(n, lay) for n, lay in f8.LAYOUTS
                                             if n.startswith("k")]
    for prec in ("bf16", "fp8"):
        job = Job(global_batch=8, seq_len=4096, runtime="torch", precision=prec,
                  **({"fp8_recipe": "tensorwise"} if prec == "fp8" else {}))
        for _, lay in drawn:
            check_layout_runnable(committed, job, dataclasses.replace(lay, compile=True))


@pytest.mark.parametrize("check, seed, pick, prefix, mb, seq, batch", [
    ("fp8h7", 4107, 2, "p", 1, 8192, 4), ("fp8h8", 4108, 4, "r", 4, 2048, 16),
    ("fp8h9", 4109, 5, "s", 8, 1024, 32), ("fp8h10", 4110, 1, "t", 2, 4096, 8),
    ("fp8h11", 4111, 3, "u", 4, 2048, 16), ("fp8h12", 4112, 3, "v", 8, 1024, 32),
    ("fp8h13", 4113, 3, "w", 8, 1024, 32), ("fp8h14", 4114, 2, "x", 1, 8192, 4),
    ("fp8h15", 4115, 2, "y", 4, 2048, 16)])
def test_the_committed_two_gpu_fp8_draws(check, seed, pick, prefix, mb, seq, batch):
    """fp8h7 to fp8h15 (2026-11-30, for 2-GPU leases): the first of the seed's models with tp 2
    admissible (heads and kv heads even) and hidden >= 2560, and four two-GPU layouts at one
    micro-batch, runnable compiled in both arms (prefix q is fp8h5's)."""
    import dataclasses

    import draw_models as dm
    import fp8_device as f8
    from meshplan.executor.parallelize import check_layout_runnable
    from meshplan.spec import Job
    rng = random.Random(seed)
    models = [dm.draw_model(rng, f"m{i:02d}", min_params=1.5e9, max_params=3.0e9)
              for i in range(1, pick + 1)]
    committed = ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks" / "sets" / check / "m01.json").read_text()))
    assert committed == models[-1]
    assert all(m.hidden_size < 2560 or m.num_kv_heads % 2 for m in models[:-1])  # why not
    assert committed.hidden_size >= 2560 and committed.num_kv_heads % 2 == 0
    drawn = f8.draw_two_gpu_layouts(seed, micro_batches=(mb,), prefix=prefix)
    assert [n for n, _ in drawn] == [f"{prefix}0{i}" for i in range(1, 5)]
    assert all(dict(f8.LAYOUTS)[n] == lay for n, lay in drawn)
    for prec in ("bf16", "fp8"):
        job = Job(global_batch=batch, seq_len=seq, runtime="torch", precision=prec,
                  **({"fp8_recipe": "tensorwise"} if prec == "fp8" else {}))
        for _, lay in drawn:
            check_layout_runnable(committed, job, dataclasses.replace(lay, compile=True))


def test_the_committed_moeh6_draw_and_plans():
    """moeh6 (2026-11-29 night): seed 3806's model at hidden >= 2048, sixteen two-GPU
    candidates at micro-batch 4, and the eight plans the GPU-bound rule kept, in order."""
    import moe_sync_gpu as msg
    committed = ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks" / "sets" / "moeh6" / "m01.json").read_text()))
    assert committed.hidden_size >= 2048 and committed.num_experts == 8
    drawn = msg.SETS["drawn2-3806"]
    assert drawn == msg.draw_layouts(3806, count=16, gpus=2, micro_batches=(4,))
    assert len(drawn) == 16 and all(lay.micro_batch == 4 for _, lay in drawn)
    plans = json.loads((ROOT / "benchmarks" / "plans" / "moeh6_h200x2" / "predictions.json")
                       .read_text())
    kept = list(plans["layouts"])
    excluded = list(plans["excluded"])
    names = [n for n, _ in drawn]
    assert len(kept) == 8 and kept == [n for n in names if n in kept]
    assert names[:len(kept) + len(excluded)] == sorted(kept + excluded, key=names.index)


def test_load_imbalance_option_prices_ep_layouts_at_the_asked_or_the_rows_rho():
    from dataclasses import replace

    import moe_sync_gpu as msg
    from meshplan.costmodel.measured import MeasuredLayer, MeasuredTables
    from meshplan.spec import Layout
    c = msg._cluster(None, 2)
    row = MeasuredLayer(shape="s", seq_len=1, tp=1, sequence_parallel=False, recompute="none",
                        micro_batch=1, forward_s=1.0, backward_s=1.0, activation_bytes=1.0,
                        backward_peak_bytes=1.0, ep=2, routed_imbalance=1.06)
    rows = replace(c, gpu=replace(c.gpu, measured=MeasuredTables((row,), ())))
    ep2, ep1 = Layout(dp=2, ep=2), Layout(dp=2)
    assert msg._with_load_imbalance(c, ep2, None) == (c, None)
    assert msg._with_load_imbalance(c, ep1, "1.1") == (c, None)          # no experts split
    got, rho = msg._with_load_imbalance(c, ep2, "1.1")
    assert rho == 1.1 and got.gpu.corrections.moe_load_imbalance == 1.1
    got, rho = msg._with_load_imbalance(rows, ep2, "rows")
    assert rho == 1.06 and got.gpu.corrections.moe_load_imbalance == 1.06
    assert msg._with_load_imbalance(c, ep2, "rows") == (c, None)         # nothing recorded
    with pytest.raises(SystemExit):
        msg.main(["plans", "--profile", "x", "--out", "/tmp/x", "--load-imbalance", "0.5"])


@pytest.mark.parametrize("check, seed, mb", [
    ("moeh7", 3807, 8), ("moeh8", 3808, 2), ("moeh9", 3809, 8), ("moeh10", 3810, 8),
    ("moeh11", 3811, 8), ("moeh12", 3812, 2), ("moeh13", 3813, 4), ("moeh14", 3814, 4),
    ("moeh15", 3815, 4), ("moeh16", 3816, 2), ("moeh17", 3817, 2)])
def test_the_committed_two_gpu_moe_draws(check, seed, mb):
    """moeh7 (2026-11-29 night) to moeh17 (2026-11-30), for 2-GPU leases: the seed's model
    at hidden >= 2048 and sixteen two-GPU candidates at one micro-batch size (8 k tokens of
    the model's own sequences)."""
    import moe_sync_gpu as msg
    committed = ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks" / "sets" / check / "m01.json").read_text()))
    assert committed == dmoe.draw_moe_model(random.Random(seed), "m01", min_hidden=2048,
                                            max_params=3e9)
    assert mb * committed.max_seq_len == 8192
    drawn = msg.SETS[f"drawn2-{seed}"]
    assert drawn == msg.draw_layouts(seed, count=16, gpus=2, micro_batches=(mb,))
    assert len({lay for _, lay in drawn}) == 16
    assert all(lay.micro_batch == mb and lay.num_gpus == 2 for _, lay in drawn)


def test_run_second_pass_runs_each_layout_again_and_the_table_reports_both(tmp_path,
                                                                         monkeypatch, capsys):
    """``run --second-pass``: every layout once, then each once more in a fresh process
    (key LAYOUT/current2), in the set's order; the table adds the second run's error and the
    summary each run's and their mean's. A spent budget skips, it does not fail."""
    import moe_sync_gpu as msg
    plans = tmp_path / "plans"
    plans.mkdir()
    preds = {"layouts": {n: {"short": n, "calibrated_s": 1.1, "curves_s": None,
                             "datasheet_s": 0.5, "memory_gib": 10.0}
                         for n in ("a", "b")}}
    (plans / "predictions.json").write_text(json.dumps(preds))
    steps = iter([1.0, 1.0, 1.2, 0.8])
    calls = []

    devices = []

    def fake_run_one(plan, tree, res, log, timeout_s, profile_dir, device,
                     allow_gpu_mismatch=False):
        calls.append((plan.stem, res.stem))
        devices.append(device)
        return {"status": "ok", "step_time_s": next(steps, 1.0), "wall_s": 1.0,
                "memory_peak_bytes": None}
    monkeypatch.setattr(msg, "_run_one", fake_run_one)
    out = tmp_path / "out"
    assert msg.main(["run", "--plans", str(plans), "--out", str(out), "--work",
                     str(tmp_path / "work"), "--second-pass"]) == 0
    assert calls == [("a", "a_current"), ("b", "b_current"), ("a", "a_current2"),
                     ("b", "b_current2")]
    doc = json.loads((out / "moe_sync.json").read_text())
    assert doc["runs"]["b/current2"]["step_time_s"] == 0.8
    text = capsys.readouterr().out
    assert "| 1.200 (-8.3 %) |" in text and "| 0.800 (+37.5 %) |" in text
    assert "first run: mean 10.0 %, max 10.0 % (2 layouts)" in text
    assert "mean of both runs: mean 11.1 %, max 22.2 % (2 layouts)" in text   # 1.1, 0.9
    assert msg.main(["run", "--plans", str(plans), "--out", str(out), "--work",
                     str(tmp_path / "work"), "--second-pass", "--budget", "0"]) == 0
    doc = json.loads((out / "moe_sync.json").read_text())
    assert doc["runs"]["a/current2"] == {"status": "skipped: budget"}
    assert set(devices) == {"cuda"}
    assert msg.main(["run", "--plans", str(plans), "--out", str(out), "--work",
                     str(tmp_path / "work"), "--device", "cpu"]) == 0      # a dry run
    assert devices[-2:] == ["cpu", "cpu"]


@pytest.mark.usefixtures("no_grad_accumulation")
def test_repredict_at_one_reading_of_the_ep_rows(capsys):
    """``repredict --readings F --ep-reading first|median`` (POST HOC): moeh14's ep rows at
    the calibration's first reading (what one round keeps) or at the median it kept — the
    median re-predicts the committed profile's figures exactly (every row as timed: the
    check ran the executor whose compiled selective rows the loader now leaves out)."""
    import moe_sync_gpu as msg
    data = ROOT / "docs" / "benchmarks" / "data"
    args = ["repredict", "--results", str(data / "moe_drawn_h200x2_moeh14_20261130.json"),
            "--load-imbalance", "rows", "--readings",
            str(data / "moe_ep_rows_reread_h200x2_moeh14_20261130.json"), "--rows-as-timed",
            "--ep-reading"]
    assert msg.main(args + ["median"]) == 0
    assert "today: mean 5.4 %, max 15.6 % (8 layouts)" in capsys.readouterr().out
    assert msg.main(args + ["first"]) == 0
    assert "today: mean 11.5 %, max 37.5 % (8 layouts)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="needs --readings"):
        msg.main(args[:5] + ["--ep-reading", "first"])
    assert msg.main(args[:7] + ["--ep-reading", "median"]) == 0    # today's executor's rows
    assert "today: mean 3.7 %, max 9.5 % (8 layouts)" in capsys.readouterr().out


@pytest.mark.usefixtures("no_grad_accumulation")
def test_repredict_reads_the_readings_from_a_profiles_provenance(tmp_path, capsys):
    """Calibrations since moeh15 keep every reading of the rows they read again in the
    profile's provenance (``synced_readings``, labelled as the progress names a row):
    ``--readings <profile>`` takes them from there, as from moeh14's readings file."""
    import tomllib

    import moe_sync_gpu as msg
    from meshplan.calibrate.tomlfile import dumps
    data = ROOT / "docs" / "benchmarks" / "data"
    readings = msg.calibration_readings(data / "moe_ep_rows_reread_h200x2_moeh14_20261130.json")
    profile = data / "profiles" / "profile_h200x2_moeh14_20261130.toml"
    doc = tomllib.loads(profile.read_text())
    doc["provenance"]["synced_readings"] = {f"layer m01-moe8x1-2.47b s2048 {k}": [
        list(r) for r in v] for k, v in readings.items()}
    with_readings = tmp_path / "profile.toml"
    with_readings.write_text(dumps(doc))
    assert msg.calibration_readings(with_readings) == {
        f"layer m01-moe8x1-2.47b s2048 {k}": v for k, v in readings.items()}
    assert msg.main(["repredict", "--results", str(data / "moe_drawn_h200x2_moeh14_"
                                                          "20261130.json"),
                     "--load-imbalance", "rows", "--readings", str(with_readings),
                     "--rows-as-timed", "--ep-reading", "first"]) == 0
    assert "today: mean 11.5 %, max 37.5 % (8 layouts)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="holds no synced_readings"):
        msg.calibration_readings(profile)
    bad = tmp_path / "readings.json"
    bad.write_text(json.dumps({"readings": {}}))
    with pytest.raises(SystemExit, match="not a profile .* nor a readings file"):
        msg.calibration_readings(bad)


def test_a_second_run_starts_only_if_it_ends_within_the_budget(tmp_path, monkeypatch):
    """A layout whose first run took longer than the budget left is not run again (a device
    call must not outlast its limit); the first pass itself is not held back."""
    import moe_sync_gpu as msg
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "predictions.json").write_text(json.dumps({"layouts": {"a": {
        "short": "a", "calibrated_s": 1.0, "curves_s": None, "datasheet_s": 0.5,
        "memory_gib": 1.0}}}))
    monkeypatch.setattr(msg, "_run_one", lambda *a: {"status": "ok", "step_time_s": 1.0,
                                                      "wall_s": 500.0,
                                                      "memory_peak_bytes": None})
    out = tmp_path / "out"
    assert msg.main(["run", "--plans", str(plans), "--out", str(out), "--work",
                     str(tmp_path / "work"), "--second-pass", "--budget", "300"]) == 0
    runs = json.loads((out / "moe_sync.json").read_text())["runs"]
    assert runs["a/current"]["status"] == "ok"
    assert runs["a/current2"] == {"status": "skipped: budget"}


def test_error_summary_names_runs_started_beside_another_process():
    import moe_sync_gpu as msg
    results = {"predictions": {"layouts": {"a": {"calibrated_s": 1.0},
                                           "b": {"calibrated_s": 1.0}}},
               "runs": {"a/current": {"step_time_s": 2.0, "gpu_busy_at_start": [
                            {"pid": 769, "used_mib": 40358}]},
                        "b/current": {"step_time_s": 1.0, "gpu_busy_at_start": []}}}
    lines = msg.error_summary(results)
    assert lines[0] == "first run: mean 25.0 %, max 50.0 % (2 layouts)"
    assert lines[-1].endswith("their times include it): a/current")


def test_fp8_summary_names_arms_started_beside_another_process():
    import fp8_device as f8

    def arm(step, busy):
        return {"status": "ok", "predicted": {"step_time_s": 1.0},
                "measured": {"step_time_s": step}, "gpu_busy_at_start": busy}
    row = {"name": "x01", "short": "dp2", "bf16": arm(2.0, [{"pid": 769, "used_mib": 1}]),
           "fp8": arm(1.0, [])}
    row.update(f8.speedups(row))
    text = f8.summary_table([row], "tensorwise", "p.toml")
    assert "Speed-up error over 1 layouts: mean 50.0 %, max 50.0 %" in text
    assert text.rstrip().endswith("their times include it): x01 bf16.")


def test_mla_draws_are_deepseek_style_and_leave_the_llama_style_draws_unchanged():
    """``--mla``: every draw has MLA's released per-head dimensions, one head per drawn head,
    a query latent of None or 1536, and sometimes a dense first layer of the dense MLP's
    width whose parameters the drawn total counts; the same seed without ``--mla`` draws what
    it drew before the option existed (its rng calls come after the others)."""
    rng = random.Random(7)
    models = [dmoe.draw_moe_model(rng, f"m{i}", mla=True) for i in range(12)]
    assert all(m.is_mla and m.kv_lora_rank == 512 and m.head_dim == 192
               and m.v_head_dim == 128 and m.num_kv_heads == m.num_heads for m in models)
    assert {m.q_lora_rank for m in models} == {None, 1536}
    dense_first = [m for m in models if m.dense_layers]
    assert dense_first and all(m.dense_layers == (0,) and not m.is_moe_layer(0)
                               and m.ffn_hidden_size % 128 == 0 for m in dense_first)
    for m in models:
        assert 1.0e9 <= m.num_params() <= 3.0e9
        assert m.name.endswith(f"-{m.num_params() / 1e9:.2f}b") and "-mla-" in m.name
    assert dmoe.draw_moe_model(random.Random(3822), "m01", min_hidden=2048,
                               max_params=3e9).to_dict() == json.loads(
        (ROOT / "benchmarks" / "sets" / "moeh19" / "m01.json").read_text())


def _committed(set_name: str) -> ModelSpec:
    return ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks" / "sets" / set_name / "m01.json").read_text()))


def _runnable_in_bf16_and_fp8(model: ModelSpec, layouts, recipe: str) -> None:
    """Each layout passes the executor's preflight in bf16 and in fp8 ``recipe``."""
    from meshplan.executor.parallelize import check_layout_runnable
    from meshplan.spec import Job
    for prec, extra in (("bf16", {}), ("fp8", {"fp8_recipe": recipe})):
        job = Job(global_batch=16, seq_len=model.max_seq_len, runtime="torch",
                  precision=prec, **extra)
        for _, lay in layouts:
            check_layout_runnable(model, job, lay)


def test_the_committed_moeh20_mla_draw_and_its_one_gpu_layouts():
    """moeh20 (2026-12-01): seed 3823's MLA draw, committed before any run, and its eight
    one-GPU layouts, each runnable by the executor in bf16 and fp8 rowwise."""
    import moe_sync_gpu as msg
    committed = _committed("moeh20")
    assert committed == dmoe.draw_moe_model(random.Random(3823), "m01", min_hidden=2048,
                                            max_params=3e9, mla=True)
    drawn = msg.SETS["drawn-3823"]
    assert drawn == msg.draw_layouts(3823, count=8, gpus=1) and len(drawn) == 8
    _runnable_in_bf16_and_fp8(committed, drawn, "rowwise")


def test_the_committed_fp8h16_draw_and_its_one_gpu_layouts():
    """fp8h16 (2026-12-01): draw_models.py seed 4116's first model, committed before any run,
    and moe_sync_gpu.py's eight one-GPU layouts of seed 4116, each runnable by the executor
    in bf16 and fp8 tensorwise."""
    import draw_models as dm
    import moe_sync_gpu as msg
    committed = _committed("fp8h16")
    assert committed == dm.draw_model(random.Random(4116), "m01", min_params=1.5e9,
                                      max_params=3.0e9)
    drawn = msg.SETS["drawn-4116"]
    assert drawn == msg.draw_layouts(4116, count=8, gpus=1)
    _runnable_in_bf16_and_fp8(committed, drawn, "tensorwise")


def test_the_committed_moeh21_draw_of_the_new_moe_paths():
    """moeh21 (drawn 2026-12-01, before any run): draw_moe.py seed 3824's dropless model and
    eight two-GPU layouts of the executor's new MoE paths (etp 2, cp 2) beside ep 2, each
    runnable by the executor; the draws of the earlier sets are unchanged by the new
    ``shapes`` / ``subject`` arguments (moeh17's set above)."""
    import draw_moe as dm
    import moe_sync_gpu as msg
    from meshplan.executor.parallelize import check_layout_runnable
    from meshplan.spec import Job
    committed = _committed("moeh21")
    assert committed == dm.draw_moe_model(random.Random(3824), "m01", min_hidden=2048,
                                          max_params=3e9)
    assert committed.capacity_factor is None
    drawn = msg.SETS["drawn2-3824"]
    assert [n for n, _ in drawn] == [
        "dp2-ep2-z3-mb4", "cp2-ep2-mb4-selective", "tp2-etp2-mb4-selective", "cp2-mb4-full",
        "tp2-ep2-mb4-selective", "tp2-etp2-mb4-full", "cp2-mb4", "cp2-ep2-mb4-full"]
    job = Job(global_batch=16, seq_len=2048, runtime="torch")
    for _, lay in drawn:
        check_layout_runnable(committed, job, lay)


@pytest.mark.parametrize("check, seed, names", [
    ("fp8h17", 4117, ["mb2-full-compiled", "mb2-selective-compiled", "mb16-full-compiled",
                      "mb1-compiled", "mb1-full-compiled", "mb16-compiled"]),
    ("fp8h18", 4118, ["mb4-selective-compiled", "mb8-selective-compiled", "mb16-full-compiled",
                      "mb1-compiled", "mb1-selective-compiled", "mb8-compiled",
                      "mb2-compiled", "mb2-full-compiled", "mb16-compiled", "mb4-compiled"]),
    ("fp8h19", 4119, ["mb1-selective-compiled", "mb8-full-compiled", "mb4-full-compiled",
                      "mb8-selective-compiled", "mb16-selective-compiled", "mb4-compiled",
                      "mb4-selective-compiled", "mb16-compiled"]),
])
def test_the_committed_compiled_fp8_draws(check, seed, names):
    """fp8h17-fp8h19 (drawn 2026-12-01, each before its runs): draw_models.py's first model of
    the set's seed and the compiled ones of sixteen one-GPU layouts of that seed, in drawn
    order, runnable in bf16 and fp8 tensorwise."""
    import draw_models as dm
    import moe_sync_gpu as msg
    committed = _committed(check)
    assert committed == dm.draw_model(random.Random(seed), "m01", min_params=1.5e9,
                                      max_params=3.0e9)
    drawn = msg.SETS[f"drawn-{seed}c"]
    assert [n for n, _ in drawn] == names
    _runnable_in_bf16_and_fp8(committed, drawn, "tensorwise")


def test_moeh64h100_is_the_seed_draw_and_its_plans_name_the_h100(tmp_path):
    """moeh64h100 (2026-12-05): seed 3874's model, and ``plans --gpu H100-SXM5-80GB`` prices
    on the H100 (an H100 profile applies without an override) and writes plans that name it,
    as the committed ones do."""
    import moe_sync_gpu as msg
    committed = ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks" / "sets" / "moeh64h100" / "m01.json").read_text()))
    assert committed == dmoe.draw_moe_model(random.Random(3874), "m01", min_hidden=2048,
                                            max_params=3e9)
    plans = ROOT / "benchmarks" / "plans" / "moeh64h100_bf16_h100x1"
    preds = json.loads((plans / "predictions.json").read_text())
    assert preds["gpu"] == "H100-SXM5-80GB"
    # the committed price predates the GPU-alone carrying ratio, which moeh70h100's rule
    # switched off (2026-12-06): the profile prices it as committed again
    profile = ROOT / preds["profile"]
    out = tmp_path / "again"
    assert msg.main(["plans", "--set", "drawn-3874c", "--model",
                     str(ROOT / "benchmarks" / "sets" / "moeh64h100" / "m01.json"),
                     "--only", "mb4-compiled", "--gpu", "H100-SXM5-80GB",
                     "--profile", str(profile), "--out", str(out)]) == 0
    again = json.loads((out / "predictions.json").read_text())
    assert again["gpu"] == "H100-SXM5-80GB"
    plan = json.loads((out / "mb4-compiled.json").read_text())
    assert plan["cluster"]["gpu"]["name"] == "H100-SXM5-80GB"
    assert again["layouts"]["mb4-compiled"]["calibrated_s"] == pytest.approx(
        preds["layouts"]["mb4-compiled"]["calibrated_s"], rel=1e-9)


def test_fp8h54h100_is_seed_4155s_first_draw_planned_from_the_h100_datasheet(tmp_path):
    """fp8h54h100 (2026-12-05, before any run): draw_models.py's first model of seed 4155,
    the first three compiled layouts of drawn-4155c the H100's datasheet predicts to fit at
    sequence 1024, bf16 and fp8 tensorwise plans naming the H100 and no profile (the
    transfer36 H100 profile, without compiled rows, priced every fitting layout host-bound),
    each layout runnable in both arms; a fresh plan prices as the committed one."""
    import draw_models as dm
    import moe_sync_gpu as msg
    committed = _committed("fp8h54h100")
    assert committed == dm.draw_model(random.Random(4155), "m01", min_params=1.2e9,
                                      max_params=4.0e9)
    kept = ["mb1-compiled", "mb4-selective-compiled", "mb1-full-compiled"]
    plans = ROOT / "benchmarks" / "plans"
    for prec in ("bf16", "fp8"):
        preds = json.loads((plans / f"fp8h54h100_{prec}_h100x1" / "predictions.json")
                           .read_text())
        assert (preds["gpu"], preds["profile"], preds["set"]) == ("H100-SXM5-80GB", "",
                                                                  "drawn-4155c")
        assert list(preds["layouts"]) == kept
        assert preds["job"]["seq_len"] == 1024 and preds["job"]["precision"] == prec
        assert preds["job"]["fp8_recipe"] == "tensorwise"
    _runnable_in_bf16_and_fp8(committed, [(n, lay) for n, lay in msg.SETS["drawn-4155c"]
                                          if n in kept], "tensorwise")
    out = tmp_path / "plans"
    assert msg.main(["plans", "--set", "drawn-4155c", "--model",
                     str(ROOT / "benchmarks" / "sets" / "fp8h54h100" / "m01.json"),
                     "--seq-len", "1024", "--global-batch", "16", "--fp8-recipe",
                     "tensorwise", "--only", "mb4-selective-compiled", "--gpu",
                     "H100-SXM5-80GB", "--profile", "", "--out", str(out)]) == 0
    again = json.loads((out / "predictions.json").read_text())["layouts"]
    was = json.loads((plans / "fp8h54h100_fp8_h100x1" / "predictions.json").read_text())
    for key in ("datasheet_s", "memory_gib"):
        assert again["mb4-selective-compiled"][key] == pytest.approx(
            was["layouts"]["mb4-selective-compiled"][key], rel=1e-9)
