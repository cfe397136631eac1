"""Zero-bubble over FSDP2 on CPU: same gradients as 1F1B, same kernels as ZeRO-0? (round 22)

    python benchmarks/zb_fsdp2_cpu_check.py        # 4 gloo ranks, ~1-2 min on 2 cores

holdout22's o05 (GPT-0.54B dp 2 pp 2 zero-bubble ZeRO-2) ran its last stage 80 ms a step
longer than its ZeRO-0 twin on 4 × H200 (docs/benchmarks/accuracy.md, round 22). This rules
out two causes without a GPU, on the distributed tests' tiny GPT and Llama (dp 2, pp 2,
micro-batch 2, global batch 16):

1. gradients: after one step, ZB + ZeRO-2's full gradients equal 1F1B + ZeRO-2's (norm
   ratio per parameter within 5 %), with FSDP2 holding bf16 parameters as on the GPU
   (``ParallelTrainer`` is built with its CUDA precision rule forced on, ``bf16`` True);
2. work: per rank, ``torch.profiler``'s FLOPs and matmul count of one step, and (last
   stage, rank 2) the count of every aten op, for ZB and 1F1B at ZeRO-0 and ZeRO-2 (fp32:
   ZeRO-0 under bf16 needs CUDA autocast).
"""

from __future__ import annotations

import os
import functools
import socket
import sys
import tempfile
from collections import Counter
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "distributed"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 4


@functools.cache
def _bf16_on_cpu_trainer():
    """meshplan.executor.parallelize with its bf16 rule (CUDA only) forced for the CPU."""
    import meshplan.executor.parallelize as par
    src = Path(par.__file__).read_text()
    rule = 'self.bf16 = device.type == "cuda" and job.precision == "bf16"'
    if rule not in src:
        raise RuntimeError(f"{par.__file__} no longer has {rule!r}; update this script")
    ns = dict(par.__dict__)
    exec(compile(src.replace(rule, 'self.bf16 = job.precision == "bf16"'), par.__file__,
                 "exec"), ns)
    return ns["ParallelTrainer"], ns["gather_full"]


def _trainer(model, precision, schedule, zero):
    from meshplan.spec import Job, Layout
    from meshplan.executor.data import SyntheticTokens, local_share
    from meshplan.executor.mesh import build_mesh
    trainer_cls, gather_full = _bf16_on_cpu_trainer()
    job = Job(global_batch=16, seq_len=16, precision=precision)
    lay = Layout(dp=2, pp=2, micro_batch=2, schedule=schedule, zero=zero)
    groups = build_mesh(lay, "cpu", tied_embeddings=model.tied_embeddings)
    tr = trainer_cls(model, job, lay, groups, torch.device("cpu"), seed=0)
    data = SyntheticTokens(model.vocab_size, job.seq_len, seed=0)
    batch = local_share(data.global_batch(0, job.global_batch), lay.dp, groups.dp_rank)
    return tr, batch, gather_full


def _worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=timedelta(seconds=180))
    from torch.profiler import ProfilerActivity, profile

    from _cases import GPT, LLAMA
    grads, work = {}, {}
    for name, model in (("gpt", GPT), ("llama", LLAMA)):
        for schedule in ("1f1b", "zero-bubble"):
            tr, batch, gather_full = _trainer(model, "bf16", schedule, 2)
            tr.optimizer.step = lambda *a, **k: None      # keep the step's gradients
            tr.step(batch)
            g = gather_full(tr, "grad")
            if rank == 0:
                grads[(name, schedule)] = {k: v for k, v in g.items()
                                           if "@" not in k and v is not None}
    for schedule in ("1f1b", "zero-bubble"):
        for zero in (0, 2):
            tr, batch, _ = _trainer(GPT, "fp32", schedule, zero)
            tr.step(batch)                                 # warm-up
            with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
                tr.step(batch)
            events = prof.events()
            mine = torch.tensor([float(sum(e.flops or 0 for e in events)),
                                 float(sum(e.name in ("aten::mm", "aten::addmm", "aten::bmm")
                                           for e in events))])
            every = [torch.zeros(2) for _ in range(WORLD)]
            dist.all_gather(every, mine)
            ops = Counter(e.name for e in events if e.name.startswith("aten::"))
            box = [None] * WORLD
            dist.all_gather_object(box, ops)
            work[(schedule, zero)] = ([tuple(int(x) for x in t.tolist()) for t in every], box[2])
    if rank == 0:
        torch.save({"grads": grads, "work": work}, out)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "zb.pt")
        mp.start_processes(_worker, args=(port, out), nprocs=WORLD, join=True,
                           start_method="spawn")
        res = torch.load(out, weights_only=False)
    ok = True
    print("1. gradients, ZB + ZeRO-2 against 1F1B + ZeRO-2 (bf16 FSDP2 parameters):")
    for name in ("gpt", "llama"):
        base, zb = res["grads"][(name, "1f1b")], res["grads"][(name, "zero-bubble")]
        off = [(k, round(float(zb[k].float().norm() / g.float().norm()), 3))
               for k, g in base.items() if k in zb and abs(
                   float(zb[k].float().norm() / g.float().norm()) - 1) > 0.05]
        ok &= not off and len(base) == len(zb)
        print(f"   {name}: {len(base)} parameters, off by more than 5 %: {off or 'none'}")
    print("2. one step's work per rank (FLOPs, matmuls), tiny GPT, fp32:")
    for key, (per_rank, _) in res["work"].items():
        print(f"   {key[0]:<12} ZeRO-{key[1]}: {per_rank}")
    z0, z2 = res["work"][("zero-bubble", 0)], res["work"][("zero-bubble", 2)]
    same = z0[0] == z2[0]
    ok &= same
    diff = {k: (z0[1].get(k, 0), z2[1].get(k, 0)) for k in set(z0[1]) | set(z2[1])
            if z0[1].get(k, 0) != z2[1].get(k, 0)}
    print(f"   zero-bubble ZeRO-2 vs ZeRO-0: same FLOPs and matmuls on every rank: {same}; "
          f"last stage's aten op counts that differ (ZeRO-0, ZeRO-2): {diff}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
