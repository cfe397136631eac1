"""The validate driver: run layouts with the executor and compare with the cost model.

For each layout: predict with :func:`meshplan.costmodel.estimate` (never the CP-SAT planner,
so no ortools), write a plan file, run it with ``torchrun -m meshplan.executor.run`` in a
subprocess with a timeout, and read its results.json. A layout that runs out of memory,
fails or times out is recorded as such and the next one runs. Then: mean and max absolute
step-time error, per-rank peak-memory error, Spearman rank correlation and whether the
predicted-best layout is the measured-best (and by how much it is slower if not).

This module runs the layouts; beside it: which layouts
(:mod:`~meshplan.calibrate.validate_layouts`), a layout's record, its measurement and errors
(:mod:`~meshplan.calibrate.validate_records`), and the summary with the accuracy files
(:mod:`~meshplan.calibrate.validate_summary`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from meshplan.calibrate.validate_layouts import (enumerate_layouts, layouts_from_json,
                                                 pick_spread)
from meshplan.calibrate.validate_records import (merge_runs, predicted_memory_per_rank,
                                                 predicted_record, read_measurement, rescore,
                                                 score)
from meshplan.calibrate.validate_summary import (bound_split_text, by_model, summarize,
                                                 write_accuracy)
from meshplan.costmodel import estimate
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.errors import ConfigError, MeshplanError
from meshplan.executor.child_env import child_env
from meshplan.hardware_profiles import Cluster
from meshplan.planner.planfile import save_plan_file

_OOM = re.compile(r"out of memory|OutOfMemoryError|CUDA error: out of memory", re.I)


@dataclass(frozen=True, kw_only=True)
class ValidateOptions:
    out_dir: Path
    nproc: int
    device: str = "cuda"               # cuda | cpu
    steps: int = 10
    warmup: int = 3
    timeout_s: float = 120.0           # per layout
    budget_s: float | None = None      # all layouts; later ones are skipped when exceeded
    # runs per layout, in rounds (every layout once, then again): a host-bound layout's step
    # moved up to 37 % between runs on one machine (docs/benchmarks/accuracy.md, round 14),
    # so one run is one sample; the record keeps every run and measures by their median
    repeats: int = 1
    # the executor's torch.profiler trace of its first measured steps, into OUT/NAME/trace
    # (diagnostics; the traced steps are slower)
    trace: bool = False
    extra_args: tuple[str, ...] = ()
    python: str = sys.executable
    runner_module: str = "meshplan.executor.run"   # tests swap in a stand-in executor
    log: Callable[[str], None] = field(default=lambda m: print(m, file=sys.stderr, flush=True))


def run_layouts(model: ModelSpec | Sequence[ModelSpec], cluster: Cluster, job: Job,
                layouts: Sequence[Layout], options: ValidateOptions, *,
                names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run each layout with the executor and score it against its prediction (``model``:
    one for all layouts, or one per layout); with
    ``options.repeats`` > 1, in rounds (all layouts once, then all again, ...), so that a
    change in the host's speed falls on every layout rather than on one, and each record
    is measured by the median of its runs
    (:func:`~meshplan.calibrate.validate_records.merge_runs`). A layout that did not run in
    the first round (invalid, out of memory, failed, timed out, over the budget) is not
    repeated; a round cut short by the budget leaves the later layouts with fewer runs."""
    if isinstance(options.repeats, bool) or not isinstance(options.repeats, int) \
            or options.repeats < 1:
        raise ConfigError(f"repeats must be an integer >= 1, got {options.repeats!r}")
    models = [model] * len(layouts) if isinstance(model, ModelSpec) else list(model)
    if len(models) != len(layouts):
        raise ConfigError(f"run_layouts: {len(models)} models for {len(layouts)} layouts; "
                          f"give one model, or one per layout")
    options.out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    records: list[dict[str, Any]] = []
    runs: list[list[dict[str, Any]]] = []
    ests = []
    for i, (model_i, layout) in enumerate(zip(models, layouts)):
        name = names[i] if names else f"L{i:02d}"
        rec: dict[str, Any] = {"name": name, "layout": layout.to_dict(), "short": layout.short(),
                               "model": model_i.name}
        records.append(rec)
        runs.append([])
        try:
            ests.append(estimate(model_i, cluster, job, layout))
        except MeshplanError as exc:
            ests.append(None)
            rec.update(status="invalid", error=str(exc))
            options.log(f"[{i + 1}/{len(layouts)}] {name} {layout.short()}: invalid: {exc}")
            continue
        rec["predicted"] = predicted_record(ests[-1], layout, cluster)
    for k in range(options.repeats):
        for i, (model_i, layout, rec, est) in enumerate(zip(models, layouts, records, ests)):
            if est is None or (k > 0 and runs[i][0].get("status") != "ok"):
                continue
            if options.budget_s is not None and time.perf_counter() - t_start > options.budget_s:
                if k == 0:
                    runs[i].append({"status": "skipped",
                                    "error": f"time budget of {options.budget_s:.0f} s spent"})
                continue
            run_dir = (options.out_dir / f"run{k + 1}" if k else options.out_dir) / rec["name"]
            run = _run_one(model_i, cluster, job, layout, est, run_dir, options)
            runs[i].append(run)
            _log_run(options, i, len(layouts), rec, est, run,
                     f" run {k + 1}/{options.repeats}" if options.repeats > 1 else "")
    for rec, rec_runs in zip(records, runs):
        if rec_runs:
            rec.update(merge_runs(rec_runs, rec.get("predicted")))
    return records


