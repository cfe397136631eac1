"""`meshplan calibrate --for-plan`: the options a plan file needs, derived from the plan, and
`meshplan plan -o` naming that command where the plan was not priced from its model's rows."""

import argparse
import dataclasses
from pathlib import Path

import pytest

from meshplan.calibrate.for_plan import calibration_for_plans, load_plans
from meshplan.cli import main as cli_main
from meshplan.commands.calibrate import _apply_plans, add_arguments, child_argv
from meshplan.commands.plan import calibrate_hint
from meshplan.errors import ConfigError, PlanFileError
from meshplan.hardware_profiles.loader import builtin_gpu

ROOT = Path(__file__).parents[2]
PLANS = ROOT / "benchmarks" / "plans"
MOE_FP8 = PLANS / "moeh69h100_fp8_h100x1"       # mb16-full, mb4-full, mb8 (none), fp8 rowwise
DENSE_BF16 = PLANS / "fp8h54h100_bf16_h100x1"   # mb1 (none), mb1-full, mb4-selective


def _parser():
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def test_the_plans_micro_batches_compile_modes_and_recipe_are_timed():
    records, names = load_plans(sorted(MOE_FP8.glob("mb*.json")))
    cal = calibration_for_plans(records, names)
    assert cal.models == (records[0].model,)
    assert cal.seq_len == records[0].job.seq_len == 2048
    assert cal.micro_batches == (4, 8, 16)
    assert cal.compile_rows == ("none", "full")          # in RECOMPUTE's order
    assert cal.fp8_rows == records[0].job.fp8_recipe == "rowwise"
    assert cal.max_tp == 1 and not cal.sp_only and cal.ep_degrees is None
    assert cal.options() == ("--model <the plans' model> --seq-len 2048 --micro-batches 4,8,16 "
                             "--compile-rows none,full --fp8-rows rowwise --max-tp 1")


def test_a_single_micro_batch_also_times_a_neighbour():
    records, names = load_plans([DENSE_BF16 / "mb1-compiled.json"])
    cal = calibration_for_plans(records, names)
    assert cal.micro_batches == (1, 2) and cal.compile_rows == ("none",) and not cal.fp8_rows
    lay = records[0].layout
    eight = dataclasses.replace(records[0], layout=dataclasses.replace(lay, micro_batch=8))
    assert calibration_for_plans([eight]).micro_batches == (4, 8)


def test_tp_sp_and_ep_of_the_plans_set_the_parallel_rows():
    rec = load_plans([DENSE_BF16 / "mb4-selective-compiled.json"])[0][0]
    lay = rec.layout
    sp = dataclasses.replace(rec, layout=dataclasses.replace(
        lay, tp=2, sequence_parallel=True, dp=1, micro_batch=4))
    cal = calibration_for_plans([rec, sp])
    assert cal.max_tp == 2 and cal.sp_only
    no_sp = dataclasses.replace(sp, layout=dataclasses.replace(sp.layout,
                                                               sequence_parallel=False))
    assert not calibration_for_plans([sp, no_sp]).sp_only
    moe = load_plans([MOE_FP8 / "mb8-compiled.json"])[0][0]
    ep2 = dataclasses.replace(moe, layout=dataclasses.replace(moe.layout, ep=2, dp=2))
    assert calibration_for_plans([moe, ep2]).ep_degrees == (2,)


def test_plans_one_calibration_cannot_serve_are_refused_by_name():
    a = load_plans([DENSE_BF16 / "mb1-compiled.json"])[0][0]
    b = dataclasses.replace(a, job=dataclasses.replace(a.job, seq_len=4096))
    with pytest.raises(ConfigError, match=r"different sequence lengths \(a.json: 1024, "
                                          r"b.json: 4096\)"):
        calibration_for_plans([a, b], ("a.json", "b.json"))
    f1 = dataclasses.replace(a, job=dataclasses.replace(a.job, precision="fp8",
                                                        fp8_recipe="rowwise"))
    f2 = dataclasses.replace(a, job=dataclasses.replace(a.job, precision="fp8",
                                                        fp8_recipe="tensorwise"))
    with pytest.raises(ConfigError, match=r"fp8 recipes \['rowwise', 'tensorwise'\]"):
        calibration_for_plans([f1, f2])
    with pytest.raises(ConfigError, match="no plan file given"):
        calibration_for_plans([])


def test_what_calibrate_does_not_time_is_said():
    a = load_plans([DENSE_BF16 / "mb1-compiled.json"])[0][0]
    te = dataclasses.replace(a, job=dataclasses.replace(a.job, precision="fp8",
                                                        fp8_recipe="delayed",
                                                        runtime="megatron"))
    cal = calibration_for_plans([te])
    assert cal.fp8_rows == ""
    assert any("'delayed'" in n for n in cal.notes)
    assert any("runtime 'megatron'" in n for n in cal.notes)


