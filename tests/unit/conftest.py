"""Shared fixtures of the unit tests."""

import importlib.util
import sys
from pathlib import Path

import pytest

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="session")
def load_benchmark():
    """Import a script of benchmarks/ (not a package) by its file name, once."""
    def load(name: str):
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, _BENCHMARKS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod
    return load


@pytest.fixture(scope="session")
def solve_fixed_partition():
    """The planner's CP-SAT step expression minimised on a fixed partition ``part`` of the
    tables ``t``, in seconds: the pipeline (``pipeline_units``), or with ``host=True``
    max(pipeline, host bound) (``_host_bound_units``)."""
    cp_model = pytest.importorskip("ortools.sat.python.cp_model")
    from meshplan.planner.cpsat import UNITS_PER_S, pipeline_units
    from meshplan.planner.cpsat_partition import _host_bound_units

    def solve(t, part, *, host: bool = False) -> float:
        M = cp_model.CpModel()
        n = [M.NewIntVar(v, v, f"n{i}") for i, v in enumerate(part)]
        top = pipeline_units(M, t, n, "t")
        if host:
            x = M.NewBoolVar("x")
            M.Add(x == 1)
            top = _host_bound_units(M, t, n, n, x, top, "t")
        obj = M.NewIntVar(0, 10**15, "obj")
        M.Add(obj == top)
        M.Minimize(obj)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        assert solver.Solve(M) == cp_model.OPTIMAL
        return solver.Value(obj) / UNITS_PER_S
    return solve


TINY_LLAMA = {"name": "tiny-llama", "num_layers": 2, "hidden_size": 64, "num_heads": 4,
              "num_kv_heads": 2, "ffn_hidden_size": 128, "vocab_size": 128, "max_seq_len": 32,
              "activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope",
              "tied_embeddings": False, "bias": False}


@pytest.fixture(scope="session")
def two_rank_profile(tmp_path_factory) -> dict:
    """The profile of one real 2-rank CPU calibration (torchrun, gloo) of a tiny Llama:
    ``--quick``, micro-batch 1, two layer rounds under a --time-budget that allows both, and
    each module's sustained-clock loop (``--sustained-s 0.02``).
    Run once per session: the layer-table test and the round-budget test of
    test_calibrate_layers.py read the same file (a run takes 20-30 s on the 2-core machine);
    keep its users in that one file, so that pytest-xdist's --dist loadfile runs it once."""
    pytest.importorskip("torch")
    import json
    import os
    import tomllib

    from meshplan.cli import main as cli_main
    d = tmp_path_factory.mktemp("two_rank_profile")
    spec = d / "tiny.json"
    spec.write_text(json.dumps(TINY_LLAMA))
    out = d / "p.toml"
    root = Path(__file__).resolve().parents[2]
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{root}{os.pathsep}{env_path}"   # torchrun's ranks: this tree
    try:
        # --sustained-s: each module's back-to-back loop on both ranks, collectives (tp,
        # FSDP2 over dp 2) inside it, iteration counts agreed (off by default on CPU)
        rc = cli_main(["calibrate", "--device", "cpu", "--quick", "--model", str(spec),
                       "--micro-batches", "1", "--nproc", "2", "--rounds", "2",
                       "--time-budget", "100000", "--sustained-s", "0.02", "--out", str(out),
                       "--no-progress"])
    finally:
        os.environ["PYTHONPATH"] = env_path
    assert rc == 0
    return tomllib.loads(out.read_text())


@pytest.fixture
def no_grad_accumulation(monkeypatch):
    """The cost model without its gradient-accumulation term
    (:mod:`meshplan.costmodel.grad_accumulation`), for tests of other mechanisms whose
    expected numbers are a measured row passed through or a committed prediction made
    before the term (tests/unit/test_grad_accumulation.py tests the term itself)."""
    from meshplan.costmodel import build, grad_accumulation, tables
    monkeypatch.setattr(build, "accumulation_terms",
                        lambda *a, **k: grad_accumulation.AccumulationTerms())
    tables._layer_tables.cache_clear()
    yield
    tables._layer_tables.cache_clear()
