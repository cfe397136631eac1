"""What a step that starts with an empty GPU queue costs, for measured pp-1 layouts (post hoc).

    python benchmarks/step_start_drain.py [--sets holdout20,pair14] [--only REGEX]

Until round 20 the executor copied every step's batch from pageable host memory, which
makes the CPU wait for every queued kernel (CUDA runtime API, "API synchronization
behavior"), so each step began with the GPU idle and the CPU dispatching from zero. The
cost model assumes the CPU runs ahead across steps: a step costs max(CPU, GPU). This races
the two from zero instead, op by op, for one step of a layout without a pipeline — per
micro-batch the embedding, every layer and the output forward, then their backward in
reverse, each costing the profile's CPU dispatch (the layer row's, with its per-call part)
and the cost model's GPU time — and prints how much later the GPU finishes than
max(CPU, GPU), beside the layout's measured miss. Each set is re-predicted with the
profile it was measured with (found by the date in its ``gpu_profile``).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from meshplan.costmodel.estimate import estimate, layer_tables  # noqa: E402
from meshplan.spec import Job, Layout  # noqa: E402
from repredict_sets import measured_records  # noqa: E402
from validate_device import GPT_05B, LLAMA_16B  # noqa: E402

BENCH = ROOT / "docs" / "benchmarks"
SETS = [f"holdout{i}" for i in (7, 8, 9, 10, 11, 12, 13, 16, 17, 18, 19, 20)] + [
    "pair12", "pair14"]


def race_s(ops: list[tuple[float, float]]) -> float:
    """When the GPU finishes ``ops`` ((CPU dispatch, GPU time) each, in order) if both
    start at 0 and an op's GPU work cannot begin before the CPU has dispatched it."""
    cpu = gpu = 0.0
    for c, g in ops:
        cpu += c
        gpu = max(gpu, cpu) + g
    return gpu


def step_ops(model, cluster, job: Job, layout: Layout) -> list[tuple[float, float]] | None:
    """One step's ops of a pp-1 layout, or None where the profile lacks CPU times."""
    t = layer_tables(model, cluster, job, layout)
    tables = cluster.gpu.measured
    if not t.cpu_known or tables is None:
        return None
    kw = dict(seq_len=job.seq_len, tp=layout.tp, sequence_parallel=layout.sequence_parallel,
              micro_batch=layout.micro_batch)
    row = tables.layer(model, recompute=layout.recompute, zero=layout.zero, dp=layout.dp, **kw)
    emb, out = tables.end(model, "embedding", **kw), tables.end(model, "output", **kw)
    if row is None or emb is None or out is None or row.forward_cpu_s <= 0:
        return None
    one = ([(row.forward_cpu_fixed_s + emb.forward_cpu_s, t.first_forward_s)]
           + [(row.forward_cpu_s, t.layer_forward_s)] * model.num_layers
           + [(out.forward_cpu_s, t.last_forward_s),
              (row.backward_cpu_fixed_s + out.backward_cpu_s, t.last_backward_s)]
           + [(row.backward_cpu_s, t.layer_backward_s)] * model.num_layers
           + [(emb.backward_cpu_s, t.first_backward_s)])
    return one * t.num_microbatches


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--only", default=None, help="regex on 'model layout'")
    args = p.parse_args(argv)
    models = {m.name: m for m in (GPT_05B, LLAMA_16B)}
    try:
        pat = re.compile(args.only) if args.only else None
    except re.error as exc:
        print(f"step_start_drain: --only {args.only!r} is not a regular expression: {exc}",
              file=sys.stderr)
        return 2
    missing = [s for s in args.sets.split(",") if not (BENCH / f"accuracy_{s}.json").is_file()]
    if missing:
        known = sorted(f.stem.removeprefix("accuracy_") for f in BENCH.glob("accuracy_*.json"))
        print(f"step_start_drain: no measured set {', '.join(map(repr, missing))} in {BENCH}; "
              f"measured sets: {', '.join(known)}", file=sys.stderr)
        return 2
    print("| set | name | model | layout | CPU/GPU | drain ms | measured − predicted ms "
          "| error % | with the drain % |")
    print("|---|---|---|---|---|---|---|---|---|")
    before, after = [], []
    for s, cluster, job, r in measured_records(args.sets.split(","), BENCH):
        layout = Layout.from_dict(r["layout"])
        model = models.get(r.get("model"))
        if layout.pp != 1 or model is None:
            continue
        if pat and not pat.search(f"{model.name} {layout.short()}"):
            continue
        ops = step_ops(model, cluster, job, layout)
        if ops is None:
            continue
        gpu = sum(g for _, g in ops)
        drain = race_s(ops) - max(sum(c for c, _ in ops), gpu)
        pred = estimate(model, cluster, job, layout).time.total_s
        meas = r["measured"]["step_time_s"]
        before.append(abs(pred - meas) / meas)
        after.append(abs(pred + drain - meas) / meas)
        print(f"| {s} | {r['name']} | {model.name} | {layout.short()} "
              f"| {sum(c for c, _ in ops) / gpu:.2f} | {1e3 * drain:+.1f} "
              f"| {1e3 * (meas - pred):+.1f} | {100 * (pred - meas) / meas:+.1f} "
              f"| {100 * (pred + drain - meas) / meas:+.1f} |")
    if before:
        print(f"\n{len(before)} layouts: mean |error| {100 * statistics.mean(before):.2f} % "
              f"as predicted, {100 * statistics.mean(after):.2f} % with the drain added")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
