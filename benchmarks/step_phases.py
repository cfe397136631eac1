"""Where each validated layout's step goes, phase by phase, beside the model's prediction.

    python benchmarks/step_phases.py RUN/accuracy.json [--only "z[23]"]
    python benchmarks/step_phases.py RUN/accuracy.json --blocks \
        --profile docs/benchmarks/data/profiles/profile_h200x4_round26.toml

Reads an ``accuracy.json`` of ``validate_device.py`` (its records keep the executor's phase
marks). The executor times every step in phases (``ParallelTrainer.step``'s marks):
"passes" (forward and backward of every micro-batch, the pipeline schedule), "grads"
(gradient averaging outside DDP/FSDP2), "optimizer", "loss" (the global loss all-reduce),
each on the device's timeline (CUDA events: waits for the CPU included) and the host's.
Without a pipeline the passes are marked per micro-batch as well ("forward i", "backward i"),
and they count as passes here. This prints, per layout, the slowest rank's passes and tail
(grads + optimizer + loss) beside the model's: its step less its tail, and its tail
(``predicted.tail_s``: exposed data-parallel communication and the optimizer); where the run
has per-micro-batch marks, that rank's first forward and the mean of its later ones (a step
that starts with the GPU's queue empty pays in its first forward), and its mean backward.

Runs with the executor's ``--block-marks`` (``BLOCK_MARKS=1 ... device_accuracy.sh
validate``) also time each transformer block's forward and backward: ``--blocks`` prints
them per layout, for the slowest rank — each block's first micro-batch and the mean of its
later ones — beside the per-layer forward and backward the cost model prices from
``--profile`` (the calibrated rows, :func:`meshplan.costmodel.estimate.layer_tables`).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from pathlib import Path

from meshplan.errors import MeshplanError

TAIL_PHASES = ("grads", "optimizer", "loss")


def phase_rows(doc: dict, only: str | None = None) -> list[dict]:
    """One row per measured record that has phase timings (runs since round 19)."""
    pat = re.compile(only) if only else None
    rows = []
    for r in doc.get("records", []):
        meas, pred = r.get("measured") or {}, r.get("predicted") or {}
        ranks = [p for p in meas.get("phase_median_ms_per_rank") or [] if p]
        if r.get("status") != "ok" or not ranks:
            continue
        if pat and not pat.search(f"{r.get('model', '')} {r.get('short', '')}"):
            continue
        slowest = max(ranks, key=_passes_ms)
        passes = _passes_ms(slowest)
        tail = max(sum(p[k]["device_ms"] for k in TAIL_PHASES if k in p) for p in ranks)
        host_tail = max(sum(p[k]["host_ms"] for k in TAIL_PHASES if k in p) for p in ranks)
        tail_pred = 1e3 * pred["tail_s"] if "tail_s" in pred else None
        rows.append({
            "name": r.get("name"), "layout": r.get("short"), "model": r.get("model"),
            "step_ms": 1e3 * meas["step_time_s"], "pred_step_ms": 1e3 * pred["step_time_s"],
            "passes_ms": passes, "tail_ms": tail, "host_tail_ms": host_tail,
            "pred_passes_ms": (1e3 * pred["step_time_s"] - tail_pred
                               if tail_pred is not None else None),
            "pred_tail_ms": tail_pred, **_microbatch_ms(slowest)})
    return rows


def _passes_ms(phases: dict) -> float:
    """The passes on the device's timeline: every phase but the tail's."""
    return sum(v["device_ms"] for k, v in phases.items() if k not in TAIL_PHASES)


def _microbatch_ms(phases: dict) -> dict:
    """First forward, mean later forward and mean backward (ms) where the run marked each
    micro-batch; Nones where it did not (pipelines, runs before round 20)."""
    fwd = [v["device_ms"] for k, v in phases.items() if k.startswith("forward ")]
    bwd = [v["device_ms"] for k, v in phases.items() if k.startswith("backward ")]
    if not fwd or not bwd:
        return {"forward0_ms": None, "forward_later_ms": None, "backward_ms": None}
    return {"forward0_ms": fwd[0],
            "forward_later_ms": sum(fwd[1:]) / len(fwd[1:]) if len(fwd) > 1 else None,
            "backward_ms": sum(bwd) / len(bwd)}


BLOCK_PHASE = re.compile(r"^(before )?block (\d+) (forward|backward)(?: #(\d+))?$")


def block_times(phases: dict) -> dict[int, dict[str, list[float]]]:
    """Per block index: device ms per micro-batch (in order) of its forward, backward and
    of what ran before each ("before forward", "before backward")."""
    out: dict[int, dict[str, list[float]]] = {}
    for name, v in phases.items():
        m = BLOCK_PHASE.match(name)
        if not m:
            continue
        before, i, what, k = m.groups()
        key = ("before " if before else "") + what
        slot = out.setdefault(int(i), {}).setdefault(key, [])
        slot.append((int(k or 1), v["device_ms"]))
    return {i: {key: [ms for _, ms in sorted(vals)] for key, vals in d.items()}
            for i, d in sorted(out.items())}


def block_rows(doc: dict, only: str | None = None) -> list[dict]:
    """One row per measured record with block marks: the slowest rank's per-block times."""
    pat = re.compile(only) if only else None
    rows = []
    for r in doc.get("records", []):
        ranks = [p for p in (r.get("measured") or {}).get("phase_median_ms_per_rank") or []
                 if p]
        if r.get("status") != "ok" or not ranks:
            continue
        if pat and not pat.search(f"{r.get('model', '')} {r.get('short', '')}"):
            continue
        blocks = block_times(max(ranks, key=_passes_ms))
        if blocks:
            rows.append({"record": r, "blocks": blocks})
    return rows


