"""A plain DDP or FSDP2 (+ torch.compile) training script: the baseline the executor must beat.

What a user would write without meshplan, on the same model and job: the executor's own
model code (``meshplan.executor.model.Transformer``, so only the parallelization and the
training loop differ), fp32 weights under ``torch.autocast(bfloat16)``, fused AdamW,
``DistributedDataParallel`` with gradient bucket views, gradient accumulation under
``no_sync`` when a rank's share of the batch takes several micro-batches, and with
``--compile`` the whole DDP model under ``torch.compile`` (DDPOptimizer splits the graph at
the gradient buckets so the all-reduces still overlap the backward pass). ``--recompute
full`` checkpoints every block (``torch.utils.checkpoint``, non-reentrant), as under
``--fsdp``.

DDP's gradient accumulation keeps one fp32 copy of the gradients, as a user short of memory
would: the ``no_sync`` micro-batches add into DDP's bucket views in place
(``zero_grad(set_to_none=False)``) instead of into fresh ``.grad`` tensors that sit beside
the buckets until the last micro-batch copies them in (4 bytes a parameter more at that
backward's peak). For that the gradients must already be bucket views, which DDP makes
them only in a synchronised backward: the first two steps reduce every micro-batch instead
(the same gradients: all-reducing an already-averaged sum plus a new micro-batch's
gradient adds only that micro-batch's mean). DDP reduces its first synchronised backward as
one whole-model bucket and builds its real buckets at the next forward; the first step's
gradients (possibly views of that bucket) are dropped and the GPU drained after it, so
that the old bucket is not held beside the new ones once the optimizer state exists. Both
steps are warm-up steps at the default ``--warmup``. With one micro-batch a rank none of
this applies (as before).

``--fsdp``: FSDP2 instead, as torchtitan applies it to a Llama (``fully_shard`` on every
block, then on the root, parameters resharded after the forward, ``MixedPrecisionPolicy``
bf16 parameters with fp32 gradient reduction, no autocast), with ``--compile`` each block
compiled before it is sharded (torchtitan's per-block compile), and a gradient
reduce-scatter every micro-batch (torchtitan's gradient accumulation). ``--model`` (a
preset or ModelSpec JSON), ``--global-batch`` and ``--seq-len`` set the model and job
(default the 1.3 B GPT, 16 × 2048).

    torchrun --standalone --nproc-per-node 4 benchmarks/baseline_ddp.py --out ddp.json
    torchrun --standalone --nproc-per-node 4 benchmarks/baseline_ddp.py --compile --out ddpc.json
    torchrun --standalone --nproc-per-node 8 benchmarks/baseline_ddp.py --fsdp --compile \\
        --model llama3-8b --global-batch 32 --seq-len 4096 --micro-batch 1 --out f.json
    torchrun --standalone --nproc-per-node 4 benchmarks/baseline_ddp.py --compile \\
        --recompute full --model llama3-8b --micro-batch 1 --out ddp_full.json
    torchrun --standalone --nproc-per-node 2 benchmarks/baseline_ddp.py --tiny --out t.json  # CPU

Rank 0 writes ``--out`` (JSON): the median step (CUDA events) of the steps after
``--warmup``, tokens/s, MFU with the executor's FLOP count
(``meshplan.costmodel.flops.model_flops_per_step``: Narayanan et al. 2021 eq. 3, attention
not halved for the causal mask) and with the causal count (attention halved), peak memory
(after the warm-up), and the environment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from torchrun_group import init_torchrun_group  # noqa: E402

from meshplan.executor.run import flush_and_exit  # noqa: E402
from meshplan.spec import Job, ModelSpec  # noqa: E402

# GPT-3 XL (Brown et al. 2020, Table 2.1): 24 layers, d_model 2048, 16 heads of 128;
# vocabulary 50257 padded to 51200 as Megatron-LM does.
GPT_1_3B = ModelSpec(name="gpt3-1.3b", num_layers=24, hidden_size=2048, num_heads=16,
                     vocab_size=51200, max_seq_len=2048)
JOB = Job(global_batch=16, seq_len=2048, precision="bf16")
TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_heads=4, vocab_size=256,
                 max_seq_len=64)
TINY_JOB = Job(global_batch=8, seq_len=64, precision="fp32")


def causal_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int) -> float:
    """Model FLOPs with the attention core halved for the causal mask (what a kernel that
    skips the masked half computes); the rest as ``model_flops_per_step``."""
    from meshplan.costmodel.flops import layer_forward_flops_per_token, model_flops_per_step
    _, attn = layer_forward_flops_per_token(model, seq_len)
    tokens = global_batch * seq_len
    return model_flops_per_step(model, global_batch, seq_len) \
        - 3.0 * tokens * model.num_layers * attn / 2


def wrap_fsdp(m, *, compile: bool, recompute: str, bf16: bool):
    """FSDP2 over the whole world (1-D mesh), torchtitan's order: checkpoint and compile each
    block, shard each block, then the root."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if bf16 else MixedPrecisionPolicy())
    for block in m.layers.values():
        block.recompute_block = recompute == "full"
        if compile:
            block.compile()
        fully_shard(block, reshard_after_forward=True, mp_policy=mp)
    fully_shard(m, reshard_after_forward=True, mp_policy=mp)
    return m


