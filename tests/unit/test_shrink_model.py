"""benchmarks/shrink_model.py and the dry-run paths of the 4-GPU device scripts."""

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import shrink_model as sm  # noqa: E402
from meshplan.executor.parallelize import check_layout_runnable  # noqa: E402
from meshplan.spec import Job, ModelSpec  # noqa: E402

MOEH5 = ROOT / "benchmarks" / "sets" / "moeh5" / "m01.json"
FP8H5 = ROOT / "benchmarks" / "sets" / "fp8h5" / "m01.json"


def test_an_moe_model_keeps_every_degree_its_layouts_cut_by():
    full = ModelSpec.from_dict(json.loads(MOEH5.read_text()))
    tiny = ModelSpec.from_dict(sm.tiny_spec(full.to_dict()))
    for key in ("num_layers", "num_heads", "num_kv_heads", "num_experts",
                "experts_per_token", "num_shared_experts", "activation", "norm"):
        assert getattr(tiny, key) == getattr(full, key), key
    assert tiny.hidden_size == 8 * full.num_heads
    assert tiny.moe_ffn_hidden_size == tiny.shared_expert_ffn_hidden_size == 2 * tiny.hidden_size
    assert tiny.max_seq_len == sm.SEQ_LEN and tiny.vocab_size == 512
    assert tiny.num_params() < full.num_params() / 100     # 7.7 M of 3.0 B


def test_the_moeh5_layouts_stay_runnable_on_the_shrunk_model():
    import moe_sync_gpu as ms
    tiny = ModelSpec.from_dict(sm.tiny_spec(json.loads(MOEH5.read_text())))
    job = Job(global_batch=32, seq_len=sm.SEQ_LEN, runtime="torch")
    for name, lay in ms.SETS["drawn4-3805"]:
        check_layout_runnable(tiny, job, lay)


def test_fp8_device_on_the_cpu_takes_the_layouts_only_names():
    """A dry run of fp8h5's protocol asks the CPU for q01-q06, not its own c01/c02."""
    import fp8_device as f8
    args = argparse.Namespace(device="cpu", model=str(FP8H5), seq_len=64, global_batch=64,
                              only="q03,q01")
    _, job, todo = f8._model_job_layouts(args)
    assert [n for n, _ in todo] == ["q03", "q01"]
    assert job.seq_len == 64
    with pytest.raises(SystemExit, match="q99"):
        f8._model_job_layouts(argparse.Namespace(**{**vars(args), "only": "q99"}))


def test_the_command_line_writes_a_model_and_refuses_a_bad_one(tmp_path, capsys):
    out = tmp_path / "d" / "m.json"
    assert sm.main([str(FP8H5), str(out)]) == 0
    assert ModelSpec.from_dict(json.loads(out.read_text())).hidden_size == 240
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "num_heads": 4}))
    assert sm.main([str(bad), str(tmp_path / "o.json")]) == 1
    assert "bad.json" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()
