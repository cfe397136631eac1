"""How a run ends when a rank fails, dies or hangs: bounded waits, per-rank reports, a diagnosis.

* Every process group (the world, dp, pp, tp, tied-embedding pairs) gets the run's
  ``--timeout-s``: a rank waiting in a collective for a peer that died or hangs raises
  after that long (gloo: "Timed out waiting ..."; NCCL: the watchdog aborts the
  communicator), instead of gloo's default 30 minutes.
* A rank that raises writes ``<results>.rank<R>.error.json`` (what, where, which step) and
  exits; torchrun then stops the other ranks with SIGTERM (and SIGKILL after its grace
  period), and each of them records "terminated" with the step, the phase and the Python
  stack where the signal found it — the hung rank's stack shows where it hangs.
* A rank that dies without a word (SIGKILL, the kernel's OOM killer, a segfault) writes
  nothing; the launcher names it from torchrun's failure report.
* Each rank asks the kernel for SIGTERM when its parent (torchrun) dies
  (``PR_SET_PDEATHSIG``). Python runs that signal's handler only between bytecodes of the
  main thread, so a rank blocked in C++ (a collective waiting for a hung peer, a device
  sync) would outlive a SIGKILLed torchrun by up to ``--timeout-s`` with its GPU busy; a
  thread waiting on the parent's exit (:func:`exit_when_orphaned`) records where the main
  thread was and ends the rank ``ORPHAN_GRACE_S`` later. A killed launcher, or a harness's
  ``subprocess.run(timeout=...)`` killing torchrun, leaves no orphan ranks.

:func:`diagnose` turns the reports into one sentence: the root cause first.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

from meshplan.errors import ConfigError

TIMEOUT_PATTERN = re.compile(r"timed? ?out|timeout|watchdog", re.IGNORECASE)
PEER_LOST_PATTERN = re.compile(r"connection closed|connection reset|remote process exited|"
                               r"broken pipe|peer", re.IGNORECASE)


def error_file(out: Path, rank: int) -> Path:
    return out.with_name(f"{out.name}.rank{rank}.error.json")


def classify(message: str) -> str:
    """'collective_timeout', 'peer_lost' or 'error' for an exception's message."""
    if TIMEOUT_PATTERN.search(message):
        return "collective_timeout"
    if PEER_LOST_PATTERN.search(message):
        return "peer_lost"
    return "error"


def collect_rank_errors(out: Path, world: int) -> list[dict]:
    """The ranks' error files, root cause first."""
    errs = []
    for r in range(world):
        p = error_file(out, r)
        if p.exists():
            try:
                errs.append(json.loads(p.read_text()))
            except (OSError, json.JSONDecodeError):
                errs.append({"rank": r, "kind": "error", "message": f"unreadable error file {p}"})
    return root_cause_first(errs)


_KIND_ORDER = {"out_of_memory": 0, "died": 1, "error": 2, "collective_timeout": 3,
               "peer_lost": 4, "terminated": 5}


def root_cause_first(errors: list[dict]) -> list[dict]:
    """The reports in the order :func:`diagnose` reads them: by kind (out of memory, died,
    error, timeouts, a lost peer, terminated), then, among ranks that died, one a signal
    killed (torchrun's negative exit code) before one that exited with a code, then by
    rank. A rank killed by a signal is the outside cause; a rank that exits with a code
    (the executor's ``EXIT_FAILED`` when torchrun stops it after a peer's death) is its
    consequence, and torchrun may list it first when the host is busy."""
    def key(e: dict) -> tuple:
        code = e.get("exitcode")
        signalled = isinstance(code, int) and code < 0
        return (_KIND_ORDER.get(e.get("kind"), 1), 0 if signalled else 1, e.get("rank", 0))
    return sorted(errors, key=key)


