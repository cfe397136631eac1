"""Diagnostic (issue 38): does an MoE block run slower on the hidden states a training step
feeds it than on the random input calibrate times its rows with?

moeh1's compiled layouts ran 6-8 % slower than predicted from rows timed on that model; with
``--block-marks`` every block's forward ran 3.5-4.1 ms in the step against the row's 3.29 ms
(backward within 3 %), slower in deeper blocks. Calibrate feeds a row's blocks
``torch.randn`` (:func:`meshplan.calibrate.layer_build._layer_input`); the step feeds block i
what blocks 0 .. i−1 made of embedded tokens. This builds the whole model as the executor
does (seeded init, bf16 autocast, each block compiled), runs one micro-batch of random
tokens through it recording each block's input and its routing (tokens per expert: max /
mean), then times chosen blocks' forward and backward on (a) that recorded input and (b)
calibrate's random input of the same shape.

    python benchmarks/moe_routing_gpu.py --model benchmarks/sets/moeh1/m01.json \
        --micro-batch 2 --out $OUT/moe_routing.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _time(block, x, rope, reps: int, torch) -> tuple[float, float]:
    """Median forward and backward ms of ``block`` on ``x`` (synchronized per iteration)."""
    fw, bw = [], []
    for i in range(reps + 3):
        xi = x.detach().requires_grad_(True)
        e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        e[0].record()
        y = block(xi, rope)
        e[1].record()
        y.backward(torch.ones_like(y))
        e[2].record()
        torch.cuda.synchronize()
        if i >= 3:
            fw.append(e[0].elapsed_time(e[1]))
            bw.append(e[1].elapsed_time(e[2]))
    return statistics.median(fw), statistics.median(bw)


def main(argv=None) -> int:
    import torch
    import torch.nn.functional as F

    from moe_forward_gap_gpu import _build

    from meshplan.spec import ModelSpec
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--blocks", default="0,1,2,4,10,19")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    spec = ModelSpec.from_dict(json.loads(Path(args.model).read_text()))
    dev = torch.device("cuda", 0)
    m = _build(spec, spec.num_layers, torch, compile=False)   # compiled after the routing pass
    s = spec.max_seq_len
    inputs: dict[int, torch.Tensor] = {}
    loads: dict[int, dict] = {}

    def hooks(i, layer):
        def block_in(_mod, a):
            inputs[i] = a[0].detach().clone()

        def mlp_in(_mod, a):
            x2d = a[0].reshape(-1, a[0].shape[-1]).float()
            logits = F.linear(x2d, layer.mlp.router.weight.float())
            idx = torch.softmax(logits, -1).topk(spec.experts_per_token, -1).indices
            c = torch.bincount(idx.reshape(-1), minlength=spec.num_experts).float()
            loads[i] = {"max_over_mean": float(c.max() / c.mean()),
                        "min_over_mean": float(c.min() / c.mean()),
                        "input_std": float(a[0].float().std())}
        layer.register_forward_pre_hook(block_in)
        layer.mlp.register_forward_pre_hook(mlp_in)

    for i, layer in enumerate(m.layers.values()):
        hooks(i, layer)
    tokens = torch.randint(0, spec.vocab_size, (args.micro_batch, s), device=dev)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        m(tokens)
    print("routing per block (tokens per expert, max / mean):",
          [round(loads[i]["max_over_mean"], 2) for i in sorted(loads)], flush=True)
    for block in m.layers.values():
        block.compile()
    rope = m._rope
    out = {"model": spec.name, "micro_batch": args.micro_batch, "gpu":
           torch.cuda.get_device_name(0), "torch": torch.__version__, "routing": loads,
           "blocks": {}}
    for i in (int(b) for b in args.blocks.split(",")):
        block = list(m.layers.values())[i]
        real = inputs[i]
        rand = torch.randn_like(real)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            r = _time(block, real, rope, args.reps, torch)
            n = _time(block, rand, rope, args.reps, torch)
        out["blocks"][i] = {"step_input_ms": r, "randn_input_ms": n,
                            "input_std": loads[i]["input_std"]}
        print(f"block {i}: step input fwd {r[0]:.3f} bwd {r[1]:.3f} ms, randn fwd {n[0]:.3f} "
              f"bwd {n[1]:.3f} ms, routing max/mean {loads[i]['max_over_mean']:.2f}",
              flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
