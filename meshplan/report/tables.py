"""pandas tables of a report: raw numbers (for CSV and the figures) and their display form.

Cost arithmetic (the only arithmetic here, on the cost model's step time): a step costs
``price_per_gpu_hour · GPUs used · step_time_s / 3600``; per token divide by the step's
tokens; the run takes ``job.tokens / tokens_per_s`` and costs price · GPUs · that time.
"""

from __future__ import annotations

from typing import Any, Sequence

from meshplan.report.collect import PlanOutcome
from meshplan.report.figures_plan import memory_parts, time_parts
from meshplan.report.labels import layout_label, split_marks, split_notes, stage_split
from meshplan.report.style import GIB, dollars, duration, seconds, si


def _plan_numbers(o: PlanOutcome) -> dict[str, Any]:
    """Throughput, efficiency, memory and cost of an outcome's best plan (NaN if none)."""
    nan = float("nan")
    if not o.feasible:
        return {"feasible": False, "layout": "", "stage_layers": "", "gpus_used": nan,
                "tokens_per_s": nan,
                "mfu": nan, "step_time_s": nan, "memory_peak_gib": nan,
                "usd_per_million_tokens": nan, "time_to_train_s": nan, "cost_usd": nan,
                "note": " ".join((o.error or "no feasible layout").split())}
    est, lay = o.estimate, o.layout
    price = o.cluster.price_per_gpu_hour
    usd_per_step = price * est.num_gpus * est.step_time_s / 3600.0
    tokens = o.job.tokens
    ttt = tokens / est.tokens_per_s if tokens else nan
    return {"feasible": True, "layout": layout_label(lay), "stage_layers": stage_split(lay),
            "gpus_used": est.num_gpus,
            "tokens_per_s": est.tokens_per_s, "mfu": est.mfu, "step_time_s": est.step_time_s,
            "memory_peak_gib": est.memory_peak_bytes / GIB,
            "usd_per_million_tokens": usd_per_step / o.job.tokens_per_step * 1e6,
            "time_to_train_s": ttt,
            "cost_usd": price * est.num_gpus * ttt / 3600.0 if tokens else nan,
            "note": ""}


def summary_table(outcomes: Sequence[PlanOutcome]):
    """One row per GPU count: the best plan's layout, throughput, MFU, time-to-train and cost.

    ``scaling_efficiency`` is tokens/s per GPU relative to the smallest feasible count
    (1.0 = perfectly linear scaling).
    """
    import pandas as pd
    rows = []
    for o in outcomes:
        r = {"gpus": o.gpus, "nodes": o.cluster.nodes, **_plan_numbers(o)}
        rows.append(r)
    df = pd.DataFrame(rows)
    feas = df[df["feasible"]]
    if len(feas):
        base = feas.iloc[0]
        per_gpu = base["tokens_per_s"] / base["gpus_used"]
        df["scaling_efficiency"] = df["tokens_per_s"] / df["gpus_used"] / per_gpu
    else:
        df["scaling_efficiency"] = float("nan")
    return df


def gpu_table(outcomes: Sequence[PlanOutcome]):
    """One row per GPU type, same model, job and GPU count."""
    import pandas as pd
    rows = []
    for o in outcomes:
        rows.append({"gpu": o.cluster.gpu.name, "cluster": o.cluster.name, "gpus": o.gpus,
                     "price_per_gpu_hour": o.cluster.price_per_gpu_hour, **_plan_numbers(o)})
    return pd.DataFrame(rows)


def sensitivity_table(outcomes: Sequence[PlanOutcome], column: str):
    """One row per varied job value (``column`` is "global_batch" or "seq_len")."""
    import pandas as pd
    rows = [{column: getattr(o.job, column), "gpus": o.gpus, **_plan_numbers(o)}
            for o in outcomes]
    return pd.DataFrame(rows)


def topk_table(outcome: PlanOutcome):
    """The ranked candidates of one GPU count: every layout field, speed, memory, time parts."""
    import pandas as pd
    rows = []
    for rank, (lay, est) in enumerate(outcome.candidates, start=1):
        r = {"rank": rank, "layout": layout_label(lay), "dp": lay.dp, "pp": lay.pp,
             "tp": lay.tp,
             "micro_batch": lay.micro_batch, "schedule": lay.schedule, "vpp": lay.vpp,
             "recompute": lay.recompute, "zero": lay.zero,
             "sequence_parallel": lay.sequence_parallel,
             "stage_layers": stage_split(lay),
             "microbatches": est.num_microbatches, "step_time_s": est.step_time_s,
             "tokens_per_s": est.tokens_per_s, "mfu": est.mfu,
             "memory_peak_gib": est.memory_peak_bytes / GIB}
        for name, s in time_parts(est).items():
            r[f"{name.lower().replace(' ', '_').replace('-', '')}_s"] = s
        rows.append(r)
    return pd.DataFrame(rows)


