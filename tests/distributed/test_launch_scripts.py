"""The generated launch scripts run as written: two torchrun "nodes" on one host (issue 40 #3).

The plan is dp 2 · tp 2 on a cluster of 2 nodes × 2 GPUs; the torchrun script runs twice
at once (NNODES=2, c10d rendezvous on 127.0.0.1, gloo on CPU, 2 ranks each). Each rank
records its global rank, its node and the global ranks of its dp, pp and tp groups; they
must be the plan's mesh with tp innermost: tp groups {0, 1} and {2, 3}, each inside one
node, dp groups {0, 2} and {1, 3}. The SLURM script runs under stand-ins for ``srun`` and
``scontrol`` that start one task per node on this host, as SLURM would on each node.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import meshplan as mp  # noqa: E402
from meshplan.executor.planfiles import write_plan_for_layout  # noqa: E402
from meshplan.planner.launch import write_launch_script  # noqa: E402

M = mp.ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64,
                 max_seq_len=16)
JOB = mp.Job(global_batch=8, seq_len=16, precision="fp32")
ARGS = ["--device", "cpu", "--steps", "2", "--warmup", "1", "--timeout-s", "120"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    import meshplan
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                        "MESHPLAN_EXECUTOR_INJECT")}
    root = str(Path(meshplan.__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TORCHRUN"] = str(Path(sys.executable).with_name("torchrun"))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


@pytest.fixture
def plan_file(tmp_path):
    cluster = mp.Cluster.preset("dgx-h100", nodes=2).replace(gpus_per_node=2)
    return write_plan_for_layout(tmp_path / "plan.json", M, JOB, mp.Layout(dp=2, tp=2),
                                 cluster)


def _check_mesh(results: Path) -> None:
    doc = json.loads(results.read_text())
    assert doc["status"] == "ok"
    ranks = sorted(doc["measured"]["memory_per_rank"], key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    for r in ranks:
        assert r["node_rank"] == r["rank"] // 2 and r["local_rank"] == r["rank"] % 2
        assert r["groups"]["tp"] == [2 * (r["rank"] // 2), 2 * (r["rank"] // 2) + 1]
        assert r["groups"]["dp"] == [r["rank"] % 2, r["rank"] % 2 + 2]
        assert r["groups"]["pp"] == [r["rank"]]
        assert (r["tp"], r["dp"]) == (r["rank"] % 2, r["rank"] // 2)
        # tp is innermost: both members of a tp group run on the same node
        assert {ranks[t]["node_rank"] for t in r["groups"]["tp"]} == {r["node_rank"]}


@pytest.mark.distributed
@pytest.mark.slow
def test_torchrun_script_on_two_local_nodes(plan_file, tmp_path):
    script = write_launch_script(plan_file, tmp_path / "launch", "torchrun")
    env = _env(NNODES="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               RDZV_ID=f"test-{os.getpid()}")
    nodes = [subprocess.Popen([str(script), *ARGS], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    try:
        outs = [n.communicate(timeout=400)[0] for n in nodes]
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(o[-3000:] for o in outs)
    _check_mesh(script.parent / "results.json")


@pytest.mark.distributed
@pytest.mark.slow
def test_slurm_script_under_stand_ins(plan_file, tmp_path):
    script = write_launch_script(plan_file, tmp_path / "launch", "slurm")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # srun: one task per node (here: both on this host), each with the node's SLURM_NODEID
    _exe(bin_dir / "srun", '#!/usr/bin/env bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
         'for i in $(seq 0 $((SLURM_NNODES - 1))); do SLURM_NODEID=$i "$@" & done\n'
         'rc=0; for j in $(jobs -p); do wait $j || rc=$?; done; exit $rc\n')
    _exe(bin_dir / "scontrol", '#!/usr/bin/env bash\necho 127.0.0.1\necho 127.0.0.1\n')
    env = _env(SLURM_JOB_NODELIST="n[1-2]", SLURM_NNODES="2", SLURM_JOB_ID=str(os.getpid()),
               SLURM_SUBMIT_DIR=str(script.parent), MASTER_PORT=str(_free_port()))
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    r = subprocess.run(["bash", str(script), *ARGS], env=env, capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    _check_mesh(script.parent / "results.json")


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_torchrun_script_requires_master_addr_for_several_nodes(plan_file, tmp_path):
    script = write_launch_script(plan_file, tmp_path / "launch", "torchrun")
    r = subprocess.run([str(script)], env=_env(NNODES="2", TORCHRUN="false"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "set MASTER_ADDR" in r.stderr
    # one node: localhost is the right default (TORCHRUN=echo shows the command it would run)
    r = subprocess.run([str(script), "--device", "cpu"], env=_env(NNODES="1", TORCHRUN="echo"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "--rdzv-endpoint=localhost:29500" in r.stdout
    assert r.stdout.rstrip().endswith("--device cpu")


def test_slurm_script_has_site_placeholders(plan_file, tmp_path):
    text = write_launch_script(plan_file, tmp_path, "slurm").read_text()
    for piece in ("##SBATCH --time=", "##SBATCH --partition=", "##SBATCH --account=",
                  "source /path/to/venv/bin/activate", "#SBATCH --nodes=2",
                  "#SBATCH --gpus-per-node=2"):
        assert piece in text, piece


def test_uneven_node_split_and_tp_across_nodes_are_refused(tmp_path):
    from meshplan.errors import ConfigError
    from meshplan.planner.launch import nodes_and_procs
    assert nodes_and_procs(16, 8, 8) == (2, 8) and nodes_and_procs(4, 8, 2) == (1, 4)
    with pytest.raises(ConfigError, match="evenly over 2 nodes"):
        nodes_and_procs(12 + 1, 8, 1)
    with pytest.raises(ConfigError, match="tp = 4"):
        nodes_and_procs(12, 8, 4)      # 2 nodes × 6: a tp 4 group would straddle them
