"""benchmarks/transfer_round.py: the device commands of a transfer round and its report."""

import json
import sys

import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import transfer_round as tr  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402

SET = ROOT / "benchmarks" / "sets" / "transfer36"


def test_calibrate_is_the_users_command_with_every_model():
    doc = tr.load_set(SET)
    cmd = tr.calibrate_cmd(doc["models"], Path("/k/profile.toml"), nproc=4, budget_s=500,
                           micro_batches="1,4")
    assert cmd[1:5] == ["-m", "meshplan.cli", "calibrate", "--nproc"]
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--model"] == \
        [m["model_file"] for m in doc["models"]]
    assert cmd[cmd.index("--time-budget") + 1] == "500"
    generic = tr.calibrate_cmd([], Path("/k/generic.toml"), nproc=4, budget_s=200,
                               micro_batches="1,4")
    assert "--model" not in generic and "--micro-batches" not in generic
    grid = tr.calibrate_cmd([], Path("/k/generic.toml"), nproc=2, budget_s=300,
                            micro_batches="2,4,8,16", layer_grid=True)
    assert "--model" not in grid and "--layer-grid" in grid
    assert grid[grid.index("--micro-batches") + 1] == "2,4,8,16"   # the stand-ins' tables


def test_parts_split_the_models_and_validate_finds_each_models_profile(tmp_path):
    doc = tr.load_set(SET)
    one = tr.part_models(doc, tr.parse_part("1/2"))
    two = tr.part_models(doc, tr.parse_part("2/2"))
    assert [m["name"] for m in one + two] == [doc["models"][i]["name"] for i in (0, 2, 1, 3)]
    with pytest.raises(SystemExit, match="K/N"):
        tr.parse_part("2")
    for k in (1, 2):
        (tmp_path / tr.profile_name((k, 2))).write_text("")
    assert tr.kept_profile(tmp_path, doc, doc["models"][1]["name"]).name == \
        "profile_part2of2.toml"
    assert tr.kept_profile(tmp_path, doc, doc["models"][2]["name"]).name == \
        "profile_part1of2.toml"
    (tmp_path / "profile.toml").write_text("")
    assert tr.kept_profile(tmp_path, doc, doc["models"][1]["name"]).name == "profile.toml"


def test_validate_runs_each_model_with_its_own_job():
    doc = tr.load_set(SET)
    m = doc["models"][1]
    cmd = tr.validate_cmd(m, Path("/k/val"), profile="/k/p.toml", gpu="NVIDIA H200",
                          nproc=4, budget_s=100, device="cuda")
    arg = {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i].startswith("--")}
    assert arg["--runtime"] == "torch" and arg["--cluster"] == "dgx-h200"
    assert arg["--global-batch"] == str(m["job"]["global_batch"])
    assert arg["--seq-len"] == str(m["job"]["seq_len"])
    assert arg["--layout-list"].endswith(f"layouts/{m['name']}.json")
    assert tr.cluster_preset("NVIDIA H100 80GB HBM3") == "dgx-h100"


def test_tiny_set_keeps_the_parallel_structure(tmp_path):
    doc = tr.tiny_set(tr.load_set(SET), tmp_path)
    for m in doc["models"]:
        tiny = ModelSpec.from_dict(json.loads(Path(m["model_file"]).read_text()))
        assert (tiny.num_layers, tiny.num_heads, tiny.num_kv_heads, tiny.activation) == (
            m["spec"]["num_layers"], m["spec"]["num_heads"], m["spec"]["num_kv_heads"],
            m["spec"]["activation"])
        assert tiny.hidden_size == 8 * tiny.num_heads and m["job"]["seq_len"] == 64


def _rec(name, model, pred, meas, mem_errs):
    return {"name": name, "model": model, "status": "ok",
            "predicted": {"step_time_s": pred}, "measured": {"step_time_s": meas},
            "step_time_error_pct": (pred - meas) / meas * 100,
            "memory_error_pct_per_rank": mem_errs}


def test_figures_are_the_issues_goals():
    recs = [_rec("a", "m1", 1.0, 1.0, [1.0, -2.0]), _rec("b", "m1", 2.2, 2.0, [6.0, 0.0]),
            _rec("c", "m2", 0.97, 1.0, [4.9, 5.1])]
    f = tr.figures(recs)
    assert f["step_max_abs_pct"] == pytest.approx(10.0)
    assert f["step_mean_abs_pct"] == pytest.approx((0 + 10 + 3) / 3)
    assert f["memory_ranks_within_5pct"] == 4 / 6
    assert f["per_model"]["m1"]["spearman"] == 1.0
    assert f["per_model"]["m1"]["best_gap_pct"] == 0.0


