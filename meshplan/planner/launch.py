"""Launch scripts for a plan: torchrun (multi-node rendezvous) and SLURM (``srun torchrun``).

Both run ``python -m meshplan.executor.run --plan plan.json --out results.json`` on every
GPU (torchrun's ``-m``); the plan file is copied next to the script. Arguments after the
script's name go to the executor (``--checkpoint-dir DIR --checkpoint-every 500
--resume``, ``--steps``, ``--device cpu``...).

Rank order: torchrun numbers the ranks node by node (rank = node · nproc + local rank) and
the executor's mesh puts tp fastest (Megatron's "tp-dp-pp"), so a tp group stays inside
a node whenever tp divides the GPUs per node — checked here before a script is written.
"""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

from meshplan.errors import ConfigError, MeshplanError

LAUNCHERS = ("torchrun", "slurm")

_TORCHRUN = """#!/usr/bin/env bash
# meshplan launch script (torchrun) — {summary}
# {gpus} GPUs = {nnodes} node(s) × {nproc} GPUs. Run this script once on EVERY node, with the
# same MASTER_ADDR / MASTER_PORT / RDZV_ID everywhere; torchrun's c10d rendezvous assigns ranks.
# Arguments go to the executor, e.g.  ./{name} --checkpoint-dir /shared/ckpt --checkpoint-every 500
#
# Environment variables (defaults in brackets):
#   MASTER_ADDR     host name or IP of the rendezvous node, reachable from all nodes
#                   [required when NNODES > 1; localhost for one node]
#   MASTER_PORT     free TCP port on MASTER_ADDR [29500]
#   RDZV_ID         job id shared by all nodes of one run [meshplan-$USER]
#   NNODES          nodes taking part [{nnodes}]
#   NPROC_PER_NODE  processes (GPUs) per node [{nproc}]
#   PLAN            plan file [the plan.json next to this script]
#   OUT             results file written by rank 0 [results.json next to this script]
#   TORCHRUN        torchrun executable [torchrun]
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
: "${{NNODES:={nnodes}}}"
if [ "$NNODES" -gt 1 ] && [ -z "${{MASTER_ADDR:-}}" ]; then
    echo "error: NNODES=$NNODES: set MASTER_ADDR to the host name or IP of the rendezvous" \\
         "node (the same on every node), e.g. MASTER_ADDR=node001 $0" >&2
    exit 2
fi
: "${{MASTER_ADDR:=localhost}}"
: "${{MASTER_PORT:=29500}}"
: "${{RDZV_ID:=meshplan-${{USER:-user}}}}"
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
# Submit from this directory:  sbatch {name}   (arguments after the name go to the executor,
# e.g. sbatch {name} --checkpoint-dir $PWD/ckpt --checkpoint-every 500 --resume)
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
# Set these for your site (remove one '#' to enable a line):
##SBATCH --time=24:00:00          # wall-clock limit
##SBATCH --partition=PARTITION    # queue
##SBATCH --account=ACCOUNT        # project to charge
set -euo pipefail
# Environment: activate the Python that has meshplan[executor] and torch, e.g. one of
#   source /path/to/venv/bin/activate
#   module load cuda pytorch
#   conda activate meshplan
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
: "${{MASTER_PORT:=29500}}"
: "${{PLAN:=$SLURM_SUBMIT_DIR/plan.json}}"
: "${{OUT:=$SLURM_SUBMIT_DIR/results.json}}"
: "${{TORCHRUN:=torchrun}}"
srun --kill-on-bad-exit=1 "$TORCHRUN" --nnodes="$SLURM_NNODES" --nproc-per-node={nproc} \\
    --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \\
    -m meshplan.executor.run --plan "$PLAN" --out "$OUT" "$@"
"""


def nodes_and_procs(gpus: int, gpus_per_node: int, tp: int) -> tuple[int, int]:
    """(nodes, processes per node) for ``gpus`` ranks: as few nodes as hold them, the same
    number on each; refused where that cannot hold or splits a tp group over nodes."""
    nnodes = -(-gpus // gpus_per_node)
    if gpus % nnodes:
        raise ConfigError(f"dp·pp·tp = {gpus} GPUs cannot be spread evenly over {nnodes} "
                          f"nodes of {gpus_per_node} GPUs; plan for a multiple of "
                          f"{gpus_per_node} GPUs or at most {gpus_per_node}")
    nproc = gpus // nnodes
    if nproc % tp:
        raise ConfigError(f"{nproc} processes per node split the tp = {tp} groups over nodes "
                          f"(tp must divide the GPUs per node for tp to stay on NVLink)")
    return nnodes, nproc


def write_launch_script(plan, directory: str | Path, launcher: str = "torchrun", *,
                        overwrite: bool = False) -> Path:
    """Write ``plan.json`` and the launcher script into ``directory``; return the script.

    ``plan``: a :class:`~meshplan.planner.plan.Plan`, or the path of a plan file (copied).
    """
    if launcher not in LAUNCHERS:
        raise ConfigError(f"launcher {launcher!r} is not valid; choose one of "
                          f"{', '.join(LAUNCHERS)}")
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise MeshplanError(f"{str(directory)!r} exists and is not a directory")
    name = "run_torchrun.sh" if launcher == "torchrun" else "run_slurm.sbatch"
    script, plan_path = directory / name, directory / "plan.json"
    for p in (script, plan_path):
        if p.exists() and not overwrite and not _same_file(p, plan):
            raise MeshplanError(f"{str(p)!r} exists; refusing to overwrite it (pass "
                                f"overwrite=True / --force)")
    if isinstance(plan, (str, Path)):
        from meshplan.planner.planfile import load_plan_file
        rec = load_plan_file(plan)
        model, cluster, layout = rec.model, rec.cluster, rec.layout
        summary = f"{model.name} on {layout.num_gpus} × {cluster.gpu.name}: {layout.short()}"
    else:
        model, cluster, layout = plan.model, plan.cluster, plan.best.layout
        summary = plan.summary().replace("\n", " ")
    gpus = layout.num_gpus
    nnodes, nproc = nodes_and_procs(gpus, cluster.gpus_per_node, layout.tp)
    text = (_TORCHRUN if launcher == "torchrun" else _SLURM).format(
        summary=summary, gpus=gpus, nnodes=nnodes, nproc=nproc, name=name,
        model="".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in model.name))
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(plan, (str, Path)):
        if not _same_file(plan_path, plan):
            shutil.copyfile(plan, plan_path)
    else:
        plan.to_json(plan_path, overwrite=True)
    script.write_text(text)
    mode = script.stat().st_mode
    script.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def _same_file(p: Path, plan) -> bool:
    if not isinstance(plan, (str, Path)) or not p.exists():
        return False
    return Path(plan).resolve() == p.resolve()


__all__ = ["write_launch_script", "nodes_and_procs", "LAUNCHERS"]
