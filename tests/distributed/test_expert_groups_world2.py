"""The experts' all-to-alls have a communicator of their own even where their ranks are the
world's (dp 2 · ep 2 and tp 2 · ep 2 on two ranks, where DeviceMesh hands out the default
group): FSDP2's or tp's collectives and the all-to-alls issued in different orders on two
ranks cannot then meet in one sequence (meshplan/executor/expert_parallel.py,
build_expert_groups). Two gloo ranks under torchrun."""

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
import torch.distributed as dist
import meshplan as mp
from meshplan.executor.expert_parallel import build_expert_groups
from meshplan.executor.mesh import build_mesh
dist.init_process_group("gloo")
out = {}
for name, lay in (("dp2-ep2", mp.Layout(dp=2, ep=2, zero=3)),
                  ("tp2-ep2", mp.Layout(tp=2, ep=2, sequence_parallel=True))):
    g = build_mesh(lay, "cpu")
    eg = build_expert_groups(g.mesh, lay.ep, lay.etp, "cpu")
    dense = g.dp_group if lay.dp > 1 else g.tp_group
    out[name] = {"ep_ranks": dist.get_process_group_ranks(eg.ep_group),
                 "ep_is_world": eg.ep_group is dist.group.WORLD,
                 "dense_is_world": dense is dist.group.WORLD,
                 "ep_name": eg.ep_group.group_name, "dense_name": dense.group_name}
    # the group works: each rank sends its rank to the other
    import torch
    recv = torch.empty(2, dtype=torch.long)
    dist.all_to_all_single(recv, torch.full((2,), dist.get_rank()), group=eg.ep_group)
    out[name]["received"] = recv.tolist()
if dist.get_rank() == 0:
    json.dump(out, open(sys.argv[1], "w"))
dist.destroy_process_group()
'''


@pytest.mark.distributed
def test_the_ep_group_is_its_own_communicator_where_its_ranks_are_the_worlds(tmp_path):
    script = tmp_path / "groups.py"
    script.write_text(SCRIPT)
    import meshplan
    root = str(Path(meshplan.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node=2", str(script), str(tmp_path / "out.json")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    for name in ("dp2-ep2", "tp2-ep2"):
        case = out[name]
        assert case["ep_ranks"] == [0, 1], case
        assert case["dense_is_world"], case        # what DeviceMesh hands out here
        assert not case["ep_is_world"] and case["ep_name"] != case["dense_name"], case
        assert case["received"] == [0, 1], case
