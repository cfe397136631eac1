"""What calibrate's layer rows leave alive: memory of a module's deep stacks and of attempts
that ran out of memory must not reach the next rows (on a GPU it made later rows of a
GPT 2.82 B at seq 8192 run out of memory, 1 x H200)."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from meshplan.calibrate import bench_layers, layer_run  # noqa: E402
from meshplan.calibrate.bench_split import split_functions  # noqa: E402
from meshplan.calibrate.layer_grid import Config  # noqa: E402
from meshplan.calibrate.layer_ranks import _Groups  # noqa: E402
from meshplan.calibrate.layer_rows import NO_SPLIT_MEMORY  # noqa: E402
from meshplan.calibrate.layer_split import _deep_split  # noqa: E402
from meshplan.calibrate.split_memory import _live_bytes_mode  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402

from conftest import TINY_LLAMA  # noqa: E402

TINY = ModelSpec(**TINY_LLAMA)
CPU = torch.device("cpu")
needs_split = pytest.mark.skipif(split_functions() is None,
                                 reason="this torch has no split backward")


class _Recorded:
    """A calibration progress that keeps its messages."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def step(self, message: str) -> None:
        self.messages.append(message)

    note = step

    def drop(self, n: int) -> None:
        pass


@needs_split
def test_deep_stacks_do_not_outlive_their_module_rows(monkeypatch):
    """The deep split's and the CPU-dispatch stacks belong to one build key: by the next
    module's rows (here the ends) they and what hangs on them are gone."""
    real_measure = layer_run._measure

    def measure(*a, **kw):     # CPU fields as a queued CUDA row has them: _cpu_deep runs
        samples, out = real_measure(*a, **kw)
        return [replace(s, forward_cpu_s=s.forward_s, backward_cpu_s=s.backward_s)
                for s in samples], out

    stacks: list[weakref.ref] = []

    def keep_ref(fn):
        def run(*a, **kw):
            got = fn(*a, **kw)
            if got[1] is not None:
                stacks.append(weakref.ref(got[1]))
            return got
        return run

    alive_at_ends: list[int] = []

    class Progress(_Recorded):
        def step(self, message: str) -> None:
            if "embedding" in message or "output" in message:
                gc.collect()
                alive_at_ends.append(sum(r() is not None for r in stacks))

        note = step

    monkeypatch.setattr(layer_run, "_measure", measure)
    monkeypatch.setattr(bench_layers, "_deep_split", keep_ref(bench_layers._deep_split))
    monkeypatch.setattr(bench_layers, "_cpu_deep", keep_ref(bench_layers._cpu_deep))
    bench_layers.bench_layer_rows([TINY], None, CPU, 1, 0, quick=True, progress=Progress(),
                                  micro_batches=(1,), max_tp=1)
    assert len(stacks) >= 2 and len(alive_at_ends) == 2     # both stacks built; two ends
    assert alive_at_ends == [0, 0]


def _b_runs_out_of_memory(monkeypatch, from_call: int = 1) -> list[int]:
    """torch's stage_backward_input running out of memory inside its autograd call from its
    ``from_call``-th call on: torch re-raises that as a RuntimeError from the out-of-memory
    error. Returns the count of calls."""
    from torch.distributed.pipelining import _backward
    real = _backward.stage_backward_input
    calls = [0]

    def backward_input(outputs, grads, inputs, weights):
        def oom(_grad):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        calls[0] += 1
        if calls[0] >= from_call:
            outputs[0].register_hook(oom)
        return real(outputs, grads, inputs, weights)
    monkeypatch.setattr(_backward, "stage_backward_input", backward_input)
    return calls


