"""Assemble a capacity-planning report: plan every question, make the tables and figures.

``report(...)`` in :mod:`meshplan.report` calls :func:`build_report`; the CLI
``meshplan report`` calls the same. See docs/report.md.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from meshplan.spec import Job, ModelSpec
from meshplan.errors import ConfigError, NoFeasiblePlan, unknown_name_error
from meshplan.hardware_profiles import Cluster
from meshplan.report import figures_plan, figures_sweep, tables
from meshplan.report.collect import (OBJECTIVES, PlanOutcome, check_gpu_counts, plan_outcome,
                                     sensitivity_values)
from meshplan.report.labels import label_with_split, layout_label
from meshplan.report.recommend import pick, recommendation
from meshplan.report.render import FigureItem, Section, Table
from meshplan.report.style import si

BATCH_FACTORS = (0.25, 0.5, 2.0, 4.0)
SEQ_FACTORS = (0.5, 2.0)
MAX_BREAKDOWN_BARS = 8


@dataclass(frozen=True, kw_only=True)
class Report:
    """A built report: its sections, the raw tables and figures by name, and where it was
    written (``paths`` is empty when no output directory was given)."""

    title: str
    meta: str
    recommendation: str
    sections: tuple[Section, ...]
    tables: dict[str, Any]
    figures: dict[str, Any]
    outcomes: tuple[PlanOutcome, ...]
    paths: dict[str, Path] = field(default_factory=dict)

    @property
    def html_path(self) -> Path | None:
        return self.paths.get("report.html")


def _stderr(msg: str) -> None:
    print(f"meshplan report: {msg}", file=sys.stderr, flush=True)


def _progress_fn(progress: bool | Callable[[str], None] | None) -> Callable[[str], None]:
    if callable(progress):
        return progress
    return _stderr if progress else (lambda msg: None)


def _as_model(model: ModelSpec | str) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        from meshplan.spec.resolve import load_model
        return load_model(model)
    raise ConfigError(f"model must be a ModelSpec or a preset name, got {type(model).__name__}")


def _as_cluster(cluster: Cluster | str) -> Cluster:
    if isinstance(cluster, Cluster):
        return cluster
    if isinstance(cluster, str):
        from meshplan.hardware_profiles.resolve import load_cluster
        return load_cluster(cluster, None)
    raise ConfigError(f"cluster must be a Cluster or a preset name, got {type(cluster).__name__}")


def _as_job(job: Job | None, global_batch, seq_len, tokens) -> Job:
    if job is None:
        if global_batch is None or seq_len is None:
            raise ConfigError("give job=Job(...) or both global_batch= and seq_len=")
        return Job(global_batch=global_batch, seq_len=seq_len, tokens=tokens)
    if not isinstance(job, Job):
        raise ConfigError(f"job must be a meshplan.Job, got {type(job).__name__}")
    changes = {k: v for k, v in (("global_batch", global_batch), ("seq_len", seq_len),
                                 ("tokens", tokens)) if v is not None}
    return dataclasses.replace(job, **changes) if changes else job


def _what_if(name: str, values) -> tuple[int, ...]:
    try:
        vals = tuple(values)
    except TypeError:
        raise ConfigError(f"{name} must be a list of integers, got {values!r}") from None
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name}: {v!r} is not valid; give integers >= 1")
    return vals


def _check_precisions(job: Job, cluster: Cluster, precisions, compare) -> None:
    """A precision a GPU of the report cannot run (fp8 on an A100, say) fails before any
    planning, not after the plans that come before its section."""
    from meshplan.costmodel.fp8_cost import check_fp8_supported
    check_fp8_supported(job, cluster.gpu)
    if precisions:
        from meshplan.report.precision import precision_job
    for prec, recipe in precisions:
        try:
            check_fp8_supported(precision_job(job, prec, recipe), cluster.gpu)
        except ConfigError as exc:
            raise ConfigError(f"compare_precision {prec}{':' + recipe if recipe else ''} on "
                              f"{cluster.name!r}: {exc}") from None
    for preset in compare:
        try:
            check_fp8_supported(job, Cluster.preset(preset).gpu)
        except ConfigError as exc:
            raise ConfigError(f"compare_gpus {preset!r} with precision {job.precision}: "
                              f"{exc}") from None


def build_report(model: ModelSpec | str, cluster: Cluster | str, job: Job | None = None, *,
                 gpus: int | Sequence[int], out_dir: str | Path | None = None,
                 global_batch: int | None = None, seq_len: int | None = None,
                 tokens: float | None = None, objective: str = "throughput", top_k: int = 10,
                 main_gpus: int | None = None, price_per_gpu_hour: float | None = None,
                 compare_gpus: str | Sequence[str] | None = None,
                 measurements: Sequence[str | Path] = (), sensitivity: bool = True,
                 what_if_global_batch: Sequence[int] | None = None,
                 what_if_seq_len: Sequence[int] | None = None,
                 constraints=None, force: bool = False,
                 progress: bool | Callable[[str], None] | None = True,
                 compare_precision: str | Sequence[str] | None = None) -> Report:
    """Plan, tabulate, draw and (with ``out_dir``) write a capacity-planning report.

    ``what_if_global_batch`` / ``what_if_seq_len``: the values the sensitivity section
    re-plans for (default ×¼, ×½, ×2, ×4 of the global batch and ×½, ×2 of the sequence
    length); ignored when ``sensitivity`` is False. ``compare_precision`` ("bf16,fp8",
    "bf16,fp8:rowwise"): re-plan the main GPU count in each (:mod:`meshplan.report.precision`).
    """
    say = _progress_fn(progress)
    t_start = time.perf_counter()
    model, cluster = _as_model(model), _as_cluster(cluster)
    job = _as_job(job, global_batch, seq_len, tokens)
    counts = check_gpu_counts(gpus)
    if objective not in OBJECTIVES:
        raise unknown_name_error("objective", objective, OBJECTIVES)
    if objective == "time_to_train" and not job.tokens:
        raise ConfigError("objective 'time_to_train' needs the run's token count: pass "
                          "tokens= (--tokens), e.g. 2e12")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ConfigError(f"top_k must be an integer >= 1, got {top_k!r}")
    if main_gpus is not None and main_gpus not in counts:
        raise ConfigError(f"main_gpus = {main_gpus!r} is not one of the GPU counts "
                          f"{list(counts)}")
    if price_per_gpu_hour is not None:
        if not isinstance(price_per_gpu_hour, (int, float)) or price_per_gpu_hour < 0:
            raise ConfigError(f"price_per_gpu_hour must be a number >= 0, got "
                              f"{price_per_gpu_hour!r}")
        cluster = cluster.replace(price_per_gpu_hour=float(price_per_gpu_hour))
    precisions = ()
    if compare_precision:
        from meshplan.report.precision import parse_precisions, precision_job
        precisions = parse_precisions(compare_precision)
    compare = ()
    if compare_gpus:
        from meshplan.report.gpu_names import parse_gpu_list
        compare = parse_gpu_list(compare_gpus)
    _check_precisions(job, cluster, precisions, compare)
    # the what-if values, before minutes of planning: a sequence no layout can run (past
    # learned position embeddings) fails here, not after the main plans
    what_if_batches = (_what_if("what_if_global_batch", what_if_global_batch)
                       if sensitivity and what_if_global_batch is not None else None)
    what_if_seqs = (_what_if("what_if_seq_len", what_if_seq_len)
                    if sensitivity and what_if_seq_len is not None else None)
    if what_if_seqs and model.position_embedding == "learned":
        from meshplan.spec.validate import check_seq_len
        for s in what_if_seqs:
            check_seq_len(model, dataclasses.replace(job, seq_len=s))
    out = None
    if out_dir is not None:  # refuse a bad directory before minutes of planning
        from meshplan.report.render import check_output_dir
        out = check_output_dir(out_dir, force=force)
    loaded = []
    if measurements:
        from meshplan.report.measurements import load_measurement
        loaded = [load_measurement(p, model, cluster) for p in measurements]

    def run(cl: Cluster, n: int, jb: Job, what: str) -> PlanOutcome:
        t0 = time.perf_counter()
        say(f"planning {what} …")
        o = plan_outcome(model, cl, jb, n, objective=objective, top_k=top_k,
                         constraints=constraints)
        dt = time.perf_counter() - t0
        if o.feasible:
            say(f"  {what}: {layout_label(o.layout)}, {si(o.estimate.tokens_per_s, 'tokens/s')}, "
                f"MFU {o.estimate.mfu:.1%} ({dt:.1f} s)")
        else:
            say(f"  {what}: no feasible layout ({dt:.1f} s)")
        return o

    # ---- plans per GPU count
    outcomes = [run(cluster, n, job, f"{n} GPUs of {cluster.name} ({i}/{len(counts)})")
                for i, n in enumerate(counts, start=1)]
    summary = tables.summary_table(outcomes)
    best_idx = pick(summary, objective)
    if best_idx is None:
        reasons = "; ".join(f"{o.gpus} GPUs: {(o.error or '').splitlines()[0]}" for o in outcomes)
        raise NoFeasiblePlan(f"no GPU count in {list(counts)} has a layout of {model.name!r} "
                             f"that fits on {cluster.name}: {reasons}")
    rec = recommendation(summary, objective, best_idx, job)
    main_n = main_gpus if main_gpus is not None else int(summary.loc[best_idx, "gpus"])
    main = next(o for o in outcomes if o.gpus == main_n)
    if not main.feasible:
        raise NoFeasiblePlan(f"main_gpus = {main_n}: {main.error}")

    # ---- GPU types at the main count
    gpu_outcomes: list[PlanOutcome] = []
    for preset in compare:
        if preset == cluster.name:
            gpu_outcomes.append(main)
            continue
        cl = Cluster.preset(preset)
        gpu_outcomes.append(run(cl, main_n, job, f"{main_n} GPUs of {preset}"))

    # ---- precisions at the main count
    prec_outcomes = []
    for prec, recipe in precisions:
        jb = precision_job(job, prec, recipe)
        prec_outcomes.append(main if jb == job else run(
            cluster, main_n, jb, f"{main_n} GPUs in {prec}" + (f" ({jb.fp8_recipe})"
                                                             if prec == "fp8" else "")))

    # ---- what-ifs at the main count
    batch_outcomes: list[PlanOutcome] = []
    seq_outcomes: list[PlanOutcome] = []
    if sensitivity:
        batches = (sensitivity_values(job.global_batch, BATCH_FACTORS)
                   if what_if_batches is None else
                   tuple(sorted({job.global_batch, *what_if_batches})))
        for gb in batches:
            jb = dataclasses.replace(job, global_batch=gb)
            batch_outcomes.append(main if gb == job.global_batch else
                                  run(cluster, main_n, jb, f"global batch {gb}"))
        high = model.max_seq_len   # past it: an error (learned positions) or a warning
        seqs = (sensitivity_values(job.seq_len, SEQ_FACTORS, low=min(128, job.seq_len),
                                   high=high)
                if what_if_seqs is None else
                tuple(sorted({job.seq_len, *what_if_seqs})))
        for s in seqs:
            jb = dataclasses.replace(job, seq_len=s)
            seq_outcomes.append(main if s == job.seq_len else
                                run(cluster, main_n, jb, f"sequence length {s}"))

    say("drawing figures …")
    sections = _sections(model, cluster, job, objective, rec, summary, outcomes, main,
                         gpu_outcomes, batch_outcomes, seq_outcomes, loaded)
    if prec_outcomes:
        from meshplan.report.precision import precision_section
        at = next((i for i, s in enumerate(sections) if s.anchor == "sensitivity"),
                  len(sections))
        sections.insert(at, precision_section(prec_outcomes, model, main))
    title = f"Capacity plan: {model.name} on {cluster.gpu.name}"
    from meshplan._version import __version__
    meta = (f"{model.name} ({model.num_params() / 1e9:.1f}B parameters) on {cluster.name} "
            f"({cluster.gpus_per_node} × {cluster.gpu.name} per node, "
            f"${cluster.price_per_gpu_hour:.2f}/GPU-hour); global batch {job.global_batch} × "
            f"{job.seq_len} tokens, {job.precision}"
            + (f", {job.tokens:.3g} training tokens" if job.tokens else "")
            + f"; objective {objective}; GPU counts {', '.join(map(str, counts))}. "
            f"Predictions of the meshplan {__version__} cost model.")
    tbls = {t.name: t.raw for s in sections for t in s.tables}
    figs = {f.name: f.figure for s in sections for f in s.figures}
    paths: dict[str, Path] = {}
    if out is not None:
        from meshplan.report.render import prepare_output_dir, write_report
        prepare_output_dir(out, force=force)
        say(f"writing {out}/ …")
        paths = write_report(out, title, meta, sections)
        say(f"wrote {out / 'report.html'} and {out / 'report.md'} "
            f"({len(paths)} files, {time.perf_counter() - t_start:.1f} s)")
    return Report(title=title, meta=meta, recommendation=rec, sections=tuple(sections),
                  tables=tbls, figures=figs, outcomes=tuple(outcomes), paths=paths)


def _sections(model, cluster, job, objective, rec, summary, outcomes, main,
              gpu_outcomes, batch_outcomes, seq_outcomes, loaded) -> list[Section]:
    secs: list[Section] = []
    n = main.gpus
    secs.append(Section(
        anchor="summary", title="Summary",
        text=(rec + "\n\nOne row per GPU count: the planner's best layout for the objective, "
              "its predicted throughput and model FLOPs utilization (MFU), the price of a "
              "million tokens at the cluster's GPU-hour price and, when the run's token count is "
              "given, the time to train and the cost of the run. Scaling efficiency is "
              "throughput per GPU relative to the smallest count that fits."),
        tables=(Table(name="summary", title="", raw=summary,
                      display=tables.display_plans(summary),
                      notes=tables.stage_notes(summary)),)))

    topk = tables.topk_table(main)
    secs.append(Section(
        anchor="top-plans", title=f"Top plans on {n} GPUs",
        text=(f"The {len(topk)} best layouts the planner found for {n} GPUs, ranked by "
              f"{objective.replace('_', ' ')}. m = micro-batches per step; bubble, TP comm and "
              f"DP exposed are time per step on the critical path. Layouts: dp, pp, tp = data-, "
              f"pipeline-, tensor-parallel degrees, v = virtual stages (interleaved 1F1B; "
              f"gpipe / zb = GPipe / zero-bubble, otherwise 1F1B), mb = micro-batch, rc = "
              f"recompute, z = ZeRO stage, sp = sequence parallel; the CSV has every field."),
        tables=(Table(name="top_plans", title="", raw=topk, display=tables.display_topk(topk),
                      notes=tables.stage_notes(topk)),)))

    est = main.estimate
    secs.append(Section(
        anchor="memory", title="Memory per pipeline stage",
        text=(f"Peak memory per GPU of each pipeline stage of the recommended {n}-GPU plan "
              f"({label_with_split(main.layout)}). \"other\" is logits/loss buffers, communication "
              f"buffers and the recompute working set. Usable memory is the card's capacity less "
              f"the reserve for the CUDA context, NCCL and fragmentation."),
        figures=(FigureItem(name="memory_per_stage", figure=figures_plan.memory_per_stage(
            est, gpu_memory_bytes=cluster.gpu.memory_bytes,
            title=f"Memory per GPU by pipeline stage — {layout_label(main.layout)}"),
            caption=f"Memory per GPU by pipeline stage, {n} GPUs, {layout_label(main.layout)}"),),
        tables=(Table(name="memory_per_stage", title="Memory per stage (GiB)",
                      raw=tables.memory_table(main),
                      display=tables.display_memory(tables.memory_table(main))),)))

    shown = main.candidates[:MAX_BREAKDOWN_BARS]
    labeled = [(f"#{i} {layout_label(lay)}", e) for i, (lay, e) in enumerate(shown, start=1)]
    breakdown = tables.breakdown_table(topk, len(shown))
    off = [(i, e.step_time_s, e.time.total_s) for i, (_, e) in enumerate(shown, start=1)
           if abs(e.time.total_s - e.step_time_s) > 0.01 * e.step_time_s]
    check = ("Consistency check: for every plan shown the parts sum to the step time within 1 %."
             if not off else
             "Consistency check FAILED: the cost model's parts do not sum to its step time for "
             + ", ".join(f"#{i} (parts {t:.3f} s, step {s_:.3f} s)" for i, s_, t in off)
             + " — the black tick marks the step time; treat these plans' step times with "
               "caution.")
    secs.append(Section(
        anchor="step-time", title="Step-time breakdown",
        text=("Where one optimizer step's time goes on the busiest pipeline rank, for the top "
              "plans: compute (GEMMs, attention, memory-bound ops), exposed tensor-parallel and "
              "pipeline communication, the pipeline bubble, data-parallel communication not "
              "hidden behind the backward pass, and the optimizer step. The black tick is the "
              "predicted step time.\n\n" + check),
        figures=(FigureItem(name="step_time_breakdown", figure=figures_plan.step_time_breakdown(
            labeled, title=f"Where the step time goes — top plans on {n} GPUs"),
            caption=f"Step-time breakdown of the top {len(shown)} plans on {n} GPUs"),),
        tables=(Table(name="step_time_breakdown", title="Time per step by part", raw=breakdown,
                      display=tables.display_breakdown(breakdown),
                      notes=tables.stage_notes(breakdown)),)))

    cautions = _cautions_section(main, n)
    if cautions is not None:
        secs.append(cautions)

    from meshplan.report.timeline import pipeline_seconds, simulate_plan
    lay = main.layout
    sim = simulate_plan(model, main.cluster, main.job, lay, est)
    secs.append(Section(
        anchor="timeline", title="Pipeline timeline",
        text=(f"The recommended plan's step as the schedule simulator runs it ({lay.schedule}, "
              f"pp = {lay.pp}, vpp = {lay.vpp}, {est.num_microbatches} micro-batches): one row "
              f"per pipeline stage, one block per micro-batch's forward or backward pass. The gaps "
              f"are the bubble. The simulated pipeline time is compared with the cost model's "
              f"closed form in the title." + (" With pp = 1 there is no pipeline and no bubble."
                                             if lay.pp == 1 else "")),
        figures=(FigureItem(name="pipeline_timeline", figure=figures_plan.pipeline_timeline(
            sim, pp=lay.pp, vpp=lay.vpp, closed_form_s=pipeline_seconds(est),
            title=f"{lay.schedule}, {lay.pp} stages"),
            caption=f"Pipeline schedule of {label_with_split(lay)} "
                    f"({est.num_microbatches} micro-batches)"),)))

    feas = summary[summary["feasible"]]
    if len(feas) >= 2:
        secs.append(Section(
            anchor="scaling", title="Scaling with cluster size",
            text=("Best plan per GPU count (the summary table holds the numbers). GPU counts, "
                  "throughput and time to train are on log scales, so the dashed line, linear "
                  "scaling from the smallest count that fits, is straight; MFU and cost are on "
                  "linear scales from zero."),
            figures=(FigureItem(name="scaling", figure=figures_sweep.scaling(summary),
                                caption="Throughput, MFU, time to train and cost against GPUs"),)))

    if gpu_outcomes:
        gdf = tables.gpu_table(gpu_outcomes)
        figs: tuple[FigureItem, ...] = ()
        if gdf["feasible"].any():
            figs = (FigureItem(name="gpu_comparison", figure=figures_sweep.gpu_comparison(gdf),
                               caption=f"GPU types compared on {n} GPUs"),)
        secs.append(Section(
            anchor="gpu-types", title="GPU types compared",
            text=(f"The same model and job on {n} GPUs of each type, re-planned for each, at "
                  f"each cluster's GPU-hour price (column $ / GPU-h)."),
            figures=figs, tables=(Table(name="gpu_comparison", title="", raw=gdf,
                                        display=tables.display_plans(gdf),
                                        notes=tables.stage_notes(gdf)),)))

    if batch_outcomes or seq_outcomes:
        bdf = tables.sensitivity_table(batch_outcomes, "global_batch")
        sdf = tables.sensitivity_table(seq_outcomes, "seq_len")
        secs.append(Section(
            anchor="sensitivity", title="Sensitivity to global batch and sequence length",
            text=(f"The best plan on {n} GPUs, re-planned for each global batch and sequence "
                  f"length with everything else unchanged. A larger batch gives the pipeline "
                  f"more micro-batches to hide its bubble and amortizes gradient reduction; a "
                  f"longer sequence raises attention's share of the work and activation memory."),
            figures=(FigureItem(name="sensitivity", figure=figures_sweep.sensitivity(
                bdf, sdf, baseline_batch=job.global_batch, baseline_seq=job.seq_len),
                caption="Throughput and MFU against global batch and sequence length"),),
            tables=(Table(name="sensitivity_global_batch", title="Global batch", raw=bdf,
                          display=tables.display_plans(bdf), notes=tables.stage_notes(bdf)),
                    Table(name="sensitivity_seq_len", title="Sequence length", raw=sdf,
                          display=tables.display_plans(sdf), notes=tables.stage_notes(sdf)))))

    if loaded:
        from meshplan.report.measurements import measurements_table
        mdf = measurements_table(loaded)
        secs.append(Section(
            anchor="measured", title="Measured vs predicted",
            text=("Runs of planned layouts by the executor (results.json files) against the cost "
                  "model's prediction. Error = (predicted − measured) / measured. \"prediction: "
                  "re-estimated\" means the prediction was recomputed with this version's cost "
                  "model from the file's model, cluster, job and layout; \"file\" means the "
                  "file's own prediction was used."),
            figures=(FigureItem(name="measured_vs_predicted",
                                figure=figures_sweep.measured_vs_predicted(mdf),
                                caption="Predicted against measured step time and peak memory"),),
            tables=(Table(name="measurements", title="", raw=mdf,
                          display=tables.display_measurements(mdf)),)))
    return secs


def _cautions_section(main, n: int) -> Section | None:
    """The recommended plan's cautions (``Estimate.caveats``) and the named corrections that
    moved its estimate (``Estimate.corrections``: the estimate less the same estimate with
    each switched off); None where it has neither."""
    est = main.estimate
    moved = tables.corrections_table(est)
    if not est.caveats and moved.empty:
        return None
    text = (f"What the cost model says about its own estimate of the recommended {n}-GPU "
            f"plan ({label_with_split(main.layout)}).")
    if est.caveats:
        text += "\n\n" + "\n\n".join(f"Caution: {c}" for c in est.caveats)
    if not moved.empty:
        text += ("\n\nNamed corrections (docs/costmodel.md, \"Named corrections\"): empirical "
                 "effects with their numbers in the GPU profile; each row is what switching "
                 "it off would take away from the step time and the peak memory.")
    return Section(anchor="cautions", title="Cautions and corrections", text=text,
                   tables=((Table(name="corrections", title="", raw=moved, display=moved),)
                           if not moved.empty else ()))