def test_validate_parts_split_every_models_layouts(tmp_path):
    doc = tr.load_set(SET)
    parts = [tr.part_layouts(doc, tr.parse_part(f"{k}/2"), tmp_path / str(k)) for k in (1, 2)]
    names = []
    for part in parts:
        assert [m["name"] for m in part] == [m["name"] for m in doc["models"]]
        for m in part:
            listed = json.loads(Path(m["layout_file"]).read_text())
            assert len(listed) == 3 and Path(m["layout_file"]).parent.parent == tmp_path
            names += [x["name"] for x in listed]
    # the two calls of 12 run every layout once
    assert sorted(names) == sorted(x["name"] for m in doc["models"] for x in m["layouts"])
    assert tr.part_layouts(doc, None, tmp_path / "all") == doc["models"]


def test_merge_joins_the_parts_and_refuses_a_layout_in_two(tmp_path):
    run = json.loads((ROOT / "docs" / "benchmarks" / "data" / "transfer36_accuracy.json")
                     .read_text())
    for k in (1, 2):    # the round's records, split as two validate calls would write them
        part = {key: v for key, v in run.items() if key not in ("summary", "summary_by_model")}
        part["records"] = [r for j, r in enumerate(run["records"]) if j % 2 == k - 1]
        part["command"] = f"call {k}"
        (tmp_path / f"p{k}.json").write_text(json.dumps(part))
    records, meta = tr.merge_parts([tmp_path / "p2.json", tmp_path / "p1.json"])
    assert [r["name"] for r in records] == [r["name"] for r in run["records"]]
    assert meta["jobs"] == run["jobs"] and meta["command"] == "call 2 ; call 1"
    # parts one outer command made (gpu8_round.py validate): that command once
    for k in (1, 2):
        part = json.loads((tmp_path / f"p{k}.json").read_text())
        (tmp_path / f"p{k}.json").write_text(json.dumps({**part, "command": "round"}))
    assert tr.merge_parts([tmp_path / "p2.json", tmp_path / "p1.json"])[1]["command"] == "round"
    with pytest.raises(SystemExit, match="t01 of t36m01-llama-mha-0.51b is in both"):
        tr.merge_parts([tmp_path / "p1.json", tmp_path / "p1.json"])
    assert tr.main(["merge", "--parts", str(tmp_path / "p1.json"), str(tmp_path / "p2.json"),
                    "--out", str(tmp_path / "merged"), "--keep", str(tmp_path / "k")]) == 0
    doc = json.loads((tmp_path / "merged" / "accuracy.json").read_text())
    assert doc["summary"]["ok"] == run["summary"]["ok"] == 14
    assert doc["summary"]["step_time_mean_abs_error_pct"] == pytest.approx(
        run["summary"]["step_time_mean_abs_error_pct"])


def test_leave_out_repredicts_round38_without_each_models_own_rows():
    """round 38 re-predicted on its own profile: --leave-out drops each model's rows (the
    nearest-shape transfer: its layers come from the other three models), so each model's
    predictions move (nearly all layouts; one may land on its own rows' price by chance:
    v23 within 0.01 % since the executor's eager memory-bound ops are counted); without it
    the model's own rows price it."""
    doc = json.loads((ROOT / "docs/benchmarks/data/transfer38_accuracy.json").read_text())
    profile = str(ROOT / "docs/benchmarks/data/profiles/round38/profile.toml")
    as_is = tr.repredict(doc, profile, "NVIDIA H200")
    out = tr.repredict(doc, profile, "NVIDIA H200", leave_out=True)
    assert len(out) == len(as_is) == 24
    moved: dict[str, list[bool]] = {}
    for r, a, o in zip(doc["records"], as_is, out):
        moved.setdefault(r["model"], []).append(
            o["predicted"]["step_time_s"] != pytest.approx(a["predicted"]["step_time_s"],
                                                           rel=1e-4))
    assert len(moved) == 4 and all(sum(m) >= len(m) - 1 for m in moved.values())
    # what makes it a leave-out, whatever the prices do: the profile each model is priced on
    # holds rows of the round's other models and none of its own
    from transfer_analysis import _timed, without_own_rows
    from meshplan.hardware_profiles import Cluster
    from meshplan.hardware_profiles.calibrated import apply_profile
    cluster = apply_profile(Cluster.preset(tr.cluster_preset("NVIDIA H200"), nodes=1,
                                           gpus_per_node=2), profile)
    for name in moved:
        model = ModelSpec.from_dict(json.loads(
            (ROOT / "benchmarks/sets/transfer38/models" / f"{name}.json").read_text()))
        assert _timed(cluster, model) and not _timed(without_own_rows(cluster, model), model)
        assert without_own_rows(cluster, model).gpu.measured.layers


