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
import os
import socket
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _spawn import spawn_and_collect  # noqa: E402

from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402
from meshplan.executor.data import SyntheticTokens, local_share  # noqa: E402

MODEL = ModelSpec(name="tl", num_layers=8, hidden_size=256, num_heads=8, num_kv_heads=4,
                  ffn_hidden_size=512, vocab_size=1024, max_seq_len=512, activation="swiglu",
                  norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False)
JOB = Job(global_batch=16, seq_len=512, runtime="torch", precision="fp32")
ILV = dict(pp=2, vpp=2, micro_batch=2, schedule="interleaved-1f1b")
PLAIN = dict(pp=2, micro_batch=2, schedule="1f1b")
CASES = [("ilv-sel", Layout(**ILV, recompute="selective")),
         ("ilv-none", Layout(**ILV, recompute="none")),
         ("1f1b-sel", Layout(**PLAIN, recompute="selective")),
         ("1f1b-none", Layout(**PLAIN, recompute="none"))]
WORLD = 2


def worker(rank: int, port: int, queue) -> None:
    """One gloo rank: per case, a warm step, then the peak live bytes of the next step."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from meshplan.calibrate.split_memory import _live_bytes_mode
    from meshplan.executor.mesh import build_mesh
    from meshplan.executor.parallelize import ParallelTrainer
    data = SyntheticTokens(MODEL.vocab_size, JOB.seq_len, seed=1)
    peaks = {}
    for name, layout in CASES:
        groups = build_mesh(layout, "cpu", tied_embeddings=False)
        trainer = ParallelTrainer(MODEL, JOB, layout, groups, torch.device("cpu"), seed=1)
        trainer.step(local_share(data.global_batch(0, JOB.global_batch), 1, 0))
        mode = _live_bytes_mode()
        with mode:
            trainer.step(local_share(data.global_batch(1, JOB.global_batch), 1, 0))
        peaks[name] = mode.peak
        dist.barrier()
    queue.put((rank, peaks))
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = spawn_and_collect(worker, [(r, port) for r in range(WORLD)])
    for r in sorted(results):
        mib = {k: v / 2**20 for k, v in results[r].items()}
        print(f"rank {r}: peak MiB " + ", ".join(f"{k} {v:.2f}" for k, v in mib.items())
              + f"; interleaved / 1F1B: selective {mib['ilv-sel'] / mib['1f1b-sel']:.3f}, "
              f"none {mib['ilv-none'] / mib['1f1b-none']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