def predicted_layer_ms(record: dict, job: dict, gpu_name: str, profile: Path, *,
                       plain: bool = False) -> tuple[float, float] | None:
    """The cost model's per-layer forward and backward (ms) for ``record`` on ``profile``
    (None for a model this script does not know). ``plain``: the same layout at ZeRO-0, i.e.
    priced from the plain (autocast) rows instead of FSDP2's — round 21's lead: GPT's
    FSDP2 steps at micro-batch 16 ran as slow as the plain rows plus FSDP2's own cost."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import layout_sets as ls
    from meshplan.costmodel.estimate import layer_tables
    from meshplan.spec import Job, Layout
    model = ls.MODELS.get(record.get("model"))
    if model is None:
        return None
    layout = Layout.from_dict(record["layout"])
    if plain:
        layout = layout.replace(zero=0)
    cluster = _profiled_cluster(gpu_name, layout.num_gpus, profile)
    t = layer_tables(model, cluster, Job.from_dict(job), layout)
    return 1e3 * t.layer_forward_s, 1e3 * t.layer_backward_s


@functools.lru_cache(maxsize=8)
def _profiled_cluster(gpu_name: str, nproc: int, profile: Path):
    """The lent GPUs' cluster with ``profile`` applied, read once per run of this script."""
    import layout_sets as ls
    from meshplan.hardware_profiles.calibrated import apply_profile
    return apply_profile(ls.gpu_cluster(gpu_name, nproc), profile)


def _first_later(vals: list[float] | None) -> str:
    if not vals:
        return "–"
    later = vals[1:]
    return f"{vals[0]:.2f}" + (f" / {sum(later) / len(later):.2f}" if later else "")


