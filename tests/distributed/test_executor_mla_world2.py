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
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from _cases import ATOL, JOB, RTOL, L  # noqa: E402
from _harness import Case, compare, reference  # noqa: E402
from _ranks import run_and_save, start_ranks  # noqa: E402

from _mla_models import MLA as _MLA, MLA_MOE as _MLA_MOE, MLA_NOQ as _MLA_NOQ  # noqa: E402

# the unit tests' tiny models (tests/_mla_models.py) at a 128-token vocabulary, the MoE one
# with a stronger balance loss
MLA, MLA_NOQ = (replace(m, vocab_size=128) for m in (_MLA, _MLA_NOQ))
MLA_MOE = replace(_MLA_MOE, vocab_size=128, router_aux_loss_coeff=0.1)

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
    jobs = [(c.name, lambda c=c: _run_case(c)) for c in CASES]
    jobs.append((PAIR[0], lambda: _pair(*PAIR, Path(root), rank, world, group)))
    run_and_save(jobs, out, rank)


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
