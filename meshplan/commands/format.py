"""Plain-text rendering of an Estimate: memory per stage and the step-time breakdown."""

from __future__ import annotations

from meshplan.costmodel.corrections import MOE_HOST
from meshplan.costmodel.estimate import HOST_NEAR_LOAD_TEXT
from meshplan.costmodel.result import Estimate


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


HOST_BOUND_NOTE = 0.1   # share of the step the GPUs wait for the CPU above which we say so


def _corrections(est: Estimate) -> list[str]:
    """The named corrections that moved this estimate (each: the estimate less the same
    estimate with it switched off), and what to do where Megatron's MoE host work sets a
    large part of the step."""
    moved = est.moved_corrections
    if not moved:
        return []
    rows = [[c.name, f"{c.step_time_delta_s:+.4f}", f"{c.memory_delta_bytes / 2**30:+.2f}"]
            for c in moved]
    out = ["\nnamed corrections that moved this estimate (docs/costmodel.md, "
           "\"Named corrections\")",
           _table(rows, ["correction", "step time s", "peak memory GiB"])]
    host = sum(c.step_time_delta_s for c in moved if c.name == MOE_HOST)
    if host > HOST_BOUND_NOTE * est.step_time_s:
        out.append(f"note: Megatron's host work per MoE layer sets {host:.3f} s of this step "
                   f"({host / est.step_time_s:.0%}): each layer's micro-batch costs the host "
                   "more than the GPU; larger micro-batches amortise it, and a run that "
                   "replays CUDA graphs does not pay it (--cuda-graphs). The number is fitted "
                   "on published runs (docs/costmodel.md, \"Megatron's host work per MoE "
                   "layer\")")
    return out


def format_estimate(est: Estimate) -> str:
    g = 2**30
    out = []
    out.append(f"step time {est.step_time_s:.3f} s | {est.tokens_per_s:,.0f} tokens/s | "
               f"{est.model_tflops_per_gpu:.1f} model TFLOP/s/GPU | MFU {est.mfu:.1%} | "
               f"HFU {est.hfu:.1%} | {est.num_microbatches} micro-batches on {est.num_gpus} GPUs")
    verdict = "fits" if est.fits else "DOES NOT FIT"
    out.append(f"peak memory {est.memory_peak_bytes / g:.1f} GiB of {est.usable_memory_bytes / g:.1f} "
               f"GiB usable: {verdict}")
    rows = [[str(m.stage), str(m.layers), f"{m.weights_bytes / g:.2f}", f"{m.grads_bytes / g:.2f}",
             f"{m.optimizer_bytes / g:.2f}", f"{m.activations_bytes / g:.2f}",
             f"{m.embedding_logits_bytes / g:.2f}", f"{m.buffers_bytes / g:.2f}",
             f"{round(m.inflight_microbatches, 2):g}", f"{m.total_bytes / g:.2f}"]
            for m in est.memory]
    if len(rows) > 12:  # long pipelines: first, worst and last stages
        worst = max(range(len(est.memory)), key=lambda i: est.memory[i].total_bytes)
        keep = sorted({0, 1, worst, len(rows) - 2, len(rows) - 1})
        rows = [rows[i] for i in keep]
    out.append("\nmemory per GPU by pipeline stage (GiB; mb held: micro-batches whose "
               "activations the stage holds at its peak)")
    out.append(_table(rows, ["stage", "layers", "weights", "grads", "optim", "activ",
                             "logits", "buffers", "mb held", "total"]))
    t = est.time
    parts = [("GEMM", t.gemm_s), ("attention", t.attention_s),
             ("memory-bound ops", t.memory_bound_s), ("fixed overheads", t.overhead_s),
             ("TP/SP communication", t.tp_comm_s), ("PP point-to-point", t.pp_comm_s),
             ("compute slowed by PP p2p kernels", t.pp_interference_s),
             ("pipeline bubble", t.bubble_s), ("DP communication (exposed)", t.dp_comm_exposed_s),
             ("ZeRO-3 gathers (exposed)", t.zero3_gather_s), ("optimizer step", t.optimizer_s),
             ("GPUs waiting for CPU dispatch", t.host_wait_s),
             ("FSDP2 per-step time (measured, not explained)", t.fsdp_step_s)]
    rows = [[name, f"{s:.4f}", f"{s / est.step_time_s:.1%}"] for name, s in parts]
    rows.append(["DP communication (total, overlapped or not)", f"{t.dp_comm_total_s:.4f}", ""])
    out.append("\nstep time on the busiest pipeline rank")
    out.append(_table(rows, ["part", "seconds", "share"]))
    if t.host_wait_s > HOST_BOUND_NOTE * est.step_time_s:
        out.append(f"note: the CPU's kernel dispatch sets this step ({t.host_wait_s / est.step_time_s:.0%}"
                   " of it is the GPUs waiting): larger micro-batches, fewer pipeline stages or "
                   "compiled blocks (`meshplan run --compile`) dispatch less per token. The "
                   "time depends on the host CPU and is not steady: on lent 4-GPU hosts such "
                   "layouts' steps varied 10-46 % within a run and 5-24 % between runs, and "
                   "held-out predictions were 12-14 % off on average against about 1-3 % for "
                   "GPU-bound ones (docs/benchmarks/accuracy.md, rounds 8-9)")
    if est.host_dispatch_s > 0:
        out.append(f"CPU dispatch: {est.host_dispatch_s:.4f} s per step, {est.host_load:.0%} of "
                   f"the GPUs' time (at {HOST_NEAR_LOAD_TEXT} or more the step is near "
                   "host-bound)")
    out.extend(_corrections(est))
    out.extend(f"caution: {c}" for c in est.caveats)
    rows = [[k, f"{v / g:.3f}"] for k, v in est.comm_bytes.items()]
    rows += [[f"on {k}", f"{v / g:.3f}"] for k, v in est.comm_bytes_by_link.items()]
    out.append("\ncommunication sent per GPU per step (GiB)")
    out.append(_table(rows, ["collective", "GiB"]))
    return "\n".join(out)
