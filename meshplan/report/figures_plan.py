"""Figures about one plan (or a few): memory per stage, step-time breakdown, pipeline timeline.

Every function returns a :class:`matplotlib.figure.Figure` (Agg canvas, no pyplot) and draws
only numbers the cost model produced: :class:`~meshplan.costmodel.result.Estimate` fields and
the schedule simulator's events.
"""

from __future__ import annotations

import textwrap
from typing import Sequence

from meshplan.costmodel.result import Estimate
from meshplan.report.style import (ACCENT, GIB, MEMORY_COLORS, PASS_COLORS, REFERENCE,
                                   TIME_COLORS, figure)


def memory_parts(est: Estimate) -> dict[str, list[float]]:
    """Per pipeline stage, GiB of each memory part; "other" = logits/embedding + buffers."""
    return {
        "weights": [m.weights_bytes / GIB for m in est.memory],
        "grads": [m.grads_bytes / GIB for m in est.memory],
        "optimizer": [m.optimizer_bytes / GIB for m in est.memory],
        "activations": [m.activations_bytes / GIB for m in est.memory],
        "other": [(m.embedding_logits_bytes + m.buffers_bytes) / GIB for m in est.memory],
    }


def time_parts(est: Estimate) -> dict[str, float]:
    """Step-time parts in seconds; they sum to ``est.step_time_s`` (TimeBreakdown.total_s)."""
    t = est.time
    return {"compute": t.compute_s, "TP comm": t.tp_comm_s, "PP comm": t.pp_comm_s,
            "PP p2p interference": t.pp_interference_s,
            "bubble": t.bubble_s, "DP exposed": t.dp_comm_exposed_s,
            "ZeRO-3 gathers": t.zero3_gather_s, "optimizer": t.optimizer_s,
            "waiting for the CPU": t.host_wait_s, "FSDP2 per step": t.fsdp_step_s}


def memory_per_stage(est: Estimate, *, title: str | None = None, gpu_memory_bytes: float | None = None):
    """Stacked bars of each pipeline stage's memory per GPU against usable memory.

    ``gpu_memory_bytes`` (optional) also draws the card's full capacity; usable memory is
    capacity less the cluster's reserve (CUDA context, NCCL, fragmentation).
    """
    parts = memory_parts(est)
    n = len(est.memory)
    with figure(3.6 + (0.2 if n > 16 else 0.0)) as fig:
        ax = fig.add_subplot()
        xs = list(range(n))
        bottom = [0.0] * n
        for name, vals in parts.items():
            if any(v > 0 for v in vals):
                ax.bar(xs, vals, bottom=bottom, color=MEMORY_COLORS[name], label=name,
                       width=0.8, edgecolor="white", linewidth=0.4 if n <= 32 else 0)
            bottom = [b + v for b, v in zip(bottom, vals)]
        usable = est.usable_memory_bytes / GIB
        ax.axhline(usable, color=ACCENT, linestyle="--", linewidth=1.4,
                   label=f"usable {usable:.1f} GiB")
        top = max(max(bottom), usable)
        if gpu_memory_bytes:
            cap = gpu_memory_bytes / GIB
            ax.axhline(cap, color=REFERENCE, linestyle=":", linewidth=1.2,
                       label=f"capacity {cap:.0f} GiB")
            top = max(top, cap)
        ax.set_ylim(0, top * 1.12)
        ax.set_xlabel("pipeline stage (rank)")
        ax.set_ylabel("memory per GPU (GiB)")
        if n <= 24:
            ax.set_xticks(xs)
        pad = 0.6 + max(0, 4 - n) / 2   # a lone stage should not fill the axis
        ax.set_xlim(-pad, n - 1 + pad)
        peak = max(range(n), key=lambda i: est.memory[i].total_bytes)
        ax.annotate(f"peak {est.memory[peak].total_bytes / GIB:.1f} GiB",
                    (peak, bottom[peak]), xytext=(0, 4), textcoords="offset points",
                    ha="center", fontsize=8.5)
        # wrapped: a long layout in the title must not run past the figure's edge
        ax.set_title(textwrap.fill(title or "Memory per GPU by pipeline stage", 90))
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="x", visible=False)
    return fig