def test_a_missing_plan_file_is_a_plan_file_error(tmp_path):
    with pytest.raises(PlanFileError):
        load_plans([tmp_path / "nope.json"])


def test_the_command_fills_what_the_user_left_and_keeps_what_they_gave(capsys):
    plans = [str(p) for p in sorted(MOE_FP8.glob("mb*.json"))]
    args = _parser().parse_args(["--out", "x.toml", "--micro-batches", "8",
                                 *sum((["--for-plan", p] for p in plans), [])])
    models = _apply_plans(args)
    assert len(models) == 1 and models[0].num_experts == 8
    assert args.micro_batches == (8,)                       # given: kept
    assert args.seq_len == 2048 and args.compile_rows == ("none", "full")
    assert args.fp8_rows == "rowwise" and args.max_tp == 1
    assert "--micro-batches 4,8,16" in capsys.readouterr().err
    # torchrun's children get the plans and the filled options, and derive the same
    argv = child_argv(args)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--for-plan"] == plans
    again = _parser().parse_args(argv[1:])
    _apply_plans(again)
    for k in ("seq_len", "micro_batches", "compile_rows", "fp8_rows", "max_tp", "sp_only", "ep"):
        assert getattr(again, k) == getattr(args, k)


def test_without_plans_the_defaults_are_unchanged():
    args = _parser().parse_args(["--out", "x.toml"])
    assert _apply_plans(args) == () and args.max_tp is None
    assert "--max-tp" not in child_argv(args)


def test_plan_names_the_calibration_where_the_plan_was_not_priced_from_its_rows(tmp_path,
                                                                                  capsys):
    out = tmp_path / "plan.json"
    assert cli_main(["plan", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1",
                     "--global-batch", "64", "--seq-len", "2048", "--quiet",
                     "-o", str(out)]) == 0
    assert (f"meshplan calibrate --for-plan {out} --nproc 8 --out profile.toml"
            in capsys.readouterr().out)
    assert calibrate_hint(("rows read past the timed micro-batches: `meshplan calibrate "
                           "--micro-batches` times them",), profile_given=True,
                          plan_path=out, gpus_per_node=4)
    assert calibrate_hint(("host-bound",), profile_given=True, plan_path=out,
                          gpus_per_node=4) == ""


DENSE_DRAW = ("draw_models.py", "--count", "6", "--min-params", "1.2e9", "--max-params", "4.0e9")
MOE_DRAW = ("draw_moe.py", "--count", "1", "--min-hidden", "2048", "--max-params", "3e9")


