"""The CPU side of context parallelism on the GPUs: the cost of one c10d call as the ring
makes it (``host_comm_op_s``, :mod:`meshplan.calibrate.bench_host_comm`) and, as a check of
:mod:`meshplan.costmodel.cp_host`'s operator counts, the CPU time of the executor's ring
and all-to-all cores at tiny shapes (the GPU work negligible), forward and backward,
against ``operators × host_op_dispatch_s + c10d calls × host_comm_op_s``.

    torchrun --standalone --nproc-per-node 4 benchmarks/cp_host_gpu.py --out host.json
    torchrun --standalone --nproc-per-node 2 benchmarks/cp_host_gpu.py --out h.json --device cpu

Rank 0 writes ``--out``: ``host_comm_op_s`` and ``host_all_to_all_s`` (each the median over
the group sizes 2 .. world; calibrate measures the node's largest group only),
the raw exchange rows, and per core (style, cp, heads / kv heads) the measured CPU seconds
of a forward and of a backward (median of 20 after 5 warm-up calls) beside the counted
prediction with the GPU preset's ``host_op_dispatch_s`` (``--op-s`` to override).
``benchmarks/context_parallel_gpu.py --host-json`` puts the measured key on the cluster its
predictions use.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from torchrun_group import init_torchrun_group  # noqa: E402

CORES = (("ring", 8, 2), ("ring", 8, 8), ("all-to-all", 8, 4))   # a2a: kv heads % cp == 0


def time_core(core, device, heads: int, kv: int, iters: int = 20) -> tuple[float, float]:
    """Median CPU seconds of one forward and one backward of ``core`` at 2 × 8 tokens a rank
    of head dim 64, bf16 on CUDA (fp32 on CPU), no device synchronisation inside."""
    import torch
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(0)

    def leaf(n):
        return torch.randn(1, 16, n, 64, generator=g).to(device, dtype).requires_grad_()
    q, k, v = leaf(heads), leaf(kv), leaf(kv)
    views = [t.transpose(1, 2) for t in (q, k, v)]
    dout = torch.ones(1, heads, 16, 64, device=device, dtype=dtype)
    fwd, bwd = [], []
    for i in range(5 + iters):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        y = core(*views)
        t1 = time.perf_counter()
        torch.autograd.grad(y, views, dout)
        t2 = time.perf_counter()
        if i >= 5:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return statistics.median(fwd), statistics.median(bwd)


def main(argv=None) -> int:
    import torch
    import torch.distributed as dist

    from meshplan.calibrate.bench_host_comm import (bench_host_comm, host_all_to_all_s,
                                                    host_comm_op_s)
    from meshplan.costmodel.cp_host import cp_core_ops
    from meshplan.executor.context_parallel import AllToAllAttentionCore, RingAttentionCore
    from meshplan.hardware_profiles.loader import builtin_gpu
    from meshplan.spec import Layout, ModelSpec

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--gpu", default="H200-SXM-141GB", help="preset whose host_op_dispatch_s "
                   "prices the operators [H200-SXM-141GB]")
    p.add_argument("--op-s", type=float, default=None, help="host_op_dispatch_s override")
    args = p.parse_args(argv)
    device = init_torchrun_group(args.device == "cuda")
    world, rank = dist.get_world_size(), dist.get_rank()
    sizes = [n for n in (2, 4, 8) if n <= world]
    rows = [r for n in sizes for r in (bench_host_comm(device, n) or [])]
    t_comm = host_comm_op_s(rows) if rank == 0 else None
    t_a2a = host_all_to_all_s(rows) if rank == 0 else None
    t_op = args.op_s if args.op_s is not None else builtin_gpu(args.gpu).host_op_dispatch_s
    cores = []
    for n in sizes:
        group = dist.new_group(list(range(n)))
        for style, heads, kv in CORES:
            if rank < n:
                core = (RingAttentionCore(group) if style == "ring"
                        else AllToAllAttentionCore(group))
                f_s, b_s = time_core(core, device, heads, kv)
            dist.barrier()
            if rank == 0:
                spec = ModelSpec(name="h", num_layers=1, hidden_size=64 * heads,
                                 num_heads=heads, num_kv_heads=kv, vocab_size=16)
                of, ob = cp_core_ops(spec, Layout(cp=n, cp_style=style))
                t_c = t_comm if style == "ring" else t_a2a
                price = {"forward_s": of.aten * t_op + of.comm * t_c,
                         "backward_s": ob.aten * t_op + ob.comm * t_c}
                cores.append({"style": style, "cp": n, "heads": heads, "kv_heads": kv,
                              "forward_s": f_s, "backward_s": b_s,
                              "ops": {"forward": list(of), "backward": list(ob)},
                              "predicted": price})
                print(f"{style:10s} cp {n} heads {heads}/{kv}: forward {f_s * 1e6:7.0f} us "
                      f"(counted {price['forward_s'] * 1e6:7.0f}), backward "
                      f"{b_s * 1e6:7.0f} us (counted {price['backward_s'] * 1e6:7.0f})",
                      flush=True)
    if rank == 0:
        doc = {"host_comm_op_s": t_comm, "host_all_to_all_s": t_a2a,
               "host_op_dispatch_s": t_op, "exchanges": rows,
               "cores": cores, "device": (torch.cuda.get_device_name(device)
                                          if device.type == "cuda" else "cpu"),
               "torch": torch.__version__, "world": world}
        Path(args.out).write_text(json.dumps(doc, indent=1))
        print(f"host_comm_op_s {t_comm * 1e6:.1f} us (per send or receive), host_all_to_all_s "
              f"{t_a2a * 1e6:.1f} us, t_op {t_op * 1e6:.1f} us", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
