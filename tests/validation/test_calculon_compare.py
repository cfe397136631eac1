"""benchmarks/calculon_compare.py: Calculon's inputs for the published runs, and its absence."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import calculon_compare as cc  # noqa: E402
import validate_published as vp  # noqa: E402
from published_runs import (korthikanti2022, megatron_core_h100, mlperf_gpt3_fp8,  # noqa: E402
                            narayanan2021)

from meshplan import Cluster, Job, Layout, ModelSpec  # noqa: E402

CALCULON_DIR = os.environ.get("CALCULON_DIR", "/work/calculon")
CALCULON_NAMES = {"megatron-22b": "megatron-22B", "gpt3-175b": "gpt3-175B",
                  "turing-530b": "turing-530B", "megatron-1t": "megatron-1T"}


def test_narayanan_run_in_calculon_schema():
    run = next(r for r in narayanan2021() if r.model.name == "gpt-145.6b")
    app, exe, system = cc.calculon_inputs(run)
    assert app == {"hidden": 12288, "feedforward": 49152, "seq_size": 2048, "attn_heads": 96,
                   "attn_size": 128, "num_blocks": 80}
    assert (exe["tensor_par"], exe["pipeline_par"], exe["data_par"], exe["num_procs"]) == \
        (8, 8, 24, 1536)
    assert exe["pipeline_interleaving"] == 2 and exe["activation_recompute"] == "full"
    assert exe["tensor_par_comm_type"] == "ar" and not exe["data_par_overlap"]
    assert system == "a100_80g.json"


def test_megatron_core_run_maps_overlaps_and_sp():
    run = next(r for r in megatron_core_h100() if r.layout.pp == 2)
    _, exe, system = cc.calculon_inputs(run)
    assert exe["tensor_par_comm_type"] == "rs_ag" and exe["seq_par_ag_redo"]
    assert exe["tensor_par_overlap"] == "ring" and exe["data_par_overlap"]
    assert exe["optimizer_sharding"] and system == "h100_80g_nvl8.json"


def test_fp8_runs_use_calculons_float8_datatype():
    """An fp8 run goes to Calculon as its ``float8`` datatype, a bf16/fp16 one as ``float16``,
    with the MLPerf layout's interleaving, SP and overlaps."""
    run = mlperf_gpt3_fp8()[-1]
    app, exe, system = cc.calculon_inputs(run)
    assert exe["datatype"] == "float8" and system == "h100_80g_nvl8.json"
    assert (exe["tensor_par"], exe["pipeline_par"], exe["data_par"]) == (4, 8, 336)
    assert exe["pipeline_interleaving"] == 12 and exe["tensor_par_comm_type"] == "rs_ag"
    assert exe["activation_recompute"] == "none" and exe["optimizer_sharding"]
    assert cc.calculon_inputs(megatron_core_h100()[0])[1]["datatype"] == "float16"


def test_llama_and_zero3_are_not_expressible():
    run = narayanan2021()[0]
    llama = type(run)("llama", ModelSpec.preset("llama3-8b"), Cluster.preset("dgx-h100"),
                      Job(global_batch=8, seq_len=8192), Layout(dp=8), 1.0, {})
    with pytest.raises(cc.NotExpressible, match="MHA or MQA"):
        cc.calculon_inputs(llama)
    z3 = type(run)("z3", run.model, run.cluster, run.job,
                   Layout(dp=run.layout.dp, zero=3, micro_batch=16), 1.0, {})
    with pytest.raises(cc.NotExpressible, match="ZeRO-2/3"):
        cc.calculon_inputs(z3)


@pytest.mark.skipif(not (Path(CALCULON_DIR) / "validation").exists(),
                    reason="no Calculon checkout (set CALCULON_DIR)")
@pytest.mark.parametrize("run", korthikanti2022(), ids=lambda r: r.label)
def test_table5_inputs_equal_calculons_own_files(run):
    """Our translation of Korthikanti Table 5 is byte-for-byte Calculon's own validation input."""
    app, exe, _ = cc.calculon_inputs(run)
    name = CALCULON_NAMES[run.model.name]
    base = Path(CALCULON_DIR)
    assert app == json.loads((base / "models" / f"{name}.json").read_text())
    assert exe == json.loads(
        (base / "validation" / "seqsel" / "tab5" / f"{name}_{run.row['mode']}.json").read_text())


def test_without_calculon_exits_2_and_says_how(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("CALCULON_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "calculon", None)   # import calculon -> ImportError
    out = tmp_path / "published.md"
    assert cc.main(["--out", str(out)]) == 2
    assert "git clone https://github.com/calculon-ai/calculon" in capsys.readouterr().err
    assert not out.exists()


def test_bad_calculon_path_names_it(tmp_path):
    with pytest.raises(SystemExit, match="is not a Calculon checkout"):
        cc.load_calculon(str(tmp_path))


def test_section_round_trip_keeps_the_rest(tmp_path):
    md = tmp_path / "published.md"
    md.write_text("# head\n\n" + "\n".join(vp.kept_section(md)) + "\n\n## tail\n")
    vp.replace_section(md, "| a | b |")
    text = md.read_text()
    assert text.startswith("# head") and text.rstrip().endswith("## tail")
    assert "| a | b |" in text and "Not generated yet" not in text
    assert vp.kept_section(md)[0].count("| a | b |") == 1
