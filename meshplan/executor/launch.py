"""``meshplan run plan.json``: check the plan against this machine, start torchrun, clean up.

Before anything starts, the plan must fit this node: one node's worth of GPUs (a
multi-node plan gets launch scripts instead — :func:`meshplan.planner.launch.write_launch_script`),
that many GPUs visible, of the plan's type (or ``--device cpu`` for a functional run).

torchrun (``python -m torch.distributed.run --standalone``) starts one process per GPU
running :mod:`meshplan.executor.run`. It runs in a session of its own: SIGINT, SIGTERM and
SIGHUP sent to this process are forwarded to it (torchrun stops its workers and exits), the
kernel sends it SIGTERM if this process dies (``PR_SET_PDEATHSIG``), and on every way out
of :func:`run_local` — success, failure, exception, signal — it is waited for, and killed
if it outlives :data:`STOP_GRACE_S`. Its workers do the same towards torchrun, so no rank
outlives the launch.

If the run fails, ``results.json`` is written (atomically) from the ranks' error files and
torchrun's own failure report, with a one-line diagnosis naming the rank and the cause.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

from meshplan.errors import ExecutorError, MeshplanError
from meshplan.planner.planfile import check_output_file, load_plan_file, write_json_atomic

#: how long torchrun may take to stop its workers after a forwarded signal before it is
#: killed (torchrun itself waits 30 s for its workers before SIGKILL)
STOP_GRACE_S = 45.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def torchrun_command(plan_path: str | Path, *, nproc: int, steps: int, warmup: int,
                     out: str | Path, force: bool, extra_args: Sequence[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "meshplan.executor.run",
           "--plan", str(plan_path), "--out", str(out), "--steps", str(steps),
           "--warmup", str(warmup)]
    if force:
        cmd.append("--force")
    return cmd + list(extra_args)


def check_machine(plan, *, nproc: int, device: str | None, allow_gpu_mismatch: bool = False,
                  plan_path: str | Path = "plan.json") -> str:
    """Refuse a plan this node cannot run; return the device type ("cuda" or "cpu")."""
    layout, cluster = plan.layout, plan.cluster
    need = layout.num_gpus
    if need > cluster.gpus_per_node:
        nodes = -(-need // cluster.gpus_per_node)
        raise ExecutorError(
            f"the plan's layout {layout.short()} uses {need} GPUs = {nodes} nodes of "
            f"{cluster.gpus_per_node}; `meshplan run` starts one node. Write launch scripts "
            f"and run them on every node: `meshplan run {plan_path} --launch-dir DIR "
            f"--launcher torchrun|slurm` (or `meshplan plan ... --launch-dir DIR`)")
    if nproc != need:
        raise ExecutorError(f"the plan's layout {layout.short()} needs {need} processes; "
                            f"nproc = {nproc} was given (a single-node run uses dp·pp·tp "
                            f"processes)")
    try:
        import torch
    except ImportError as exc:
        raise ExecutorError(f"meshplan run needs PyTorch: pip install 'meshplan[executor]' "
                            f"({exc})") from None
    cuda = torch.cuda.is_available()
    device = device or ("cuda" if cuda else None)
    if device is None:
        raise ExecutorError(f"torch sees no GPU on this machine and the plan is for {need} × "
                            f"{cluster.gpu.name}; pass --device cpu for a functional run on "
                            f"the CPU, or write launch scripts for the GPU nodes (`meshplan "
                            f"run {plan_path} --launch-dir DIR`)")
    if device == "cuda":
        if not cuda:
            raise ExecutorError("--device cuda: torch sees no CUDA device")
        have = torch.cuda.device_count()
        if have < need:
            raise ExecutorError(f"the plan needs {need} GPUs on this node; {have} are visible "
                                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        from meshplan.executor.run_args import gpu_family
        name = torch.cuda.get_device_name(0)
        if gpu_family(name) != gpu_family(cluster.gpu.name) and not allow_gpu_mismatch:
            raise ExecutorError(f"the plan is for {cluster.gpu.name!r} GPUs but this node has "
                                f"{name!r}; re-plan for this GPU or pass --allow-gpu-mismatch")
    return device


def run_local(plan_path: str | Path, *, nproc: int | None = None, steps: int = 30,
              warmup: int = 5, out: str | Path = "results.json", force: bool = False,
              device: str | None = None, allow_gpu_mismatch: bool = False,
              extra_args: Sequence[str] = ()) -> int:
    """Run ``plan_path`` on this node with torchrun; return the exit code (0 = success).

    ``nproc`` defaults to the plan's dp·pp·tp; ``device`` to "cuda" where torch sees a
    GPU (``"cpu"`` runs the layout on CPU processes with gloo). Raises
    :class:`ExecutorError` before starting anything if this node cannot run the plan
    (:func:`check_machine`) or the results file exists (without ``force``).
    """
    from meshplan.executor.run_args import build_parser, check_checkpoint_args, effective_plan
    plan = load_plan_file(plan_path)
    extra = list(extra_args)
    # the ranks' own argument checks, here, before anything starts
    args = build_parser().parse_args(["--plan", str(plan_path), "--steps", str(steps),
                                      "--warmup", str(warmup), *extra])
    plan = effective_plan(plan, args)
    if args.device != "auto":   # the older way of asking for the CPU
        device = device or args.device
    check_checkpoint_args(plan, args)
    need = plan.layout.num_gpus
    nproc = need if nproc is None else nproc
    device = check_machine(plan, nproc=nproc, device=device,
                           allow_gpu_mismatch=allow_gpu_mismatch, plan_path=plan_path)
    if "--device" not in extra:
        extra += ["--device", device]
    if allow_gpu_mismatch and "--allow-gpu-mismatch" not in extra:
        extra.append("--allow-gpu-mismatch")
    try:   # the check every output file gets, raised as the run's error
        out = check_output_file(out, overwrite=force, what="results file", flag="--force",
                                example_name="results.json")
    except MeshplanError as exc:
        raise ExecutorError(str(exc)) from None
    if args.data is not None:
        check_token_file(args.data, args.data_dtype)
    if device == "cuda":   # after the cheap checks: it runs the cost model
        from meshplan.executor.run_results import warn_if_too_big
        warn_if_too_big(plan)
    from meshplan.executor.failures import error_file
    for r in range(nproc):   # stale error files of an earlier run would be misread
        error_file(out, r).unlink(missing_ok=True)
    cmd = torchrun_command(plan_path, nproc=nproc, steps=steps, warmup=warmup, out=out,
                           force=force, extra_args=extra)
    if device == "cuda":
        from meshplan.executor.gpu_busy import gpu_processes
        busy = gpu_processes()
        if busy:
            listed = ", ".join(f"pid {b['pid']}: {b['used_mib']} MiB" for b in busy)
            print(f"meshplan run: warning: {len(busy)} process(es) already on the GPUs "
                  f"({listed}); the measured step time will include their load",
                  file=sys.stderr, flush=True)
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    env = os.environ.copy()
    # the ranks import the same meshplan as this process, installed or not
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    rc, stderr_tail = supervise(cmd, env)
    if rc != 0:
        _write_failure(plan, out, nproc, rc, cmd, stderr_tail, extra)
    return rc


def check_token_file(path: str, dtype: str) -> None:
    """Refuse a token file the ranks could not read, before any of them starts."""
    width = {"uint16": 2, "uint32": 4}[dtype]
    p = Path(path)
    if not p.is_file():
        raise ExecutorError(f"--data {path!r}: no such file (a flat {dtype} token file)")
    size = p.stat().st_size
    if size == 0 or size % width:
        raise ExecutorError(f"--data {path!r} holds {size:,} bytes, not a whole positive number "
                            f"of {dtype} tokens ({width} bytes each); is --data-dtype right?")


def supervise(cmd: list[str], env: dict) -> tuple[int, str]:
    """Run ``cmd`` in its own session, forwarding signals; never leave it running."""
    from meshplan.executor.failures import die_with_parent
    tail: list[str] = []
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=die_with_parent, text=True, errors="replace")
    copier = threading.Thread(target=_tee, args=(proc.stderr, tail), daemon=True)
    copier.start()
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in _FORWARDED}
    try:
        rc = _wait(proc, None)
        if got:   # a forwarded signal: torchrun is stopping its workers
            rc = _wait(proc, STOP_GRACE_S)
    finally:
        if proc.poll() is None:
            proc.terminate()
            if _wait(proc, STOP_GRACE_S) is None:
                proc.kill()
                proc.wait()
        for s, h in old.items():
            signal.signal(s, h)
        copier.join(timeout=5)
        if not copier.is_alive():   # else the copier still reads it; it dies with us
            proc.stderr.close()
    if got:
        print(f"meshplan run: stopped by {signal.Signals(got[0]).name}; torchrun and its "
              f"workers have exited", file=sys.stderr, flush=True)
        rc = rc if rc else 128 + got[0]
    return proc.returncode if rc is None else rc, "".join(tail)


def _wait(proc, timeout):
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def _tee(stream, tail: list[str], keep_chars: int = 200_000) -> None:
    size = 0
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        tail.append(line)
        size += len(line)
        while size > keep_chars and len(tail) > 1:
            size -= len(tail.pop(0))


def _write_failure(plan, out: Path, world: int, rc: int, cmd: list[str], stderr_tail: str,
                   extra: list[str]) -> None:
    """Write results.json for a failed run: every rank's report, torchrun's, a diagnosis.
    A results file of this run that says "ok" (the failure came after it) is kept."""
    from meshplan.executor.failures import (collect_rank_errors, diagnose, root_cause_first,
                                            torchrun_failures)
    from meshplan.executor.run import RESULTS_SCHEMA
    if out.exists():
        try:
            if json.loads(out.read_text()).get("status") == "ok":
                return
        except (OSError, ValueError):
            pass
    errs = collect_rank_errors(out, world)
    reported = {e.get("rank") for e in errs}
    errs = root_cause_first(
        errs + [e for e in torchrun_failures(stderr_tail) if e["rank"] not in reported])
    from meshplan.executor.run_args import DEFAULT_TIMEOUT_S
    timeout = (float(extra[extra.index("--timeout-s") + 1]) if "--timeout-s" in extra
               else DEFAULT_TIMEOUT_S)
    summary = diagnose(errs, world, timeout)
    print(f"meshplan run: failed: {summary}", file=sys.stderr, flush=True)
    doc = {"schema": RESULTS_SCHEMA, "version": 1, "status": "failed",
           "command": " ".join(cmd), "model": plan.model.to_dict(),
           "cluster": plan.cluster.to_dict(), "job": plan.job.to_dict(),
           "layout": plan.layout.to_dict(), "prediction": plan.prediction, "measured": {},
           "errors_pct": {}, "environment": {},
           "error": {"summary": summary, "torchrun_exit_code": rc, "ranks": errs}}
    write_json_atomic(out, doc, overwrite=True)


__all__ = ["run_local", "torchrun_command", "check_machine", "supervise", "STOP_GRACE_S"]
