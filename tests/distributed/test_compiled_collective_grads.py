"""Every autograd function of the executor that communicates has, compiled, the gradients it
has eager (two gloo ranks under torchrun, fp32, backend ``aot_eager``: Dynamo and AOT
autograd, where the defect lived, without Inductor's compile time).

Why: under torch 2.11 the compiled gradient through the sequence-parallel reduce-scatter,
Ulysses' all-to-all and the experts' all-to-all was exactly zero while they filled buffers
in place (meshplan/executor/functional_comm.py); this test failed on those three cases with
torch 2.11 before they became functional collectives, and passes on 2.11 and 2.13 since.
CI runs torch 2.13, where the old code passed too: run it under torch 2.11 as
docs/executor.md says ("Compiled gradients") when torch or a collective changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = '''
import json, sys
import torch
import torch.distributed as dist
from meshplan.executor import tp_collectives as tc
from meshplan.executor.context_parallel import RingAttentionCore, heads_to_seq, seq_to_heads
from meshplan.executor.moe import _AllToAll
from meshplan.executor.tensor_parallel import vocab_parallel_cross_entropy

dist.init_process_group("gloo")
W, r = dist.group.WORLD, dist.get_rank()
# the experts' exchange, uneven: rank 0 keeps 5 of its 8 rows and sends 3, rank 1 sends 4
IN, OUT = ([5, 3], [5, 4]) if r == 0 else ([4, 4], [3, 4])
targets = torch.tensor([[1, 6, 3, 0]]) + r      # vocabulary 8, rank r holds rows 4r..4r+3
CASES = {
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
out = {}
for name, fn in CASES.items():
    grads = []
    for compiled in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(r)
        w = torch.randn(8, 8, requires_grad=True)
        x = torch.randn(4, 8)

        def step(x, fn=fn, w=w):
            y = fn((x @ w).reshape(1, 4, 8))
            return (y.float() ** 2).sum() if y.dim() else y

        run = torch.compile(step, backend="aot_eager") if compiled else step
        run(x).backward()
        grads.append(w.grad.clone())
    eager, comp = grads
    out[name] = {"eager_max": eager.abs().max().item(),
                 "gap": ((comp - eager).abs().max() / eager.abs().max()).item()}
if r == 0:
    json.dump({"torch": torch.__version__, "cases": out}, open(sys.argv[1], "w"))
dist.destroy_process_group()
'''


@pytest.mark.distributed
def test_every_communicating_autograd_function_keeps_its_backward_when_compiled(tmp_path):
    script = tmp_path / "grads.py"
    script.write_text(SCRIPT)
    import meshplan
    root = str(Path(meshplan.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node=2", str(script), str(tmp_path / "out.json")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    cases = json.loads((tmp_path / "out.json").read_text())["cases"]
    assert len(cases) == 10
    for name, c in cases.items():
        assert c["eager_max"] > 0, name             # a gradient there is to compare
        # fp32 on both sides; only the order of a few sums may differ
        assert c["gap"] < 1e-5, (name, c)
