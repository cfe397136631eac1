"""accuracy.md and the predicted-vs-measured scatter plot of a validate run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from meshplan.calibrate.stats import STEADY_SPREAD_PCT
from meshplan.costmodel.estimate import HOST_NEAR_LOAD_TEXT

GIB = 2**30


def _fmt(v: Any, spec: str = ".1f", suffix: str = "") -> str:
    return "—" if v is None else f"{v:{spec}}{suffix}"


def markdown(records: Sequence[dict[str, Any]], summary: dict[str, Any],
             per_model: dict[str, dict[str, Any]], meta: dict[str, Any], png_name: str) -> str:
    out = ["# Predicted vs measured step time and memory", ""]
    for k in ("date", "machine", "device", "gpu_name", "torch", "cuda", "nccl", "cluster",
              "profile", "job", "command"):
        if meta.get(k) not in (None, ""):
            out.append(f"- **{k}**: `{meta[k]}`")
    out.append("")
    out.append("## Summary")
    out.append("")
    out.append("| models | layouts run | step time mean abs err | max abs err | Spearman | "
               "predicted best = measured best | predicted best's gap | memory mean abs err | "
               "memory max abs err | not run |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for name, s in [("all", summary), *per_model.items()] if len(per_model) > 1 else \
            [(next(iter(per_model), "all"), summary)]:
        not_ok = ", ".join(f"{v} {k}" for k, v in s.get("not_ok", {}).items() if v) or "none"
        same = s.get("predicted_best_is_measured_best")
        out.append(
            f"| {name} | {s.get('ok', 0)}/{s.get('layouts', 0)} | "
            f"{_fmt(s.get('step_time_mean_abs_error_pct'), '.2f', '%')} | "
            f"{_fmt(s.get('step_time_max_abs_error_pct'), '.2f', '%')} | "
            f"{_fmt(s.get('spearman'), '.3f')} | "
            f"{'—' if same is None else ('yes' if same else 'no')} | "
            f"{_fmt(s.get('predicted_best_gap_pct'), '.2f', '%')} | "
            f"{_fmt(s.get('memory_mean_abs_error_pct'), '.2f', '%')} | "
            f"{_fmt(s.get('memory_max_abs_error_pct'), '.2f', '%')} | {not_ok} |")
    out.append("")
    out.append("Errors are (predicted − measured) / measured. Spearman and the best-layout check "
               "are computed per model (across models they compare unlike work); the 'all' row "
               "pools the layouts.")
    if summary.get("steady_layouts"):
        out.append("")
        out.append(f"Layouts whose measured steps were steady (p90 − p10 ≤ "
                   f"{STEADY_SPREAD_PCT:g} % of the median step): {summary['steady_layouts']} of "
                   f"{summary.get('ok', 0)}, step time mean abs err "
                   f"{_fmt(summary.get('steady_step_time_mean_abs_error_pct'), '.2f', '%')}, "
                   f"max {_fmt(summary.get('steady_step_time_max_abs_error_pct'), '.2f', '%')}. "
                   f"The others varied more than the goal from step to step.")
    if summary.get("host_bound_layouts") or summary.get("gpu_bound_layouts"):
        def err(kind: str, stat: str) -> str:
            return _fmt(summary.get(f"{kind}_step_time_{stat}_abs_error_pct"), ".2f", "%")
        out.append("")
        out.append(f"By the model's own call (from the profile and the layout, not the "
                   f"measurement): {summary.get('gpu_bound_layouts', 0)} layouts GPU-bound, "
                   f"step time mean abs err {err('gpu_bound', 'mean')}, max "
                   f"{err('gpu_bound', 'max')}; {summary.get('host_bound_layouts', 0)} "
                   f"host-bound (the CPU's kernel launches set the step; its `host-bound:` "
                   f"caveat), mean {err('host_bound', 'mean')}, max {err('host_bound', 'max')}.")
        if "headroom_layouts" in summary:
            out.append(f"Of the GPU-bound ones, {summary['headroom_layouts']} leave the CPU "
                       f"headroom (its dispatch < {HOST_NEAR_LOAD_TEXT} of the GPU's time): mean "
                       f"{err('headroom', 'mean')}, max {err('headroom', 'max')}; "
                       f"{summary.get('near_host_bound_layouts', 0)} are near host-bound "
                       f"(≥ {HOST_NEAR_LOAD_TEXT}; "
                       f"their `near host-bound:` caveat): mean {err('near_host_bound', 'mean')}, "
                       f"max {err('near_host_bound', 'max')}.")
    out.append("")
    out.append("## Layouts")
    out.append("")
    if any(len(r.get("runs") or []) > 1 for r in records):
        out.append("Layouts run more than once (`--repeats`) are measured by the median of their "
                   "runs' step times and each rank's largest peak; the range of the runs is shown "
                   "beside the median.")
        out.append("")
    out.append("| name | model | layout | status | predicted step (s) | measured step (s) | "
               "step spread | err | predicted peak mem (GiB) | measured peak mem per rank (GiB) | "
               "worst rank mem err |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in records:
        p, m = r.get("predicted", {}), r.get("measured", {})
        mem = m.get("memory_per_rank_bytes") or []
        errs = r.get("memory_error_pct_per_rank") or []
        worst = max(errs, key=abs) if errs else None
        status = r.get("status", "?")
        if status != "ok" and r.get("error"):
            status += f": {str(r['error'])[:80]}".replace("|", "/")
        times = [x["step_time_s"] for x in r.get("runs") or []
                 if x.get("status") == "ok" and x.get("step_time_s")]
        runs = (f" (runs {min(times):.4f}-{max(times):.4f}, {len(times)} of "
                f"{len(r['runs'])} ok)" if len(r.get("runs") or []) > 1 and times else "")
        out.append(
            f"| {r['name']} | {r.get('model', '')} | {r['short']} | {status} | "
            f"{_fmt(p.get('step_time_s'), '.4f')} | {_fmt(m.get('step_time_s'), '.4f')}{runs} | "
            f"{_fmt(m.get('step_time_spread'), '.0f', '%')} | "
            f"{_fmt(r.get('step_time_error_pct'), '+.1f', '%')} | "
            f"{_fmt(p.get('memory_peak_bytes') and p['memory_peak_bytes'] / GIB, '.2f')} | "
            f"{' '.join(f'{v / GIB:.2f}' for v in mem) or '—'} | {_fmt(worst, '+.1f', '%')} |")
    out.append("")
    out.append(f"![predicted vs measured]({png_name})")
    out.append("")
    return "\n".join(out)


def scatter_png(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    """Two panels: step time and per-rank peak memory, predicted (x) against measured (y),
    with the y = x line and a ±3% (time) / ±5% (memory) band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if r.get("status") == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, key, band, unit, scale in ((axes[0], "time", 0.03, "s", 1.0),
                                       (axes[1], "mem", 0.05, "GiB", 1 / GIB)):
        xs, ys, labels = [], [], []
        for r in ok:
            if key == "time":
                xs.append(r["predicted"]["step_time_s"])
                ys.append(r["measured"]["step_time_s"])
                labels.append(r["name"])
            else:
                for pv, mv in zip(r["predicted"]["memory_per_rank_bytes"],
                                  r["measured"].get("memory_per_rank_bytes") or []):
                    xs.append(pv * scale)
                    ys.append(mv * scale)
                    labels.append("")
        if xs:
            models = sorted({r.get("model", "") for r in ok})
            if key == "time":
                for mname in models:
                    pts = [(x, y) for x, y, r in zip(xs, ys, ok) if r.get("model", "") == mname]
                    ax.scatter(*zip(*pts), label=mname or "layouts", s=25)
                for x, y, lab in zip(xs, ys, labels):
                    ax.annotate(lab, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            else:
                ax.scatter(xs, ys, s=15, label="ranks")
            lo, hi = min(xs + ys) * 0.9, max(xs + ys) * 1.1
            line = [lo, hi]
            ax.plot(line, line, "k-", lw=0.8, label="predicted = measured")
            ax.fill_between(line, [v * (1 - band) for v in line], [v * (1 + band) for v in line],
                            color="grey", alpha=0.2, label=f"±{band:.0%}")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            ax.legend(fontsize=8)
        ax.set_xlabel(f"predicted ({unit})")
        ax.set_ylabel(f"measured ({unit})")
        ax.set_title("step time" if key == "time" else "peak memory per rank")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return path