def step_time_breakdown(labeled: Sequence[tuple[str, Estimate]], *, title: str | None = None):
    """Horizontal stacked bars of the step-time parts, one bar per plan (best on top)."""
    labels = [lab for lab, _ in labeled]
    rows = [time_parts(est) for _, est in labeled]
    n = len(rows)
    with figure(1.3 + 0.42 * n) as fig:
        ax = fig.add_subplot()
        ys = list(range(n))[::-1]
        left = [0.0] * n
        for name in TIME_COLORS:
            vals = [r.get(name, 0.0) for r in rows]
            if any(v > 0 for v in vals):
                ax.barh(ys, vals, left=left, color=TIME_COLORS[name], label=name, height=0.7,
                        edgecolor="white", linewidth=0.4)
            left = [a + v for a, v in zip(left, vals)]
        for y, (_, est), end in zip(ys, labeled, left):
            # label at the bar's end; a step time that differs from the sum of its parts
            # would show as a gap or overlap, so it is printed, not hidden
            ax.plot([est.step_time_s] * 2, [y - 0.42, y + 0.42], color="black", linewidth=1.6)
            ax.text(max(end, est.step_time_s), y, f" {est.step_time_s:.2f} s", va="center",
                    fontsize=8.5)
        ax.set_yticks(ys, labels, fontsize=8)
        ax.set_xlim(0, max(left) * 1.13)
        ax.set_xlabel("time per optimizer step (s)")
        ax.set_ylabel("plan (rank: layout)")
        ax.set_title(title or "Where the step time goes")
        from matplotlib.lines import Line2D
        handles, names = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], color="black", linewidth=1.6))
        names.append("step time")
        # beside the axes, one entry a line: below them it ran into the x label
        fig.legend(handles, names, loc="outside right upper")
        ax.grid(axis="y", visible=False)
    return fig


def pipeline_timeline(sim, *, pp: int, vpp: int = 1, title: str | None = None,
                      closed_form_s: float | None = None):
    """The schedule as a Gantt chart: one row per pipeline rank, forward/backward/weight-grad
    blocks per micro-batch; the white gaps between blocks are the bubble (the "comb").

    ``sim`` is a :class:`meshplan.costmodel.pipeline_sim.Simulation`; ``closed_form_s``
    (optional) is the cost model's pipeline time, printed beside the simulated one.
    """
    rows = {r: {k: [] for k in PASS_COLORS} for r in range(pp)}
    for e in sim.events:
        rows[e.rank][e.kind].append((e.start_s, e.end_s - e.start_s, e.chunk, e.microbatch))
    m = 1 + max((e.microbatch for e in sim.events), default=0)
    with figure(1.6 + 0.32 * min(pp, 32)) as fig:
        ax = fig.add_subplot()
        for r in range(pp):
            y = pp - 1 - r
            for kind, spans in rows[r].items():
                for chunk in range(vpp):
                    bars = [(s, d) for s, d, c, _ in spans if c == chunk]
                    if bars:
                        # later chunks of an interleaved rank are drawn lighter
                        alpha = 1.0 - 0.45 * chunk / max(1, vpp - 1) if vpp > 1 else 1.0
                        ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=PASS_COLORS[kind],
                                       alpha=alpha, edgecolor="white",
                                       linewidth=0.3 if m * vpp <= 64 else 0)
            if m * vpp <= 16 and pp <= 16:  # micro-batch numbers only while they fit
                for kind, spans in rows[r].items():
                    for s, d, _, j in spans:
                        ax.text(s + d / 2, y, str(j), ha="center", va="center", fontsize=6.5,
                                color="white")
        ax.set_yticks(range(pp), [f"rank {r}" for r in range(pp)][::-1] if pp <= 32 else
                      [str(r) if r % 8 == 0 else "" for r in range(pp)][::-1], fontsize=8)
        ax.set_ylim(-0.6, pp - 0.4)
        ax.set_xlim(0, sim.step_time_s * 1.005)
        ax.set_xlabel("time within one optimizer step (s)")
        ax.set_ylabel("pipeline stage")
        idle = sum(sim.idle_s(r) for r in range(pp)) / (pp * sim.step_time_s)
        sub = f"simulated {sim.step_time_s:.3f} s"
        if closed_form_s is not None:
            sub += f" (cost model {closed_form_s:.3f} s)"
        ax.set_title((title or "Pipeline schedule") + f" — {sub}, {idle:.0%} idle")
        from matplotlib.patches import Patch
        names = {"F": "forward", "B": "backward", "W": "weight gradient"}
        kinds = [k for k in PASS_COLORS if any(rows[r][k] for r in range(pp))]
        handles = [Patch(color=PASS_COLORS[k], label=names[k]) for k in kinds]
        handles.append(Patch(facecolor="white", edgecolor="#BBBBBB", label="idle (bubble)"))
        if vpp > 1:
            handles.append(Patch(color="#BBBBBB", alpha=0.5,
                                 label=f"lighter = later of the {vpp} model chunks per rank"))
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles))
        ax.grid(axis="y", visible=False)
    return fig