@pytest.mark.usefixtures("no_grad_accumulation")
def test_without_a_profile_each_model_is_repredicted_on_the_profile_it_ran_with():
    """Round 43 ran each part's layouts of all four models, each model priced on its own
    part's calibration: re-predicted with no --profile, every record gets its as-run
    prediction back (the code that ran it: without ``sustained_clock_duty``, which came after
    the run; its zero-bubble layouts moved with the synchronized split's pricing, also after
    the run, so they are left out); one part's profile for all would price the other part's
    models on rows they never had."""
    doc = json.loads((ROOT / "docs/benchmarks/data/transfer43_accuracy.json").read_text())
    as_run = tr.without_corrections(("sustained_clock_duty",))
    again = tr.repredict(doc, None, "NVIDIA H200", adjust=as_run)
    assert len(again) == 24
    same = [(r, a) for r, a in zip(doc["records"], again)
            if r["layout"]["schedule"] != "zero-bubble"]
    assert len(same) == 22
    for r, a in same:
        assert a["predicted"]["step_time_s"] == pytest.approx(r["predicted"]["step_time_s"],
                                                              rel=1e-6)
    one = tr.repredict(doc, doc["profiles"]["t43m01-gpt-mqa-2.45b"], "NVIDIA H200",
                       adjust=as_run)
    assert any(o["predicted"]["step_time_s"] != pytest.approx(
        r["predicted"]["step_time_s"], rel=1e-3) for r, o in zip(doc["records"], one))
    bare = dict(doc, profiles={})
    with pytest.raises(SystemExit, match="no profile recorded"):
        tr.repredict(bare, None, "NVIDIA H200")


def test_without_repredicts_with_a_named_correction_switched_off(capsys):
    """rc52 (GPT, 1 × H200, rows with sustained ratios): without ``sustained_clock`` every
    prediction is faster — the rows as timed in bursts — and the report says so."""
    doc = json.loads((ROOT / "docs/benchmarks/data/rc52_accuracy.json").read_text())
    profile = str(ROOT / "docs/benchmarks/data/profiles/rc52/profile.toml")
    on = tr.repredict(doc, profile, "NVIDIA H200")
    off = tr.repredict(doc, profile, "NVIDIA H200",
                       adjust=tr.without_corrections(("sustained_clock",)))
    assert len(on) == len(off) == 5
    assert all(b["predicted"]["step_time_s"] < a["predicted"]["step_time_s"]
               for a, b in zip(on, off))
    assert tr.main(["report", "--accuracy", str(ROOT / "docs/benchmarks/data/rc52_accuracy.json"),
                    "--profile", profile, "--without", "sustained_clock"]) == 0
    assert "without sustained_clock" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        tr.main(["report", "--accuracy", str(ROOT / "docs/benchmarks/data/rc52_accuracy.json"),
                 "--profile", profile, "--without", "bogus"])
    assert exc.value.code == 2 and "not a named correction" in capsys.readouterr().err


def test_per_layout_prints_each_layouts_error_as_run_and_re_predicted(capsys):
    acc = str(ROOT / "docs/benchmarks/data/transfer43_accuracy.json")
    assert tr.main(["report", "--accuracy", acc, "--per-layout"]) == 0
    out = capsys.readouterr().out
    lines = [l for l in out.splitlines() if "t43m" in l and "%" in l and "Spearman" not in l]
    assert len(lines) == 24 and "→" not in out
    assert [l.split()[0] for l in lines] == [f"y{i:02d}" for i in range(1, 25)]
    assert tr.main(["report", "--accuracy", acc, "--per-layout", "--without",
                    "sustained_clock_duty"]) == 0
    out = capsys.readouterr().out
    moved = [l for l in out.splitlines() if "→" in l]
    assert len(moved) == 24 and any(l.split()[0] == "y23" and "+13.8 % →" in l for l in moved)


def _fake_calibrate(calls, *, writes=True):
    """``_run`` as ``meshplan calibrate`` answers: an existing --out refused (rc 2) unless
    --force, else the profile written (``writes``) and rc 0."""
    def run(cmd, log, timeout_s):
        out = Path(cmd[cmd.index("--out") + 1])
        calls.append(out.name)
        if out.exists() and "--force" not in cmd:
            return 2
        if not writes:
            return 124
        out.write_text(f"# new {out.name}\n")
        return 0
    return run


@pytest.mark.parametrize("writes", [True, False])
def test_calibrate_rerun_does_not_pass_on_the_earlier_profile(tmp_path, monkeypatch, writes):
    """calibrate refuses an existing --out: a re-run into the same --keep would have copied
    the earlier call's profile to --out as this call's (and validate would have used it)."""
    keep, out = tmp_path / "keep", tmp_path / "out"
    for d in (keep, out):
        d.mkdir()
        for name in ("generic.toml", "profile_part1of2.toml"):
            (d / name).write_text("# stale\n")
    calls = []
    monkeypatch.setattr(tr, "_run", _fake_calibrate(calls, writes=writes))
    rc = tr.main(["calibrate", "--set", str(SET), "--part", "1/2", "--generic-first",
                  "--keep", str(keep), "--out", str(out), "--nproc", "4"])
    assert calls == ["generic.toml", "profile_part1of2.toml"]
    for name in ("generic.toml", "profile_part1of2.toml"):
        for d in (keep, out):
            if writes:
                assert (d / name).read_text() == f"# new {name}\n"
            else:
                assert not (d / name).exists()       # nothing from the earlier call
    assert rc == (0 if writes else 124)