def memory_table(outcome: PlanOutcome):
    """Memory per pipeline stage of the best plan (GiB), the data of the memory figure."""
    import pandas as pd
    est = outcome.estimate
    parts = memory_parts(est)
    df = pd.DataFrame({"stage": [m.stage for m in est.memory],
                       "layers": [m.layers for m in est.memory],
                       "inflight_microbatches": [m.inflight_microbatches for m in est.memory],
                       **{f"{k}_gib": v for k, v in parts.items()},
                       "total_gib": [m.total_bytes / GIB for m in est.memory]})
    df["usable_gib"] = est.usable_memory_bytes / GIB
    return df


def corrections_table(est):
    """The named corrections that moved ``est`` (step time in s, peak memory in GiB: the
    estimate less the same with each switched off); empty where none did."""
    import pandas as pd
    rows = [{"correction": c.name, "step_time_delta_s": c.step_time_delta_s,
             "peak_memory_delta_gib": c.memory_delta_bytes / GIB}
            for c in est.moved_corrections]
    return pd.DataFrame(rows, columns=["correction", "step_time_delta_s",
                                       "peak_memory_delta_gib"])


# ------------------------------------------------------------------------------ display

def _fmt_col(df, col: str, fn) -> None:
    df[col] = [fn(v) if v == v and v is not None else "–" for v in df[col]]


def stage_notes(df) -> tuple[str, ...]:
    """Footnotes giving the uneven stage splits that :func:`display_plans` marks."""
    return split_notes(split_marks(df["stage_layers"])) if "stage_layers" in df else ()


def _mark_splits(out) -> None:
    """The layout label with a footnote mark where the stage split is uneven, in place of
    the split itself (the CSV keeps the split)."""
    if "stage_layers" not in out:
        return
    marks = split_marks(out["stage_layers"])
    out["layout"] = [f"{lab} {marks[s]}" if s in marks else lab
                     for lab, s in zip(out["layout"], out["stage_layers"])]
    del out["stage_layers"]


def display_plans(df, *, key: str | None = None):
    """A copy of a summary/gpu/sensitivity table with readable units, for HTML and Markdown."""
    out = df.copy()
    _mark_splits(out)
    if "tokens_per_s" in out:
        _fmt_col(out, "tokens_per_s", lambda v: si(v, "tok/s"))
    if "mfu" in out:
        _fmt_col(out, "mfu", lambda v: f"{v:.1%}")
    if "step_time_s" in out:
        _fmt_col(out, "step_time_s", seconds)
    if "memory_peak_gib" in out:
        _fmt_col(out, "memory_peak_gib", lambda v: f"{v:.1f} GiB")
    if "usd_per_million_tokens" in out:
        _fmt_col(out, "usd_per_million_tokens", lambda v: f"${v:.3f}")
    if "time_to_train_s" in out:
        if out["time_to_train_s"].isna().all():
            out = out.drop(columns=["time_to_train_s", "cost_usd"])
        else:
            _fmt_col(out, "time_to_train_s", duration)
            _fmt_col(out, "cost_usd", dollars)
    if "scaling_efficiency" in out:
        _fmt_col(out, "scaling_efficiency", lambda v: f"{v:.0%}")
    if "price_per_gpu_hour" in out:
        _fmt_col(out, "price_per_gpu_hour", lambda v: f"${v:.2f}")
    if "gpus_used" in out:
        # columns that repeat what every row (or the section's text) already says go
        if "gpus" in out and all(u != u or u == g for u, g in zip(out["gpus_used"], out["gpus"])):
            out = out.drop(columns=["gpus_used"])
        else:
            _fmt_col(out, "gpus_used", lambda v: f"{int(v)}")
    if "gpus" in out and ({"gpu", "global_batch", "seq_len"} & set(out.columns)) \
            and out["gpus"].nunique() == 1:
        out = out.drop(columns=["gpus"])
    if "feasible" in out:
        out = out.drop(columns=["feasible"])
    if "note" in out:
        if not any(out["note"]):
            out = out.drop(columns=["note"])
        else:
            out["note"] = [n if len(n) <= 240 else n[:239] + "…" for n in out["note"]]
    names = {"tokens_per_s": "throughput", "mfu": "MFU", "step_time_s": "step time",
             "memory_peak_gib": "peak memory", "usd_per_million_tokens": "$ / M tokens",
             "time_to_train_s": "time to train", "cost_usd": "cost of run",
             "scaling_efficiency": "scaling eff.", "gpus_used": "GPUs used",
             "price_per_gpu_hour": "$ / GPU-h", "global_batch": "global batch",
             "seq_len": "seq len"}
    return out.rename(columns=names)


