"""meshplan/calibrate/split_memory.py: zero-bubble's split-backward memory, on CPU."""

import pytest

torch = pytest.importorskip("torch")

from meshplan.calibrate.bench_layers import Config, _build, _Groups  # noqa: E402
from meshplan.calibrate.layer_build import _set_recompute  # noqa: E402
from meshplan.calibrate.bench_split import split_functions  # noqa: E402
from meshplan.calibrate.split_memory import _live_bytes_mode, split_memory_per_layer  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402

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



def _kept_by_input_pass(model, tp, sp, groups, layers=2, mb=2, seq=32):
    """What torch's stage_backward_input keeps for W on a stack of ``layers`` blocks in fp32
    on CPU, counted two ways (bytes): ``(live, kept)``.

    ``live``: bytes left alive beyond what the forward kept, followed by :class:`LiveBytes`
    (the input gradient dropped; the output gradient dropped too, so it counts only where
    the pass keeps it: the residual add hands it on as is to the last matmul, or to the
    row-parallel bias under SP). ``kept``: the distinct storages of the gradients the pass
    hands to W (its param groups' ``grads``). On one rank they agree; on gloo ranks
    ``live`` is not deterministic, because a collective's worker thread drops its
    reference to the buffers some time after the caller's wait returns (a forward
    all-reduce's buffer was seen freed during B on a gloo thread in 7 of 60 runs)."""
    backward_input, _ = split_functions()
    cfg = Config(model=model, seq_len=seq, tp=tp, sequence_parallel=sp, micro_batch=mb,
                 recompute="none")
    m, _ = _build(cfg, layers, torch.device("cpu"), groups)
    params = list(m.parameters())
    mode = _live_bytes_mode()
    with mode:
        x = torch.randn(mb, seq // tp if sp else seq, model.hidden_size, requires_grad=True)
        y = m(x)
        after_forward = mode.cur
        gy = torch.randn_like(y)
        grads, kept_groups = backward_input([y], [gy], [x], iter(params))
        del gy, grads
        x.grad = None
        live = mode.cur - after_forward
    storages = {}
    for group in kept_groups:
        for grad_inputs in group.get("grads") or ():
            for g in grad_inputs or ():
                if isinstance(g, torch.Tensor):
                    s = g.untyped_storage()
                    storages[s.data_ptr()] = s.nbytes()
    return live, sum(storages.values())


def _want(model, tp, sp, layers=2, mb=2, seq=32):
    from meshplan.costmodel.memory import split_backward_kept_grad_bytes
    from meshplan.spec import Job
    return layers * split_backward_kept_grad_bytes(
        model, Job(global_batch=mb, seq_len=seq, precision="fp32"), mb, tp, sp,
        fp32_norm_output=False)


@pytest.mark.skipif(split_functions() is None, reason="this torch has no split backward")
@pytest.mark.parametrize("model", [GPT, LLAMA], ids=lambda m: m.name)
def test_kept_gradients_match_what_the_input_pass_keeps(model):
    """The cost model's split_backward_kept_grad_bytes (the output gradients of the matmuls
    and norms, kept from I to W) against torch's stage_backward_input, tp 1."""
    live, kept = _kept_by_input_pass(model, 1, False, _Groups(1, 0, "cpu"))
    assert live == kept == pytest.approx(_want(model, 1, False), rel=1e-6)


def _tp_worker(rank, world, init_method, out_dir):
    import torch.distributed as dist

    from _gloo import write_rank_result
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    groups = _Groups(world, rank, "cpu")
    write_rank_result(out_dir, rank, {
        f"{m.name} {sp}": _kept_by_input_pass(m, 2, sp, groups)[1]
        for m in (GPT, LLAMA) for sp in (False, True)})


@pytest.mark.skipif(split_functions() is None, reason="this torch has no split backward")
def test_kept_gradients_under_tensor_and_sequence_parallelism(tmp_path):
    """tp 2 on two gloo ranks: the column-parallel outputs' gradients are sharded, the
    row-parallel ones span the full sequence; without SP the row-parallel bias add's
    gradient is the matmul's own (the all-reduce's backward hands it on), with SP it is a
    separate sequence slice."""
    from _gloo import run_gloo_ranks
    got = run_gloo_ranks(_tp_worker, 2, tmp_path)
    assert got[0] == got[1]
    for model in (GPT, LLAMA):
        for sp in (False, True):
            assert got[0][f"{model.name} {sp}"] == pytest.approx(_want(model, 2, sp),
                                                                 rel=1e-6), (model.name, sp)
