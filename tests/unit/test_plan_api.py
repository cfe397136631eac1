"""plan(): bad input gives clear meshplan errors; plan files round-trip; launch scripts."""

import dataclasses
import json
import os
import subprocess

import pytest

import meshplan as mp
from meshplan.errors import ConfigError, MeshplanError, NoFeasiblePlan, PlanFileError
from meshplan.planner import Constraints

GIB = 2**30


def tiny_model(**kw):
    base = dict(name="tiny", num_layers=6, hidden_size=128, num_heads=4, vocab_size=4096,
                max_seq_len=512)
    base.update(kw)
    return mp.ModelSpec(**base)


def tiny_cluster(memory_mib=None, nodes=1, gpus_per_node=4):
    c = mp.Cluster.preset("dgx-a100-80gb")
    c = c.replace(nodes=nodes, gpus_per_node=gpus_per_node)
    if memory_mib is not None:
        c = c.replace(gpu=dataclasses.replace(c.gpu, memory_bytes=memory_mib * 2**20),
                      memory_reserve_bytes=0, memory_reserve_fraction=0.0)
    return c


JOB = mp.Job(global_batch=16, seq_len=256)


@pytest.fixture(scope="module")
def small_plan():
    return mp.plan(tiny_model(), tiny_cluster(nodes=2), JOB, top_k=4)


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs,words", [
    (dict(schedules=("1f1b",), fixed={"schedule": "gpipe"}),
     ["contradictory", "schedule='gpipe'", "1f1b"]),
    (dict(max_tp=2, fixed={"tp": 4}), ["contradictory", "tp=4", "max_tp=2"]),
    (dict(max_micro_batch=2, fixed={"micro_batch": 4}), ["micro_batch=4", "max_micro_batch=2"]),
    (dict(zero=(0,), fixed={"zero": 3}), ["zero=3", "[0]"]),
    (dict(fixed={"pipeline": 4}), ["'pipeline'", "dp, pp, tp"]),
    (dict(schedules=()), ["schedules is empty"]),
    (dict(schedules=("1f2b",)), ["'1f2b'", "'1f1b'"]),
    (dict(memory_headroom=1.0), ["memory_headroom", "[0, 1)"]),
    (dict(max_micro_batch=0), ["max_micro_batch", "positive"]),
    (dict(max_tp=-2), ["max_tp", "-2"]),
    (dict(min_layers_per_stage=0), ["min_layers_per_stage", ">= 1, got 0", "stage_layers"]),
])
def test_bad_constraints_name_the_value(kwargs, words):
    with pytest.raises(ConfigError) as err:
        Constraints(**kwargs)
    for w in words:
        assert w in str(err.value)


def test_fixed_values_that_rule_out_every_layout():
    # 5 does not divide the 8 GPUs: no pp=5 layout exists
    with pytest.raises(NoFeasiblePlan) as err:
        mp.plan(tiny_model(), tiny_cluster(nodes=2), JOB, constraints=Constraints(fixed={"pp": 5}))
    assert err.value.binding == "constraints"
    assert "{'pp': 5}" in str(err.value) and "rule out every layout" in str(err.value)


def test_model_that_fits_nowhere_explains_with_numbers():
    # 16 MiB GPUs: the model states fit (test_planner_bounds covers GPUs where they do
    # not), the activations do not; recompute and ZeRO-3 forbidden so that the suggestions
    # have work to do
    cluster = tiny_cluster(memory_mib=16, nodes=1, gpus_per_node=2)
    cons = Constraints(recompute=("none",), zero=(0,), max_micro_batch=4,
                       memory_headroom=0.1)
    with pytest.raises(NoFeasiblePlan) as err:
        mp.plan(tiny_model(), cluster, JOB, constraints=cons)
    e = err.value
    msg = str(e)
    assert e.binding == "memory"
    assert e.min_memory_bytes > e.usable_memory_bytes == pytest.approx(16 * 2**20 * 0.9)
    assert f"{e.min_memory_bytes / 2**20:.1f} MiB" in msg and "14.4 MiB" in msg
    assert "Binding constraint: GPU memory" in msg
    joined = " | ".join(e.suggestions)
    assert "recompute='full'" in joined and "ZeRO stage 3" in joined
    assert "no memory headroom" in joined
    assert "more GPUs: 4 GPUs (2 nodes of 2) fit" in joined
    # every suggestion carries a number (memory it would need, or a GPU count)
    assert all(any(ch.isdigit() for ch in s) for s in e.suggestions)


