"""Post hoc (a reading of 2026-12-06): the CPU dispatch a profile prices per step against the
pace the CPU kept in the run, for the 1-GPU H100 arms that recorded ``host_step_s``.

    python benchmarks/host_price_vs_run.py                  # every arm, its set's own profile
    python benchmarks/host_price_vs_run.py --all-own        # + every profile of the arm's model
    python benchmarks/host_price_vs_run.py docs/benchmarks/data/moe_fp8_h100x1_moeh74h100_*.json \\
        --profile second=docs/benchmarks/data/profiles/profile_h100x1_moeh74h100-2_20261206.toml

Reads the data files (default: every ``docs/benchmarks/data/{moe_fp8,fp8}_h100x1_*.json``; arms
without ``host_step_s`` are left out): each run's ``step_time_s``, ``host_step_s`` and per-phase
medians (``forward i`` / ``backward i``: device and host ms of micro-batch i), and the committed
plan that priced it (``optimizer_rate_posthoc.matched_runs``; an H200 plan run on the H100 is
priced on the H100). Each arm is priced, in today's tree, with the data file's own ``profile``
where it is a 1-GPU H100 one (moeh61's and moeh63h100's are not), with ``--all-own`` also every
committed ``profile_h100x1_*.toml`` calibrated on the arm's model (e.g. a set's second calibration,
``…<set>-2_<date>.toml``), or with the ``--profile NAME=PATH`` given instead. A profile is the
arm's *own model's* when its provenance names the arm's model, else *transferred*.

Per arm × profile (M micro-batches, L layers, pp 1):
- priced CPU s/step C = ``Estimate.host_dispatch_s`` = M × (L × cpu_layer + cpu_call + ends)
  (``LayerTables.rank_cpu_s``); per-layer share = M × L × cpu_layer / C; priced host load =
  C / ``pipeline_s``.
- CPU own pace s/step P = M × (q(forward host ms) + q(backward host ms)), q = the mean of the
  lowest quarter (at least one) of the micro-batches' host times; only M ≥ 4. A heuristic:
  ``host_step_s`` is the host's wall time with its blocking on the GPU included (launch queue
  full, syncs), so it is the CPU's own time only where the CPU paces; the micro-batches it
  dispatched before it first blocked show its own pace, and the cheapest quarter picks them
  (on CPU-paced arms within a few % of the median). It still holds the executor's unpriced
  per-micro-batch work (zero_grad, loss scaling, marks), so priced ÷ P errs low.
- paced by cpu where the median micro-batch's device time ran ≥ 8 % over the priced GPU pass
  (``LayerTables.stage_times`` of the L layers, forward + backward) with the host's ≥ 90 % of
  it (heuristic), else gpu.
- step error = priced step ÷ measured − 1; with the run's CPU in place of the price: the priced
  step with max(pipeline_s, C) replaced by max(pipeline_s, R), R = P where GPU-paced, M × the
  median micro-batch's host time where CPU-paced.

The summary reads the pairs priced host-loaded (host load ≥ 0.8, ``HOST_NEAR_LOAD``), own-model
and transferred apart: priced ÷ P (median, quartiles by ``statistics.quantiles`` inclusive,
range), by precision and by MoE / dense; the Pearson correlation of the step error with
priced ÷ P and with priced ÷ ``host_step_s``; the mean and max |step error|, priced and with the
run's CPU in. The 2026-12-06 study's headline is ``--all-own``'s own-model summary (20 pairs
over fp8h57h100, fp8h59h100, moeh72h100-moeh74h100: priced ÷ P median 1.16; correlation 0.74
with priced ÷ P, 0.86 with priced ÷ ``host_step_s``; mean |step error| 7.6 % → 2.0 %); its
fp8h54h100 arms, which have no H100 profile of their model, were priced from fp8h17src's
(``--profile``).
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from grad_accumulation_phases import passes  # noqa: E402
from moe_profile_transfer import check_name  # noqa: E402
from optimizer_rate_posthoc import matched_runs  # noqa: E402
from price_plans import named_profiles, priced_cluster  # noqa: E402

from meshplan.calibrate.stats import pearson  # noqa: E402
from meshplan.costmodel import estimate  # noqa: E402
from meshplan.costmodel.caveats import HOST_NEAR_LOAD  # noqa: E402
from meshplan.costmodel.tables import layer_tables  # noqa: E402
from meshplan.errors import MeshplanError, MeshplanWarning  # noqa: E402
from meshplan.hardware_profiles.calibrated import load_profile  # noqa: E402
from meshplan.planner.planfile import load_plan_file  # noqa: E402

H100 = "H100-SXM5-80GB"
DATA = ROOT / "docs/benchmarks/data"
PROFILES = str(DATA / "profiles/profile_h100x1_*.toml")
CPU_PACED_OVER_GPU = 1.08     # device micro-batch over the priced GPU pass: the GPU waited
CPU_PACED_HOST_SHARE = 0.9    # ... while the host took this share of it or more


def default_data() -> list[str]:
    """The 1-GPU H100 check data files."""
    return sorted(glob.glob(str(DATA / "moe_fp8_h100x1_*.json"))
                  + glob.glob(str(DATA / "fp8_h100x1_*.json")))


@functools.cache
def profile_models(path: str) -> frozenset[str]:
    """The models a profile was calibrated on (its provenance)."""
    names = str(load_profile(path).provenance.get("model", ""))
    return frozenset(m.strip() for m in names.split(",") if m.strip())


@functools.cache
def own_profile(data_path: str) -> str | None:
    """The data file's ``profile`` where it is a 1-GPU H100 calibration."""
    prof = json.loads(Path(data_path).read_text()).get("profile") or ""
    return str(ROOT / prof) if "profile_h100x1_" in prof else None


