"""``meshplan run plan.json``: start torchrun for a single node and run the plan.

torchrun (``python -m torch.distributed.run --standalone``) starts one process per GPU
running :mod:`meshplan.executor.run`. If the run fails before rank 0 could write the
results file (a rank died, or was out of memory and torchrun stopped the others), the
results file is written here from the ranks' error files, so a failed run still leaves a
``results.json`` saying what happened.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from meshplan.errors import ExecutorError
from meshplan.planner.planfile import load_plan_file, write_json_atomic


def torchrun_command(plan_path: str | Path, *, nproc: int, steps: int, warmup: int,
                     out: str | Path, force: bool, extra_args: Sequence[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "meshplan.executor.run",
           "--plan", str(plan_path), "--out", str(out), "--steps", str(steps),
           "--warmup", str(warmup)]
    if force:
        cmd.append("--force")
    return cmd + list(extra_args)


def run_local(plan_path: str | Path, *, nproc: int | None = None, steps: int = 30,
              warmup: int = 5, out: str | Path = "results.json", force: bool = False,
              extra_args: Sequence[str] = ()) -> int:
    """Run ``plan_path`` on this node with torchrun; return the exit code (0 = success).

    ``nproc`` defaults to the plan's dp·pp·tp. Raises :class:`ExecutorError` before
    starting anything if the results file exists (without ``force``) or ``nproc`` does not
    match the plan.
    """
    plan = load_plan_file(plan_path)
    need = plan.layout.num_gpus
    nproc = need if nproc is None else nproc
    if nproc != need:
        raise ExecutorError(f"the plan's layout {plan.layout.short()} needs {need} processes; "
                            f"nproc = {nproc} was given (a single-node run uses dp·pp·tp "
                            f"processes)")
    out = Path(out)
    if out.exists() and not force:
        raise ExecutorError(f"results file {str(out)!r} exists; refusing to overwrite it "
                            f"(pass --force to replace it)")
    from meshplan.executor.run import error_file
    for r in range(nproc):   # stale error files of an earlier run would be misread
        error_file(out, r).unlink(missing_ok=True)
    cmd = torchrun_command(plan_path, nproc=nproc, steps=steps, warmup=warmup, out=out,
                           force=force, extra_args=extra_args)
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    env = os.environ.copy()
    # the ranks import the same meshplan as this process, installed or not
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        _write_failure(plan, out, nproc, rc, cmd, force)
    return rc


def _write_failure(plan, out: Path, world: int, rc: int, cmd: list[str], force: bool) -> None:
    """Write results.json from the ranks' error files unless rank 0 wrote it for this run."""
    import json

    from meshplan.executor.run import RESULTS_SCHEMA, collect_rank_errors
    if out.exists():
        try:
            if json.loads(out.read_text()).get("status") == "failed":
                return   # rank 0 recorded the failure itself
        except (OSError, ValueError):
            pass
        if not force:
            return
    errs = collect_rank_errors(out, world)
    doc = {"schema": RESULTS_SCHEMA, "version": 1, "status": "failed",
           "command": " ".join(cmd), "model": plan.model.to_dict(),
           "cluster": plan.cluster.to_dict(), "job": plan.job.to_dict(),
           "layout": plan.layout.to_dict(), "prediction": plan.prediction, "measured": {},
           "errors_pct": {}, "environment": {},
           "error": {"torchrun_exit_code": rc, "ranks": errs}}
    write_json_atomic(out, doc, overwrite=True)


__all__ = ["run_local", "torchrun_command"]
