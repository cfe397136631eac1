"""How repeatable a measurement is: the same layouts' measured steps across validate runs.

Each argument is a ``LABEL=accuracy.json`` written by ``benchmarks/validate_device.py``
(e.g. one run with ``--cpu-affinity none`` and one with ``split``, twice each). Prints, per
layout, every run's median step and its step spread (p90 − p10 over the median), then per
label the mean spread and, for labels given more than once, the mean run-to-run change, and
over all runs how far apart each layout's slowest and fastest run were.

    python benchmarks/compare_runs.py none=a1/accuracy.json split=b1/accuracy.json \\
        none=a2/accuracy.json split=b2/accuracy.json --json ab.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshplan.errors import ConfigError


def load_runs(specs: list[str]) -> list[tuple[str, dict[str, dict]]]:
    """[(label, {layout name: measured dict})] from ``LABEL=path`` arguments."""
    runs = []
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            raise ConfigError(f"{spec!r}: expected LABEL=path/to/accuracy.json")
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path!r} is not a readable accuracy.json: {exc}") from None
        recs = {r["name"]: r["measured"] for r in doc.get("records", [])
                if r.get("status") == "ok" and isinstance(r.get("measured"), dict)}
        runs.append((label, recs))
    return runs


def compare(runs: list[tuple[str, dict[str, dict]]]) -> dict:
    """Per layout: each run's (label, step s, spread %); per label: mean spread and the mean
    absolute change between consecutive runs of that label (%)."""
    names = sorted({n for _, recs in runs for n in recs})
    layouts = {n: [(label, recs[n]["step_time_s"], recs[n].get("step_time_spread"))
                   for label, recs in runs if n in recs] for n in names}
    labels: dict[str, dict] = {}
    for label in dict.fromkeys(lb for lb, _ in runs):
        spreads = [s for rows in layouts.values() for lb, _, s in rows
                   if lb == label and isinstance(s, (int, float))]
        changes = []
        for rows in layouts.values():
            steps = [st for lb, st, _ in rows if lb == label]
            changes += [abs(b - a) / a * 100 for a, b in zip(steps, steps[1:])]
        labels[label] = {"mean_spread_pct": sum(spreads) / len(spreads) if spreads else None,
                         "mean_run_to_run_pct": sum(changes) / len(changes) if changes else None}
    ranges = [(max(st for _, st, _ in rows) / min(st for _, st, _ in rows) - 1) * 100
              for rows in layouts.values() if len(rows) > 1]
    return {"layouts": layouts, "labels": labels,
            "mean_range_pct": sum(ranges) / len(ranges) if ranges else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="LABEL=accuracy.json")
    ap.add_argument("--json", type=Path, help="also write the comparison here")
    args = ap.parse_args()
    try:
        out = compare(load_runs(args.runs))
    except ConfigError as exc:
        ap.error(str(exc))
    for name, rows in out["layouts"].items():
        cells = "  ".join(f"{lb} {st:.4f} s ({'—' if sp is None else f'{sp:.0f} %'})"
                          for lb, st, sp in rows)
        print(f"{name}: {cells}")
    for label, v in out["labels"].items():
        sp, rr = v["mean_spread_pct"], v["mean_run_to_run_pct"]
        print(f"{label}: mean step spread {'—' if sp is None else f'{sp:.1f} %'}, "
              f"mean run-to-run change {'—' if rr is None else f'{rr:.1f} %'}")
    if out["mean_range_pct"] is not None:
        print(f"layouts measured more than once: mean (slowest / fastest − 1) "
              f"{out['mean_range_pct']:.1f} %")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
