"""``meshplan calibrate --for-plan``: the calibration options a plan file needs.

A plan priced from another model's rows, or from the datasheet, is the weakest prediction
meshplan makes; the same plan priced from its own model's rows is the strongest (one H100,
docs/calibrate.md "Calibrate the model you will train": another model's rows 2.1-11.4 %
mean step error, the model's own 1.0-3.9 %). This module reads plan files and says which
layer rows price them: their model at their sequence length, at their micro-batches,
compiled at their compiled layouts' recompute modes, in fp8 with their recipe, at their
tensor- and expert-parallel degrees. Pure functions; the command fills every option the
user did not give from :func:`calibration_for_plans`.

Worked example: two plans of one model at seq 2048, ``mb8-compiled`` (recompute none) and
``mb4-full-compiled`` in fp8 tensorwise, tp 1 →

    --model <the plans' model> --seq-len 2048 --micro-batches 4,8
    --compile-rows none,full --fp8-rows tensorwise --max-tp 1

A single micro-batch size m also times m / 2 (2 where m = 1), so the layer tables have two
sizes to read growth from when a later plan moves the micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meshplan.errors import ConfigError
from meshplan.spec import ModelSpec
from meshplan.spec.choices import RECOMPUTE, TORCH_FP8_RECIPES


@dataclass(frozen=True, kw_only=True)
class PlanCalibration:
    """What ``meshplan calibrate`` times for a set of plans (module docstring)."""

    models: tuple[ModelSpec, ...]
    seq_len: int
    micro_batches: tuple[int, ...]
    compile_rows: tuple[str, ...]
    fp8_rows: str                       # "" = none
    max_tp: int
    sp_only: bool
    ep_degrees: tuple[int, ...] | None  # None: calibrate's default
    notes: tuple[str, ...] = ()         # what the plans ask that calibrate does not time

    def options(self, model_label: str = "<the plans' model>") -> str:
        """The equivalent command-line options, for the progress line and the docs."""
        parts = [f"--model {model_label}"] * len(self.models)
        parts += [f"--seq-len {self.seq_len}",
                  "--micro-batches " + ",".join(map(str, self.micro_batches))]
        if self.compile_rows:
            parts.append("--compile-rows " + ",".join(self.compile_rows))
        if self.fp8_rows:
            parts.append(f"--fp8-rows {self.fp8_rows}")
        parts.append(f"--max-tp {self.max_tp}")
        if self.sp_only:
            parts.append("--sp-only")
        if self.ep_degrees:
            parts.append("--ep " + ",".join(map(str, self.ep_degrees)))
        return " ".join(parts)


def calibration_for_plans(records, sources: tuple[str, ...] | None = None) -> PlanCalibration:
    """The layer rows that price ``records`` (:class:`~meshplan.planner.planfile.PlanRecord`),
    ``sources`` naming them in errors. Refuses plans of different sequence lengths or fp8
    recipes: one calibration times one of each."""
    records = tuple(records)
    if not records:
        raise ConfigError("--for-plan: no plan file given; pass one or more plan JSON files "
                          "written by `meshplan plan -o plan.json`")
    names = sources or tuple(f"plan {i + 1}" for i in range(len(records)))
    seqs = sorted({r.job.seq_len for r in records})
    if len(seqs) > 1:
        which = ", ".join(f"{n}: {r.job.seq_len}" for n, r in zip(names, records))
        raise ConfigError(f"--for-plan: the plans run different sequence lengths ({which}); "
                          "one calibration times one length: calibrate once per length "
                          "(--out a profile each)")
    models: list[ModelSpec] = []
    for r in records:
        if r.model not in models:
            models.append(r.model)
    layouts = [r.layout for r in records]
    micro = sorted({lay.micro_batch for lay in layouts})
    if len(micro) == 1:
        m = micro[0]
        micro = sorted({m, m // 2 if m > 1 else 2})
    compiled = {lay.recompute for lay in layouts if lay.compile}
    compile_rows = tuple(mode for mode in RECOMPUTE if mode in compiled)
    notes: list[str] = []
    recipes = sorted({r.job.fp8_recipe for r in records if r.job.precision == "fp8"})
    if len(recipes) > 1:
        raise ConfigError(f"--for-plan: the plans run fp8 recipes {recipes}; one calibration "
                          "times one recipe's fp8 rows: calibrate once per recipe")
    fp8_rows = recipes[0] if recipes else ""
    if fp8_rows and fp8_rows not in TORCH_FP8_RECIPES:
        notes.append(f"fp8 recipe {fp8_rows!r} is TransformerEngine's (runtime megatron): "
                     "meshplan's executor does not run it, so no fp8 layer rows are timed")
        fp8_rows = ""
    if any(r.job.runtime != "torch" for r in records):
        notes.append("a plan runs runtime 'megatron': calibrate times meshplan's executor's "
                     "layers, which then price Megatron's as a stand-in (they are not "
                     "Megatron's own kernels); the GEMM and attention curves at the model's "
                     "shapes serve both")
    if any(lay.cp > 1 for lay in layouts):
        notes.append("context-parallel layer rows are not timed by calibrate: cp > 1 is "
                     "priced from the cp = 1 rows and the curves")
    tps = [lay.tp for lay in layouts]
    sp_only = any(t > 1 for t in tps) and all(lay.sequence_parallel
                                             for lay in layouts if lay.tp > 1)
    eps = sorted({lay.ep for lay in layouts if lay.ep > 1})
    return PlanCalibration(models=tuple(models), seq_len=seqs[0], micro_batches=tuple(micro),
                           compile_rows=compile_rows, fp8_rows=fp8_rows, max_tp=max(tps),
                           sp_only=sp_only, ep_degrees=tuple(eps) or None,
                           notes=tuple(notes))


def load_plans(paths) -> tuple[list, tuple[str, ...]]:
    """The plan records of ``paths`` and their names, for :func:`calibration_for_plans`."""
    from meshplan.planner.planfile import load_plan_file
    paths = [Path(p) for p in paths]
    return [load_plan_file(p) for p in paths], tuple(str(p) for p in paths)


__all__ = ["PlanCalibration", "calibration_for_plans", "load_plans"]
