"""Spawn CPU ranks once, run many layouts inside one gloo process group, compare to one process.

Each layout trains ``STEPS`` optimizer steps on the same synthetic batches; rank 0 gathers
the losses, the last step's full gradients and the final full parameters. The reference
is the plain model of ``meshplan.executor.model`` with ``torch.optim.AdamW`` on the whole
global batch in one process — it shares no code with the parallel path beyond the model.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from _ranks import start_ranks
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.executor.data import SyntheticTokens, local_share
from meshplan.executor.data_parallel import OptimizerConfig
from meshplan.executor.model import Transformer, cross_entropy

STEPS = 3
SEED = 1234
# A larger learning rate than training would use, so that three steps move the weights
# visibly and a wrong gradient shows up in the losses.
OPT = OptimizerConfig(lr=1e-2, weight_decay=0.1)


@dataclass(frozen=True)
class Case:
    name: str
    model: ModelSpec
    job: Job
    layout: Layout | None     # None: compare hand-written TP layers with DTensor's
    #: torch.compile backend of a compiled layout (None: the session's, tests/conftest.py)
    compile_backend: str | None = None


def _run_case(case: Case):
    from meshplan.executor.parallelize import COMPILE_BACKEND_ENV
    if case.compile_backend is None:
        return _train_case(case)
    before = os.environ.get(COMPILE_BACKEND_ENV)
    os.environ[COMPILE_BACKEND_ENV] = case.compile_backend
    try:
        return _train_case(case)
    finally:
        if before is None:
            del os.environ[COMPILE_BACKEND_ENV]
        else:
            os.environ[COMPILE_BACKEND_ENV] = before


def _train_case(case: Case):
    from meshplan.executor.mesh import build_mesh
    from meshplan.executor.parallelize import ParallelTrainer, gather_full
    if case.layout.compile:
        # A compiled layout traces from a fresh Dynamo state, as in a run of its own. Else
        # the earlier layouts' shapes (another tp, cp or ep) mark the shared functions' dims
        # dynamic, and each later layout traces symbolic graphs it would not trace alone:
        # the MoE world's five layouts took 153 s of CPU instead of 103 s.
        torch._dynamo.reset()
    groups = build_mesh(case.layout, "cpu", tied_embeddings=case.model.tied_embeddings)
    trainer = ParallelTrainer(case.model, case.job, case.layout, groups, torch.device("cpu"),
                              seed=SEED, optimizer=OPT, compile=case.layout.compile)
    data = SyntheticTokens(case.model.vocab_size, case.job.seq_len, seed=SEED)
    losses, grads = [], None
    for step in range(STEPS):
        batch = local_share(data.global_batch(step, case.job.global_batch), case.layout.dp,
                            groups.dp_rank)
        losses.append(float(trainer.step(batch)))
        if step == 0:
            grads = gather_full(trainer, "grad")
    params = gather_full(trainer, "param")
    return {"losses": losses, "grads": grads, "params": params}


def _dtensor_check(model: ModelSpec) -> dict:
    """Hand-written tp layers against DTensor ``parallelize_module`` on the same weights.

    Returns {check: max abs difference} for outputs, input gradients and weight gradients.
    """
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    from meshplan.executor import tensor_parallel as tpm
    from meshplan.executor.model import MLP

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    group = mesh.get_group("tp")
    rank = dist.get_rank(group)
    out = {}
    for sp in (False, True):
        torch.manual_seed(SEED)                       # same weights and inputs on every rank
        mlp = MLP(model)
        ref, hand = copy.deepcopy(mlp), copy.deepcopy(mlp)
        if sp:
            plan = {"fc": ColwiseParallel(input_layouts=Shard(1)),
                    "proj": RowwiseParallel(output_layouts=Shard(1))}
        else:
            plan = {"fc": ColwiseParallel(), "proj": RowwiseParallel()}
        parallelize_module(ref, mesh, plan)
        hand.fc = tpm.ColumnParallelLinear(hand.fc, group, sequence_parallel=sp)
        hand.proj = tpm.RowParallelLinear(hand.proj, group, sequence_parallel=sp)
        x = torch.randn(2, 8, model.hidden_size)      # (b, s, h)
        if sp:
            x = x.chunk(world, dim=1)[rank]           # (b, s/tp, h)
        xr, xh = x.clone().requires_grad_(), x.clone().requires_grad_()
        yr, yh = ref(xr), hand(xh)
        gy = torch.randn_like(yh)
        yr.backward(gy)
        yh.backward(gy)
        tag = "sp" if sp else "tp"
        out[f"mlp-{tag} output"] = (yr - yh).abs().max().item()
        out[f"mlp-{tag} input grad"] = (xr.grad - xh.grad).abs().max().item()
        for lin in ("fc", "proj"):
            gh = getattr(hand, lin).weight.grad
            full = getattr(ref, lin).weight.grad.full_tensor()
            gr = getattr(hand, lin).weight_spec.shard(full, rank, world)
            out[f"mlp-{tag} {lin}.weight grad"] = (gr - gh).abs().max().item()
    torch.manual_seed(SEED)
    emb = torch.nn.Embedding(model.vocab_size, model.hidden_size)
    ref, hand = copy.deepcopy(emb), tpm.VocabParallelEmbedding(copy.deepcopy(emb), group,
                                                               sequence_parallel=False)
    # ids are replicated (RowwiseParallel's default input layout is Shard(-1))
    parallelize_module(ref, mesh, RowwiseParallel(input_layouts=Replicate()))
    ids = torch.randint(0, model.vocab_size, (2, 8))
    yr, yh = ref(ids), hand(ids)
    gy = torch.randn_like(yh)
    yr.backward(gy)
    yh.backward(gy)
    out["embedding output"] = (yr - yh).abs().max().item()
    out["embedding weight grad"] = (hand.weight_spec.shard(ref.weight.grad.full_tensor(), rank, world)
                                    - hand.weight.grad).abs().max().item()
    return out


def _worker(rank: int, world: int, store: str, cases: list[Case], out_path: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=90))
    results = {}
    for case in cases:
        try:
            results[case.name] = (_run_case(case) if case.layout is not None
                                  else {"dtensor": _dtensor_check(case.model)})
        except Exception:
            results[case.name] = {"error": f"rank {rank}: {traceback.format_exc()}"}
            break   # the group may now be out of step; later cases are reported as not run
    if rank == 0:
        torch.save(results, out_path)
    else:
        # a failing non-zero rank reports through a file of its own
        errs = {k: v for k, v in results.items() if "error" in v}
        if errs:
            torch.save(errs, f"{out_path}.rank{rank}")
    dist.barrier()
    dist.destroy_process_group()


def run_cases(world: int, cases: list[Case]) -> dict[str, dict]:
    """Run ``cases`` (all of world size ``world``) in one spawned group; results by name."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.pt")
        try:
            # a file store in this call's own directory: no port that a parallel test
            # (pytest-xdist) could take between choosing and binding it
            start_ranks(_worker, (world, os.path.join(tmp, "store"), cases, out), world)
        except Exception as exc:   # a rank died: keep whatever rank 0 saved
            failure = f"spawned ranks failed: {exc}"
        else:
            failure = None
        results = torch.load(out, weights_only=False) if os.path.exists(out) else {}
        for r in range(1, world):
            p = f"{out}.rank{r}"
            if os.path.exists(p):
                for k, v in torch.load(p, weights_only=False).items():
                    results.setdefault(k, v)
    for c in cases:
        results.setdefault(c.name, {"error": failure or "not run (an earlier case failed)"})
    return results


