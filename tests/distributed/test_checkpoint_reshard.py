"""A checkpoint saved in one layout resumes in another (DCP resharding), on 4 gloo ranks.

Each pair trains layout A for K steps, saves a checkpoint, builds layout B in the same
process group, loads it and trains to N steps. B's losses after the restart must match a
single process trained N steps without a break, with the tolerance the layout tests use
(rtol 1e-5: two layouts add the same numbers in different orders). The pairs cross every
cut the executor has: DDP and ZeRO-1 replicas, FSDP2 shards (ZeRO-2/3), tensor-parallel
slices of fused QKV and SwiGLU weights, pipeline stages (1F1B, interleaved) and a tied
embedding held by two stages.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from _cases import GPT, JOB, LLAMA, RTOL, L  # noqa: E402
from _harness import OPT, SEED, reference  # noqa: E402
from _ranks import run_and_save, start_ranks  # noqa: E402

K, N = 2, 4
PAIRS = [
    ("dp2pp2-gpt-tied -> dp4-zero3", GPT, L(dp=2, pp=2, schedule="1f1b"), L(dp=4, zero=3)),
    ("dp4-zero1 -> tp2pp2-sp", LLAMA, L(dp=4, zero=1),
     L(tp=2, pp=2, sequence_parallel=True, schedule="gpipe")),
    ("tp2dp2-zero2 -> pp2-interleaved-dp2-zero1", LLAMA, L(tp=2, dp=2, zero=2),
     L(pp=2, dp=2, schedule="interleaved-1f1b", vpp=2, micro_batch=1, zero=1)),
    ("tp4-gpt -> dp2tp2-zero3", GPT, L(tp=4), L(dp=2, tp=2, zero=3)),
]


def _train(layout, model, steps, groups_out, trainer=None, start=0):
    from meshplan.executor.data import SyntheticTokens, local_share
    from meshplan.executor.mesh import build_mesh
    from meshplan.executor.parallelize import ParallelTrainer
    if trainer is None:
        groups = build_mesh(layout, "cpu", tied_embeddings=model.tied_embeddings)
        trainer = ParallelTrainer(model, JOB, layout, groups, torch.device("cpu"), seed=SEED,
                                  optimizer=OPT)
    data = SyntheticTokens(model.vocab_size, JOB.seq_len, seed=SEED)
    losses = []
    for step in range(start, steps):
        batch = local_share(data.global_batch(step, JOB.global_batch), layout.dp,
                            trainer.groups.dp_rank)
        losses.append(float(trainer.step(batch)))
    groups_out.append(trainer)
    return trainer, losses


def _pair(name, model, a, b, root: Path, rank, world, group):
    from meshplan.executor import checkpoint as ck
    from meshplan.executor.mesh import build_mesh
    from meshplan.executor.parallelize import ParallelTrainer
    keep: list = []
    trainer, first = _train(a, model, K, keep)
    record = {"schema": ck.SCHEMA, "version": 1, "seed": SEED, "model": model.to_dict(),
              "job": JOB.to_dict(), "layout": a.to_dict(), "world": world}
    saver = ck.Checkpointer(directory=root / name.replace(" ", ""), every=K, rank=rank,
                            world=world, group=group, run_id="t", record=record)
    saver.save(trainer, K, torch.device("cpu"))
    saver.wait()
    dist.barrier()
    groups = build_mesh(b, "cpu", tied_embeddings=model.tied_embeddings)
    resumed = ParallelTrainer(model, JOB, b, groups, torch.device("cpu"), seed=SEED + 1,
                              optimizer=OPT)     # another seed: the load must replace it all
    path = ck.latest_checkpoint(saver.directory)
    ck.load(resumed, path, group=group, rank=rank, device=torch.device("cpu"),
            same_layout=False)
    _, second = _train(b, model, N, keep, trainer=resumed, start=K)
    return {"losses": first + second, "saved_bytes": saver.saves[0].bytes}


def _worker(rank, world, store, root, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    from meshplan.executor.checkpoint import checkpoint_group
    group = checkpoint_group(world)
    run_and_save([(name, lambda p=(name, model, a, b): _pair(*p, Path(root), rank, world,
                                                             group))
                  for name, model, a, b in PAIRS], out, rank)


@pytest.fixture(scope="module")
def resharded():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.pt")
        start_ranks(_worker, (4, os.path.join(tmp, "store"), tmp, out), 4)
        return [torch.load(f"{out}.rank{r}", weights_only=False) for r in range(4)]


@pytest.mark.distributed
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p[0])
def test_resume_in_another_layout_continues_the_run(resharded, pair):
    name, model = pair[0], pair[1]
    for r, res in enumerate(resharded):
        assert name in res, f"rank {r}: not run (an earlier pair failed)"
        assert "error" not in res[name], res[name]["error"]
    got = resharded[0][name]["losses"]
    want = reference(model, JOB, steps=N)["losses"]
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64),
                               torch.tensor(want, dtype=torch.float64), rtol=RTOL, atol=0.0)
    # the checkpoint holds the full model and AdamW's two moments, each once (12 bytes a
    # parameter) — file framing adds the rest, which a toy model makes visible
    from meshplan.costmodel.checkpoint import checkpoint_bytes
    assert resharded[0][name]["saved_bytes"] > checkpoint_bytes(model)
