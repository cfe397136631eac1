"""Capacity-planning reports: pandas tables, matplotlib figures, HTML and Markdown.

    import meshplan as mp
    r = mp.report("llama3-70b", "dgx-h100", gpus=[64, 128, 256], global_batch=1024,
                  seq_len=8192, tokens=2e12, compare_gpus="a100-80gb,h100,h200",
                  compare_precision="bf16,fp8", out_dir="report/")
    r.recommendation, r.tables["summary"], r.figures["memory_per_stage"], r.html_path

The figure functions (:mod:`meshplan.report.figures_plan`, :mod:`meshplan.report.figures_sweep`)
return :class:`matplotlib.figure.Figure` objects for notebooks. matplotlib and pandas are
imported only when a report or a figure is made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence


def report(model, cluster, job=None, *, gpus: int | Sequence[int],
           out_dir: str | Path | None = None, global_batch: int | None = None,
           seq_len: int | None = None, tokens: float | None = None,
           objective: str = "throughput", top_k: int = 10, main_gpus: int | None = None,
           price_per_gpu_hour: float | None = None,
           compare_gpus: str | Sequence[str] | None = None,
           measurements: Sequence[str | Path] = (), sensitivity: bool = True,
           what_if_global_batch: Sequence[int] | None = None,
           what_if_seq_len: Sequence[int] | None = None, constraints=None, force: bool = False,
           progress: bool | Callable[[str], None] | None = True,
           compare_precision: str | Sequence[str] | None = None):
    """Plan ``model`` on ``gpus`` GPUs of ``cluster`` and build a capacity-planning report.

    ``model``/``cluster``: specs or preset names; ``job`` or ``global_batch`` + ``seq_len``
    (+ ``tokens`` of the whole run, for time-to-train and cost). ``objective`` is the
    planner's ("throughput", "cost", "time_to_train"); the recommended GPU count is the one
    that serves it best, and its plan is the one drawn in detail (``main_gpus`` overrides).
    ``compare_gpus``: short GPU names ("a100-80gb,h100,h200") planned at the main count.
    ``compare_precision``: precisions ("bf16,fp8", "bf16,fp8:rowwise") re-planned at the main
    count, with the main plan's layout estimated in each (time, memory, cost, speed-up).
    ``measurements``: executor ``results.json`` files for the measured-vs-predicted section.
    ``sensitivity``: re-plan for other global batches and sequence lengths (default ×¼, ×½,
    ×2, ×4 and ×½, ×2; or the values in ``what_if_global_batch`` / ``what_if_seq_len``).
    ``constraints``: a :class:`meshplan.planner.Constraints` passed to every plan.
    ``out_dir``: write report.html (self-contained), report.md, PNGs and CSVs there; a
    non-empty directory is refused unless ``force``. Progress goes to stderr (``progress``
    may also be a callable taking a line, or False).

    Returns a :class:`meshplan.report.build.Report`.
    """
    from meshplan.report.build import build_report
    return build_report(model, cluster, job, gpus=gpus, out_dir=out_dir,
                        global_batch=global_batch, seq_len=seq_len, tokens=tokens,
                        objective=objective, top_k=top_k, main_gpus=main_gpus,
                        price_per_gpu_hour=price_per_gpu_hour, compare_gpus=compare_gpus,
                        measurements=measurements, sensitivity=sensitivity,
                        what_if_global_batch=what_if_global_batch,
                        what_if_seq_len=what_if_seq_len, constraints=constraints, force=force,
                        progress=progress, compare_precision=compare_precision)


__all__ = ["report"]


class _CallableModule(__import__("types").ModuleType):
    """Importing ``meshplan.report.<anything>`` makes Python bind the *package* to the name
    ``report`` on :mod:`meshplan`, replacing the lazily exposed function; a callable module
    keeps ``mp.report(...)`` working either way."""

    def __call__(self, *args, **kwargs):
        return report(*args, **kwargs)


__import__("sys").modules[__name__].__class__ = _CallableModule
