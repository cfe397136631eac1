"""meshplan/calibrate/split_memory.py: zero-bubble's split-backward memory, on CPU."""

import pytest

torch = pytest.importorskip("torch")

from meshplan.calibrate.bench_layers import Config, _build, _Groups, _set_recompute  # noqa: E402
from meshplan.calibrate.bench_split import split_functions  # noqa: E402
from meshplan.calibrate.split_memory import _live_bytes_mode, split_memory_per_layer  # noqa: E402
from meshplan.costmodel.specs import ModelSpec  # noqa: E402

GPT = ModelSpec(name="gpt-ish", num_layers=2, hidden_size=64, num_heads=4, vocab_size=128,
                max_seq_len=32, activation="gelu", norm="layernorm", bias=True)
LLAMA = ModelSpec(name="llama-ish", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                  ffn_hidden_size=256, vocab_size=128, max_seq_len=32, activation="swiglu",
                  norm="rmsnorm", position_embedding="rope", bias=False)


def test_live_bytes_follows_storages_and_views():
    mode = _live_bytes_mode()
    with mode:
        a = torch.zeros(1000)                 # 4000 bytes
        v = a.view(10, 100)                   # same storage: not counted again
        assert mode.cur == 4000
        b = a + 1
        assert mode.cur == 8000 and mode.peak == 8000
        del a
        assert mode.cur == 8000               # the view keeps the storage
        del v
        assert mode.cur == 4000
        mode.reset_peak()
        del b
    assert mode.cur == 0 and mode.peak == 4000


def _per_layer(model, recompute, layers):
    cfg = Config(model=model, seq_len=32, tp=1, sequence_parallel=False, micro_batch=2,
                 recompute=recompute)
    m, _ = _build(cfg, layers, torch.device("cpu"), _Groups(1, 0, "cpu"))
    _set_recompute(m, recompute)
    make = lambda: torch.randn(2, 32, model.hidden_size, requires_grad=True)  # noqa: E731
    return split_memory_per_layer(m, make, layers, torch.device("cpu"))


@pytest.mark.skipif(split_functions() is None, reason="this torch has no split backward")
def test_full_recompute_w_needs_more_than_a_set_and_depends_on_the_block():
    sets = {}
    for model in (GPT, LLAMA):
        cfg_none = _per_layer(model, "none", 2)
        pending, transient = _per_layer(model, "full", 2)
        # no recomputation: W needs little beyond what the pending micro-batch keeps
        assert cfg_none[1] < 0.5 * cfg_none[0]
        # full recomputation: a fraction kept after B, several sets' worth while W runs
        assert 0 < pending < cfg_none[0] < transient
        sets[model.name] = transient / cfg_none[0]
    assert sets["llama-ish"] != pytest.approx(sets["gpt-ish"], rel=0.05)


def test_no_split_backward_gives_zeros(monkeypatch):
    from meshplan.calibrate import bench_split
    monkeypatch.setattr(bench_split, "split_functions", lambda: None)
    assert split_memory_per_layer(torch.nn.Linear(2, 2), lambda: torch.randn(1, 2), 1,
                                  torch.device("cpu")) == (0.0, 0.0)
