"""Multi-head latent attention over 2 gloo ranks trains like one process, and its checkpoint
reshards.

Tolerances as the other layouts (``_cases.RTOL``, ``ATOL``): the losses of three steps and
the first step's full gradients match the single-process run with rtol 1e-5, atol 1e-6 on
gradient entries near zero; every replica of a parameter ends identical (exactly). The
replicated parameters checked that way include MLA's down-projections and latent norms,
whose gradients tp must get whole on every rank (tensor_parallel.parallelize_mla).
The resharding pair saves MLA under tp 2 with sequence parallelism (column-parallel
up-projections, replicated down-projections) and resumes it under pp 2 (whole tensors),
with the losses of the whole run checked against one process as test_checkpoint_reshard.py
does.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from _cases import ATOL, JOB, RTOL, L  # noqa: E402
from _harness import Case, compare, reference  # noqa: E402
from _ranks import start_ranks  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402

# DeepSeek-V2 style, tiny: query latent 24, key-value latent 16, head dims d_n 8, d_r 4 and
# d_v 6 (v narrower than q/k, as the core must allow)
MLA = ModelSpec(name="tiny-mla", num_layers=2, hidden_size=32, num_heads=4, vocab_size=128,
                ffn_hidden_size=64, max_seq_len=16, activation="swiglu", norm="rmsnorm",
                position_embedding="rope", tied_embeddings=False, bias=False,
                q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                v_head_dim=6)
# DeepSeek-V2-Lite style: no query latent, v wider than q/k
MLA_NOQ = replace(MLA, name="tiny-mla-noq", q_lora_rank=None, qk_nope_head_dim=4,
                  qk_rope_head_dim=4, v_head_dim=10, head_dim=None)
# the first layer dense, then 4 routed experts top-2 and one shared expert
MLA_MOE = replace(MLA, name="tiny-mla-moe", num_experts=4, experts_per_token=2,
                  moe_ffn_hidden_size=24, num_shared_experts=1,
                  shared_expert_ffn_hidden_size=16, dense_layers=(0,),
                  router_aux_loss_coeff=0.1, head_dim=None)

CASES = [
    Case("tp2-mla", MLA, JOB, L(tp=2)),
    Case("tp2-sp-mla", MLA, JOB, L(tp=2, sequence_parallel=True)),
    Case("tp2-sp-mla-noq", MLA_NOQ, JOB, L(tp=2, sequence_parallel=True)),
    Case("tp2-mla-noq-selective", MLA_NOQ, JOB, L(tp=2, recompute="selective")),
    Case("tp2-mla-moe", MLA_MOE, JOB, L(tp=2)),
    Case("pp2-mla-1f1b-full", MLA, JOB, L(pp=2, schedule="1f1b", recompute="full")),
]
PAIR = ("tp2-sp-mla -> pp2", MLA, L(tp=2, sequence_parallel=True),
        L(pp=2, schedule="gpipe"))


def _worker(rank, world, store, root, out):
    from _harness import _run_case
    from test_checkpoint_reshard import _pair
    from meshplan.executor.checkpoint import checkpoint_group
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    group = checkpoint_group(world)
    results = {}
    jobs = [(c.name, lambda c=c: _run_case(c)) for c in CASES]
    jobs.append((PAIR[0], lambda: _pair(*PAIR, Path(root), rank, world, group)))
    for name, run in jobs:
        try:
            results[name] = run()
        except Exception:
            results[name] = {"error": f"rank {rank}: {traceback.format_exc()}"}
            break    # the group may be out of step; later ones are reported as not run
    torch.save(results, f"{out}.rank{rank}")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.pt")
        start_ranks(_worker, (2, os.path.join(tmp, "store"), tmp, out), 2)
        got, other = (torch.load(f"{out}.rank{r}", weights_only=False) for r in range(2))
    # rank 0 gathers the results; a failure on rank 1 is reported under its name
    got.update({name: v for name, v in other.items() if "error" in v})
    return got


@pytest.mark.distributed
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_mla_layout_matches_single_process(results, case):
    assert case.name in results, "not run (an earlier case failed)"
    compare(results[case.name], reference(case.model, case.job), rtol=RTOL, atol=ATOL)


@pytest.mark.distributed
def test_mla_checkpoint_reshards_from_tp2_sp_to_pp2(results):
    from test_checkpoint_reshard import N
    name = PAIR[0]
    assert name in results, "not run (an earlier case failed)"
    assert "error" not in results[name], results[name]["error"]
    want = reference(MLA, JOB, steps=N)["losses"]
    torch.testing.assert_close(torch.tensor(results[name]["losses"], dtype=torch.float64),
                               torch.tensor(want, dtype=torch.float64), rtol=RTOL, atol=0.0)
