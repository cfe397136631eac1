"""benchmarks/mcore_moe_layer.py: Megatron-LM's MoE layer test read as meshplan specs, and the
MoE part of a layer priced as the routed experts plus the shared expert and the host sync."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import mcore_moe_layer as bench  # noqa: E402
from meshplan.costmodel.compute import gemm_s  # noqa: E402
from meshplan.costmodel.inputs import table_inputs  # noqa: E402
from meshplan.costmodel.moe_layer import routed_mlp  # noqa: E402


def test_every_case_is_read_as_the_test_ran_it():
    rows = bench.read_rows(bench.DATA)
    assert len(rows) == len({r["case"] for r in rows}) == 12
    for row in rows:
        model, cluster, job, layout = bench.case(row)
        assert (layout.tp, layout.ep, layout.num_gpus, layout.micro_batch) == (1, 8, 8, 1)
        assert job.seq_len == 4096 and job.runtime == "megatron"
        assert job.precision == row["precision"]
        assert job.moe_dispatcher == ("alltoall" if row["dispatcher"] == "alltoall"
                                      else "deepep")
        assert cluster.gpu.corrections.moe_load_imbalance == 1.0       # forced balance
        assert model.activation == "gelu" and model.ffn_matrices == 1  # no gate (GLU off)
    ds = bench.PROXIES["deepseek-proxy"]
    assert (ds.hidden_size, ds.num_experts, ds.experts_per_token, ds.moe_ffn_hidden_size,
            ds.num_shared_experts, ds.router) == (7168, 32, 8, 2048, 1, "sigmoid")


@pytest.mark.parametrize("name", ["mixtral_a2a_tp1ep8_bf16", "deepseek_deepep_tp1ep8_bf16"])
def test_the_moe_part_is_routed_plus_shared_plus_host(name):
    row = next(r for r in bench.read_rows(bench.DATA) if r["case"] == name)
    model, cluster, job, layout = bench.case(row)
    fwd, bwd = bench.moe_layer_s(model, cluster, job, layout)
    links = table_inputs(model, cluster, job, layout).links
    routed = routed_mlp(model, cluster, job, layout, links, 1.0)
    gpu = cluster.gpu
    shared = (2 * gemm_s(gpu, gpu.peak_flops("bf16"), 2.0 * 4096 * 7168 * 2048)
              if model.num_shared_experts else 0.0)
    extra = fwd - routed.forward.total_s
    # the shared expert's two GEMMs and its activation, plus one host sync (< 0.1 ms)
    assert shared <= extra < shared + 0.1e-3 + 0.5 * shared
    assert bwd >= routed.backward.total_s + 2 * shared


def test_report_names_every_row_and_summarises(tmp_path):
    out = tmp_path / "m.md"
    assert bench.main(["--out", str(out)]) == 0
    text = out.read_text()
    assert text.count("| mixtral-proxy |") == 6 and text.count("| deepseek-proxy |") == 6
    assert "every row, forward + backward: mean" in text
