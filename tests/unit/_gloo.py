"""Run a worker on several spawned CPU ranks (gloo) and collect what each rank wrote.

A worker is ``worker(rank, world, init_method, out_dir)``: it joins the group with
``dist.init_process_group("gloo", init_method=init_method, ...)`` and ends with
:func:`write_rank_result`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def write_rank_result(out_dir: str, rank: int, result: Any) -> None:
    """A rank's JSON result for :func:`run_gloo_ranks`; destroys the process group."""
    import torch.distributed as dist
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def run_gloo_ranks(worker: Callable, nprocs: int, tmp_path: Path) -> list:
    """Spawn ``nprocs`` ranks of ``worker`` and return their results in rank order."""
    from _ranks import start_ranks
    start_ranks(worker, (nprocs, f"file://{tmp_path / 'store'}", str(tmp_path)), nprocs)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(nprocs)]
