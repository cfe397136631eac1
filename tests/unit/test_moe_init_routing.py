"""benchmarks/moe_init_routing.py: the executor's routing of synthetic tokens at init, per
MoE layer (docs/benchmarks/moe_checks.md "The ep rows against the runs")."""

import json

import pytest

torch = pytest.importorskip("torch")
import meshplan as mp  # noqa: E402

TINY = mp.ModelSpec(name="tiny-moe", num_layers=3, hidden_size=32, num_heads=2, vocab_size=64,
                    max_seq_len=32, activation="swiglu", norm="rmsnorm",
                    position_embedding="rope", tied_embeddings=False, bias=False,
                    num_experts=4, experts_per_token=2)


def test_layer_rho(load_benchmark):
    m = load_benchmark("moe_init_routing")
    # experts 0, 1 on rank 0 and 2, 3 on rank 1: 6 copies against 2
    assert m.layer_rho(torch.tensor([0, 1, 0, 1, 0, 1, 2, 3]), 4, 2) == (1.5, 1.5)
    assert m.layer_rho(torch.tensor([0, 1, 2, 3]), 4, 2) == (1.0, 1.0)
    assert m.layer_rho(torch.tensor([0, 1, 2, 3]), 4, 4) == (1.0, 1.0)


def test_routing_at_init_reads_every_moe_layer(load_benchmark, tmp_path):
    m = load_benchmark("moe_init_routing")
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY.to_dict()))
    rows = m.routing_at_init(str(path), seq_len=16, micro_batch=2, ep=2)
    assert len(rows) == 3
    for rho, top in rows:
        assert 1.0 <= rho <= 2.0 and 1.0 <= top <= 4.0
    assert rows == m.routing_at_init(str(path), seq_len=16, micro_batch=2, ep=2)   # seeded


def test_bad_arguments_are_usage_errors(load_benchmark, tmp_path):
    m = load_benchmark("moe_init_routing")
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY.to_dict()))
    with pytest.raises(SystemExit, match="does not divide"):
        m.routing_at_init(str(path), seq_len=16, micro_batch=1, ep=3)
    with pytest.raises(SystemExit, match="above the model's 32"):
        m.routing_at_init(str(path), seq_len=64, micro_batch=1, ep=2)


def test_missing_model_file_is_a_usage_error(load_benchmark, tmp_path, capsys):
    m = load_benchmark("moe_init_routing")
    with pytest.raises(SystemExit) as e:
        m.main(["--model", str(tmp_path / "none.json"), "--seq-len", "16"])
    assert e.value.code == 2 and "no such file" in capsys.readouterr().err
