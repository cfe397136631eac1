"""Every autograd function of the executor that communicates, compiled against eager: the
largest gradient difference over the largest eager gradient, per function, on two ranks.

Under torch 2.11 four of them lost their backward when compiled (0 gradient: gap 1.0) while
their collectives filled buffers in place (meshplan/executor/functional_comm.py). CI runs
torch 2.13, where that code passed too; run this where torch 2.11 is, the device first:

    torchrun --standalone --nproc-per-node 2 benchmarks/compiled_grads_check.py \\
        --out $OUT/compiled_grads.json                      # CPU, gloo, aot_eager
    torchrun --standalone --nproc-per-node 2 benchmarks/compiled_grads_check.py \\
        --device cuda --backend inductor --out $OUT/compiled_grads_cuda.json

Each case also runs eagerly as if traced (``functional_comm._traced`` patched to True) with
c10d's in-place collectives recorded: any such call is a defect under every torch, so CI on
torch 2.13 catches an autograd function that bypasses ``functional_comm``.

fp32 throughout; a gap above 1e-5 (``MAX_GAP``) is a defect: every rank checks its own
gradients and exits 1 after ``--out`` is written, so torchrun's status says it
(tests/distributed/test_compiled_collective_grads.py reads the cases;
benchmarks/compiled_grads_device.sh stops the device work behind it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from meshplan.executor import tp_collectives as tc  # noqa: E402
from meshplan.executor.context_parallel import (RingAttentionCore, heads_to_seq,  # noqa: E402
                                                seq_to_heads)
from meshplan.executor.moe import _AllToAll  # noqa: E402
from meshplan.executor.run import flush_and_exit  # noqa: E402
from meshplan.executor.tensor_parallel import vocab_parallel_cross_entropy  # noqa: E402

MAX_GAP = 1e-5
# c10d collectives that fill a buffer in place: what Dynamo under torch 2.11 differentiated to
# a zero gradient inside an autograd function (functional_comm.py)
IN_PLACE_C10D = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                 "all_to_all_single")


def cases(dev: torch.device) -> dict:
    """Each communicating autograd function, as a map of the (1, 4, 8) activation."""
    W, r = dist.group.WORLD, dist.get_rank()
    # the experts' exchange, uneven: rank 0 keeps 5 of its 8 rows and sends 3, rank 1 sends 4
    IN, OUT = ([5, 3], [5, 4]) if r == 0 else ([4, 4], [3, 4])
    targets = torch.tensor([[1, 6, 3, 0]], device=dev) + r  # vocabulary 8; rank r: 4r..4r+3
    return {
        "copy_to_tp": lambda x: tc.copy_to_tp(x, W),
        "reduce_from_tp": lambda x: tc.reduce_from_tp(x, W),
        "gather_from_sp": lambda x: tc.gather_from_sp(x, W),
        "reduce_scatter_to_sp": lambda x: tc.reduce_scatter_to_sp(x, W),
        "scatter_to_sp": lambda x: tc.scatter_to_sp(x, W),
        "gather_from_slices": lambda x: tc.gather_from_slices(x, W),
        "ulysses_all_to_all": lambda x: heads_to_seq(
            seq_to_heads(x.reshape(1, 4, 4, 2), W, 2) * 3, W, 2),
        "experts_all_to_all": lambda x: _AllToAll.apply(
            _AllToAll.apply(x.reshape(8, 4), OUT, IN, W) * 3, IN, OUT, W),
        "vocab_parallel_cross_entropy": lambda x: vocab_parallel_cross_entropy(
            x.reshape(1, 4, 8)[..., :4], targets, 4 * r, W),
        "ring_attention": lambda x: RingAttentionCore(W, kernel="math")(
            *(x.reshape(1, 2, 2, 8)[..., 2 * i:2 * i + 2] for i in range(3))),
    }


def gap(fn, dev: torch.device, backend: str) -> dict:
    """The gradient of a weight feeding ``fn``, eager and compiled, from the same inputs."""
    r = dist.get_rank()
    grads = []
    for compiled in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(r)
        w = torch.randn(8, 8, device=dev, requires_grad=True)
        x = torch.randn(4, 8, device=dev)

        def step(x, w=w):
            y = fn((x @ w).reshape(1, 4, 8))
            return (y.float() ** 2).sum() if y.dim() else y

        run = torch.compile(step, backend=backend) if compiled else step
        run(x).backward()
        grads.append(w.grad.clone())
    eager, comp = grads
    return {"eager_max": eager.abs().max().item(),
            "gap": ((comp - eager).abs().max() / eager.abs().max()).item()}


class _Waited:
    """``funcol`` with each result waited for: eager calls return an AsyncCollectiveTensor
    whose work c10d otherwise reports as unwaited at exit."""

    def __getattr__(self, name):
        from torch.distributed import _functional_collectives as funcol
        f = getattr(funcol, name)

        def call(*args, **kwargs):
            out = f(*args, **kwargs)
            return out.wait() if isinstance(out, funcol.AsyncCollectiveTensor) else out
        return call


def c10d_when_traced(fn, dev: torch.device) -> list[str]:
    """The in-place c10d collectives ``fn``'s forward and backward call when
    ``functional_comm`` believes Dynamo is tracing (none, where every collective goes through
    it): run eagerly, the calls recorded and still made so the ranks stay in step. This holds
    under any torch, so CI (torch 2.13, which traced the old code right) still catches an
    autograd function that bypasses ``functional_comm``."""
    from meshplan.executor import functional_comm
    spies = {op: mock.patch.object(dist, op, wraps=getattr(dist, op)) for op in IN_PLACE_C10D}
    with mock.patch.object(functional_comm, "_traced", return_value=True), \
            mock.patch.object(functional_comm, "funcol", _Waited()):
        mocks = {op: p.start() for op, p in spies.items()}
        try:
            x = torch.randn(4, 8, device=dev, requires_grad=True)
            y = fn(x.reshape(1, 4, 8))
            ((y.float() ** 2).sum() if y.dim() else y).backward()
        finally:
            for p in spies.values():
                p.stop()
    return sorted(op for op, m in mocks.items() if m.called)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--backend", default="aot_eager", help="torch.compile backend")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    dist.init_process_group("gloo" if a.device == "cpu" else "nccl")
    dev = torch.device("cpu")
    if a.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(dev)
        torch.set_default_device(dev)
    rank = dist.get_rank()
    out = {}
    for name, fn in cases(dev).items():
        out[name] = gap(fn, dev, a.backend)
        out[name]["c10d_when_traced"] = c10d_when_traced(fn, dev)
        if rank == 0:
            print(f"{name:30s} compiled vs eager: {out[name]['gap']:.3g}; in-place c10d "
                  f"calls when traced: {out[name]['c10d_when_traced'] or 'none'}", flush=True)
    if rank == 0:
        Path(a.out).write_text(json.dumps({"torch": torch.__version__, "device": a.device,
                                           "backend": a.backend, "cases": out}, indent=1) + "\n")
    dist.destroy_process_group()
    bad = {k: c["gap"] for k, c in out.items() if not c["gap"] <= MAX_GAP}   # NaN fails too
    if bad:
        print(f"rank {rank}: compiled gradients off eager's above {MAX_GAP}: {bad}",
              file=sys.stderr)
    c10d = {k: c["c10d_when_traced"] for k, c in out.items() if c["c10d_when_traced"]}
    if c10d:
        print(f"rank {rank}: in-place c10d collectives while traced: {c10d}", file=sys.stderr)
    return 1 if bad or c10d else 0


if __name__ == "__main__":
    # no interpreter teardown once the output is written: the compiled collectives keep the
    # gloo group alive into it, where moe_saved_copies.py's ranks sometimes aborted
    flush_and_exit(main())
