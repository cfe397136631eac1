"""Diagnostic (issue 38): which kernels make a compiled MoE block's forward slower inside a
training step than in its calibration row (moeh1: 3.5-4.1 ms a block in the step against the
row's 3.29 ms at micro-batch 2; backward within 4 %; docs/benchmarks/moe_checks.md).

One process, one GPU, the executor's model built as the executor builds it (seeded init,
bf16 autocast, each block compiled). The forward's CUDA kernels are profiled in two regimes
and compared name by name (mean µs a call):

* ``row``: one block on ``torch.randn`` input (what ``meshplan calibrate`` feeds a row),
  queued behind a spin kernel after a synchronize;
* ``step``: the whole model on random tokens (embedding, every block, output layer), each
  block fed what the blocks before it made, as in a training step.

Only the forward is profiled (each backward runs after the profiler stops), so the
comparison is of the kernels themselves: if the step's are slower, the input is what
differs; if they match, the step's forward loses its time between kernels (the host).

    python benchmarks/moe_forward_gap_gpu.py --model benchmarks/sets/moeh1/m01.json \
        --micro-batch 2 --out $OUT/moe_forward_gap.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _build(spec, layers: int, torch, *, compile: bool = True):
    """The executor's model (or its first ``layers`` blocks alone), seeded, in bf16 under
    autocast, each block compiled (``compile``)."""
    from meshplan.executor.model import Transformer
    with torch.device("meta"):
        m = Transformer(spec)
    if layers < spec.num_layers:
        m.keep_part(0, layers, embeds_input=False, computes_logits=False)
    m.to_empty(device="cuda")
    m.init_weights(0)
    m.activation_dtype = torch.bfloat16
    if compile:
        for block in m.layers.values():
            block.compile()
    return m


def _forward_kernels(forward, backward, iters: int, torch) -> dict[str, dict]:
    """Per kernel name: calls and µs of ``forward()``'s CUDA kernels over ``iters`` calls
    (``backward(y)`` runs after each, unprofiled); spin kernels left out."""
    from torch.profiler import ProfilerActivity, profile
    acc: dict[str, list[float]] = defaultdict(list)
    for _ in range(iters):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            y = forward()
            torch.cuda.synchronize()
        for e in prof.events():
            if e.device_time_total > 0 and "sleep" not in e.name.lower():
                acc[e.name].append(e.device_time_total)
        backward(y)
    return {k: {"calls": len(v), "mean_us": sum(v) / len(v), "total_us": sum(v)}
            for k, v in acc.items()}


def main(argv=None) -> int:
    import torch

    from meshplan.spec import ModelSpec
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    spec = ModelSpec.from_dict(json.loads(Path(a.model).read_text()))
    s, h, n = spec.max_seq_len, spec.hidden_size, spec.num_layers
    amp = torch.autocast("cuda", dtype=torch.bfloat16)
    out: dict = {"model": spec.name, "micro_batch": a.micro_batch, "iters": a.iters,
                 "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}

    block = _build(spec, 1, torch)
    block.reset_buffers()
    x = torch.randn(a.micro_batch, s, h, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)

    def row_forward():
        torch.cuda._sleep(50_000_000)      # the row's queued regime
        with amp:
            return block(x)

    def ones_backward(y):
        y.backward(torch.ones_like(y))

    for _ in range(3):
        ones_backward(row_forward())
    out["row"] = _forward_kernels(row_forward, ones_backward, a.iters, torch)
    del block, x
    torch.cuda.empty_cache()

    model = _build(spec, n, torch)
    tokens = torch.randint(0, spec.vocab_size, (a.micro_batch, s), device="cuda")

    def step_forward():
        with amp:
            return model(tokens)

    def loss_backward(logits):
        torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                                          tokens.view(-1)).backward()

    for _ in range(2):
        loss_backward(step_forward())
    out["step"] = _forward_kernels(step_forward, loss_backward, a.iters, torch)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")

    row, step = out["row"], out["step"]
    row_block_us = sum(v["total_us"] for v in row.values()) / a.iters
    step_us = sum(v["total_us"] for v in step.values()) / a.iters
    print(f"forward kernel time: row {row_block_us / 1e3:.3f} ms a block; step "
          f"{step_us / 1e3:.3f} ms a micro-batch ({n} blocks and the ends: "
          f"{step_us / n / 1e3:.3f} ms a block with the ends spread)")
    moved = sorted(((step[k]["mean_us"] - r["mean_us"], k) for k, r in row.items()
                    if k in step), reverse=True)
    print("kernels of both, mean us a call, row -> step (calls a block-forward: row / step):")
    for d, k in moved[:12] + moved[-4:]:
        print(f"  {d:+8.1f}  {row[k]['mean_us']:8.1f} -> {step[k]['mean_us']:8.1f}  "
              f"{row[k]['calls'] / a.iters:4.1f} / {step[k]['calls'] / a.iters / n:5.2f}  "
              f"{k[:80]}")
    only = sorted(((v["total_us"] / a.iters, k) for k, v in step.items() if k not in row),
                  reverse=True)[:8]
    print("only in the step (us a micro-batch):", [(round(t), k[:50]) for t, k in only])
    return 0


if __name__ == "__main__":
    sys.exit(main())
