"""Executor pieces that need no process group: shards, stage split, checks, data, measurement."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402
from meshplan.errors import ExecutorError  # noqa: E402
from meshplan.executor.data import SyntheticTokens, TokenFile, local_share, to_device  # noqa: E402
from meshplan.executor.measure import error_pct, summarize  # noqa: E402
from meshplan.executor.parallelize import check_layout_runnable  # noqa: E402
from meshplan.executor.pipeline import local_parts  # noqa: E402
from meshplan.executor.tensor_parallel import ShardSpec  # noqa: E402

M = ModelSpec(name="m", num_layers=8, hidden_size=32, num_heads=4, num_kv_heads=2,
              vocab_size=128, max_seq_len=32)


@pytest.mark.parametrize("spec", [ShardSpec(0), ShardSpec(1), ShardSpec(0, (8, 4, 4))])
def test_shard_unshard_round_trip(spec):
    full = torch.arange(16 * 12, dtype=torch.float32).view(16, 12)
    pieces = [spec.shard(full, r, 2) for r in range(2)]
    assert sum(p.shape[spec.dim] for p in pieces) == full.shape[spec.dim]
    torch.testing.assert_close(spec.unshard(pieces), full, rtol=0, atol=0)


def test_sectioned_shard_takes_each_section_slice():
    full = torch.arange(16, dtype=torch.float32)       # q: 0..7, k: 8..11, v: 12..15
    got = ShardSpec(0, (8, 4, 4)).shard(full, 1, 2)
    assert got.tolist() == [4, 5, 6, 7, 10, 11, 14, 15]


def test_interleaved_parts_follow_stage_layers():
    lay = Layout(pp=2, vpp=2, schedule="interleaved-1f1b", stage_layers=(1, 2, 3, 2))
    r0 = [(p.stage_index, p.first_layer, p.num_layers) for p in local_parts(M, lay, 0)]
    r1 = [(p.stage_index, p.first_layer, p.num_layers) for p in local_parts(M, lay, 1)]
    assert r0 == [(0, 0, 1), (2, 3, 3)]
    assert r1 == [(1, 1, 2), (3, 6, 2)]


@pytest.mark.parametrize("job,layout,words", [
    (Job(global_batch=6, seq_len=16), Layout(dp=4), "not divisible"),
    (Job(global_batch=8, seq_len=64), Layout(dp=1), "max_seq_len"),
    (Job(global_batch=8, seq_len=16), Layout(tp=8), "num_heads"),
    (Job(global_batch=2, seq_len=16), Layout(pp=4, schedule="1f1b"), "at least pp = 4"),
    (Job(global_batch=8, seq_len=16, precision="fp16"), Layout(), "loss scaling"),
    (Job(global_batch=5, seq_len=16), Layout(pp=2, vpp=2, schedule="interleaved-1f1b"),
     "multiple"),
    # torch's split weight pass after FSDP2 resharded: wrong losses / a hang on CPU
    (Job(global_batch=16, seq_len=16), Layout(dp=2, pp=2, schedule="zero-bubble", zero=3),
     "zero-bubble' with zero = 3"),
])
def test_unrunnable_layouts_are_named(job, layout, words):
    with pytest.raises(ExecutorError, match=words):
        check_layout_runnable(M, job, layout)


def test_synthetic_batches_depend_on_step_only():
    d = SyntheticTokens(128, 16, seed=3)
    a, b = d.global_batch(5, 8), SyntheticTokens(128, 16, seed=3).global_batch(5, 8)
    assert torch.equal(a, b) and a.shape == (8, 17) and int(a.max()) < 128
    assert not torch.equal(a, d.global_batch(6, 8))
    assert torch.equal(torch.cat([local_share(a, 4, r) for r in range(4)]), a)


def test_batches_reach_the_gpu_from_pinned_memory_without_a_host_sync():
    batch = SyntheticTokens(128, 16, seed=3).global_batch(0, 4)
    assert torch.equal(to_device(batch, torch.device("cpu")), batch)
    calls = []

    class Batch:   # stands in for a CPU tensor on a machine without CUDA
        def pin_memory(self):
            calls.append("pin")
            return self

        def to(self, device, non_blocking=False):
            calls.append((device.type, non_blocking))
            return self

    to_device(Batch(), torch.device("cuda"))
    assert calls == ["pin", ("cuda", True)]     # pinned first, then an asynchronous copy


def test_token_file(tmp_path):
    p = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(p)
    batch = TokenFile(p, 1000, 16).global_batch(0, 4)
    assert batch.shape == (4, 17)
    assert (batch[:, 1:] - batch[:, :-1] == 1).all()       # contiguous windows
    with pytest.raises(ExecutorError, match="vocab_size"):
        TokenFile(p, 10, 16).global_batch(0, 4)
    with pytest.raises(ExecutorError, match="does not exist"):
        TokenFile(tmp_path / "nope.bin", 10, 16)


def test_summary_and_errors():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 100.0 and s["n"] == 5
    assert error_pct(2.0, 3.0) == pytest.approx(50.0)
    assert error_pct(None, 3.0) is None
    json.dumps(s)


def test_executor_never_imports_ortools(tmp_path):
    """GPU machines have torch but no ortools: the executor and plan files must not need it."""
    import subprocess
    import sys
    pytest.importorskip("torch")
    code = (
        "import sys; sys.modules['ortools'] = None\n"   # any `import ortools` now fails
        "import meshplan as mp\n"
        "import meshplan.executor.run, meshplan.executor.parallelize, meshplan.executor.launch\n"
        "from meshplan.executor.planfiles import write_plan_for_layout\n"
        "from meshplan.planner.planfile import load_plan_file\n"
        "m = mp.ModelSpec(num_layers=2, hidden_size=32, num_heads=4, vocab_size=64, max_seq_len=16)\n"
        f"p = write_plan_for_layout({str(tmp_path / 'plan.json')!r}, m,\n"
        "    mp.Job(global_batch=4, seq_len=16, precision='fp32'), mp.Layout(dp=2))\n"
        "assert load_plan_file(p).layout.dp == 2\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
