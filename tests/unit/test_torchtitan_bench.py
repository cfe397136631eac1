"""benchmarks/torchtitan_bench.py and torchtitan_summary.py without torchtitan installed: the
Llama-shaped twin of gpt3-1.3b, the import stand-ins, and the summary of a device call
(a torchtitan row, and the traceback of a run that wrote no results)."""

import json
import sys

import pytest

RANK_ERROR = """\
*****************************************
Traceback (most recent call last):
  File "benchmarks/torchtitan_bench.py", line 312, in main
    import torchtitan.train as tt_train
ModuleNotFoundError: No module named 'torchtitan'
W1128 14:23:43.915000 10312 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 10318 closing signal SIGTERM
E1128 14:23:43.949000 10312 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 10317) of binary: python3
Traceback (most recent call last):
  File "torch/distributed/run.py", line 1032, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def test_llama_twin_has_the_parameters_torchtitan_built(load_benchmark):
    bench = load_benchmark("torchtitan_bench")
    spec = bench.llama_shape_spec()
    # torchtitan 0.2.2's Transformer for the flavor, built on the meta device (CPU,
    # 2026-11-28): 1,442,940,928 parameters, SwiGLU width 5632
    assert spec.num_params() == 1_442_940_928
    assert (spec.activation, spec.norm, spec.tied_embeddings) == ("swiglu", "rmsnorm", False)
    from meshplan.costmodel.flops import model_flops_per_step
    assert model_flops_per_step(spec, 8, 2048) == pytest.approx(1.5132e14, rel=1e-4)


def test_stand_in_imports_but_refuses_use(load_benchmark):
    bench = load_benchmark("torchtitan_bench")
    name = "meshplan_test_stand_in_module"
    try:
        bench._stand_in(name, "for the test")
        mod = __import__(name)
        assert not hasattr(mod, "__path__")          # importers see a plain module
        with pytest.raises(RuntimeError, match=f"{name} is a stand-in.*for the test"):
            mod.load_dataset("c4")
    finally:
        sys.modules.pop(name, None)


def test_error_tail_keeps_the_ranks_traceback_not_torchruns(load_benchmark):
    summary = load_benchmark("torchtitan_summary")
    tail = summary.error_tail(RANK_ERROR)
    assert tail[-2] == "ModuleNotFoundError: No module named 'torchtitan'"
    assert "failed (exitcode: 1)" in tail[-1]
    assert not any("SIGTERM" in ln or "ChildFailedError" in ln for ln in tail)
    # no torchrun report (a time-out): the log's last lines
    assert summary.error_tail("a\nb\nc") == ["a", "b", "c"]


def test_summary_rows_torchtitan_and_a_failed_run(load_benchmark, tmp_path, capsys):
    bench = load_benchmark("torchtitan_bench")
    summary = load_benchmark("torchtitan_summary")
    spec = bench.llama_shape_spec()
    doc = {"torchtitan_version": "0.2.2", "world": 2, "local_batch_size": 4,
           "activation_checkpoint": "none", "compile": True, "model": spec.to_dict(),
           "step_time_s": 0.2, "tokens_per_s": 81920.0, "mfu": 0.38, "mfu_causal": 0.36,
           "memory_peak_bytes": 2**31, "torchtitan_mfu": 0.37, "step_times_s": [0.2],
           "job": {"global_batch": 8, "seq_len": 2048}}
    (tmp_path / "titan_compiled.json").write_text(json.dumps(doc))
    (tmp_path / "titan_eager.log").write_text(RANK_ERROR)
    summary.main([str(tmp_path), "titan_compiled", "titan_eager",
                  "--json", str(tmp_path / "s.json")])
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("| titan_compiled"))
    assert "torchtitan 0.2.2 FSDP2 dp 2 mb4 ac=none compiled" in row
    assert "| 200.0 | 81,920 | 38.0 % | 36.0 % | 2.0 | - | 1.000× | 37.0 % |" in row
    assert "| titan_eager | no results file |" in out
    assert "No module named 'torchtitan'" in out
    runs = json.loads((tmp_path / "s.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["ok", "no results file"]
