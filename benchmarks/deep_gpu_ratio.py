"""A layer's GPU time on 4 blocks against its 2-block row, from a calibration log.

Since round 18, `meshplan calibrate` logs, for each setting's smallest micro-batch, the GPU
time per layer of the 4-block stack it times for the CPU's per-call part, beside the
2-block row (``... fwd F ms, bwd B ms per layer, ..., cpu on 4 blocks c / c ms, gpu f / b
ms``). For FSDP2 rows the ratio says whether a layer costs more per layer with more
neighbours' gathers and reduce-scatters around it — the open question behind GPT-0.54B's
FSDP2 layouts without a pipeline, under-predicted in every measured set (round 18 of
docs/benchmarks/accuracy.md). Rounds are listed apart (each round re-times the setting)::

    python benchmarks/deep_gpu_ratio.py docs/benchmarks/round19/calibrate.log
    python benchmarks/deep_gpu_ratio.py LOG --only "zero[23] dp"     # FSDP2 rows only
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

_LINE = re.compile(
    r"round (?P<round>\d+): layer (?P<setting>.+?) mb(?P<mb>\d+): fwd (?P<f2>[\d.]+) ms, "
    r"bwd (?P<b2>[\d.]+) ms per layer.*?cpu on (?P<deep>\d+) blocks [\d.]+ / [\d.]+ ms, "
    r"gpu (?P<f4>[\d.]+) / (?P<b4>[\d.]+) ms")


@dataclass(frozen=True)
class DeepRow:
    """One logged setting: per-layer GPU ms on 2 blocks (the row) and on ``deep`` blocks."""

    round: int
    setting: str
    micro_batch: int
    deep: int
    forward_2_ms: float
    backward_2_ms: float
    forward_deep_ms: float
    backward_deep_ms: float

    @property
    def ratio(self) -> float:
        """(forward + backward) per layer on the deep stack over the 2-block row's."""
        shallow = self.forward_2_ms + self.backward_2_ms
        return (self.forward_deep_ms + self.backward_deep_ms) / shallow if shallow else 0.0


def parse(lines, only: str | None = None) -> list[DeepRow]:
    """The log lines that carry a deep GPU time (logs from before round 18 have none)."""
    pick = re.compile(only) if only else None
    out = []
    for line in lines:
        m = _LINE.search(line)
        if m is None or (pick is not None and not pick.search(m["setting"])):
            continue
        out.append(DeepRow(int(m["round"]), m["setting"], int(m["mb"]), int(m["deep"]),
                           float(m["f2"]), float(m["b2"]), float(m["f4"]), float(m["b4"])))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("log", type=Path, help="a calibrate.log")
    p.add_argument("--only", default=None, help="regular expression on the setting label")
    args = p.parse_args(argv)
    if not args.log.is_file():
        print(f"deep_gpu_ratio: no such file: {args.log}", file=sys.stderr)
        return 2
    rows = parse(args.log.read_text().splitlines(), args.only)
    if not rows:
        print(f"deep_gpu_ratio: no deep GPU times in {args.log} (calibrations before round 18 "
              "do not log them)", file=sys.stderr)
        return 1
    print("| round | setting | mb | fwd / bwd per layer, 2 blocks (ms) | on N blocks (ms) | "
          "ratio |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.round} | {r.setting} | {r.micro_batch} | {r.forward_2_ms:.3f} / "
              f"{r.backward_2_ms:.3f} | {r.deep}: {r.forward_deep_ms:.3f} / "
              f"{r.backward_deep_ms:.3f} | {r.ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
