"""CPU emulation (issue 5, round 11): is the selective-recompute memory miss of interleaved
GPU layouts (docs/benchmarks/accuracy.md, round 11, "Next") a property of the schedule?

Two gloo ranks run the executor's ParallelTrainer (pp 2, 8 micro-batches of a small
Llama-shaped model, fp32) for interleaved 1F1B (vpp 2) and plain 1F1B, with and without
selective recompute, and record each rank's peak live bytes in the second step
(``split_memory``'s LiveBytes mode: storages operators create). If interleaving kept
something more per micro-batch with selective recompute, the interleaved / 1F1B peak ratio
would differ between selective and none. No GPU needed, ~1 minute:

    python benchmarks/emulate_selective_memory.py
"""
import os, sys, json
import torch, torch.distributed as dist, torch.multiprocessing as mp
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from meshplan.costmodel.specs import Job, Layout, ModelSpec
from meshplan.executor.data import SyntheticTokens, local_share

MODEL = ModelSpec(name="tl", num_layers=8, hidden_size=256, num_heads=8, num_kv_heads=4,
                  ffn_hidden_size=512, vocab_size=1024, max_seq_len=512, activation="swiglu",
                  norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False)
JOB = Job(global_batch=16, seq_len=512, runtime="torch", precision="fp32")
CASES = [("ilv-sel", Layout(pp=2, vpp=2, micro_batch=2, schedule="interleaved-1f1b", recompute="selective")),
         ("ilv-none", Layout(pp=2, vpp=2, micro_batch=2, schedule="interleaved-1f1b", recompute="none")),
         ("1f1b-sel", Layout(pp=2, micro_batch=2, schedule="1f1b", recompute="selective")),
         ("1f1b-none", Layout(pp=2, micro_batch=2, schedule="1f1b", recompute="none"))]

def worker(rank, world, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from meshplan.executor.mesh import build_mesh
    from meshplan.executor.parallelize import ParallelTrainer
    import meshplan.calibrate.split_memory as sm
    out = {}
    for name, lay in CASES:
        groups = build_mesh(lay, "cpu", tied_embeddings=False)
        tr = ParallelTrainer(MODEL, JOB, lay, groups, torch.device("cpu"), seed=1)
        data = SyntheticTokens(MODEL.vocab_size, JOB.seq_len, seed=1)
        b0 = local_share(data.global_batch(0, JOB.global_batch), 1, 0)
        tr.step(b0)
        mode = sm._live_bytes_mode()
        with mode:
            tr.step(local_share(data.global_batch(1, JOB.global_batch), 1, 0))
        out[name] = mode.peak
        dist.barrier()
    q.put((rank, out))
    dist.destroy_process_group()

if __name__ == "__main__":
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, 2, port, q)) for r in range(2)]
    [p.start() for p in ps]
    res = dict(q.get() for _ in ps); [p.join() for p in ps]
    for r in sorted(res):
        peaks = {k: v / 2**20 for k, v in res[r].items()}
        print(f"rank {r}: peak MiB " + ", ".join(f"{k} {v:.2f}" for k, v in peaks.items())
              + f"; interleaved / 1F1B: selective {peaks['ilv-sel'] / peaks['1f1b-sel']:.3f}, "
              f"none {peaks['ilv-none'] / peaks['1f1b-none']:.3f}")
