"""The calibration's MoE layer rows at ep > 1 against the layers of the runs they priced
(issue 38; CPU only, from committed data).

For every drawn 2-GPU MoE set that ran (moeh6-moeh15) and each of its ZeRO-0/1, unpipelined
layouts at ep > 1: the layer row the profile timed at that layout's tp, SP, recompute,
micro-batch, compile and ep, against the run's own forward and backward phases (medians over
the measured steps' micro-batches, the profile's embedding and output rows taken off, over
the model's layers). A ratio below 1 is a row faster than the run's layer. What it separates:
how much of a set's step-time error is the rows' reading (the same layer timed twice, in the
calibration and in the run) rather than what is priced around them. The routed load of the
run (busiest rank over the mean) is shown beside the row's, since a busier rank's experts
take longer than the row's.

    python benchmarks/moe_rows_vs_runs.py            # the table and its summary (markdown)
    python benchmarks/moe_rows_vs_runs.py --second-runs   # with the fresh-process reruns
    python benchmarks/moe_rows_vs_runs.py --host     # and the runs' host time a layer
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import moe_sync_gpu as msg  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs/benchmarks/data"
#: set tag -> the layout set its README names (benchmarks/moe_sync_gpu.py SETS)
SETS = {"moeh6": "drawn2-3806", "moeh7": "drawn2-3807", "moeh8": "drawn2-3808",
        "moeh9": "drawn2-3809", "moeh10": "drawn2-3810", "moeh11": "drawn2-3811",
        "moeh12": "drawn2-3812", "moeh13": "drawn2-3813",
        "moeh14": "drawn2-3814", "moeh15": "drawn2-3815"}


def _one(paths: list[str], what: str) -> str:
    if len(paths) != 1:
        raise SystemExit(f"moe_rows_vs_runs: expected one {what}, found {paths}")
    return paths[0]


def _layer_row(profile: dict, lay) -> dict | None:
    for row in profile.get("layers", []):
        if (row["tp"] == lay.tp and row["recompute"] == lay.recompute
                and row["micro_batch"] == lay.micro_batch
                and bool(row.get("compile", False)) == lay.compile
                and row.get("ep", 1) == lay.ep and row.get("zero", 0) == 0
                and row.get("precision", "bf16") == "bf16"
                and bool(row.get("sequence_parallel", False)) == lay.sequence_parallel):
            return row
    return None


def _ends_s(profile: dict, lay) -> tuple[float, float]:
    """Forward and backward of the embedding and output rows at the layout's tp and
    micro-batch (the output's compiled row at tp 1 where the layout compiles)."""
    fwd = bwd = 0.0
    for part in ("embedding", "output"):
        rows = [e for e in profile.get("ends", []) if e["part"] == part
                and e["tp"] == lay.tp and e["micro_batch"] == lay.micro_batch]
        compiled = [e for e in rows if e.get("compile", False) == (lay.compile and lay.tp == 1)]
        row = (compiled or [e for e in rows if not e.get("compile", False)] or [None])[0]
        if row is not None:
            fwd += row["forward_s"]
            bwd += row["backward_s"]
    return fwd, bwd


def rows_vs_runs(tags: list[str], second_runs: bool = False) -> list[dict]:
    """Each set's first runs; with ``second_runs`` also the layouts run again in a fresh
    process (``moe_sync_gpu.py run --second-pass``, moeh15 on), named ``LAYOUT (2nd)``."""
    out = []
    for tag in tags:
        layouts = dict(msg.SETS[SETS[tag]])
        profile = tomllib.loads(Path(_one(glob.glob(str(
            DATA / f"profiles/profile_h200x2_{tag}_2026*.toml")), "profile")).read_text())
        runs = json.loads(Path(_one(glob.glob(str(DATA / f"moe_drawn_h200x2_{tag}_2026*.json")),
                                    "run file")).read_text())["runs"]
        layers = json.loads((ROOT / f"benchmarks/sets/{tag}/m01.json").read_text())["num_layers"]
        for key, run in runs.items():
            name, arm = key.split("/")
            second = arm == msg.SECOND_RUN
            if second and not second_runs:
                continue
            lay = layouts.get(name)
            phases = run.get("phases") or {}
            if lay is None or lay.ep < 2 or lay.zero > 1 or lay.pp > 1 or not phases:
                continue
            row = _layer_row(profile, lay)
            if row is None:
                continue
            end_f, end_b = _ends_s(profile, lay)
            med = {(p, clock): statistics.median(v[clock] for k, v in phases.items()
                                                 if k.startswith(p)) / 1e3
                   for p in ("forward", "backward") for clock in ("device_ms", "host_ms")}
            run_f = (med["forward", "device_ms"] - end_f) / layers
            run_b = (med["backward", "device_ms"] - end_b) / layers
            out.append({"set": tag, "layout": name + (" (2nd)" if second else ""),
                        "compiled": lay.compile,
                        "row_f": row["forward_s"],
                        "row_b": row["backward_s"], "run_f": run_f, "run_b": run_b,
                        "host_f": (med["forward", "host_ms"] - end_f) / layers,
                        "host_b": (med["backward", "host_ms"] - end_b) / layers,
                        "ratio": (row["forward_s"] + row["backward_s"]) / (run_f + run_b),
                        "rho_row": row.get("routed_imbalance", 0.0),
                        "rho_run": (run.get("moe_routing") or {}).get("busiest_over_mean")})
    return out


def markdown(rows: list[dict], host: bool = False) -> str:
    """The table and its summary; ``host`` adds the run's host time a layer (the same phases
    on the CPU's clock, the profile's end rows taken off as for the GPU's)."""
    lines = ["| set | layout | row fwd + bwd ms | run's layer fwd + bwd ms | "
             + ("run's host fwd + bwd ms | " if host else "") + "row / run | ρ row / run |",
             "|---|---|---|---|---|---|" + ("---|" if host else "")]
    for r in rows:
        rho_run = f"{r['rho_run']:.2f}" if r["rho_run"] else "—"
        rho_row = f"{r['rho_row']:.2f}" if r["rho_row"] else "—"
        cpu = f"{r['host_f'] * 1e3:.2f} + {r['host_b'] * 1e3:.2f} | " if host else ""
        lines.append(f"| {r['set']} | `{r['layout']}` | {r['row_f'] * 1e3:.2f} + "
                     f"{r['row_b'] * 1e3:.2f} | {r['run_f'] * 1e3:.2f} + {r['run_b'] * 1e3:.2f} | "
                     f"{cpu}{r['ratio']:.3f} | {rho_row} / {rho_run} |")
    ratios = sorted(r["ratio"] for r in rows)
    if ratios:
        lines.append("")
        lines.append(f"{len(ratios)} layouts: row / run median {statistics.median(ratios):.3f}, "
                     f"range {ratios[0]:.3f}-{ratios[-1]:.3f}, standard deviation "
                     f"{statistics.pstdev(ratios):.3f}")
    eager = [r for r in rows if not r["compiled"]]
    if len(eager) > 1:
        e = sorted(r["ratio"] for r in eager)
        lines.append(f"{len(e)} eager layouts: median {statistics.median(e):.3f}, range "
                     f"{e[0]:.3f}-{e[-1]:.3f}, standard deviation {statistics.pstdev(e):.3f}")
    fit = rho_trend(eager)
    if fit is not None:
        lines.append(f"eager row / run against ρ as run ({fit[0]} layouts): correlation "
                     f"{fit[1]:+.2f}, slope {fit[2]:+.2f} per unit of ρ")
    return "\n".join(lines)


def rho_trend(rows: list[dict]) -> tuple[int, float, float] | None:
    """(layouts, Pearson correlation, least-squares slope) of row / run against the ρ
    the run recorded, over the rows that recorded one; None with fewer than three or no
    spread in ρ. A negative slope: the more unevenly a run routed, the slower its layer
    than the row (timed at the calibration's own, near-even routing).

    >>> rho_trend([{"rho_run": 1.0, "ratio": 1.0}, {"rho_run": 1.2, "ratio": 0.9},
    ...            {"rho_run": 1.4, "ratio": 0.8}])
    (3, -1.0, -0.5)
    """
    pts = [(r["rho_run"], r["ratio"]) for r in rows if r.get("rho_run")]
    if len(pts) < 3:
        return None
    xs, ys = zip(*pts)
    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return (len(pts), round(statistics.correlation(xs, ys), 6),
            round(statistics.linear_regression(xs, ys).slope, 6))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default=",".join(SETS),
                   help=f"comma-separated set tags (default: {','.join(SETS)})")
    p.add_argument("--second-runs", action="store_true",
                   help="also the layouts run a second time in a fresh process (moeh15 on)")
    p.add_argument("--host", action="store_true",
                   help="add the runs' host time a layer beside their GPU time")
    args = p.parse_args(argv)
    tags = [t for t in args.sets.split(",") if t]
    unknown = [t for t in tags if t not in SETS]
    if unknown:
        p.error(f"--sets: unknown {unknown}; valid: {', '.join(SETS)}")
    print(markdown(rows_vs_runs(tags, second_runs=args.second_runs), host=args.host))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