def main(argv=None) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from meshplan.costmodel.flops import model_flops_per_step
    from meshplan.executor.model import Transformer, cross_entropy

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (ZeRO-3) instead of DDP")
    p.add_argument("--recompute", default="none", choices=["none", "full"],
                   help="full: checkpoint every block (DDP or FSDP2) [none]")
    p.add_argument("--model", default=None, help="a preset or ModelSpec JSON [gpt3-1.3b]")
    p.add_argument("--global-batch", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--micro-batch", type=int, default=None,
                   help="sequences per forward (default: the rank's whole share)")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="dense bf16 peak per GPU for MFU [989: H100 / H200 SXM datasheet]")
    p.add_argument("--tiny", action="store_true", help="tiny fp32 model on CPU (a check)")
    args = p.parse_args(argv)

    model_spec, job = (TINY, TINY_JOB) if args.tiny else (GPT_1_3B, JOB)
    if args.model:
        from meshplan.spec.resolve import load_model
        model_spec = load_model(args.model)
    job = Job(global_batch=args.global_batch or job.global_batch,
              seq_len=args.seq_len or job.seq_len, precision=job.precision)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cuda = torch.cuda.is_available() and not args.tiny
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    device = init_torchrun_group(cuda)
    share = job.global_batch // world
    mb = args.micro_batch or share
    n_micro = share // mb
    torch.manual_seed(0)
    with torch.device("meta"):
        m = Transformer(model_spec)
    m.to_empty(device=device)
    m.init_weights(0)
    bf16 = cuda and job.precision == "bf16"
    if args.fsdp:
        model = ddp = wrap_fsdp(m, compile=args.compile, recompute=args.recompute, bf16=bf16)
    else:
        for block in m.layers.values():
            block.recompute_block = args.recompute == "full"
        ddp = DDP(m, device_ids=[device.index] if cuda else None, gradient_as_bucket_view=True)
        model = torch.compile(ddp) if args.compile else ddp
    # DDP with several micro-batches: accumulate in the bucket views (module docstring)
    in_buckets = not args.fsdp and n_micro > 1
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if cuda else {}))
    # FSDP2 casts the parameters itself (MixedPrecisionPolicy); DDP trains under autocast
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and not args.fsdp
           else contextlib.nullcontext())
    g = torch.Generator().manual_seed(1234)
    batches = [torch.randint(0, model_spec.vocab_size, (share, job.seq_len + 1), generator=g)
               for _ in range(2)]
    if cuda:
        batches = [b.pin_memory() for b in batches]

    def step(i: int) -> torch.Tensor:
        batch = batches[i % 2].to(device, non_blocking=True)
        x, y = batch[:, :-1], batch[:, 1:]
        total = torch.zeros((), device=device)
        for k in range(n_micro):
            # FSDP2 reduce-scatters every micro-batch (as torchtitan); DDP syncs the last, and
            # every one in the first two steps where it accumulates in the bucket views
            sync = k == n_micro - 1 or (in_buckets and i < 2)
            no_sync = contextlib.nullcontext() if sync or args.fsdp else ddp.no_sync()
            with no_sync, amp:
                loss = cross_entropy(model(x[k * mb:(k + 1) * mb]), y[k * mb:(k + 1) * mb])
                (loss / n_micro).backward()
            total += loss.detach()
        opt.step()
        # in the bucket views from the second step on; the first step's are views of the
        # bucket DDP drops when it rebuilds its buckets, so they go, and the GPU drains
        opt.zero_grad(set_to_none=not in_buckets or i == 0)
        if in_buckets and i == 0 and cuda:
            torch.cuda.synchronize(device)
            time.sleep(0.25)
        return total / n_micro

    times, losses = [], []
    t_start = time.perf_counter()
    for i in range(args.warmup + args.steps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        else:
            t0 = time.perf_counter()
        losses.append(step(i))
        if i >= args.warmup:
            if cuda:
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                times.append(time.perf_counter() - t0)
        if i == args.warmup - 1 and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
    wall = time.perf_counter() - t_start
    step_s = statistics.median(times)
    flops = model_flops_per_step(model_spec, job.global_batch, job.seq_len)
    causal = causal_flops_per_step(model_spec, job.global_batch, job.seq_len)
    peak = args.peak_tflops * 1e12
    peak_mem = [float(torch.cuda.max_memory_allocated(device)) if cuda else None]
    gathered = [None] * world
    dist.all_gather_object(gathered, peak_mem[0])
    if rank == 0:
        doc = {"name": ("baseline-fsdp2" if args.fsdp else "baseline-ddp")
               + ("-compiled" if args.compile else ""), "fsdp": args.fsdp,
               "recompute": args.recompute,
               "model": model_spec.to_dict(), "job": job.to_dict(), "world": world,
               "micro_batch": mb, "num_microbatches": n_micro, "compile": args.compile,
               "grads_accumulate_in_buckets": in_buckets,
               "step_time_s": step_s, "step_times_s": times,
               "tokens_per_s": job.tokens_per_step / step_s,
               "model_flops_per_step": flops, "causal_flops_per_step": causal,
               "peak_tflops_per_gpu": args.peak_tflops,
               "mfu": flops / step_s / world / peak if cuda else None,
               "mfu_causal": causal / step_s / world / peak if cuda else None,
               "memory_peak_bytes": max(v for v in gathered if v is not None) if cuda else None,
               "loss_per_step": [float(v) for v in losses], "wall_s": wall,
               "environment": {"torch": torch.__version__,
                               "gpu": torch.cuda.get_device_name(device) if cuda else "cpu",
                               "command": " ".join(sys.argv)}}
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
        mfu = f", MFU {100 * doc['mfu']:.1f} % (causal {100 * doc['mfu_causal']:.1f} %)" \
            if cuda else ""
        print(f"{doc['name']}: {1e3 * step_s:.1f} ms/step, "
              f"{doc['tokens_per_s']:,.0f} tokens/s{mfu}", flush=True)
    dist.barrier()
    # leave here, while main's locals still hold DDP and the process group: their C++
    # destructors hung at return about one gloo run in ten under CPU contention (the rank
    # had written its results; found with faulthandler), and torchrun waited for it
    flush_and_exit(0)


if __name__ == "__main__":
    try:
        main()
    except Exception:           # e.g. out of memory: say so and leave at once, rather than
        import traceback        # tear NCCL down while the other ranks wait in a collective
        traceback.print_exc()
        flush_and_exit(1)