@needs_split
@pytest.mark.parametrize("recompute, from_call", [("none", 1), ("full", 1), ("full", 4)])
def test_deep_split_out_of_memory_frees_its_stack(monkeypatch, recompute, from_call):
    """Out of memory in the deep split's B is out of memory (not "no split", not a crash):
    the deep stack is dropped and every tensor of the attempt is freed. Its timed split
    makes three calls of B (iters 2 and a warm-up); the fourth is the split-memory pass of
    a full-recompute row."""
    calls = _b_runs_out_of_memory(monkeypatch, from_call)
    cfg = Config(model=TINY, seq_len=32, tp=1, sequence_parallel=False, micro_batch=2,
                 recompute=recompute)
    mode = _live_bytes_mode()
    with mode:
        gc.collect()
        before = mode.cur
        key, module, split, memory = _deep_split(cfg, None, None, None, 2, CPU,
                                                 _Groups(1, 0, "cpu"), iters=2,
                                                 barrier=lambda: None, world=1)
        gc.collect()
        left = mode.cur - before
    assert calls[0] == from_call       # the timed split stopped at its first failed B
    assert key == cfg.build_key and split is None and memory == NO_SPLIT_MEMORY
    assert module is None
    assert left == 0


@needs_split
def test_a_row_whose_split_runs_out_of_memory_keeps_its_times_without_a_split(monkeypatch):
    """B keeps the graph for W, so it can run out of memory where the row's own passes fit:
    the row is kept, its split zero (not measured), and what the failed split allocated is
    freed."""
    _b_runs_out_of_memory(monkeypatch)
    progress = _Recorded()
    messages = progress.messages

    mode = _live_bytes_mode()
    with mode:
        gc.collect()
        before = mode.cur
        tables = bench_layers.bench_layer_rows([TINY], None, CPU, 1, 0, quick=True,
                                               progress=progress, micro_batches=(1, 2),
                                               max_tp=1, only=lambda c: not c.part)
        gc.collect()
        left = mode.cur - before
    assert not any("out of memory" in m for m in messages)
    assert {(r["recompute"], r["micro_batch"]) for r in tables.layers} == {
        (rc, mb) for rc in ("none", "selective", "full") for mb in (1, 2)}
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in tables.layers)
    assert all(r["backward_input_s"] == 0 and r["backward_weight_s"] == 0
               for r in tables.layers)
    assert left == 0


