"""Which layouts ``meshplan validate`` runs: every runnable one, a spread of them, or a list.

:func:`enumerate_layouts` keeps the layouts of ``nproc`` ranks that the cost model accepts
and predicts to fit (and the executor's schedule rules allow, where it is installed);
:func:`pick_spread` spreads a few over the predicted step-time range; :func:`layouts_from_json`
reads a user's list.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from meshplan.costmodel import estimate
from meshplan.spec import SCHEDULES, Job, Layout, ModelSpec
from meshplan.spec.validate import check_layout, divisors
from meshplan.errors import ConfigError, MeshplanError
from meshplan.hardware_profiles import Cluster


def enumerate_layouts(model: ModelSpec, cluster: Cluster, job: Job, nproc: int, *,
                      micro_batches: Sequence[int] = (1, 2)) -> list[Layout]:
    """Every layout of ``nproc`` ranks the cost model accepts and predicts to fit."""
    out = []
    for tp in divisors(nproc):
        for pp in divisors(nproc // tp):
            dp = nproc // (tp * pp)
            for mb in micro_batches:
                for sched, vpp in _schedules(pp):
                    for rc in ("none", "selective", "full"):
                        for zero in ((0, 1, 2, 3) if dp > 1 else (0,)):
                            for sp in ((False, True) if tp > 1 else (False,)):
                                lay = Layout(dp=dp, pp=pp, tp=tp, micro_batch=mb, schedule=sched,
                                             vpp=vpp, recompute=rc, zero=zero,
                                             sequence_parallel=sp)
                                if _runnable(model, cluster, job, lay):
                                    out.append(lay)
    return out


def pick_spread(model, cluster, job, layouts: list[Layout], n: int) -> list[Layout]:
    """``n`` layouts spread evenly over the predicted step-time range (rank correlation is
    only informative when the layouts differ)."""
    if n >= len(layouts):
        return layouts
    ranked = sorted(layouts, key=lambda l: estimate(model, cluster, job, l).step_time_s)
    idx = sorted({round(i * (len(ranked) - 1) / max(1, n - 1)) for i in range(n)})
    return [ranked[i] for i in idx]


def _schedules(pp: int) -> list[tuple[str, int]]:
    if pp == 1:
        return [("1f1b", 1)]
    return [(s, 2 if s == "interleaved-1f1b" else 1) for s in SCHEDULES]


def _runnable(model, cluster, job, layout) -> bool:
    try:
        check_layout(model, cluster, job, layout)
        if not estimate(model, cluster, job, layout).fits:
            return False
    except MeshplanError:
        return False
    try:  # the executor's own schedule rules, where the executor is installed
        from meshplan.executor.pipeline import check_schedule
        check_schedule(layout, layout.num_microbatches(job.global_batch))
    except ImportError:
        pass
    except MeshplanError:
        return False
    return True


def layouts_from_json(path: Path) -> tuple[list[Layout], list[str] | None]:
    """A JSON list of layout objects (Layout fields; an optional "name" each)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"layout list {str(path)!r} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"layout list {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, list) or not data:
        raise ConfigError(f"layout list {str(path)!r} must be a non-empty JSON list of layouts")
    for i, d in enumerate(data):
        if not isinstance(d, dict):
            raise ConfigError(f"layout list {str(path)!r}: entry {i} is {d!r}, not a layout "
                              f"object such as {{\"dp\": 2, \"tp\": 2, \"micro_batch\": 1}}")
    names = [d.pop("name", None) for d in data]
    layouts = [Layout.from_dict(d) for d in data]
    return layouts, (names if all(names) else None)
