"""The report's recommendation: which GPU count serves the objective, in one paragraph."""

from __future__ import annotations

from meshplan.report.labels import is_uneven
from meshplan.report.style import dollars, duration, si
from meshplan.spec import Job


def pick(summary, objective: str) -> int | None:
    """Index into ``summary`` of the GPU count that best serves ``objective``."""
    feas = summary[summary["feasible"]]
    if not len(feas):
        return None
    if objective == "cost":
        return int(feas["usd_per_million_tokens"].idxmin())
    if objective == "time_to_train" and feas["time_to_train_s"].notna().any():
        return int(feas["time_to_train_s"].idxmin())
    return int(feas["tokens_per_s"].idxmax())


def split_text(split: str) -> str:
    return f" (layers per stage {split})" if is_uneven(split) else ""


def recommendation(summary, objective: str, idx: int, job: Job) -> str:
    r = summary.loc[idx]
    text = (f"Recommendation (objective: {objective.replace('_', ' ')}): {int(r['gpus'])} GPUs "
            f"as {r['layout']}{split_text(r['stage_layers'])} — "
            f"{si(r['tokens_per_s'], 'tokens/s')}, MFU {r['mfu']:.1%}, "
            f"{r['step_time_s']:.2f} s per step, ${r['usd_per_million_tokens']:.3f} per million "
            f"tokens")
    if job.tokens:
        text += (f"; {job.tokens:.3g} tokens take {duration(r['time_to_train_s'])} and cost "
                 f"{dollars(r['cost_usd'])}")
    text += "."
    feas = summary[summary["feasible"]]
    if len(feas) > 1:
        cheap = feas.loc[feas["usd_per_million_tokens"].idxmin()]
        fast = feas.loc[feas["tokens_per_s"].idxmax()]
        if int(cheap["gpus"]) != int(r["gpus"]):
            text += (f" Cheapest per token: {int(cheap['gpus'])} GPUs "
                     f"(${cheap['usd_per_million_tokens']:.3f}/M tokens).")
        if int(fast["gpus"]) != int(r["gpus"]):
            text += (f" Fastest: {int(fast['gpus'])} GPUs "
                     f"({si(fast['tokens_per_s'], 'tokens/s')}).")
    return text
