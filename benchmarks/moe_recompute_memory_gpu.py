"""Diagnostic (issue 38): what a compiled, fully recomputed MoE block keeps for its backward.

The calibration of 2026-11-29 12:04 UTC (moeh1, after the executor's permutation lost its
atomics) measured a compiled ``rc=full`` layer keeping 340 MiB at micro-batch 2, where the
earlier executor kept 20 MiB (the block's input): two more [R, h] tensors a layer. Eager
full recomputation keeps only the input, and on the CPU the compiled block does too. This
builds one MoE block of ``--model`` as the executor does (fp32 weights, bf16 autocast,
``recompute_block``, ``block.compile()``), runs a forward under a saved-tensor hook and
prints what the backward keeps (shape, dtype, MiB; weights left out) and the allocator's
difference — for the executor as it is and with one piece of its permutation swapped back
to plain autograd (``--variants``):

* ``current``: the executor's code;
* ``plain-unpad``: the grouped GEMM's output read back with ``index_select`` (autograd's
  ``index_add`` backward) instead of the executor's ``unpad_rows``;
* ``plain-combine``: the combine as ``F.embedding_bag`` with autograd's own backward
  instead of ``combine`` (on CUDA in bf16 its per-sample-weight backward does not exist:
  the variant fails there);
* ``plain-dispatch``: the dispatch as ``index_select`` instead of ``dispatch``;
* ``plain-all``: all three.

Run on 85c84c7 (the pieces as autograd Functions: ``current`` kept two [k·T, h] tensors,
``plain-unpad`` one) and on e0d86f1 (custom operators: ``current`` keeps the input alone);
docs/benchmarks/data/moe_recompute_memory_h200x1_moeh1_20261129.json.

    python benchmarks/moe_recompute_memory_gpu.py --model benchmarks/sets/moeh1/m01.json \
        --micro-batch 2 --out $OUT/moe_recompute_memory.json

``--fp8 rowwise``: the block with the executor's fp8 linears and fp8 routed experts
(moeh33's question: its fp8 full-recompute arm peaked 22 % above the prediction at 64 k
tokens, moeh31's and moeh32's at 16 k did not).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("current", "plain-unpad", "plain-combine", "plain-dispatch", "plain-all")


def _patch(variant: str, moe, torch):
    """Swap one autograd function of executor/moe.py for plain autograd; returns an undo."""
    F = torch.nn.functional
    saved = {n: getattr(moe, n) for n in ("unpad_rows", "combine", "dispatch")}
    if variant in ("plain-unpad", "plain-all"):
        moe.unpad_rows = lambda y, dest: y.index_select(0, dest)
    if variant in ("plain-combine", "plain-all"):
        def combine(out, gates, r):
            rows = out
            if r.padded:
                rows = torch.cat([out, out.new_zeros((1,) + tuple(out.shape[1:]))])
            return F.embedding_bag(r.slot, rows, mode="sum",
                                   per_sample_weights=gates.view(r.slot.shape).to(out.dtype))
        moe.combine = combine
    if variant in ("plain-dispatch", "plain-all"):
        moe.dispatch = lambda x2d, r: x2d.index_select(0, r.token)

    def undo():
        for n, f in saved.items():
            setattr(moe, n, f)
    return undo


def measure(spec, micro_batch: int, variant: str, torch, device: str,
            fp8: str | None = None) -> dict:
    from meshplan.executor import moe
    from meshplan.executor.model import Block
    undo = _patch(variant, moe, torch)
    try:
        torch.manual_seed(0)
        blk = Block(spec, 0).to(device)
        for p in blk.parameters():
            torch.nn.init.normal_(p, std=0.02)
        blk.recompute_block = True
        if fp8:     # the executor's fp8 linears and routed experts (executor/fp8.py)
            from types import SimpleNamespace

            from meshplan.executor.fp8 import convert_to_fp8
            convert_to_fp8(SimpleNamespace(layers={"0": blk}), fp8,
                           device=torch.device(device), tokens=micro_batch * spec.max_seq_len)
        blk.compile()
        dt = torch.bfloat16
        x = torch.randn(micro_batch, spec.max_seq_len, spec.hidden_size, device=device,
                        requires_grad=True)
        params = {p.data_ptr() for p in blk.parameters()}
        amp = torch.autocast(device, dtype=dt)
        for _ in range(2):                       # compile and fill autocast's caches
            with amp:
                y = blk(x, None)
            y.float().sum().backward()
        saved = []

        def pack(t):
            if t.data_ptr() not in params:
                saved.append((list(t.shape), str(t.dtype).replace("torch.", ""),
                              t.numel() * t.element_size() / 2**20))
            return t
        cuda = device == "cuda"
        if cuda:
            torch.cuda.synchronize()
        before = torch.cuda.memory_allocated() if cuda else 0
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp:
            y = blk(x, None)
        kept = (torch.cuda.memory_allocated() - before) / 2**20 if cuda else None
        out_mib = y.numel() * y.element_size() / 2**20
        y.float().sum().backward()
        return {"saved": sorted(saved, key=lambda s: -s[2]),
                "saved_mib": sum(s[2] for s in saved), "allocated_after_forward_mib": kept,
                "output_mib": out_mib}
    finally:
        undo()


def main(argv=None) -> int:
    import torch

    from meshplan.spec import ModelSpec
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=None, help="default: the model's")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--fp8", default=None, help="an fp8 recipe (e.g. rowwise): the block in fp8")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    spec = ModelSpec.from_dict(json.loads(Path(a.model).read_text()))
    if a.seq_len:
        from dataclasses import replace
        spec = replace(spec, max_seq_len=a.seq_len)
    out = {"model": spec.name, "micro_batch": a.micro_batch, "torch": torch.__version__,
           "seq_len": spec.max_seq_len, "fp8": a.fp8,
           "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu", "variants": {}}
    for v in a.variants.split(","):
        if v not in VARIANTS:
            raise SystemExit(f"--variants: {v!r} is not one of {', '.join(VARIANTS)}")
        r = measure(spec, a.micro_batch, v, torch, a.device, a.fp8)
        out["variants"][v] = r
        print(f"{v}: saved {r['saved_mib']:.1f} MiB, allocated after forward "
              f"{r['allocated_after_forward_mib']} MiB; largest "
              f"{[s for s in r['saved'][:6]]}", flush=True)
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
