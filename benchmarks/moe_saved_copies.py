"""What the executor's MoE layer keeps for its backward, eager and compiled, at ep 1 and at
ep = world (issue 38): do the 16-bit copies of the experts' weights stay?

The cost model's compiled FSDP2 rows at ep > 1 take only the dense weights' copies off the
compiled plain row (``meshplan/costmodel/compiled_rows.py``): six 2 x H200 profiles show
compiled ep 2 rows without the experts' copies, though on the CPU (Inductor, bf16 autocast,
grouped GEMM, ep 2 over gloo) the compiled layer saves them at ep 1 and 2 alike. This script
asks the GPU directly, with the layer alone (router, permutation, all-to-alls, grouped
experts; no attention), at the model's hidden size, experts, sequence and micro-batch.

For each (ep, compiled) it records the bytes autograd saves (``saved_tensors_hooks``, each
storage once, parameters apart), the part of them that are 16-bit tensors of an expert
weight's shape (the copies), and on CUDA the allocator's growth over the forward less the
output (as the calibration's rows read ``activation_bytes``); and, per ep, how far the
compiled layer's gradients (the input's, every parameter's) are from eager's, from the same
weights, tokens and upstream gradient — a routed part left out of the compiled backward
would show as a gap near 1 or "missing". Rank 0 writes ``--out``. On 2 x H200 (torch 2.11,
2026-11-30) it did: gap 1.0 at ep 2, the experts' all-to-all compiled to a zero gradient —
the defect docs/benchmarks/compiled_grads.md describes, since fixed; the copies' question
above had the same answer (nothing needed the routed rows' activations).

    torchrun --standalone --nproc-per-node 2 benchmarks/moe_saved_copies.py \\
        --model benchmarks/sets/moeh14/m01.json --seq-len 2048 --micro-batch 4 \\
        --out $OUT/saved_copies.json
    # CPU (gloo; a quicker compiler with Inductor's partitioner)
    torchrun --standalone --nproc-per-node 2 benchmarks/moe_saved_copies.py --device cpu \\
        --model /tmp/tiny_moe.json --seq-len 64 --micro-batch 2 \\
        --backend aot_eager_decomp_partition --out /tmp/saved_copies.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from meshplan.executor.moe import MoELayer, grouped_mm_usable  # noqa: E402
from meshplan.executor.run import flush_and_exit  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402


def _layer(spec: ModelSpec, ep: int, rank: int, device: torch.device) -> MoELayer:
    torch.manual_seed(0)
    layer = MoELayer(spec)
    if ep > 1:
        per = spec.num_experts // ep
        layer.experts.keep_experts(rank * per, per)
        layer.ep_group = dist.group.WORLD
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.02)
    if device.type == "cpu" or not grouped_mm_usable(device, torch.bfloat16):
        layer.experts.backend = "grouped"     # the GPU path's graph, where torch has it
    return layer.to(device)


def saved(spec: ModelSpec, tokens: tuple[int, int], ep: int, compile_backend: str | None,
          device: torch.device) -> tuple[dict, dict]:
    """One forward and backward of the layer: what autograd saved and the copies in it, and
    the gradients (name -> tensor or None) of the last pass."""
    rank = dist.get_rank()
    layer = _layer(spec, ep, rank, device)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    # a copy is saved as the GEMM takes it: the weight's shape or its transpose
    expert_shapes = {s for p in layer.experts.parameters()
                     for s in (tuple(p.shape), tuple(p.shape[:-2]) + tuple(p.shape[-2:])[::-1])}
    run = torch.compile(layer, backend=compile_backend) if compile_backend else layer
    torch.manual_seed(1 + rank)
    x = torch.randn(*tokens, spec.hidden_size, device=device, dtype=torch.bfloat16,
                    requires_grad=True)
    seen: dict[int, tuple[int, str, tuple[int, ...]]] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params and st.data_ptr() != x.untyped_storage().data_ptr():
            seen[st.data_ptr()] = (st.nbytes(), str(t.dtype), tuple(t.shape))
        return t
    for _ in range(2):          # the second pass measured (compiled, warm)
        seen.clear()
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = run(x)
        grown = (torch.cuda.memory_allocated(device) - before - y.untyped_storage().nbytes()
                 if cuda else None)
        torch.manual_seed(2)      # one upstream gradient for eager and compiled alike
        (y.float() * torch.randn(y.shape, device=device)).sum().backward()
        grads = {"input": x.grad.detach().float().clone()}
        grads.update({n: None if q.grad is None else q.grad.detach().float().clone()
                      for n, q in layer.named_parameters()})
        x.grad = None
        layer.zero_grad(set_to_none=True)
    copies = [v for v in seen.values() if v[1] == "torch.bfloat16" and v[2] in expert_shapes]
    return {"ep": ep, "compiled": compile_backend,
            "saved_bytes": sum(v[0] for v in seen.values()),
            "expert_copy_bytes": sum(v[0] for v in copies),
            "expert_weight_bf16_bytes": 2 * sum(p.numel() for p in layer.experts.parameters()),
            "forward_growth_bytes": grown,
            "largest_saved": sorted(seen.values(), reverse=True)[:8]}, grads


def grad_gaps(eager: dict, compiled: dict) -> dict:
    """Per gradient (the input's, each parameter's): max |compiled − eager| over max |eager|,
    or "missing" where one side has none — whether compile keeps the backward whole."""
    out = {}
    for name, e in eager.items():
        c = compiled.get(name)
        if e is None or c is None:
            out[name] = "missing" if (e is None) != (c is None) else "none"
        else:
            out[name] = float((c - e).abs().max() / e.abs().max().clamp_min(1e-30))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="an MoE ModelSpec JSON")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--backend", default="inductor", help="torch.compile backend")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    spec = ModelSpec.from_dict(json.loads(Path(a.model).read_text()))
    if not spec.is_moe:
        p.error(f"--model {a.model}: {spec.name} has no routed experts")
    if a.seq_len < 1 or a.micro_batch < 1:
        p.error(f"--seq-len {a.seq_len} --micro-batch {a.micro_batch}: both integers >= 1")
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if spec.num_experts % world:
        p.error(f"{spec.num_experts} experts do not split over {world} ranks")
    device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
              if a.device == "cuda" else torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rows = []
    for ep in sorted({1, world}):
        grads = {}
        for backend in (None, a.backend):
            torch._dynamo.reset()
            row, grads[backend] = saved(spec, (a.micro_batch, a.seq_len), ep, backend, device)
            rows.append(row)
            if rank == 0:
                print(f"ep {ep} {'compiled' if backend else 'eager   '}: saved "
                      f"{row['saved_bytes'] / 2**20:.3f} MiB, experts' 16-bit copies "
                      f"{row['expert_copy_bytes'] / 2**20:.3f} of "
                      f"{row['expert_weight_bf16_bytes'] / 2**20:.3f} MiB", flush=True)
        rows[-1]["grad_gap_vs_eager"] = grad_gaps(grads[None], grads[a.backend])
        if rank == 0:
            print(f"ep {ep} compiled gradients against eager (max |diff| / max |eager|): "
                  + ", ".join(f"{n} {g if isinstance(g, str) else f'{g:.3g}'}"
                              for n, g in rows[-1]["grad_gap_vs_eager"].items()), flush=True)
    if rank == 0:
        Path(a.out).write_text(json.dumps(
            {"model": spec.name, "seq_len": a.seq_len, "micro_batch": a.micro_batch,
             "world": world, "device": (torch.cuda.get_device_name(device)
                                        if device.type == "cuda" else "cpu"),
             "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # no interpreter teardown once the output is written: torch 2.13's compiled collectives
    # keep the gloo group alive (an opaque object their traced graphs hold) into it, and it
    # aborted both ranks about 1 run in 20 ("terminate called without an active exception")
    flush_and_exit(main())