def test_suggested_gpu_count_really_fits():
    # the model states fit 16 H100s; without recompute the activations do not
    model = mp.ModelSpec.preset("llama3-70b")
    cluster = mp.Cluster.preset("dgx-h100", nodes=2)
    job = mp.Job(global_batch=64, seq_len=8192)
    cons = Constraints(recompute=("none",))
    with pytest.raises(NoFeasiblePlan) as err:
        mp.plan(model, cluster, job, top_k=1, constraints=cons)
    more = [s for s in err.value.suggestions if s.startswith("more GPUs")]
    assert more, err.value.suggestions
    n = int(more[0].split()[2])
    p = mp.plan(model, cluster.replace(nodes=n // 8), job, top_k=1, constraints=cons)
    assert p.best.estimate.fits and p.best.layout.num_gpus == n


def test_gpu_count_that_holds_the_model_states():
    """gpt3-175b's states need 2.5 TiB: 72 A100-40GB hold them only fully sharded, which
    tp·pp leaves no room for; the count the message names holds them in some layout."""
    model = mp.ModelSpec.preset("gpt3-175b")
    job = mp.Job(global_batch=64, seq_len=2048)
    with pytest.raises(NoFeasiblePlan) as err:
        mp.plan(model, mp.Cluster.preset("dgx-a100-40gb", nodes=9), job, top_k=1)
    more = [s for s in err.value.suggestions if s.startswith("more GPUs")]
    assert more and "hold the model states" in more[0], err.value.suggestions
    n = int(more[0].split()[2])
    assert n > 72
    p = mp.plan(model, mp.Cluster.preset("dgx-a100-40gb", nodes=n // 8), job, top_k=1)
    assert p.best.layout.num_gpus == n


@pytest.mark.parametrize("kwargs,words", [
    (dict(gpus=0), ["0", "positive"]),
    (dict(gpus=-8), ["-8", "positive"]),
    (dict(gpus=16), ["16 GPUs", "has 8"]),
    (dict(gpus=range(4, 17)), ["9 GPUs", "has 8"]),
    (dict(gpus=[]), ["no GPU count"]),
    (dict(gpus="8"), ["str"]),
    (dict(top_k=0), ["top_k", "0"]),
    (dict(objective="speed"), ["'speed'", "throughput"]),
    (dict(solver="milp"), ["'milp'", "cp-sat"]),
    (dict(objective="time_to_train"), ["Job.tokens"]),
    (dict(constraints={"max_tp": 2}), ["Constraints", "dict"]),
])
def test_bad_plan_arguments(kwargs, words):
    with pytest.raises(ConfigError) as err:
        mp.plan(tiny_model(), tiny_cluster(nodes=2), JOB, **kwargs)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("make", [
    lambda: mp.Job(global_batch=0, seq_len=256),
    lambda: mp.Job(global_batch=16, seq_len=-1),
    lambda: tiny_model(num_layers=0),
    lambda: tiny_model(hidden_size=-128),
    lambda: mp.Cluster.preset("dgx-a100-80gb", nodes=0),
])
def test_zero_or_negative_sizes(make):
    with pytest.raises(ConfigError):
        make()


def test_seq_len_beyond_learned_positions():
    with pytest.raises(ConfigError, match="max_seq_len = 512"):
        mp.plan(tiny_model(), tiny_cluster(), mp.Job(global_batch=16, seq_len=1024))


def test_fixed_stage_layers_must_sum_to_layers():
    with pytest.raises(ConfigError, match="sum to 5"):
        mp.plan(tiny_model(), tiny_cluster(), JOB,
                constraints=Constraints(fixed={"stage_layers": (2, 3)}))


def test_a_fixed_partition_may_give_the_embedding_and_the_loss_stages_of_their_own():
    """Megatron's account-for-embedding/loss split, pinned: the solver keeps it."""
    p = mp.plan(tiny_model(), tiny_cluster(), JOB, top_k=1, constraints=Constraints(
        fixed={"pp": 4, "stage_layers": (0, 3, 3, 0)}))
    best = p.best.layout
    assert (best.pp, best.stage_layers) == (4, (0, 3, 3, 0))
    assert p.best.estimate.step_time_s == mp.estimate(tiny_model(), tiny_cluster(), JOB,
                                                      best).step_time_s


# ---------------------------------------------------------------- results

def test_every_candidate_satisfies_the_constraints(small_plan):
    cap = small_plan.cluster.usable_memory_bytes
    values = [c.estimate.step_time_s for c in small_plan.candidates]
    assert values == sorted(values) and len(values) == 4
    for c in small_plan.candidates:
        assert small_plan.constraints.allows(c.layout) is None
        assert c.estimate.memory_peak_bytes <= cap
        assert c.layout.num_gpus == 8
        assert sum(c.layout.stage_layers) == 6


def test_table_columns(small_plan):
    df = small_plan.table
    assert list(df.index) == [1, 2, 3, 4]
    for col in ("dp", "pp", "tp", "micro_batch", "schedule", "vpp", "recompute", "zero",
                "sequence_parallel", "stage_layers", "step_time_s", "tokens_per_s", "mfu",
                "memory_peak_gib", "bubble_s", "tp_comm_s", "dp_comm_exposed_s"):
        assert col in df.columns
    assert df["tokens_per_s"].iloc[0] == pytest.approx(small_plan.best.estimate.tokens_per_s)


# ---------------------------------------------------------------- plan files

def test_plan_file_round_trip(small_plan, tmp_path):
    path = small_plan.to_json(tmp_path / "plan.json")
    back = mp.Plan.from_json(path)
    assert back.model == small_plan.model
    assert back.cluster == small_plan.cluster
    assert back.job == small_plan.job
    assert back.objective == small_plan.objective
    assert [c.layout for c in back.candidates] == [c.layout for c in small_plan.candidates]
    a, b = small_plan.best.estimate, back.best.estimate
    assert b.step_time_s == a.step_time_s
    assert b.tokens_per_s == a.tokens_per_s
    assert b.memory_peak_bytes == a.memory_peak_bytes
    assert b.to_dict() == a.to_dict()
    doc = json.loads(path.read_text())
    assert doc["prediction"]["step_time_s"] == pytest.approx(a.step_time_s)
    assert doc["search"]["objective"] == "throughput"


def test_plan_file_refuses_overwrite(small_plan, tmp_path):
    path = small_plan.to_json(tmp_path / "plan.json")
    with pytest.raises(MeshplanError, match="refusing to overwrite"):
        small_plan.to_json(path, overwrite=False)


def _doc(small_plan, tmp_path):
    return json.loads(small_plan.to_json(tmp_path / "good.json").read_text())


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.update(schema="something.else"), "'schema'"),
    (lambda d: d.update(version=99), "'version'"),
    (lambda d: d.pop("model"), "'model'"),
    (lambda d: d["model"].update(num_layers="six"), "'model'"),
    (lambda d: d["cluster"].update(gpus_per_node=-1), "'cluster'"),
    (lambda d: d["job"].update(global_batch=0), "'job'"),
    (lambda d: d["layout"].update(schedule="2f2b"), "'layout'"),
    (lambda d: d["layout"].update(tp=3), "'layout'"),
    (lambda d: d.update(candidates={"a": 1}), "'candidates'"),
    (lambda d: d["candidates"].append({"nolayout": 1}), "candidates[4]"),
    (lambda d: d.update(search={"objective": "speed"}), "'search.objective'"),
])
def test_corrupted_plan_file_names_the_field(small_plan, tmp_path, mutate, field):
    doc = _doc(small_plan, tmp_path)
    mutate(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(PlanFileError) as err:
        mp.Plan.from_json(bad)
    assert field in str(err.value) and "bad.json" in str(err.value)


@pytest.mark.parametrize("text", ["{not json", "[1, 2, 3]", "", '"a string"'])
def test_foreign_or_broken_json(tmp_path, text):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(PlanFileError, match="bad.json"):
        mp.Plan.from_json(bad)


def test_missing_plan_file(tmp_path):
    with pytest.raises(PlanFileError, match="does not exist"):
        mp.Plan.from_json(tmp_path / "nope.json")


# ---------------------------------------------------------------- launch scripts

def test_torchrun_script(small_plan, tmp_path):
    script = small_plan.write_launch_script(tmp_path / "launch", launcher="torchrun")
    text = script.read_text()
    assert script.name == "run_torchrun.sh" and text.startswith("#!/usr/bin/env bash")
    assert os.access(script, os.X_OK)
    for piece in ('--rdzv-backend=c10d', '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"',
                  '--rdzv-id="$RDZV_ID"', '--nnodes="$NNODES"', ': "${NNODES:=2}"',
                  ': "${NPROC_PER_NODE:=4}"', "-m meshplan.executor.run --plan \"$PLAN\"",
                  ': "${PLAN:=$HERE/plan.json}"', "MASTER_ADDR", "MASTER_PORT"):
        assert piece in text, piece
    # the plan next to the script is the same plan
    back = mp.Plan.from_json(script.parent / "plan.json")
    assert back.best.layout == small_plan.best.layout
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_slurm_script(small_plan, tmp_path):
    script = small_plan.write_launch_script(tmp_path, launcher="slurm")
    text = script.read_text()
    assert os.access(script, os.X_OK)
    for piece in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                  "#SBATCH --gpus-per-node=4", "srun ", "scontrol show hostnames",
                  '--rdzv-id="$SLURM_JOB_ID"', "--rdzv-backend=c10d",
                  "-m meshplan.executor.run --plan \"$PLAN\"",
                  ': "${PLAN:=$SLURM_SUBMIT_DIR/plan.json}"'):
        assert piece in text, piece
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_launch_script_refuses_overwrite(small_plan, tmp_path):
    small_plan.write_launch_script(tmp_path, launcher="torchrun")
    with pytest.raises(MeshplanError, match="refusing to overwrite"):
        small_plan.write_launch_script(tmp_path, launcher="torchrun")
    small_plan.write_launch_script(tmp_path, launcher="torchrun", overwrite=True)


def test_launch_script_bad_input(small_plan, tmp_path):
    with pytest.raises(ConfigError, match="'mpirun'"):
        small_plan.write_launch_script(tmp_path, launcher="mpirun")
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(MeshplanError, match="not a directory"):
        small_plan.write_launch_script(f)
