"""benchmarks/moe_saved_copies.py on two CPU ranks (gloo): the MoE layer's saved tensors,
eager and compiled, at ep 1 and 2, and the experts' 16-bit copies among them."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = {"name": "tiny-moe", "num_layers": 1, "hidden_size": 64, "num_heads": 4,
        "num_kv_heads": 4, "ffn_hidden_size": 128, "vocab_size": 128, "max_seq_len": 256,
        "activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope",
        "tied_embeddings": False, "bias": False, "dropout": False, "num_experts": 4,
        "experts_per_token": 2, "moe_ffn_hidden_size": 96}


@pytest.mark.distributed
def test_two_cpu_ranks_record_the_experts_copies_eager_and_compiled_at_ep1_and_2(tmp_path):
    """On the CPU the layer keeps its experts' 16-bit copies eager and compiled, at ep 1 and
    2 alike, and the compiled layer's gradients are eager's at both (on 2 x H200 the
    compiled layer at ep 2 saved none of its routed rows' activations: this script, run on a
    GPU, also says whether its gradients then still match)."""
    pytest.importorskip("torch")
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(TINY))
    out = tmp_path / "copies.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", str(ROOT / "benchmarks" / "moe_saved_copies.py"),
           "--device", "cpu", "--model", str(model), "--seq-len", "64", "--micro-batch", "2",
           "--backend", "aot_eager_decomp_partition", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["world"] == 2 and doc["device"] == "cpu"
    rows = {(r["ep"], r["compiled"] is not None): r for r in doc["rows"]}
    assert sorted(rows) == [(1, False), (1, True), (2, False), (2, True)]
    experts = 3 * 96 * 64       # gate | up and down, each expert
    for (ep, _), r in rows.items():
        assert r["expert_weight_bf16_bytes"] == 2 * experts * 4 // ep
        assert r["expert_copy_bytes"] == r["expert_weight_bf16_bytes"]
        assert r["saved_bytes"] > r["expert_copy_bytes"] and r["forward_growth_bytes"] is None
    for ep in (1, 2):
        gaps = rows[(ep, True)]["grad_gap_vs_eager"]
        # the input's and every parameter's, experts' included; bf16 autocast's rounding only
        assert {"input", "router.weight"} <= set(gaps) and any("expert" in n for n in gaps)
        assert all(isinstance(g, float) and g < 0.05 for g in gaps.values()), gaps
    assert "grad_gap_vs_eager" not in rows[(2, False)]


def _refused(tmp_path, spec: dict, seq_len: str, load_benchmark, capsys) -> tuple[int, str]:
    """(exit code, stderr) of the script's main (no torchrun) on ``spec`` at ``--seq-len
    seq_len``: input it must refuse before it starts any process group. Called in this
    process (argparse's refusal is a SystemExit): the same main a fresh interpreter runs,
    without importing torch again."""
    model = tmp_path / "model.json"
    model.write_text(json.dumps(spec))
    script = load_benchmark("moe_saved_copies")
    with pytest.raises(SystemExit) as exit_:
        script.main(["--device", "cpu", "--model", str(model), "--seq-len", seq_len,
                     "--out", str(tmp_path / "x.json")])
    return exit_.value.code, capsys.readouterr().err


def test_a_dense_model_is_refused_by_name(tmp_path, load_benchmark, capsys):
    pytest.importorskip("torch")
    dense = {k: v for k, v in TINY.items()
             if k not in ("num_experts", "experts_per_token", "moe_ffn_hidden_size")}
    code, err = _refused(tmp_path, dense, "8", load_benchmark, capsys)
    assert code == 2 and "has no routed experts" in err


def test_a_sequence_or_micro_batch_below_one_is_refused_by_name(tmp_path, load_benchmark,
                                                                capsys):
    pytest.importorskip("torch")
    code, err = _refused(tmp_path, TINY, "0", load_benchmark, capsys)
    assert code == 2 and "--seq-len 0" in err
