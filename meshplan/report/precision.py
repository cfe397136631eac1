"""Precisions side by side (``--compare-precision bf16,fp8``): the same model, job and GPU count
re-planned in each precision, and the main plan's own layout estimated in each.

Numbers come from the planner and :func:`meshplan.costmodel.estimate` (fp8:
:mod:`meshplan.costmodel.fp8_cost`); the only arithmetic here is the speed-up, the first
precision's step time over each one's, and the cost per million tokens as in
:mod:`meshplan.report.tables`.
"""

from __future__ import annotations

from typing import Sequence

from meshplan.costmodel import estimate
from meshplan.errors import ConfigError, MeshplanError
from meshplan.report.collect import PlanOutcome
from meshplan.report.render import Section, Table
from meshplan.report.tables import _plan_numbers, display_plans, stage_notes
from meshplan.spec import Job, Layout
from meshplan.spec.choices import FP8_RECIPES, PRECISIONS


def parse_precisions(text: str | Sequence[str]) -> tuple[tuple[str, str | None], ...]:
    """``"bf16,fp8"`` or ``"bf16,fp8:rowwise"`` (or a list) → ((precision, recipe), ...)
    in order, without repeats; the recipe only for fp8 (None: the job's, else tensorwise)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[tuple[str, str | None]] = []
    for item in items:
        name, _, recipe = item.strip().partition(":")
        if name not in PRECISIONS or (recipe and (name != "fp8" or recipe not in FP8_RECIPES)):
            raise ConfigError(
                f"compare_precision: {item.strip()!r} is not a precision; give names from "
                f"{', '.join(PRECISIONS)}, fp8 optionally with a recipe (fp8:rowwise; recipes "
                f"{', '.join(FP8_RECIPES)}), e.g. 'bf16,fp8'")
        if (name, recipe or None) not in out:
            out.append((name, recipe or None))
    if len(out) < 2:
        raise ConfigError(f"compare_precision {text!r}: give at least two precisions, e.g. "
                          f"'bf16,fp8'")
    return tuple(out)


def precision_job(job: Job, precision: str, recipe: str | None) -> Job:
    """``job`` in ``precision``: fp8 keeps the job's own recipe (and fp8 weight gather) unless
    one is named."""
    return job.with_precision(precision, recipe)


def precision_label(job: Job) -> str:
    return f"fp8 ({job.fp8_recipe})" if job.precision == "fp8" else job.precision


def precision_table(outcomes: Sequence[PlanOutcome], model, main_layout: Layout):
    """One row per precision: the re-planned best plan (time, memory, cost) and the main
    plan's layout estimated in that precision; speed-ups over the first row."""
    import pandas as pd
    rows = []
    for o in outcomes:
        same: dict = {"same_layout_step_time_s": float("nan"),
                      "same_layout_memory_peak_gib": float("nan"), "same_layout_fits": None}
        try:
            e = estimate(model, o.cluster, o.job, main_layout)
            same = {"same_layout_step_time_s": e.step_time_s,
                    "same_layout_memory_peak_gib": e.memory_peak_bytes / 2**30,
                    "same_layout_fits": bool(e.fits)}
        except MeshplanError:
            pass              # the main layout cannot run in this precision: left empty
        rows.append({"precision": precision_label(o.job), **_plan_numbers(o), **same})
    df = pd.DataFrame(rows)
    df["speedup"] = df["step_time_s"].iloc[0] / df["step_time_s"]
    df["same_layout_speedup"] = (df["same_layout_step_time_s"].iloc[0]
                                 / df["same_layout_step_time_s"])
    return df


def display_precision(df):
    out = display_plans(df)
    for col in ("speedup", "same_layout_speedup"):
        out[col] = [f"{v:.2f}×" if v == v else "—" for v in df[col]]
    out["same_layout_step_time_s"] = [f"{v:.3f} s" if v == v else "—"
                                      for v in df["same_layout_step_time_s"]]
    out["same_layout_memory_peak_gib"] = [
        "—" if v != v else f"{v:.1f} GiB" + (" (does not fit)" if fits is False else "")
        for v, fits in zip(df["same_layout_memory_peak_gib"], df["same_layout_fits"])]
    out = out.drop(columns=["same_layout_fits"], errors="ignore")
    return out.rename(columns={"speedup": "speed-up",
                               "same_layout_step_time_s": "main layout: step",
                               "same_layout_memory_peak_gib": "main layout: memory",
                               "same_layout_speedup": "main layout: speed-up"})


def precision_section(outcomes: Sequence[PlanOutcome], model, main: PlanOutcome) -> Section:
    df = precision_table(outcomes, model, main.layout)
    caveats = sorted({c for o in outcomes if o.feasible for c in o.estimate.caveats
                      if "fp8" in c})
    return Section(
        anchor="precisions", title="Precisions compared",
        text=(f"The same model and job on {main.gpus} GPUs in each precision, re-planned for "
              f"each (time, peak memory and cost of its best plan; speed-up over the first "
              f"row), and the recommended plan's own layout estimated in each (\"main "
              f"layout\"; marked where it does not fit the GPU in that precision). fp8 "
              f"runs the transformer linears' GEMMs in fp8 and pays their casts (an MoE "
              f"layer's routed experts too, except under runtime torch with a "
              f"recipe other than rowwise); attention, norms, the router and the logits stay "
              f"bf16 (docs/fp8.md). MFU is against the bf16 peak in every row."
              + ("\n\nCautions: " + " ".join(caveats)
                                                 if caveats else "")),
        tables=(Table(name="precision_comparison", title="", raw=df,
                      display=display_precision(df), notes=stage_notes(df)),))


__all__ = ["parse_precisions", "precision_job", "precision_table", "precision_section",
           "precision_label"]
