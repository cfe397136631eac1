"""benchmarks/gpu8_round.py: the device commands of issue 42's 8-GPU round."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu8_round as g8r  # noqa: E402
import transfer_round as tr  # noqa: E402

SET = ROOT / "benchmarks" / "sets" / "gpu8_42"


def _args(cmd):
    return {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i].startswith("--")}


def test_each_part_calibrates_one_model_at_8_ranks_at_its_own_sizes():
    doc = tr.load_set(SET)
    for k, m in enumerate(doc["models"], 1):
        models = tr.part_models(doc, tr.parse_part(f"{k}/2"))
        assert [x["name"] for x in models] == [m["name"]]
        cmd = g8r.calibrate_cmd(models, Path("/k/p.toml"), budget_s=360, rounds=1,
                                device="cuda", quick=False)
        a = _args(cmd)
        assert cmd[1:4] == ["-m", "meshplan.cli", "calibrate"]
        assert a["--nproc"] == "8" and a["--rounds"] == "1" and a["--time-budget"] == "360"
        assert a["--model"] == m["model_file"]
        assert a["--micro-batches"] == ",".join(map(str, m["calibrate_micro_batches"]))
        assert "--no-progress" not in cmd and "--quick" not in cmd   # per-row times kept
    tiny = g8r.calibrate_cmd(doc["models"][:1], Path("/k/p.toml"), budget_s=60, rounds=1,
                             device="cpu", quick=True, micro_batches="1")
    assert _args(tiny)["--micro-batches"] == "1" and "--quick" in tiny


def test_only_keeps_the_named_layouts_and_names_unknown_ones(tmp_path):
    doc = tr.load_set(SET)
    first = doc["models"][0]["layouts"][0]["name"]
    last = doc["models"][-1]["layouts"][-1]["name"]
    cut = g8r.only_layouts(doc, {first, last}, tmp_path)
    assert [json.loads(Path(m["layout_file"]).read_text())[0]["name"]
            for m in cut["models"]] == [first, last]
    one = g8r.only_layouts(tr.load_set(SET), {first}, tmp_path / "one")
    assert len(one["models"]) == 1
    with pytest.raises(SystemExit, match="g99: not in the set"):
        g8r.only_layouts(tr.load_set(SET), {"g99"}, tmp_path / "bad")


def test_validate_runs_each_model_on_8_ranks_with_its_job():
    doc = tr.load_set(SET)
    for m in doc["models"]:
        a = _args(tr.validate_cmd(m, Path("/k/val"), profile="/k/p.toml", gpu="NVIDIA H100",
                                  nproc=g8r.NPROC, budget_s=250, device="cuda"))
        assert a["--nproc"] == "8" and a["--cluster"] == "dgx-h100"
        assert int(a["--global-batch"]) * int(a["--seq-len"]) == doc["tokens_per_step"]


def test_a_cpu_dry_run_prices_the_gpu_cluster_with_the_cpu_profile():
    (m, *_) = tr.load_set(SET)["models"]
    cpu = tr.validate_cmd(m, Path("/k/val"), profile="/k/p.toml", gpu="cpu", nproc=8,
                          budget_s=250, device="cpu")
    assert "--profile-override" in cpu and _args(cpu)["--profile"] == "/k/p.toml"
    gpu = tr.validate_cmd(m, Path("/k/val"), profile="/k/p.toml", gpu="NVIDIA H100", nproc=8,
                          budget_s=250, device="cuda")
    assert "--profile-override" not in gpu


def test_a_model_whose_validate_ran_nothing_fails_the_call(tmp_path, monkeypatch):
    keep, out = tmp_path / "keep", tmp_path / "out"
    keep.mkdir()
    (keep / "profile_part2of2.toml").write_text("")
    def refused(cmd, log, timeout_s):             # as meshplan validate refusing a profile
        log.write_text("$ " + " ".join(cmd) + "\nmeshplan validate: error: ...\n")
        return 2
    monkeypatch.setattr(tr, "_run", refused)
    with pytest.raises(SystemExit, match="ran nothing for g42m13-llama-mha-5.44b \\(rc 2\\)"):
        g8r.main(["validate", "--device", "cpu", "--only", "g09", "--keep", str(keep),
                  "--out", str(out), "--budget", "10"])
    assert json.loads((out / "accuracy.json").read_text())["records"] == []


def test_summary_counts_what_8_ranks_add(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("""
[provenance]
world_size = 8
layer_rounds = 1
[[layers]]
tp = 8
sequence_parallel = true
zero = 0
dp = 1
[[layers]]
tp = 1
sequence_parallel = false
zero = 3
dp = 8
[[ends]]
tp = 8
[measurements]
collectives = [{group_size = 2}, {group_size = 8}]
pipeline = [{pp = 8}]
""")
    s = g8r.summary(p)
    assert s["world_size"] == 8 and s["plain_rows_by_tp"] == {"tp8 sp": 1}
    assert s["fsdp_rows_by_zero_dp_tp"] == {"z3 dp8 tp1": 1}
    assert s["collective_group_sizes"] == [2, 8] and s["pipeline_pp"] == [8]
    assert s["end_rows"] == 1


def test_merge_takes_each_layout_from_the_call_that_ran_it(tmp_path):
    def doc(records, model):
        return {"set": "gpu8_42", "gpu_name": "NVIDIA H100", "nproc": 8, "records": records,
                "profiles": {model: f"/k/{model}.toml"}, "jobs": {model: {"seq_len": 64}}}

    def rec(name, model, status, step=None):
        r = {"name": name, "model": model, "status": status, "short": name,
             "layout": {"dp": 8}}
        if step:
            r.update(predicted={"step_time_s": 1.0, "memory_per_rank_bytes": [1.0] * 8},
                     measured={"step_time_s": step}, step_time_error_pct=(1 - step) / step * 100)
        return r
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(doc([rec("g01", "m1", "ok", 1.0), rec("g09", "m2", "skipped")],
                                "m1")))
    b.write_text(json.dumps(doc([rec("g09", "m2", "ok", 0.9)], "m2")))
    out = json.loads(g8r.merge([a, b], tmp_path / "m").read_text())
    assert [(r["name"], r["status"]) for r in out["records"]] == [("g01", "ok"), ("g09", "ok")]
    assert set(out["profiles"]) == {"m1", "m2"} and set(out["jobs"]) == {"m1", "m2"}
    c = tmp_path / "c.json"
    c.write_text(json.dumps(dict(doc([], "m1"), nproc=4)))
    with pytest.raises(SystemExit, match="differ"):
        g8r.merge([a, c], tmp_path / "n")


def test_validate_gives_each_model_its_own_parts_profile_however_the_set_is_cut(
        tmp_path, monkeypatch):
    """--only that leaves the Llama model alone must still run it on profile_part2of2 (its
    index in the whole set), with the whole budget, and merge what ran into --out."""
    keep, out = tmp_path / "keep", tmp_path / "out"
    keep.mkdir()
    for k in (1, 2):
        (keep / f"profile_part{k}of2.toml").write_text("")
    calls = []

    def fake_validate_set(doc, args):
        (m,) = doc["models"]
        calls.append((m["name"], Path(args.profile).name, args.budget, args.nproc))
        listed = json.loads(Path(m["layout_file"]).read_text())
        acc = {"set": "gpu8_42", "gpu_name": "NVIDIA H100", "nproc": 8, "profiles":
               {m["name"]: args.profile}, "jobs": {m["name"]: m["job"]},
               "records": [{"name": x["name"], "model": m["name"], "status": "skipped",
                            "short": x["name"], "layout": {}} for x in listed]}
        (args.out / "accuracy.json").write_text(json.dumps(acc))
        (args.out / "validate.log").write_text(f"{m['name']}\n")
        return args.out / "accuracy.json"
    monkeypatch.setattr(tr, "validate_set", fake_validate_set)
    monkeypatch.setattr(tr, "gpu_name", lambda: "NVIDIA H100")
    g8r.main(["validate", "--only", "g09,g16", "--keep", str(keep), "--out", str(out),
              "--budget", "300"])
    assert [(c[0], c[1], c[3]) for c in calls] == [
        ("g42m13-llama-mha-5.44b", "profile_part2of2.toml", 8)]
    assert calls[0][2] == pytest.approx(300.0, abs=5.0)
    merged = json.loads((out / "accuracy.json").read_text())
    assert [r["name"] for r in merged["records"]] == ["g09", "g16"]
    calls.clear()
    g8r.main(["validate", "--part", "1/2", "--keep", str(keep), "--out", str(tmp_path / "o1")])
    assert [(c[0][:6], c[1]) for c in calls] == [("g42m01", "profile_part1of2.toml")]


@pytest.mark.parametrize("writes", [True, False])
def test_calibrate_rerun_does_not_pass_on_the_earlier_profile(tmp_path, monkeypatch, writes):
    """calibrate refuses an existing --out: a re-run would have copied and summarized the
    earlier call's profile as this call's."""
    keep, out = tmp_path / "keep", tmp_path / "out"
    profile = (ROOT / "docs/benchmarks/data/profiles/profile_h100x2_round12.toml").read_text()
    for d in (keep, out):
        d.mkdir()
        (d / "profile_part1of2.toml").write_text("# stale\n")
    calls = []

    def fake_run(cmd, log, timeout_s):
        dest = Path(cmd[cmd.index("--out") + 1])
        calls.append(dest.name)
        if dest.exists() and "--force" not in cmd:
            return 2                       # meshplan calibrate: refusing to overwrite it
        if writes:
            dest.write_text(profile)
        return 0 if writes else 124
    monkeypatch.setattr(tr, "_run", fake_run)
    monkeypatch.setattr(g8r, "host_info", lambda path: None)
    rc = g8r.main(["calibrate", "--part", "1/2", "--keep", str(keep), "--out", str(out)])
    assert calls == ["profile_part1of2.toml"]
    if writes:
        assert rc == 0 and (out / "profile_part1of2.toml").read_text() == profile
        assert (out / "calibrate_summary.json").exists()
    else:
        assert rc == 124 and not (out / "profile_part1of2.toml").exists()
        assert not (keep / "profile_part1of2.toml").exists()
