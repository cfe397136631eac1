"""Checkpoints of a training run: save every N steps, atomically and in the background; resume.

Layout of ``--checkpoint-dir DIR``::

    DIR/step-00000040/            a committed checkpoint: 40 optimizer steps done
        __0_0.distcp ...          DCP's files, one per rank (torch.distributed.checkpoint)
        .metadata                 DCP's index of every chunk
        meshplan.json             the commit record: step, seed, data, model, job, layout
    DIR/step-00000050.tmp-<run>/  a checkpoint being written (or left by a crash): ignored

What is saved: the model's parameters (fp32 master weights), AdamW's state (step, exp_avg,
exp_avg_sq) in the layout-free form of :mod:`meshplan.executor.checkpoint_state`, each
rank's random-number generators, and the data position — the number of steps done, since
the executor draws the batch of step ``i`` from (seed, i) alone
(:mod:`meshplan.executor.data`).

Atomic: every rank writes into ``step-K.tmp-<run>``; DCP's coordinator writes ``.metadata``
only after every rank has written and synced its files; then rank 0 writes
``meshplan.json``, syncs it and renames the directory to ``step-K`` (one ``rename``: a crash
before it leaves the previous checkpoint the latest, a crash after it a complete one).
Resume reads the highest committed ``step-*``.

In the background: the step loop pauses only to copy this rank's pieces to host memory
(pinned on GPU); a thread of its own then runs ``dcp.save`` on a process group of its own
(gloo), so its collectives never interleave with the training's — what torch's
``dcp.async_save`` does with its thread executor, done here the same way on every torch
version. The next save (and the end of the run) waits for the previous one.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from meshplan.errors import ExecutorError

SCHEMA = "meshplan.checkpoint"
MARKER = "meshplan.json"
PREFIX = "step-"


def step_dir_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def committed_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """[(steps done, path)] of the committed checkpoints in ``directory``, oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    out = []
    for p in d.iterdir():
        name = p.name
        if not name.startswith(PREFIX) or not name[len(PREFIX):].isdigit():
            continue   # .tmp-<run> and .old-<run> directories are not checkpoints
        if (p / MARKER).is_file() and (p / ".metadata").is_file():
            out.append((int(name[len(PREFIX):]), p))
    return sorted(out)


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = committed_checkpoints(directory)
    return found[-1][1] if found else None


def read_marker(path: str | Path) -> dict[str, Any]:
    p = Path(path) / MARKER
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ExecutorError(f"checkpoint {str(path)!r} has no readable {MARKER} ({exc}); "
                            f"it is not a committed meshplan checkpoint") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ExecutorError(f"{str(p)!r} is not a meshplan checkpoint record")
    return doc


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass
class SaveRecord:
    step: int
    path: str
    stage_s: float                 # the step loop's pause: copies to host memory
    rank_bytes: int                # bytes of the pieces this rank staged (before dedup)
    write_s: float | None = None   # thread start to commit (rank 0) / to its files done
    bytes: int | None = None       # files of the committed checkpoint (rank 0)
    error: str | None = None


