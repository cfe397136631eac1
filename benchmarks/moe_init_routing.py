"""How unevenly an MoE model routes the executor's synthetic tokens at its initial weights,
per layer, at a given expert-parallel degree (issue 38; CPU, no GPU needed).

The drawn MoE checks price their ep > 1 layouts at the load imbalance ρ the calibration's ep
rows recorded (random activations through a fresh router: ρ 1.00-1.02), and their runs
record the ρ they routed at (``meshplan.executor.moe_routing``: the busiest ep rank's rows
over the mean, per MoE call, averaged): 1.09-1.23 on moeh7-moeh11, 1.28-1.30 on moeh12
(docs/benchmarks/moe_checks.md "The ep rows against the runs"). This script runs the executor's own
model — ``Transformer.init_weights(seed)``, ``SyntheticTokens`` step 0, the runner's defaults — in
one process and reads each MoE layer's top-k choices, splitting the experts over ``ep``
ranks as the executor does (rank r keeps experts r·E/ep .. (r+1)·E/ep − 1), to see whether
the runs' routing is already there before any training step, and where in the depth of the
model it grows. (A run's ρ also covers its training steps; this is the forward at step 0.)

    python benchmarks/moe_init_routing.py --model benchmarks/sets/moeh12/m01.json \\
        --seq-len 4096 --micro-batch 2 --ep 2

Prints one line per MoE layer (ρ of that layer's call, its busiest expert's share) and the
mean over layers — the figure comparable with a run's ``busiest_over_mean``. Holds the
model's fp32 weights (about 12 GB for the 2.96 B moeh12) and takes 1-2 minutes on two cores
for 8 k tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def layer_rho(experts, num_experts: int, ep: int) -> tuple[float, float]:
    """(ρ over the ep ranks, busiest expert's rows over the mean expert's) of one call's
    routed copies ``experts`` (expert index per copy).

    >>> import torch
    >>> layer_rho(torch.tensor([0, 0, 0, 3]), 4, 2)
    (1.5, 3.0)
    """
    import torch
    per_expert = torch.bincount(experts.reshape(-1), minlength=num_experts).double()
    per_rank = per_expert.view(ep, num_experts // ep).sum(1)
    return (float(per_rank.max() / per_rank.mean()),
            float(per_expert.max() / per_expert.mean()))


def routing_at_init(model_path: str, seq_len: int, micro_batch: int, ep: int,
                    seed: int = 0) -> list[tuple[float, float]]:
    """Per MoE layer (ρ, busiest expert share) of ``micro_batch`` synthetic sequences of
    step 0 through the executor's model at ``Transformer.init_weights(seed)``."""
    import torch

    from meshplan.executor.data import SyntheticTokens
    from meshplan.executor.model import Transformer
    from meshplan.executor.moe import MoELayer
    from meshplan.spec import ModelSpec
    spec = ModelSpec.from_dict(json.loads(Path(model_path).read_text()))
    if not spec.is_moe:
        raise SystemExit(f"--model {model_path}: {spec.name} is dense")
    if spec.num_experts % ep:
        raise SystemExit(f"--ep {ep}: does not divide the model's {spec.num_experts} experts")
    if seq_len > spec.max_seq_len:
        raise SystemExit(f"--seq-len {seq_len}: above the model's {spec.max_seq_len}")
    torch.manual_seed(seed)
    with torch.no_grad():
        model = Transformer(spec)
        model.init_weights(seed)
        model.eval()
        found: list[tuple[float, float]] = []

        def hook(mod, args, out):
            b, s, h = args[0].shape     # the layer's own routing of its input, once more
            _, experts, _, _ = mod._route(args[0].reshape(b * s, h), b, s)
            found.append(layer_rho(experts, mod.num_experts, ep))
        for m in model.modules():
            if isinstance(m, MoELayer):
                m.register_forward_hook(hook)
        batch = SyntheticTokens(spec.vocab_size, seq_len, seed=seed).global_batch(0, micro_batch)
        model(batch[:, :-1])
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="an MoE ModelSpec JSON")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--ep", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="the runner's --seed (default 0)")
    a = p.parse_args(argv)
    if min(a.seq_len, a.micro_batch, a.ep) < 1:
        p.error("--seq-len, --micro-batch and --ep are at least 1")
    if not Path(a.model).is_file():
        p.error(f"--model {a.model!r}: no such file (an MoE ModelSpec JSON)")
    t0 = time.perf_counter()
    rows = routing_at_init(a.model, a.seq_len, a.micro_batch, a.ep, a.seed)
    for i, (rho, top) in enumerate(rows):
        print(f"MoE layer {i}: ρ over {a.ep} ranks {rho:.3f}, busiest expert {top:.2f}× the mean")
    mean = sum(r for r, _ in rows) / len(rows)
    print(f"mean ρ over {len(rows)} layers: {mean:.3f} ({time.perf_counter() - t0:.0f} s, "
          f"{a.micro_batch} × {a.seq_len} tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