def _log_run(options: ValidateOptions, i: int, n: int, rec: dict[str, Any], est,
             run: dict[str, Any], which: str) -> None:
    m = run.get("measured", {})
    probes = [v for v in m.get("host_probe_us_per_rank") or [] if v is not None]
    msg = (f"predicted {est.step_time_s:.4f} s, measured {m['step_time_s']:.4f} s "
           f"({run['step_time_error_pct']:+.1f}%)"
           + (f", CPU {est.host_load:.0%} of GPU (predicted)" if est.host_dispatch_s > 0 else "")
           + (f", host probe {max(probes):.1f} us" if probes else "")
           if run["status"] == "ok"
           else f"{run['status']}: {run.get('error', '')[:200]}")
    options.log(f"[{i + 1}/{n}] {rec['name']} {rec['short']}{which}: {msg} "
                f"[{run.get('wall_s', 0):.0f} s]")


def collective_timeout_s(layout_timeout_s: float) -> float:
    """The run's ``--timeout-s`` under a layout timeout: four fifths of it, at least 30 s
    (the executor's own default, 600 s, outlasts any layout timeout)."""
    return max(30.0, 0.8 * layout_timeout_s)


def _run_one(model, cluster, job, layout, est, d: Path, options: ValidateOptions
             ) -> dict[str, Any]:
    d.mkdir(parents=True, exist_ok=True)
    plan = save_plan_file(d / "plan.json", model, cluster, job, layout, est.to_dict())
    results = d / "results.json"
    results.unlink(missing_ok=True)
    n = layout.num_gpus
    cmd = [options.python, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={n}", "-m", options.runner_module, "--plan", str(plan),
           "--out", str(results), "--steps", str(options.steps), "--warmup", str(options.warmup),
           *(["--device", options.device] if options.device else []),
           *(["--profile", str(d / "trace")] if options.trace else []),
           # a hung collective fails inside the run (NCCL names it; every rank reports where
           # it was) before this layout's timeout kills torchrun
           *([] if "--timeout-s" in options.extra_args
             else ["--timeout-s", f"{collective_timeout_s(options.timeout_s):g}"]),
           *options.extra_args]
    env = child_env()
    if options.device == "cpu":
        # ranks share the cores: one thread each keeps them from fighting over them
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    busy = []
    if options.device != "cpu":
        from meshplan.executor.gpu_busy import wait_for_idle_gpus
        busy = wait_for_idle_gpus()
        if busy:
            options.log(f"warning: processes still on the GPUs before this run (its time "
                        f"includes theirs): {busy}")
    t0 = time.perf_counter()
    log_path = d / "log.txt"
    try:
        with log_path.open("w") as log:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=options.timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"no result within {options.timeout_s:.0f} s",
                "wall_s": time.perf_counter() - t0, "command": " ".join(cmd)}
    wall = time.perf_counter() - t0
    text = log_path.read_text(errors="replace")
    base = {"wall_s": wall, "command": " ".join(cmd), "log": str(log_path),
            **({"gpu_busy_at_start": busy} if busy else {})}
    if rc != 0 or not results.exists():
        status = "oom" if _OOM.search(text) else "failed"
        return {**base, "status": status, "returncode": rc, "error": _error_line(text)}
    try:
        meas = read_measurement(json.loads(results.read_text()), n)
    except (ValueError, KeyError, TypeError) as exc:
        return {**base, "status": "failed", "error": f"unreadable {results}: {exc}"}
    return {**base, "status": "ok", "measured": meas,
            **score(predicted_record(est, layout, cluster), meas)}


_ERROR_LINE = re.compile(r"(Error|Exception|error:|No module named)")


def _error_line(text: str) -> str:
    """The child's own error (the last exception line), not torchrun's failure banner."""
    hits = [line.strip() for line in text.splitlines() if _ERROR_LINE.search(line)
            and "ChildFailedError" not in line and "elastic" not in line]
    if hits:
        return hits[-1][:500]
    return " | ".join(text.strip().splitlines()[-3:])[:500]


__all__ = ["ValidateOptions", "collective_timeout_s", "run_layouts", "enumerate_layouts",
           "pick_spread", "layouts_from_json", "predicted_memory_per_rank", "predicted_record",
           "score", "rescore", "merge_runs", "read_measurement", "summarize", "bound_split_text",
           "by_model", "write_accuracy"]