def display_topk(df):
    out = df.copy()
    _mark_splits(out)
    keep = ["rank", "layout", "microbatches", "step_time_s", "tokens_per_s", "mfu",
            "memory_peak_gib", "bubble_s", "tp_comm_s", "dp_exposed_s"]
    out = out[keep]
    for col in ("bubble_s", "tp_comm_s", "dp_exposed_s"):
        _fmt_col(out, col, seconds)
    out = display_plans(out)
    return out.rename(columns={"microbatches": "m", "bubble_s": "bubble",
                               "tp_comm_s": "TP comm", "dp_exposed_s": "DP exposed"})


def breakdown_table(topk, count: int):
    """The step-time parts (seconds) of the first ``count`` plans of a top-k table."""
    cols = ["rank", "layout", "stage_layers"] + [
        c for c in topk.columns if c.endswith("_s") and c != "tokens_per_s"]
    return topk.iloc[:count][cols]


def display_breakdown(df):
    """Step-time parts with units (s, ms, µs), readable headers, and the parts that are zero
    for every plan shown left out (the CSV keeps them)."""
    out = df.copy()
    _mark_splits(out)
    for col in [c for c in out.columns if c.endswith("_s")]:
        if col != "step_time_s" and not (out[col].abs() > 0).any():
            del out[col]
        else:
            _fmt_col(out, col, seconds)
    out = out.rename(columns={"zero3_gathers_s": "ZeRO-3 gathers_s", "tp_comm_s": "TP comm_s",
                              "pp_comm_s": "PP comm_s", "dp_exposed_s": "DP exposed_s",
                              "pp_p2p_interference_s": "PP p2p interference_s",
                              "waiting_for_the_cpu_s": "waiting for the CPU_s",
                              "fsdp2_per_step_s": "FSDP2 per step_s",
                              "cp_comm_s": "CP comm_s", "ep_comm_s": "EP comm_s"})
    return out.rename(columns=lambda c: c[:-2].replace("_", " ") if c.endswith("_s") else c)


def display_memory(df):
    """Memory per stage in GiB with two decimals and readable headers (the in-flight
    micro-batch count, not a size, stays in the CSV)."""
    out = df.drop(columns=["inflight_microbatches"])
    for col in out.columns:
        if col.endswith("_gib"):
            _fmt_col(out, col, lambda v: f"{v:.2f}")
    return out.rename(columns=lambda c: c[:-4] if c.endswith("_gib") else c)


def display_measurements(df):
    out = df.copy()
    for key, fn in (("step_time_s", lambda v: f"{v:.3f} s"),
                    ("tokens_per_s", lambda v: si(v, "tok/s")),
                    ("mfu", lambda v: f"{v:.1%}"),
                    ("memory_peak_bytes", lambda v: f"{v / GIB:.2f} GiB")):
        for side in ("predicted", "measured"):
            _fmt_col(out, f"{side}_{key}", fn)
        _fmt_col(out, f"error_pct_{key}", lambda v: f"{v:+.1f}%")
    short = {"step_time_s": "step", "tokens_per_s": "tok/s", "mfu": "MFU",
             "memory_peak_bytes": "memory"}
    ren = {}
    for key, s in short.items():
        ren[f"predicted_{key}"] = f"{s} pred."
        ren[f"measured_{key}"] = f"{s} meas."
        ren[f"error_pct_{key}"] = f"{s} err."
    return out.rename(columns=ren)


def to_markdown(df) -> str:
    """A GitHub-flavoured Markdown table (no tabulate dependency)."""
    cols = [str(c) for c in df.columns]
    esc = lambda v: str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(esc(c) for c in cols) + " |",
             "| " + " | ".join("---" for _ in cols) + " |"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(esc(v) for v in row) + " |")
    return "\n".join(lines)