def short(profile: str) -> str:
    """``profile_h100x1_moeh74h100-2_20261206.toml`` → ``moeh74h100-2``."""
    return Path(profile).stem.removeprefix("profile_h100x1_").rsplit("_", 1)[0]


def profiles_for(data_path: str, model: str, named, all_own: bool) -> list[tuple[str, str]]:
    """(name, path) of each profile an arm is priced with."""
    if named:
        return named
    own = own_profile(data_path)
    out = [own] if own else []
    if all_own:
        out += [p for p in sorted(glob.glob(PROFILES)) if model in profile_models(p)]
    return [(short(p), p) for p in dict.fromkeys(out)]


def low_quarter(xs: list[float]) -> float:
    """Mean of the lowest quarter of ``xs`` (at least one value)."""
    k = max(1, len(xs) // 4)
    return sum(sorted(xs)[:k]) / k


def run_pace(run: dict, m: int) -> dict:
    """The run's CPU own pace P (s/step, None for M < 4) and its median micro-batch's host and
    device ms."""
    fh, bh = passes(run, "forward", "host_ms"), passes(run, "backward", "host_ms")
    fd, bd = passes(run, "forward"), passes(run, "backward")
    own = m * (low_quarter(fh) + low_quarter(bh)) / 1e3 if m >= 4 and fh and bh else None
    return {"own_pace_s": own,
            "host_mb_ms": statistics.median(fh) + statistics.median(bh),
            "dev_mb_ms": statistics.median(fd) + statistics.median(bd)}


def priced(rec, profile: str) -> dict:
    """The profile's price of a plan: step, GPU pipeline, CPU and its per-layer share."""
    gpu = None if rec.cluster.gpu.name == H100 else H100
    cluster = priced_cluster(rec, profile, gpu)
    est = estimate(rec.model, cluster, rec.job, rec.layout)
    t = layer_tables(rec.model, cluster, rec.job, rec.layout, checked=True)
    cpu, m, layers = est.host_dispatch_s, est.num_microbatches, rec.model.num_layers
    fwd, bwd, _ = t.stage_times((layers,))
    return {"m": m, "step_s": est.step_time_s, "pipeline_s": est.pipeline_s, "cpu_s": cpu,
            "load": est.host_load, "gpu_mb_ms": 1e3 * (fwd[0] + bwd[0]),
            "layer_share": m * layers * t.cpu_layer_s / cpu if cpu else None}


def compare(run: dict, p: dict) -> dict:
    """The price against the run: ratios, pacing, step errors."""
    pace = run_pace(run, p["m"])
    own, meas = pace["own_pace_s"], run["step_time_s"]
    cpu_paced = (pace["dev_mb_ms"] >= CPU_PACED_OVER_GPU * p["gpu_mb_ms"]
                 and pace["host_mb_ms"] >= CPU_PACED_HOST_SHARE * pace["dev_mb_ms"])
    out = {**pace, "paced": "cpu" if cpu_paced else "gpu",
           "ratio": p["cpu_s"] / own if own else None,
           "ratio_host": p["cpu_s"] / run["host_step_s"],
           "err": p["step_s"] / meas - 1, "err_run_cpu": None}
    if own:
        run_cpu = p["m"] * pace["host_mb_ms"] / 1e3 if cpu_paced else own
        tail = p["step_s"] - max(p["pipeline_s"], p["cpu_s"])
        out["err_run_cpu"] = (max(p["pipeline_s"], run_cpu) + tail) / meas - 1
    return out


def pairs(data: list[str], named, all_own: bool, plans: str):
    """One row per arm (with ``host_step_s``) and profile; refusals counted apart."""
    rows, refused = [], []
    for path, key, run, _meas, _pred, plan in matched_runs(data, plans):
        if not run.get("host_step_s"):
            continue
        rec = load_plan_file(plan)
        arm = {"set": check_name(path), "precision": rec.job.precision,
               "layout": key.split("/")[0], "moe": bool(rec.model.num_experts),
               "step_meas_s": run["step_time_s"], "host_step_s": run["host_step_s"]}
        for name, prof in profiles_for(path, rec.model.name, named, all_own):
            try:
                p = priced(rec, prof)
            except MeshplanError as exc:
                refused.append(f"{arm['set']} {arm['precision']} {arm['layout']} {name}: {exc}")
                continue
            rows.append({**arm, **p, **compare(run, p), "profile": name,
                         "own_model": rec.model.name in profile_models(prof)})
    return rows, refused


def f(x, fmt: str = ".3f", pct: bool = False) -> str:
    """A cell: ``x`` formatted, a dash for None."""
    if x is None:
        return "—"
    return f"{x * 100:+.1f} %" if pct else format(x, fmt)


def table(rows: list[dict]) -> list[str]:
    """The Markdown table, a row per arm and profile."""
    head = ["set", "profile", "precision", "layout", "priced host load", "priced CPU s/step",
            "per-layer share", "CPU own pace s/step", "priced ÷ own pace", "host_step_s",
            "paced by", "measured step s", "priced step s", "step error",
            "step error, run's CPU in"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["set"], r["profile"] + ("" if r["own_model"] else " (transferred)"),
                 r["precision"], f"`{r['layout']}`", f(r["load"], ".2f"), f(r["cpu_s"]),
                 f(r["layer_share"], ".0%"), f(r["own_pace_s"]), f(r["ratio"], ".2f"),
                 f(r["host_step_s"]), r["paced"], f(r["step_meas_s"]), f(r["step_s"]),
                 f(r["err"], pct=True), f(r["err_run_cpu"], pct=True)]
        out.append("| " + " | ".join(cells) + " |")
    return out


def spread(xs: list[float]) -> str:
    """n, median, quartiles and range of ``xs``."""
    xs = sorted(x for x in xs if x is not None)
    if len(xs) < 2:
        return f"n={len(xs)}" + (f", {xs[0]:.2f}" if xs else "")
    q1, med, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return (f"median {med:.2f}, quartiles {q1:.2f}-{q3:.2f}, range {xs[0]:.2f}-{xs[-1]:.2f} "
            f"(n={len(xs)})")


def errors(rows: list[dict], key: str) -> str:
    """Mean and max |``key``| over ``rows`` (an error share), in %."""
    e = [abs(r[key]) for r in rows if r[key] is not None]
    return f"mean {statistics.mean(e) * 100:.1f} %, max {max(e) * 100:.1f} %" if e else "—"


def group_summary(name: str, rows: list[dict]) -> list[str]:
    """The summary lines of one group of host-loaded pairs."""
    arms = {(r["set"], r["precision"], r["layout"]) for r in rows}
    out = [f"**{name}: {len(rows)} pairs ({len(arms)} arms) over "
           f"{', '.join(sorted({r['set'] for r in rows}))}**",
           f"- priced ÷ CPU own pace: {spread([r['ratio'] for r in rows])}"]
    for key in (lambda r: r["precision"], lambda r: "MoE" if r["moe"] else "dense"):
        for k in sorted({key(r) for r in rows}):
            out.append(f"  - {k}: {spread([r['ratio'] for r in rows if key(r) == k])}")
    both = [r for r in rows if r["ratio"] is not None]
    if len(both) >= 3:
        err = [r["err"] for r in both]
        out.append(f"- corr(step error, priced ÷ own pace) = "
                   f"{pearson(err, [r['ratio'] for r in both]):.2f}; corr(step error, priced "
                   f"÷ host_step_s) = {pearson(err, [r['ratio_host'] for r in both]):.2f} "
                   f"(n={len(both)})")
    with_run = [r for r in rows if r["err_run_cpu"] is not None]
    out.append(f"- |step error| {errors(with_run, 'err')}; with the run's CPU in place of the "
               f"price {errors(with_run, 'err_run_cpu')} (n={len(with_run)}; "
               f"{sum(r['paced'] == 'cpu' for r in with_run)} CPU-paced)")
    return out


def summary(rows: list[dict]) -> list[str]:
    """The summary: host-loaded pairs, own-model and transferred apart (:func:`group_summary`),
    then the own-model pairs priced below the host-loaded line."""
    loaded = [r for r in rows if r["load"] >= HOST_NEAR_LOAD]
    out = [f"## Summary: pairs priced host-loaded (host load ≥ {HOST_NEAR_LOAD})", ""]
    for name, own in (("own-model profiles", True), ("transferred profiles", False)):
        grp = [r for r in loaded if r["own_model"] == own]
        out += group_summary(name, grp) + [""] if grp else [f"{name}: no pair", ""]
    light = [r for r in rows if r["load"] < HOST_NEAR_LOAD and r["own_model"]]
    if light:
        out.append(f"GPU-priced own-model pairs (load < {HOST_NEAR_LOAD}): |step error| "
                   f"{errors(light, 'err')} (n={len(light)})")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="*", help="check data files (default: every 1-GPU H100 one)")
    ap.add_argument("--profile", action="append", default=[], metavar="NAME=PATH",
                    help="price with this profile instead of each set's own (repeat)")
    ap.add_argument("--all-own", action="store_true",
                    help="also every committed 1-GPU H100 profile of the arm's model")
    ap.add_argument("--min-host-load", type=float, default=0.0, metavar="X",
                    help="only pairs priced at this host load or more")
    ap.add_argument("--plans", default=str(ROOT / "benchmarks/plans/*x1/*.json"))
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", MeshplanWarning)
    rows, refused = pairs(args.data or default_data(), named_profiles(args.profile),
                          args.all_own, args.plans)
    rows = [r for r in rows if r["load"] >= args.min_host_load]
    print("\n".join(table(rows) + [""] + summary(rows)))
    for line in refused:
        print(f"refused: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
