"""GPU clock, power and temperature during each validated layout's run, next to its error.

``device_accuracy.sh`` logs ``nvidia-smi`` every 2 s (``gpu_clocks_*.csv``); each layout's
``results.json`` (in ``logs.tgz``) has its start time and step times. This matches them —
the samples from the layout's start to start + its steps' total time + a margin, with
utilization above 30 % — and prints the median SM clock, power and temperature per layout,
with its step-time error from ``accuracy.json``. Round 5 (issue 5) used it to see that
sustained runs clock lower than calibration's bursts.

    python benchmarks/clocks_by_layout.py --accuracy accuracy.json --clocks gpu_clocks_validate.csv \\
        --logs DIR_WITH_NAME/results.json
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from datetime import datetime, timedelta
from pathlib import Path


def read_clocks(path: Path) -> list[tuple[datetime, int, float, float, int]]:
    """(time, SM MHz, power W, temperature C, utilization %) per sample (all GPUs)."""
    out = []
    with path.open() as f:
        rows = csv.reader(f)
        next(rows, None)
        for r in rows:
            try:
                t = datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
                out.append((t, int(r[2].split()[0]), float(r[5].split()[0]), float(r[4]),
                            int(r[6].split()[0])))
            except (ValueError, IndexError):
                continue    # "[N/A]" fields, a torn last line
    return out


def window_stats(samples, start: datetime, seconds: float, margin_s: float = 4.0
                 ) -> dict | None:
    """Medians over the busy samples in [start, start + seconds + margin]."""
    end = start + timedelta(seconds=seconds + margin_s)
    busy = [s for s in samples if start <= s[0] <= end and s[4] > 30]
    if not busy:
        return None
    return {"samples": len(busy), "sm_mhz": statistics.median(s[1] for s in busy),
            "sm_mhz_min": min(s[1] for s in busy),
            "power_w": statistics.median(s[2] for s in busy),
            "temperature_c": statistics.median(s[3] for s in busy)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--accuracy", type=Path, required=True)
    p.add_argument("--clocks", type=Path, required=True)
    p.add_argument("--logs", type=Path, required=True,
                   help="directory holding NAME/results.json per layout (logs.tgz unpacked)")
    a = p.parse_args(argv)
    try:
        samples = read_clocks(a.clocks)
        records = json.loads(a.accuracy.read_text())["records"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("| name | layout | err | SM MHz median (min) | power W | temp C |")
    print("|---|---|---|---|---|---|")
    for r in records:
        res = a.logs / r["name"] / "results.json"
        if r.get("status") != "ok" or not res.exists():
            continue
        d = json.loads(res.read_text())
        start = datetime.strptime(d["environment"]["date"][:19], "%Y-%m-%dT%H:%M:%S")
        steps = d["measured"]["step_times_s"]
        st = window_stats(samples, start, sum(steps))
        if st is None:
            continue
        print(f"| {r['name']} | {r['short']} | {r['step_time_error_pct']:+.1f}% | "
              f"{st['sm_mhz']:.0f} ({st['sm_mhz_min']}) | {st['power_w']:.0f} | "
              f"{st['temperature_c']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
