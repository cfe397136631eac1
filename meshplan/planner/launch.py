"""Launch scripts for a plan: torchrun (multi-node rendezvous) and SLURM (``srun torchrun``).

Both run ``python -m meshplan.executor.run --plan plan.json --out results.json`` on every
GPU (torchrun's ``-m``); the plan file is copied next to the script.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from meshplan.errors import ConfigError, MeshplanError

LAUNCHERS = ("torchrun", "slurm")

_TORCHRUN = """#!/usr/bin/env bash
# meshplan launch script (torchrun) — {summary}
# {gpus} GPUs = {nnodes} node(s) × {nproc} GPUs. Run this script once on EVERY node, with the
# same MASTER_ADDR / MASTER_PORT / RDZV_ID everywhere; torchrun's c10d rendezvous assigns ranks.
#
# Environment variables (defaults in brackets):
#   MASTER_ADDR     host name or IP of the rendezvous node, reachable from all nodes [localhost]
#   MASTER_PORT     free TCP port on MASTER_ADDR [29500]
#   RDZV_ID         job id shared by all nodes of one run [meshplan-$USER]
#   NNODES          nodes taking part [{nnodes}]
#   NPROC_PER_NODE  processes (GPUs) per node [{nproc}]
#   PLAN            plan file [the plan.json next to this script]
#   OUT             results file written by rank 0 [results.json next to this script]
#   TORCHRUN        torchrun executable [torchrun]
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
: "${{MASTER_ADDR:=localhost}}"
: "${{MASTER_PORT:=29500}}"
: "${{RDZV_ID:=meshplan-${{USER:-user}}}}"
: "${{NNODES:={nnodes}}}"
: "${{NPROC_PER_NODE:={nproc}}}"
: "${{PLAN:=$HERE/plan.json}}"
: "${{OUT:=$HERE/results.json}}"
: "${{TORCHRUN:=torchrun}}"
exec "$TORCHRUN" --nnodes="$NNODES" --nproc-per-node="$NPROC_PER_NODE" \\
    --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$RDZV_ID" \\
    -m meshplan.executor.run --plan "$PLAN" --out "$OUT" "$@"
"""

_SLURM = """#!/usr/bin/env bash
# meshplan launch script (SLURM) — {summary}
# Submit from this directory:  sbatch {name}
# One task per node; srun starts torchrun on each, which starts {nproc} processes per node.
#
# Environment variables (defaults in brackets):
#   MASTER_PORT  free TCP port on the first node [29500]
#   PLAN         plan file [$SLURM_SUBMIT_DIR/plan.json]
#   OUT          results file written by rank 0 [$SLURM_SUBMIT_DIR/results.json]
#   TORCHRUN     torchrun executable [torchrun]
# MASTER_ADDR is set to the job's first node; SLURM_JOB_ID is the rendezvous id.
#SBATCH --job-name=meshplan-{model}
#SBATCH --nodes={nnodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={nproc}
#SBATCH --exclusive
set -euo pipefail
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
: "${{MASTER_PORT:=29500}}"
: "${{PLAN:=$SLURM_SUBMIT_DIR/plan.json}}"
: "${{OUT:=$SLURM_SUBMIT_DIR/results.json}}"
: "${{TORCHRUN:=torchrun}}"
srun --kill-on-bad-exit=1 "$TORCHRUN" --nnodes="$SLURM_NNODES" --nproc-per-node={nproc} \\
    --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \\
    -m meshplan.executor.run --plan "$PLAN" --out "$OUT" "$@"
"""


def write_launch_script(plan, directory: str | Path, launcher: str = "torchrun", *,
                        overwrite: bool = False) -> Path:
    """Write ``plan.json`` and the launcher script into ``directory``; return the script."""
    if launcher not in LAUNCHERS:
        raise ConfigError(f"launcher {launcher!r} is not valid; choose one of "
                          f"{', '.join(LAUNCHERS)}")
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise MeshplanError(f"{str(directory)!r} exists and is not a directory")
    name = "run_torchrun.sh" if launcher == "torchrun" else "run_slurm.sbatch"
    script, plan_path = directory / name, directory / "plan.json"
    for p in (script, plan_path):
        if p.exists() and not overwrite:
            raise MeshplanError(f"{str(p)!r} exists; refusing to overwrite it (pass "
                                f"overwrite=True / --force)")
    gpus = plan.best.layout.num_gpus
    gpn = plan.cluster.gpus_per_node
    nproc = min(gpn, gpus)
    nnodes = -(-gpus // gpn)
    text = (_TORCHRUN if launcher == "torchrun" else _SLURM).format(
        summary=plan.summary().replace("\n", " "), gpus=gpus, nnodes=nnodes, nproc=nproc,
        name=name, model="".join(ch if ch.isalnum() or ch in "-_." else "-"
                                 for ch in plan.model.name))
    directory.mkdir(parents=True, exist_ok=True)
    plan.to_json(plan_path, overwrite=True)
    script.write_text(text)
    mode = script.stat().st_mode
    script.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


__all__ = ["write_launch_script", "LAUNCHERS", "os"]