def diagnose(errors: list[dict], world: int, timeout_s: float | None = None) -> str:
    """One sentence naming the failing rank(s) and the cause.

    Order: a rank out of memory; a rank that died without a report (a signal); a rank's own
    error. A hang shows as ranks timing out in a collective: the suspects are the ranks that
    got least far — fewest (step, phase marks) — and those that never reported."""
    by_kind: dict[str, list[dict]] = {}
    for e in errors:
        by_kind.setdefault(e.get("kind", "error"), []).append(e)
    reported = {e.get("rank") for e in errors}
    silent = [r for r in range(world) if r not in reported]

    def ranks(es) -> str:
        return ", ".join(str(e.get("rank")) for e in es)

    for kind in ("out_of_memory", "died", "error"):
        if kind in by_kind:
            e = by_kind[kind][0]
            return f"rank {e.get('rank')} {_what(e)}"
    waits = by_kind.get("collective_timeout", [])
    after = f" after {timeout_s:g} s" if timeout_s else ""
    if waits:
        step = waits[0].get("step")
        if silent:
            return (f"rank {', '.join(map(str, silent))} never reported (hung in native code "
                    f"or killed): rank {ranks(waits)} timed out{after} waiting in a "
                    f"collective at step {step}")
        progressed = [e for e in errors if isinstance(e.get("progress"), list)]
        if progressed:
            least = min(tuple(e["progress"]) for e in progressed)
            behind = [e for e in progressed if tuple(e["progress"]) == least]
            if len(behind) < len(progressed):
                return (f"rank {ranks(behind)} stopped responding (hung) at step "
                        f"{least[0]}, behind the other ranks: rank {ranks(waits)} timed "
                        f"out{after} waiting for it in a collective")
        return (f"rank {ranks(waits)} timed out{after} in a collective at step {step}; no "
                f"rank was behind the others (a hang inside a collective or the network)")
    if silent:
        return (f"rank {', '.join(map(str, silent))} ended without a report (killed: "
                f"SIGKILL, the kernel's OOM killer or a crash)")
    if "peer_lost" in by_kind:
        return f"rank {ranks(by_kind['peer_lost'])} lost a peer"
    if "terminated" in by_kind:
        return f"rank {ranks(by_kind['terminated'])} was stopped by a signal"
    return "the run failed without a report from any rank"


def _what(e: dict) -> str:
    if e.get("kind") == "died":
        return f"died: {e.get('message', '')}"
    return f"failed at {e.get('phase', '?')} step {e.get('step', '?')}: {e.get('message', '')}"


_TORCHRUN_FAILURE = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)"
                               r"(?:[^\n]*\n){0,3}?\s*traceback\s*:\s*([^\n]*)")


def torchrun_failures(stderr_text: str) -> list[dict]:
    """Ranks that torchrun reports as failed (its ChildFailedError table): rank, exit code,
    and its one-line cause ("Signal 9 (SIGKILL) received by PID ...")."""
    out = {}
    for m in _TORCHRUN_FAILURE.finditer(stderr_text):
        rank, code, why = int(m.group(1)), int(m.group(2)), m.group(3).strip()
        sig = f" (signal {-code}: {_signal_name(-code)})" if code < 0 else ""
        out[rank] = {"rank": rank, "kind": "died", "exitcode": code,
                     "message": f"exit code {code}{sig}; torchrun: {why}"}
    return list(out.values())


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return "unknown"


