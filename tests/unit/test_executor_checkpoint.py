"""Checkpoint pieces, failure diagnosis and the checkpoint prediction, without processes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import meshplan as mp  # noqa: E402
from meshplan.costmodel.checkpoint import (  # noqa: E402
    checkpoint_bytes, held_bytes_per_rank, predict_checkpoint)
from meshplan.executor.checkpoint_state import _restrict, tensor_pieces  # noqa: E402
from meshplan.executor.failures import (diagnose, oom_message, root_cause_first,  # noqa: E402
                                        smaller_alternative, torchrun_failures)
from meshplan.executor.tensor_parallel import ShardSpec  # noqa: E402


def _reassemble(full_shape, per_rank_pieces):
    out = torch.full(full_shape, float("nan"))
    for pieces in per_rank_pieces:
        for off, t in pieces:
            idx = tuple(slice(o, o + n) for o, n in zip(off, t.shape))
            assert torch.isnan(out[idx]).all(), "two ranks wrote the same place"
            out[idx] = t
    return out


@pytest.mark.parametrize("spec", [ShardSpec(0), ShardSpec(1), ShardSpec(0, (8, 4, 4)),
                                  ShardSpec(0, (6, 6)), None], ids=str)
@pytest.mark.parametrize("tp", [1, 2])
def test_tensor_parallel_pieces_tile_the_full_tensor(spec, tp):
    full = torch.arange(16 * 12, dtype=torch.float32).reshape(16, 12)
    if spec is not None and spec.sections:
        full = full[:sum(spec.sections)]
    pieces = []
    for r in range(tp):
        local = spec.shard(full, r, tp) if spec is not None else full
        shape, ps = tensor_pieces(local, spec, r, tp)
        assert shape == tuple(full.shape)
        pieces.append(ps if spec is not None or r == 0 else [])   # replicas: one copy
    assert torch.equal(_reassemble(full.shape, pieces), full)


def test_restrict_follows_fsdp_rows_into_sections():
    # a tp-local fused weight [q_i (4 rows) | k_i (2) | v_i (2)] at full rows 4, 20, 28;
    # an FSDP2 shard holding local rows 3..6 covers q's last row, all of k and v's first
    segs = [(0, 4, 4), (4, 2, 20), (6, 2, 28)]
    assert _restrict(segs, 3, 4) == [(0, 1, 7), (1, 2, 20), (3, 1, 28)]
    assert _restrict(segs, 8, 0) == []


def test_diagnosis_names_the_rank_and_the_cause():
    oom = {"rank": 2, "kind": "out_of_memory", "phase": "measure", "step": 4,
           "message": "out of memory: predicted 1 GiB"}
    lost = {"rank": 0, "kind": "peer_lost", "step": 4, "message": "Connection closed by peer"}
    assert diagnose([lost, oom], 4).startswith("rank 2 failed at measure step 4: out of memory")
    died = {"rank": 3, "kind": "died", "message": "exit code -9 (signal 9: SIGKILL)"}
    assert diagnose([lost, died], 4) == "rank 3 died: exit code -9 (signal 9: SIGKILL)"
    waits = [{"rank": r, "kind": "collective_timeout", "step": 3, "progress": [3, 5]}
             for r in (0, 2)]
    behind = {"rank": 1, "kind": "terminated", "step": 3, "progress": [3, 0]}
    assert diagnose(waits + [behind], 3, 30).startswith(
        "rank 1 stopped responding (hung) at step 3, behind the other ranks: rank 0, 2 timed "
        "out after 30 s")
    assert "never reported" in diagnose(waits + [behind], 4, 30)   # rank 3: no report at all
    assert "no rank was behind" in diagnose([dict(w, rank=i) for i, w in enumerate(waits)],
                                            2, 30)
    assert "ended without a report" in diagnose([], 2)


def test_torchrun_failure_report_is_parsed():
    text = """
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_02:51:12
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
"""
    (e,) = torchrun_failures(text)
    assert (e["rank"], e["kind"], e["exitcode"]) == (1, "died", -9)
    assert "SIGKILL" in e["message"] and "received by PID 4242" in e["message"]


def test_a_rank_killed_by_a_signal_is_named_before_one_that_exited_after_it():
    # torchrun on a busy host (CI, 2026-12-06) listed rank 0, stopped after its peer's death
    # with the executor's exit code 4, beside rank 1, SIGKILLed: the root cause is rank 1
    stopped = {"rank": 0, "kind": "died", "exitcode": 4, "message": "exit code 4; torchrun: …"}
    killed = {"rank": 1, "kind": "died", "exitcode": -9,
              "message": "exit code -9 (signal 9: SIGKILL); torchrun: Signal 9 (SIGKILL)"}
    ordered = root_cause_first([stopped, killed])
    assert ordered == [killed, stopped]
    assert diagnose(ordered, 2).startswith("rank 1 died: exit code -9 (signal 9: SIGKILL)")
    # the kinds still come first: an out-of-memory report before any death, whatever its rank
    oom = {"rank": 1, "kind": "out_of_memory", "message": "CUDA out of memory"}
    assert root_cause_first([killed, dict(oom, rank=3)])[0]["kind"] == "out_of_memory"
    # two signalled deaths: by rank
    other = dict(killed, rank=0)
    assert [e["rank"] for e in root_cause_first([killed, other])] == [0, 1]


def test_oom_points_to_the_next_alternative_with_less_memory(tmp_path):
    from meshplan.planner.planfile import load_plan_file, save_plan_file
    model = mp.ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=4,
                         vocab_size=64, max_seq_len=16)
    job = mp.Job(global_batch=8, seq_len=16, precision="fp32")
    big, same, small = (mp.Layout(dp=2), mp.Layout(dp=2, zero=1), mp.Layout(dp=2, zero=3))
    pred = {"memory_peak_bytes": 8 * 2**30}
    cands = [{"layout": big.to_dict(), "prediction": pred},
             {"layout": same.to_dict(), "prediction": {"memory_peak_bytes": 8 * 2**30}},
             {"layout": small.to_dict(), "prediction": {"memory_peak_bytes": 3 * 2**30,
                                                         "tokens_per_s": 1234.0}}]
    path = save_plan_file(tmp_path / "p.json", model, mp.Cluster.preset("dgx-h100"), job, big,
                          pred, cands)
    plan = load_plan_file(path)
    assert smaller_alternative(plan, pred)[0] == 2
    msg = oom_message(plan, pred, 8 * 2**30, 9.5 * 2**30, 80 * 2**30,
                      RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert "predicted peak 8.00 GiB" in msg and "reached 9.50 GiB allocated of 80.00 GiB" in msg
    assert "candidate 2: dp2·pp1·tp1" in msg and "3.00 GiB" in msg and "--candidate 2" in msg
    assert "Tried to allocate" in msg


def test_checkpoint_prediction():
    m = mp.ModelSpec.preset("gpt3-1.3b") if "gpt3-1.3b" in mp.ModelSpec.preset_names() \
        else mp.ModelSpec(name="m", num_layers=24, hidden_size=2048, num_heads=16,
                          vocab_size=50304, max_seq_len=2048)
    e = predict_checkpoint(m, world=4, write_gbps_per_rank=2.0)
    assert e.bytes == checkpoint_bytes(m) == 12 * m.num_params()
    assert e.bytes_per_rank == e.bytes / 4
    assert e.write_s == pytest.approx(e.bytes / 4 / 2e9)
    slow_fs = predict_checkpoint(m, world=4, write_gbps_per_rank=2.0, aggregate_gbps=1.0)
    assert slow_fs.write_s == pytest.approx(e.bytes / 1e9)


def test_checkpoint_staging_is_what_the_rank_holds():
    """DDP ranks hold (and stage) the whole state; ZeRO-1 shards the moments, FSDP2 (ZeRO-2/3)
    the master weights too; tp and pp split both."""
    m = mp.ModelSpec(name="m", num_layers=24, hidden_size=2048, num_heads=16,
                     vocab_size=50304, max_seq_len=2048)
    p = m.num_params()
    ddp = predict_checkpoint(m, world=2, layout=mp.Layout(dp=2), stage_gbps=10.0)
    assert ddp.stage_s == pytest.approx(12 * p / 10e9)
    assert ddp.bytes_per_rank == pytest.approx(12 * p / 2)      # the write is deduplicated
    assert held_bytes_per_rank(m, mp.Layout(dp=2, zero=1)) == pytest.approx(p * (4 + 4))
    assert held_bytes_per_rank(m, mp.Layout(dp=2, zero=3)) == pytest.approx(p * 6)
    assert held_bytes_per_rank(m, mp.Layout(tp=2, pp=2)) == pytest.approx(3 * p)
    # ZeRO shards over the gradient replicas, dp · cp
    assert held_bytes_per_rank(m, mp.Layout(dp=2, cp=2, zero=1)) == pytest.approx(p * (4 + 2))
    assert predict_checkpoint(m, world=2).stage_s == pytest.approx(6 * p / 10e9)