_REFERENCES: dict[tuple, dict] = {}


def reference(model: ModelSpec, job: Job, steps: int = STEPS) -> dict:
    """One process, whole global batch, plain AdamW, ``steps`` optimizer steps.

    Deterministic (fixed seeds, synthetic data), so it is computed once per (model, job,
    steps) in a test process and shared by every case of that model: a world's cases mostly
    use two or three models. Callers only read it (:func:`compare`)."""
    key = (model, job, steps)
    if key not in _REFERENCES:
        _REFERENCES[key] = _reference(model, job, steps)
    return _REFERENCES[key]


def _reference(model: ModelSpec, job: Job, steps: int) -> dict:
    torch.manual_seed(0)
    m = Transformer(model)
    m.init_weights(SEED)
    opt = torch.optim.AdamW(m.parameters(), lr=OPT.lr, betas=OPT.betas, eps=OPT.eps,
                            weight_decay=OPT.weight_decay)
    data = SyntheticTokens(model.vocab_size, job.seq_len, seed=SEED)
    losses = []
    for step in range(steps):
        batch = data.global_batch(step, job.global_batch)
        opt.zero_grad(set_to_none=True)
        loss = cross_entropy(m(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
        opt.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "grads": grads,
            "params": {n: p.detach().clone() for n, p in m.named_parameters()}}


def compare(result: dict, ref: dict, *, rtol: float, atol: float) -> None:
    """Raise AssertionError naming the first quantity that differs."""
    if "error" in result:
        raise AssertionError(result["error"])
    torch.testing.assert_close(torch.tensor(result["losses"], dtype=torch.float64),
                               torch.tensor(ref["losses"], dtype=torch.float64),
                               rtol=rtol, atol=0.0, msg=lambda m: f"losses: {m}")
    got = result["grads"]
    for name, want in ref["grads"].items():
        copies = [k for k in got if k == name or k.startswith(name + "@")]
        assert copies, f"grads: parameter {name} missing from the parallel run"
        for key in copies:
            assert got[key] is not None, f"grads: {key} is None"
            torch.testing.assert_close(got[key], want, rtol=rtol, atol=atol,
                                       msg=lambda m, k=key: f"first-step gradient {k}: {m}")
    extra = {k.split("@")[0] for k in got} - set(ref["grads"])
    assert not extra, f"grads: parameters not in the reference model: {sorted(extra)}"
    # Final parameters: Adam's update is ~lr·sign(g) for tiny g, so an fp32 rounding
    # difference flips updates of near-zero gradients; the losses above carry the
    # end-to-end check. What must hold exactly is that every replica of a parameter
    # (over dp, tp and the tied pipeline copies) ends up identical.
    params = result["params"]
    for name in ref["params"]:
        copies = [params[k] for k in params if k == name or k.startswith(name + "@")]
        for other in copies[1:]:
            torch.testing.assert_close(other, copies[0], rtol=0, atol=0,
                                       msg=lambda m, n=name: f"replicas of {n} differ: {m}")