# ---- in the ranks ---------------------------------------------------------------------------
def set_group_timeouts(groups, seconds: float, extra: tuple = ()) -> None:
    """Give every group of the mesh (and the world), and ``extra`` groups (the expert
    groups), the run's timeout; subgroups otherwise keep the backend's default (gloo 30
    min, NCCL 10 min)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    setter = getattr(c10d, "_set_pg_timeout", None)
    if setter is None:
        return
    t = timedelta(seconds=seconds)
    seen = set()
    for g in (None, groups.dp_group, groups.pp_group, groups.tp_group, groups.embed_group,
              *extra):
        if g is not None and id(g) in seen:
            continue
        seen.add(id(g))
        if g is None and dist.is_initialized():
            setter(t, None)
        elif g is not None:
            setter(t, g)


def die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent dies (a killed torchrun or launcher)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        parent = os.getppid()
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:   # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)
    except (OSError, AttributeError):
        pass


ORPHAN_GRACE_S = 10.0
#: test hook: seconds of grace for ranks started by torchrun (default :data:`ORPHAN_GRACE_S`)
ORPHAN_GRACE_ENV = "MESHPLAN_ORPHAN_GRACE_S"


def _orphan_grace_s() -> float:
    """$MESHPLAN_ORPHAN_GRACE_S as seconds (unset or empty: :data:`ORPHAN_GRACE_S`)."""
    raw = os.environ.get(ORPHAN_GRACE_ENV)
    if not raw:
        return ORPHAN_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ConfigError(f"{ORPHAN_GRACE_ENV}={raw!r}: expected seconds >= 0, "
                          f"e.g. {ORPHAN_GRACE_S:g}")
    return value


def exit_when_orphaned(rank: int, out: Path, state: dict, parent_pid: int,
                       grace_s: float | None = None) -> threading.Thread:
    """End this rank ``grace_s`` after its parent (torchrun) has died, if it is still alive.

    :func:`die_with_parent`'s SIGTERM reaches a rank blocked in C++ only when the call
    returns; until then the rank keeps its GPU. Seen on 2 x H200 (2026-11-30): a hung
    layout's two ranks, left by a harness that SIGKILLed their torchrun at its 150 s
    timeout, spun both GPUs at 100 % for the ten minutes of NCCL's timeout and slowed every
    run after them 1.7-3.5x (docs/benchmarks/gpu_checks.md). The thread blocks on the
    parent's exit (a pidfd; polling ``getppid`` each second where there is none), gives the
    signal handler ``grace_s`` to end the rank, then writes the rank's "terminated" record
    with the main thread's stack and ends it with ``os._exit`` (nothing else can interrupt
    the main thread).

    ``grace_s`` defaults to $MESHPLAN_ORPHAN_GRACE_S if set (tests set it small), else
    :data:`ORPHAN_GRACE_S`."""
    if grace_s is None:
        grace_s = _orphan_grace_s()

    def watch():
        _wait_for_exit(parent_pid)
        time.sleep(grace_s)
        frame = sys._current_frames().get(threading.main_thread().ident)
        message = (f"rank {rank}: its torchrun (pid {parent_pid}) ended and {grace_s:g} s "
                   f"later the rank was still blocked outside Python (a collective or a device "
                   f"sync, where SIGTERM's handler cannot run): ended")
        if not state.get("failed"):
            write_error(out, rank, _terminated(rank, state, message, frame))
        sys.stderr.write(f"[meshplan.executor] {message}\n")
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)

    t = threading.Thread(target=watch, name="meshplan-orphan-watch", daemon=True)
    t.start()
    return t


def _wait_for_exit(pid: int) -> None:
    """Block until process ``pid`` (this process's parent) has exited."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):   # no pidfd here, or the parent is already gone
        fd = None
    if fd is not None:
        try:
            select.select([fd], [], [])
            return
        except OSError:
            pass
        finally:
            os.close(fd)
    while os.getppid() == pid:
        time.sleep(1.0)


def install_term_handler(rank: int, out: Path, state: dict, on_exit) -> None:
    """On SIGTERM/SIGHUP: record where this rank was (and its stack), then ``on_exit``."""
    def handler(signum, frame):
        err = None
        if not state.get("failed"):
            err = _terminated(rank, state,
                              f"rank {rank} received {_signal_name(signum)} at "
                              f"{state.get('phase')} step {state.get('step')} (torchrun stops "
                              f"the other ranks when one fails)", frame)
            write_error(out, rank, err)
        on_exit(err)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def _terminated(rank: int, state: dict, message: str, frame) -> dict:
    """A "terminated" rank record: where the rank was (``state``) and the stack at ``frame``."""
    return {"rank": rank, "kind": "terminated", "phase": state.get("phase"),
            "step": state.get("step"), "progress": [state.get("step"), state.get("marks", 0)],
            "message": message,
            "stack": "".join(traceback.format_stack(frame)[-8:]) if frame else ""}


def write_error(out: Path, rank: int, err: dict) -> None:
    from meshplan.planner.planfile import write_json_atomic
    try:
        write_json_atomic(error_file(out, rank), err)
    except OSError:
        pass


def maybe_inject_failure(rank: int, step: int) -> None:
    """Test hook: MESHPLAN_EXECUTOR_INJECT="RANK:STEP:KIND" makes that rank fail at that step.

    KIND: oom (raises torch.cuda.OutOfMemoryError), error (RuntimeError), kill (SIGKILL to
    itself: dies without a report), hang (sleeps until it is stopped), block (the main
    thread waits outside the interpreter with SIGTERM and SIGHUP masked, so the signals go
    to another thread and their Python handler never runs: what a device sync waiting on a
    hung collective does)."""
    spec = os.environ.get("MESHPLAN_EXECUTOR_INJECT")
    if not spec:
        return
    r, s, kind = spec.split(":")
    if int(r) != rank or int(s) != step:
        return
    import torch
    if kind == "oom":
        raise torch.cuda.OutOfMemoryError("injected out-of-memory (test hook)")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        while True:
            time.sleep(1.0)
    if kind == "block":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
        threading.Event().wait()
    if kind == "error":
        raise RuntimeError("injected failure (test hook)")


def checkpoint_crash_hook(rank: int):
    """Test hook: MESHPLAN_EXECUTOR_INJECT="RANK:STEP:crash-in-checkpoint" ends that rank
    (os._exit) after its checkpoint of STEP steps is written, before the commit."""
    spec = os.environ.get("MESHPLAN_EXECUTOR_INJECT", "")
    parts = spec.split(":")
    if len(parts) != 3 or parts[2] != "crash-in-checkpoint" or int(parts[0]) != rank:
        return None
    at = int(parts[1])

    def hook(step: int) -> None:
        if step == at:
            print(f"[meshplan.executor] rank {rank}: injected crash while committing the "
                  f"checkpoint of step {step} (test hook)", file=sys.stderr, flush=True)
            os._exit(9)
    return hook


# ---- out of memory --------------------------------------------------------------------------
def smaller_alternative(plan, prediction: dict) -> tuple[int, dict] | None:
    """The plan's best-ranked candidate predicted to need less memory than this layout."""
    mine = prediction.get("memory_peak_bytes")
    if not isinstance(mine, (int, float)):
        return None
    current = plan.layout.to_dict()
    for i, c in enumerate(plan.candidates):
        if not isinstance(c, dict) or c.get("layout") == current:
            continue
        peak = (c.get("prediction") or {}).get("memory_peak_bytes")
        if isinstance(peak, (int, float)) and peak < mine:
            return i, c
    return None


def oom_message(plan, prediction: dict, predicted_b, reached_b, capacity_b, exc) -> str:
    from meshplan.spec import Layout
    msg = (f"out of memory: predicted peak {_gib(predicted_b)} for this pipeline stage, "
           f"reached {_gib(reached_b)} allocated of {_gib(capacity_b)} when it failed.")
    alt = smaller_alternative(plan, prediction)
    if alt is not None:
        i, c = alt
        lay = Layout.from_dict(c["layout"])
        p = c.get("prediction") or {}
        msg += (f" The plan's next alternative with less memory is candidate {i}: "
                f"{lay.short()} (predicted peak {_gib(p.get('memory_peak_bytes'))}, "
                f"{p.get('tokens_per_s', 0):,.0f} tokens/s); run it with --candidate {i}.")
    else:
        msg += (" The plan file lists no alternative with less memory; try recompute="
                "'selective' or 'full', a higher ZeRO stage, a smaller micro_batch, or more "
                "pp/tp.")
    return f"{msg} ({str(exc).splitlines()[0]})"


def _gib(v) -> str:
    return "unknown" if not isinstance(v, (int, float)) else f"{v / 2**30:.2f} GiB"


__all__ = ["error_file", "collect_rank_errors", "root_cause_first", "diagnose",
           "torchrun_failures", "classify",
           "set_group_timeouts", "die_with_parent", "exit_when_orphaned", "install_term_handler",
           "write_error", "maybe_inject_failure", "checkpoint_crash_hook", "smaller_alternative",
           "oom_message"]