@dataclass
class Checkpointer:
    """Saves this rank's part of a checkpoint; one save in flight at a time."""

    directory: Path
    every: int
    rank: int
    world: int
    group: Any                     # a gloo group of all ranks, used by DCP only
    run_id: str
    record: dict[str, Any]         # what rank 0 writes into meshplan.json
    keep: int = 0                  # committed checkpoints kept (0: all)
    crash_hook: Any = None         # test hook: called in the writer thread before commit
    saves: list[SaveRecord] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def due(self, steps_done: int, last: bool) -> bool:
        return self.every > 0 and (steps_done % self.every == 0 or last)

    def save(self, trainer, steps_done: int, device: torch.device) -> SaveRecord:
        """Stage this rank's state and write it in the background (after the previous save)."""
        from meshplan.executor.checkpoint_state import rng_state, state_bytes, training_state
        self.wait()
        t0 = time.perf_counter()
        state = training_state(trainer, copy_to_cpu=True)
        state.update(rng_state(self.rank, device))
        rec = SaveRecord(step=steps_done, path=str(self.directory / step_dir_name(steps_done)),
                         stage_s=time.perf_counter() - t0, rank_bytes=state_bytes(state))
        self.saves.append(rec)
        meta = dict(self.record, step=steps_done)
        self._thread = threading.Thread(target=self._write, args=(state, rec, meta),
                                        name=f"meshplan-checkpoint-{steps_done}", daemon=True)
        self._thread.start()
        return rec

    def wait(self) -> None:
        """Wait for the save in flight; raise if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        failed = [s for s in self.saves if s.error]
        if failed:
            s = failed[-1]
            raise ExecutorError(f"checkpoint of step {s.step} into {s.path!r} failed on rank "
                                f"{self.rank}: {s.error}")

    def _write(self, state: dict, rec: SaveRecord, meta: dict) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemWriter
        t0 = time.perf_counter()
        final = Path(rec.path)
        tmp = final.with_name(f"{final.name}.tmp-{self.run_id}")
        try:
            dcp.save(state, storage_writer=FileSystemWriter(str(tmp), sync_files=True),
                     process_group=self.group)
            if self.crash_hook is not None:
                self.crash_hook(rec.step)
            if self.rank == 0:
                rec.bytes = sum(f.stat().st_size for f in tmp.iterdir() if f.is_file())
                meta = dict(meta, bytes=rec.bytes, rank_staged_bytes=rec.rank_bytes,
                            created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
                _commit(tmp, final, meta, self.run_id)
                self._prune()
        except BaseException as exc:   # reported by wait() in the step loop
            rec.error = f"{type(exc).__name__}: {exc}"
        rec.write_s = time.perf_counter() - t0

    def _prune(self) -> None:
        found = committed_checkpoints(self.directory)
        if self.keep > 0:
            for _, p in found[:-self.keep]:
                shutil.rmtree(p, ignore_errors=True)
        for p in self.directory.iterdir():   # what crashed runs left half-written
            if ".tmp-" in p.name and not p.name.endswith(self.run_id):
                shutil.rmtree(p, ignore_errors=True)

    def summary(self) -> list[dict[str, Any]]:
        return [dict(vars(s)) for s in self.saves]


def _commit(tmp: Path, final: Path, meta: dict, run_id: str) -> None:
    marker = tmp / MARKER
    with open(marker, "w") as fh:
        json.dump(meta, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    old = None
    if final.exists():   # the same step saved again (a run resumed from an earlier one)
        old = final.with_name(f"{final.name}.old-{run_id}")
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_resumable(marker: dict, model, job, seed: int) -> None:
    """Refuse a checkpoint of another model, or one whose data order would differ."""
    saved = marker.get("model", {})
    mine = model.to_dict()
    diff = sorted(k for k in set(saved) | set(mine)
                  if k != "name" and saved.get(k) != mine.get(k))
    if diff:
        shown = ", ".join(f"{k}: {saved.get(k)!r} there, {mine.get(k)!r} here" for k in diff[:4])
        raise ExecutorError(f"the checkpoint holds another model ({shown}); resume with the "
                            f"plan's model or start a new --checkpoint-dir")
    if marker.get("seed") != seed:
        raise ExecutorError(f"the checkpoint was trained with --seed {marker.get('seed')}, "
                            f"this run has --seed {seed}: the data order would change; pass "
                            f"--seed {marker.get('seed')}")
    if marker.get("job", {}).get("seq_len") != job.seq_len:
        raise ExecutorError(f"the checkpoint was trained with seq_len "
                            f"{marker.get('job', {}).get('seq_len')}, the plan has "
                            f"{job.seq_len}")


def load(trainer, path: str | Path, *, group, rank: int, device: torch.device,
         same_layout: bool) -> dict[str, Any]:
    """Load a committed checkpoint into ``trainer`` in place; return its record.

    Model and optimizer load into any layout; the random-number generators only where the
    layout (and so each rank's role) is the same as when it was saved.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    from meshplan.executor.checkpoint_state import (ensure_optimizer_state, rng_state,
                                                    set_rng_state, training_state)
    path = Path(path)
    marker = read_marker(path)
    ensure_optimizer_state(trainer.optimizer)
    state = training_state(trainer, copy_to_cpu=False)
    rng = rng_state(rank, device) if same_layout else {}
    rng = {k: torch.empty_like(v) for k, v in rng.items()}
    try:
        dcp.load({**state, **rng}, storage_reader=FileSystemReader(str(path)),
                 process_group=group)
    except Exception as exc:
        raise ExecutorError(f"loading checkpoint {str(path)!r} failed: "
                            f"{type(exc).__name__}: {exc}") from exc
    if rng:
        set_rng_state(rng, rank, device)
    return marker


def require_support() -> None:
    """Refuse a torch without DCP's dunder checkpointable protocol (torch 2.5 onwards; the
    executor's pieces rely on it, :class:`~meshplan.executor.checkpoint_state.Pieces`)."""
    from torch.distributed.tensor import DTensor
    if not hasattr(DTensor, "__create_write_items__"):
        raise ExecutorError(f"checkpoints need torch >= 2.5 (torch.distributed.checkpoint's "
                            f"checkpointable protocol); this is torch {torch.__version__}")


def checkpoint_group(world: int):
    """A gloo group of every rank for DCP's own collectives (collective: all ranks call it)."""
    require_support()
    return dist.new_group(list(range(world)), backend="gloo")


__all__ = ["Checkpointer", "SaveRecord", "committed_checkpoints", "latest_checkpoint",
           "read_marker", "load", "check_resumable", "checkpoint_group", "step_dir_name"]
