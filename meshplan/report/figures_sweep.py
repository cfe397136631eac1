"""Figures across plans: scaling with GPU count, GPU types, what-ifs, measured vs predicted.

Each function takes a pandas DataFrame built by :mod:`meshplan.report.tables` (raw numbers,
one row per plan) and returns a :class:`matplotlib.figure.Figure`.
"""

from __future__ import annotations

from meshplan.report.style import ACCENT, PALETTE, REFERENCE, figure

_DAY_S = 86400.0


def _feasible(df):
    return df[df["feasible"]] if "feasible" in df else df


def _log2_gpu_axis(ax, gpus) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(gpus), [str(g) for g in gpus])
    ax.minorticks_off()
    ax.set_xlabel("GPUs")


def _tokens_unit(values) -> tuple[float, str]:
    """(scale, axis label) putting tokens/s in k or M, whichever keeps the largest ≥ 1."""
    top = max((v for v in values if v == v), default=0.0)
    return (1e-6, "throughput (M tokens/s)") if top >= 1e6 else \
        (1e-3, "throughput (k tokens/s)")


def _log_y(ax) -> None:
    """A log y axis labelled with plain numbers: at 1, 2, 5 × 10^k, or 1, 2, 3, 5, 7 × 10^k
    where the data span less than a decade and a half (so at least three ticks show)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    subs = (1.0, 2.0, 5.0) if hi / lo > 30 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())


def scaling(df, *, title: str | None = None):
    """Tokens/s (with ideal linear scaling from the smallest count), MFU, time-to-train and
    cost against GPU count. ``df``: :func:`meshplan.report.tables.summary_table` output.

    Every panel has GPUs on a log-2 axis. Throughput and time to train (or step time) are
    on log axes too, so linear scaling is a straight line of slope ±1 whatever the range;
    MFU and cost, ratios that ideal scaling keeps flat, are on linear axes from zero."""
    d = _feasible(df)
    has_tokens = "time_to_train_s" in d and d["time_to_train_s"].notna().any()
    g = list(d["gpus"])
    with figure(5.6) as fig:
        axs = fig.subplots(2, 2)
        ax = axs[0, 0]
        scale, ylabel = _tokens_unit(d["tokens_per_s"])
        ax.plot(g, d["tokens_per_s"] * scale, "o-", color=PALETTE[0], label="best plan")
        if len(g) > 1:
            base = d.iloc[0]
            ideal = [base["tokens_per_s"] * n / base["gpus"] * scale for n in g]
            ax.plot(g, ideal, "--", color=REFERENCE, linewidth=1, label="linear from smallest")
        ax.set_ylabel(ylabel)
        ax.set_title("Throughput")
        ax.legend()
        ax = axs[0, 1]
        ax.plot(g, 100 * d["mfu"], "o-", color=PALETTE[2])
        ax.set_ylabel("MFU (%)")
        ax.set_ylim(0, max(100 * d["mfu"].max() * 1.2, 10))
        ax.set_title("Model FLOPs utilization")
        ax = axs[1, 0]
        if has_tokens:
            ax.plot(g, d["time_to_train_s"] / _DAY_S, "o-", color=PALETTE[1])
            ax.set_ylabel("time to train (days)")
            ax.set_title("Time to train")
        else:
            ax.plot(g, d["step_time_s"], "o-", color=PALETTE[1])
            ax.set_ylabel("step time (s)")
            ax.set_title("Step time (give tokens for time to train)")
        ax = axs[1, 1]
        if has_tokens:
            ax.plot(g, d["cost_usd"] / 1e3, "o-", color=ACCENT)
            ax.set_ylabel("cost of the run (k$)")
            ax.set_title("Cost of the training run")
        else:
            ax.plot(g, d["usd_per_million_tokens"], "o-", color=ACCENT)
            ax.set_ylabel("cost ($ per million tokens)")
            ax.set_title("Cost per token")
        for a in axs.flat:
            _log2_gpu_axis(a, g)
        for a in (axs[0, 0], axs[1, 0]):
            _log_y(a)
        for a in (axs[0, 1], axs[1, 1]):
            lo, hi = a.get_ylim()
            a.set_ylim(0 if lo >= 0 else lo, hi * 1.08)
        fig.suptitle(title or "Scaling with cluster size", fontweight="bold")
    return fig


def gpu_comparison(df, *, title: str | None = None):
    """Bars per GPU type: throughput, MFU, time-to-train (or step time) and cost.
    ``df``: :func:`meshplan.report.tables.gpu_table` output."""
    d = _feasible(df)
    names = list(d["gpu"])
    has_tokens = "time_to_train_s" in d and d["time_to_train_s"].notna().any()
    panels = [("tokens_per_s", *_tokens_unit(d["tokens_per_s"]), "Throughput"),
              ("mfu", 100.0, "MFU (%)", "Model FLOPs utilization"),
              (("time_to_train_s", 1 / _DAY_S, "time to train (days)", "Time to train")
               if has_tokens else ("step_time_s", 1.0, "step time (s)", "Step time")),
              (("cost_usd", 1e-3, "cost of the run (k$)", "Cost of the run") if has_tokens
               else ("usd_per_million_tokens", 1.0, "$ per million tokens", "Cost per token"))]
    with figure(5.4) as fig:
        axs = fig.subplots(2, 2)
        colors = [PALETTE[i % len(PALETTE)] for i in range(len(names))]
        for ax, (col, scale, ylabel, ttl) in zip(axs.flat, panels):
            vals = [v * scale for v in d[col]]
            ax.bar(range(len(names)), vals, color=colors, width=0.6)
            for i, v in enumerate(vals):
                ax.text(i, v, f"{v:,.0f}" if v >= 100 else f"{v:.3g}", ha="center",
                        va="bottom", fontsize=8)
            ax.set_xticks(range(len(names)), names, fontsize=8)
            ax.set_xlabel("GPU type")
            ax.set_ylabel(ylabel)
            ax.set_title(ttl)
            ax.set_ylim(0, max(vals) * 1.18 if vals and max(vals) > 0 else 1)
            ax.grid(axis="x", visible=False)
        gpus = sorted(set(d["gpus"]))
        fig.suptitle(title or f"GPU types compared on {', '.join(map(str, gpus))} GPUs",
                     fontweight="bold")
    return fig


def sensitivity(batch_df, seq_df, *, baseline_batch: int, baseline_seq: int,
                title: str | None = None):
    """Throughput and MFU of the best plan as global batch and sequence length change.
    Both frames: :func:`meshplan.report.tables.sensitivity_table` output."""
    with figure(5.2) as fig:
        axs = fig.subplots(2, 2)
        for row, (df, col, label, base) in enumerate(
                ((batch_df, "global_batch", "global batch (sequences)", baseline_batch),
                 (seq_df, "seq_len", "sequence length (tokens)", baseline_seq))):
            d = _feasible(df)
            for ax, (ycol, scale, ylabel, color) in zip(
                    axs[row], (("tokens_per_s", *_tokens_unit(d["tokens_per_s"]), PALETTE[0]),
                               ("mfu", 100.0, "MFU (%)", PALETTE[2]))):
                if len(d):
                    xs = list(d[col])
                    ax.plot(xs, [v * scale for v in d[ycol]], "o-", color=color)
                    ax.set_xscale("log", base=2)
                    ax.set_xticks(xs, [str(x) for x in xs])
                    ax.minorticks_off()
                    ax.axvline(base, color=REFERENCE, linestyle=":", linewidth=1)
                    lo, hi = ax.get_ylim()
                    ax.set_ylim(0, hi * 1.1)
                    infeasible = df[~df["feasible"]] if "feasible" in df else df.iloc[0:0]
                    for x in infeasible[col]:
                        ax.axvspan(x / 1.15, x * 1.15, color="#F4CCCC", zorder=0)
                ax.set_xlabel(label)
                ax.set_ylabel(ylabel)
            axs[row, 0].set_title(f"Throughput vs {col.replace('_', ' ')}")
            axs[row, 1].set_title(f"MFU vs {col.replace('_', ' ')}")
        fig.suptitle(title or "Sensitivity (dotted: the job as given; red: no plan fits)",
                     fontweight="bold")
    return fig


def measured_vs_predicted(df, *, title: str | None = None):
    """Scatter of predicted against measured step time and peak memory, with the y = x line
    and a ±20 % band. ``df``: :func:`meshplan.report.measurements.measurements_table`."""
    panels = (("step_time_s", 1.0, "step time (s)"),
              ("memory_peak_bytes", 1 / 2**30, "peak memory per GPU (GiB)"))
    with figure(4.0) as fig:
        axs = fig.subplots(1, 2)
        for ax, (key, scale, label) in zip(axs, panels):
            pairs = [(p * scale, m * scale, lab) for p, m, lab in
                     zip(df[f"predicted_{key}"], df[f"measured_{key}"], df["layout"])
                     if p is not None and m is not None and p == p and m == m]
            if not pairs:
                ax.text(0.5, 0.5, "not measured", ha="center", va="center",
                        transform=ax.transAxes)
                ax.set_title(label)
                continue
            ps, ms, labs = zip(*pairs)
            lo, hi = min(ps + ms) * 0.8, max(ps + ms) * 1.2
            ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2],
                            color="#EEEEEE", label="±20 %")
            ax.plot([lo, hi], [lo, hi], color=REFERENCE, linewidth=1, label="predicted = measured")
            ax.scatter(ms, ps, color=PALETTE[0], zorder=3, s=28)
            if len(pairs) <= 12:
                for x, y, lab in zip(ms, ps, labs):
                    ax.annotate(lab.split(" ")[0], (x, y), xytext=(4, 3),
                                textcoords="offset points", fontsize=7)
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            ax.set_xlabel(f"measured {label}")
            ax.set_ylabel(f"predicted {label}")
            ax.set_title(label[0].upper() + label[1:])
            ax.legend(loc="upper left")
        fig.suptitle(title or "Measured vs predicted", fontweight="bold")
    return fig
