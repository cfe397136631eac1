"""benchmarks/read_pooled_checks.py: several checks' arms pooled per column, and the
pre-registered untimed-shape rule's decision read on them."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import read_pooled_checks as rp  # noqa: E402
from price_plans import measured, plan_files, price  # noqa: E402
from meshplan.planner.planfile import load_plan_file  # noqa: E402

PROFILE = str(ROOT / "docs/benchmarks/data/profiles/profile_h200x1_moeh58_20261205.toml")


def test_pooled_errors_are_each_checks_arms_against_its_own_run():
    errs, pending = rp.errors(["moeh58", "moeh59"], [("moeh58", PROFILE)])
    assert pending == [] and len(errs["moeh58"]) == len(errs["datasheet"]) == 12
    want = []
    for check in ("moeh58", "moeh59"):
        meas = measured([str(rp.check_data(check))])
        for path in plan_files([str(d) for d in sorted(rp.PLANS.glob(f"{check}_*_h200x1"))]):
            rec = load_plan_file(path)
            want.append(price(rec, PROFILE) / meas[rec.job.precision, path.stem] - 1)
    assert errs["moeh58"] == pytest.approx(want)


def test_the_rule_adopts_only_below_every_profile_and_within_ten_percent():
    errs = {"a": [0.06, -0.08], "b": [0.05, 0.05], "datasheet": [0.03, -0.04]}
    assert rp.untimed_shape_decision(errs, ["a", "b"]).endswith("-> adopt")
    errs["datasheet"] = [0.01, 0.11]                    # mean below, max above 10 %
    assert rp.untimed_shape_decision(errs, ["a", "b"]).endswith("-> keep today's pricing")
    errs["datasheet"] = [0.05, 0.06]                    # not below b's 5 % mean
    assert rp.untimed_shape_decision(errs, ["a", "b"]).endswith("-> keep today's pricing")


def test_the_rule_is_not_read_before_every_check_ran(capsys):
    # moeh61 and moeh62 were drawn and priced before their runs; until they run, no decision
    if rp.check_data("moeh61") is not None and rp.check_data("moeh62") is not None:
        pytest.skip("moeh61 and moeh62 have run")
    assert rp.main(["moeh60", "moeh61", "moeh62", "--profile", f"moeh58={PROFILE}",
                    "--rule", "untimed-shape"]) == 1
    assert "rule: not read" in capsys.readouterr().out