def block_table(row: dict, pred: tuple[float, float] | None,
                plain: tuple[float, float] | None = None) -> str:
    r = row["record"]
    pf, pb = pred if pred else (None, None)
    alt = (f" (plain rows at ZeRO-0: {_f(plain[0])}, {_f(plain[1])})"
           if plain and plain != pred else "")
    out = [f"{r.get('name')} {r.get('model')} {r.get('short')}: per block, first micro-batch / "
           f"mean of the later ones (device ms); model per layer: forward {_f(pf)}, backward "
           f"{_f(pb)}{alt}",
           "| block | forward | backward | before forward | before backward |",
           "|---|---|---|---|---|"]
    for i, d in row["blocks"].items():
        out.append(f"| {i} | {_first_later(d.get('forward'))} | "
                   f"{_first_later(d.get('backward'))} | {_first_later(d.get('before forward'))}"
                   f" | {_first_later(d.get('before backward'))} |")
    fwd = [sum(d.get("forward", [0.0])) for d in row["blocks"].values()]
    bwd = [sum(d.get("backward", [0.0])) for d in row["blocks"].values()]
    n = max(len(d.get("forward", [])) for d in row["blocks"].values())
    out.append(f"all blocks, all {n} micro-batches: forward {sum(fwd):.1f} ms, backward "
               f"{sum(bwd):.1f} ms" + (f"; the model's layers: {pf * n * len(fwd):.1f} / "
                                       f"{pb * n * len(bwd):.1f} ms" if pred else ""))
    return "\n".join(out)


def _f(v) -> str:
    return "–" if v is None else f"{v:.1f}"


def table(rows: list[dict]) -> str:
    out = ["| name | model | layout | step ms (pred) | passes ms (pred) | tail ms (pred) "
           "| tail host ms | forward 0 / later ms | backward ms |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['name']} | {r['model']} | {r['layout']} | {_f(r['step_ms'])} "
                   f"({_f(r['pred_step_ms'])}) | {_f(r['passes_ms'])} ({_f(r['pred_passes_ms'])})"
                   f" | {_f(r['tail_ms'])} ({_f(r['pred_tail_ms'])}) | {_f(r['host_tail_ms'])} "
                   f"| {_f(r['forward0_ms'])} / {_f(r['forward_later_ms'])} "
                   f"| {_f(r['backward_ms'])} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("accuracy", type=Path, help="accuracy.json from validate_device.py")
    p.add_argument("--only", default=None, help="regex on 'model layout' to keep")
    p.add_argument("--blocks", action="store_true",
                   help="per-block times of runs with the executor's --block-marks")
    p.add_argument("--profile", type=Path, default=None,
                   help="with --blocks: the run's calibrated profile, for the model's "
                        "per-layer times beside the measured ones")
    args = p.parse_args(argv)
    if args.profile is not None and not args.profile.is_file():
        print(f"step_phases: --profile {args.profile}: no such file", file=sys.stderr)
        return 2
    try:
        doc = json.loads(args.accuracy.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"step_phases: cannot read {args.accuracy}: {exc}", file=sys.stderr)
        return 2
    try:
        if args.blocks:
            return _print_blocks(doc, args)
        rows = phase_rows(doc, args.only)
    except MeshplanError as exc:      # --profile that is not a calibrated profile
        print(f"step_phases: {exc}", file=sys.stderr)
        return 2
    except re.error as exc:
        print(f"step_phases: --only {args.only!r} is not a regular expression: {exc}",
              file=sys.stderr)
        return 2
    if not rows:
        print(f"step_phases: no record in {args.accuracy} has phase timings (executor runs "
              f"since round 19 record them)", file=sys.stderr)
        return 1
    print(table(rows))
    return 0


def _print_blocks(doc: dict, args) -> int:
    rows = block_rows(doc, args.only)
    if not rows:
        print(f"step_phases: no record in {args.accuracy} has block timings (run the "
              f"executor with --block-marks: BLOCK_MARKS=1 ... validate)", file=sys.stderr)
        return 1
    for row in rows:
        pred = plain = None
        if args.profile and doc.get("job"):
            gpu = doc.get("gpu_name") or "H200"
            pred = predicted_layer_ms(row["record"], doc["job"], gpu, args.profile)
            plain = predicted_layer_ms(row["record"], doc["job"], gpu, args.profile, plain=True)
        print(block_table(row, pred, plain))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