@pytest.mark.parametrize("check, draw, seed, index, layouts, picked_by_fit, recipe, options", [
    ("fp8h57h100", DENSE_DRAW, "4158", 0, ["mb1-full-compiled", "mb1-selective-compiled",
                                           "mb4-selective-compiled"], True, "tensorwise",
     "--seq-len 4096 --micro-batches 1,4 --compile-rows selective,full --fp8-rows tensorwise"),
    # the first model of the draw whose first three layouts fit in bf16 and fp8 both
    ("fp8h58h100", DENSE_DRAW, "4159", 1, ["mb2-full-compiled", "mb1-selective-compiled",
                                           "mb2-selective-compiled"], False, "tensorwise",
     "--seq-len 4096 --micro-batches 1,2 --compile-rows selective,full --fp8-rows tensorwise"),
    ("moeh72h100", MOE_DRAW, "3883", 0, ["mb1-full-compiled", "mb8-full-compiled",
                                         "mb4-full-compiled"], True, "rowwise",
     "--seq-len 4096 --micro-batches 1,4,8 --compile-rows full --fp8-rows rowwise"),
    ("moeh73h100", MOE_DRAW, "3884", 0, ["mb16-compiled", "mb16-full-compiled",
                                         "mb1-full-compiled"], True, "rowwise",
     "--seq-len 1024 --micro-batches 1,16 --compile-rows none,full --fp8-rows rowwise"),
    # the draw's smallest hidden size
    ("fp8h59h100", DENSE_DRAW, "4160", 1, ["mb8-selective-compiled", "mb1-compiled",
                                           "mb4-full-compiled"], True, "tensorwise",
     "--seq-len 1024 --micro-batches 1,4,8 --compile-rows none,selective,full "
     "--fp8-rows tensorwise"),
    # the draw's smallest hidden size; its first three layouts that fit in bf16 and fp8 both
    ("fp8h60h100", DENSE_DRAW, "4161", 3, ["mb1-selective-compiled", "mb2-full-compiled",
                                           "mb1-full-compiled"], False, "tensorwise",
     "--seq-len 8192 --micro-batches 1,2 --compile-rows selective,full --fp8-rows tensorwise"),
    ("moeh74h100", MOE_DRAW, "3885", 0, ["mb2-compiled", "mb1-compiled",
                                         "mb1-full-compiled"], True, "rowwise",
     "--seq-len 2048 --micro-batches 1,2 --compile-rows none,full --fp8-rows rowwise"),
    # the draw's smallest hidden size x its own sequence length
    ("fp8h61h100", DENSE_DRAW, "4162", 0, ["mb1-full-compiled", "mb1-compiled",
                                           "mb4-compiled"], True, "tensorwise",
     "--seq-len 1024 --micro-batches 1,4 --compile-rows none,full --fp8-rows tensorwise"),
    ("moeh75h100", MOE_DRAW, "3886", 0, ["mb8-full-compiled", "mb4-full-compiled",
                                         "mb2-compiled"], True, "rowwise",
     "--seq-len 2048 --micro-batches 2,4,8 --compile-rows none,full --fp8-rows rowwise"),
    # fp8h61h100's rule on the next seed: the draw's smallest hidden size x its own sequence
    ("fp8h62h100", DENSE_DRAW, "4163", 1, ["mb16-full-compiled", "mb4-full-compiled",
                                           "mb4-compiled"], True, "tensorwise",
     "--seq-len 1024 --micro-batches 4,16 --compile-rows none,full --fp8-rows tensorwise"),
    ("moeh76h100", MOE_DRAW, "3887", 0, ["mb16-full-compiled", "mb1-full-compiled",
                                         "mb2-full-compiled"], True, "rowwise",
     "--seq-len 1024 --micro-batches 1,2,16 --compile-rows full --fp8-rows rowwise"),
    ("fp8h63h100", DENSE_DRAW, "4164", 2, ["mb1-full-compiled", "mb8-selective-compiled",
                                           "mb8-compiled"], True, "tensorwise",
     "--seq-len 1024 --micro-batches 1,8 --compile-rows none,selective,full "
     "--fp8-rows tensorwise"),
    ("moeh77h100", MOE_DRAW, "3888", 0, ["mb4-full-compiled", "mb2-full-compiled",
                                         "mb1-compiled"], True, "rowwise",
     "--seq-len 4096 --micro-batches 1,2,4 --compile-rows none,full --fp8-rows rowwise"),
    ("fp8h64h100", DENSE_DRAW, "4165", 3, ["mb1-full-compiled", "mb2-compiled",
                                           "mb8-full-compiled"], True, "tensorwise",
     "--seq-len 1024 --micro-batches 1,2,8 --compile-rows none,full --fp8-rows tensorwise"),
    ("moeh78h100", MOE_DRAW, "3889", 0, ["mb2-compiled", "mb8-compiled",
                                         "mb4-full-compiled"], True, "rowwise",
     "--seq-len 4096 --micro-batches 2,4,8 --compile-rows none,full --fp8-rows rowwise"),
])
def test_a_for_plan_sets_model_and_the_calibration_its_datasheet_plans_ask_for(
        tmp_path, check, draw, seed, index, layouts, picked_by_fit, recipe, options):
    """A set committed before its run: its model is the draw script's model of the seed at
    that place in draw order, and the datasheet plans of `drawn-<seed>c` ask --for-plan for
    the calibration its README states."""
    import json
    import os
    import subprocess
    import sys
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / draw[0]), "--seed", seed,
                          *draw[1:]], capture_output=True, text=True, check=True, cwd=ROOT,
                         env=env)
    drawn = json.loads(out.stdout.splitlines()[index].split(" # ")[0])
    model_file = ROOT / "benchmarks" / "sets" / check / "m01.json"
    assert json.loads(model_file.read_text()) == drawn
    for precision in ("bf16", "fp8"):
        pick = ["--gpu-bound", "3"] if precision == "bf16" and picked_by_fit \
            else ["--only", *layouts]
        fp8 = ["--fp8-recipe", recipe] if precision == "fp8" else []
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "moe_sync_gpu.py"), "plans",
                        "--set", f"drawn-{seed}c", "--model", str(model_file),
                        "--global-batch", "16", "--profile", "", "--gpu", "H100-SXM5-80GB",
                        "--out", str(tmp_path / precision), *pick, *fp8],
                       capture_output=True, text=True, check=True, cwd=ROOT,
                       env=env)
        preds = json.loads((tmp_path / precision / "predictions.json").read_text())
        assert list(preds["layouts"]) == layouts
        capacity_gib = builtin_gpu("H100-SXM5-80GB").memory_bytes / 2**30
        assert all(v["memory_gib"] < capacity_gib for v in preds["layouts"].values())
    files = sorted(p for p in tmp_path.glob("*/*.json") if p.name != "predictions.json")
    cal = calibration_for_plans(*load_plans(files))
    assert cal.options() == f"--model <the plans' model> {options} --max-tp 1"