def test_a_deep_split_that_cannot_fit_is_not_run(monkeypatch):
    """Out of memory inside B left its forward's activations allocated on an H200 after
    every reference was dropped; a stack whose split cannot fit (twice its activations, B's
    intermediate gradients beside them) is not run."""
    from types import SimpleNamespace

    from meshplan.calibrate import layer_split
    gib = 2**30
    cuda = SimpleNamespace(type="cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (100 * gib, 139 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 30 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 20 * gib)
    # 110 GiB can be allocated: 2 x 6 x 9 GiB fits, 2 x 6 x 10 GiB does not
    assert layer_split.deep_split_fits(9 * gib, cuda)
    assert not layer_split.deep_split_fits(10 * gib, cuda)
    assert layer_split.deep_split_fits(0.0, cuda)             # not checked
    assert layer_split.deep_split_fits(1e15, CPU)             # CPU: not checked
    built = []
    monkeypatch.setattr(layer_split, "deep_split_fits", lambda a, d: a < 1e9)
    monkeypatch.setattr(layer_split, "_deep_module", lambda *a, **k: built.append(a))
    cfg = Config(model=TINY, seq_len=32, tp=1, sequence_parallel=False, micro_batch=2,
                 recompute="none")
    key, module, split, memory = _deep_split(cfg, None, None, None, 2, CPU,
                                             _Groups(1, 0, "cpu"), iters=2,
                                             barrier=lambda: None, world=1,
                                             activation_bytes=2e9)
    assert (key, module, split, memory) == (cfg.build_key, None, None, NO_SPLIT_MEMORY)
    assert built == []


def test_a_row_that_cannot_fit_by_its_smaller_micro_batch_is_not_run(monkeypatch):
    """A row's memory grows with its micro-batch: what its module's smaller timed rows
    allocated (the blocks' activations and the backward's working memory), extrapolated.
    Where that exceeds what can be allocated the row is not run (an out of memory inside
    its backward would leak, pytorch/pytorch#82218) and its larger micro-batches are
    skipped as after any out of memory."""
    from meshplan.calibrate.layer_rows import row_need_bytes

    def cfg(mb, rc="none", part=""):
        return Config(model=TINY, seq_len=32, tp=1, sequence_parallel=False, micro_batch=mb,
                      recompute=rc, part=part)
    grid = [cfg(1), cfg(2), cfg(8), cfg(4, "full"), cfg(2, part="output"),
            cfg(8, part="output")]
    measured = {0: [[0.1, 0.2, 3.0, 1.0]], 1: [[0.1, 0.2, 5.0, 2.0]],
                4: [[0.1, 0.2, 7.0, 1.0]]}
    # mb 1 and 2 allocated 7 and 12: 5 a sequence on 2 fixed, so mb 8 needs 42, not 48
    assert row_need_bytes(grid, 2, measured, layers=2) == 12.0 + 5.0 * 6
    assert row_need_bytes(grid, 5, measured, layers=2) == (7.0 + 1.0) * 8 / 2   # one row
    # a smaller row that allocated more (noise) does not make the need shrink
    noisy = {0: [[0.1, 0.2, 6.0, 1.0]], 1: [[0.1, 0.2, 5.0, 2.0]]}
    assert row_need_bytes(grid, 2, noisy, layers=2) == 12.0
    assert row_need_bytes(grid, 3, measured, layers=2) is None    # no smaller full row
    assert row_need_bytes(grid, 0, measured, layers=2) is None
    need = {1: None, 2: 10.0 * 2**30, 4: 30.0 * 2**30}
    monkeypatch.setattr(bench_layers, "row_need_bytes",
                        lambda g, i, m, n: need[g[i].micro_batch] if not g[i].part else None)
    monkeypatch.setattr(bench_layers, "allocatable_bytes", lambda d: 20.0 * 2**30)
    progress = _Recorded()
    messages = progress.messages

    tables = bench_layers.bench_layer_rows([TINY], None, CPU, 1, 0, quick=True,
                                           progress=progress, micro_batches=(1, 2, 4),
                                           max_tp=1, only=lambda c: not c.part)
    assert {(r["recompute"], r["micro_batch"]) for r in tables.layers} == {
        (rc, mb) for rc in ("none", "selective", "full") for mb in (1, 2)}
    assert sorted(tables.skipped.values()) == 3 * [
        "needs about 30.0 GiB by its smaller micro-batch, 20.0 GiB allocatable: not run"]
    not_run = [m for m in messages if "not run" in m]
    assert len(not_run) == 3 and all(
        "mb4: needs about 30.0 GiB by its smaller micro-batch, 20.0 GiB allocatable: not run, "
        "skipped" in m for m in not_run)


def test_a_failed_b_leaves_no_hook_on_the_graph():
    """torch 2.11's stage_backward_input removes its hooks only after a B that succeeds;
    left on the stage's nodes, their closures keep the parameter groups, whose intermediates
    are those nodes: on torch 2.11 a cycle Python's collector does not break, and the
    graph's saved tensors stay allocated (on the device, 110 GiB after a 6-block split at
    micro-batch 16; on CPU, the deep-split tests above fail so under torch 2.11 without
    the fix). B as split_functions gives it removes the hooks of a B that failed, found in
    the frame its exception's traceback holds."""
    from meshplan.calibrate.bench_split import _drop_hooks

    def fired_after(drop: bool) -> list[int]:
        fired: list[int] = []
        x = torch.randn(4, requires_grad=True)
        y = (x * 2).sum()

        def stage_backward_input():         # registers as torch 2.11's does, then fails
            handles = [y.grad_fn.register_prehook(lambda g: fired.append(1))]
            assert handles
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        try:
            stage_backward_input()
        except torch.cuda.OutOfMemoryError as exc:
            if drop:
                _drop_hooks(exc)
        y.backward()
        return fired

    assert fired_after(drop=False) == [1]
    assert fired_after(drop=True) == []
