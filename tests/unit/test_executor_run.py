"""The runner's checks before any allocation, and a one-process run end to end (CPU)."""

import json

import pytest

pytest.importorskip("torch")

from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402
from meshplan.executor.planfiles import write_plan_for_layout  # noqa: E402
from meshplan.executor.run import EXIT_BAD_INPUT, gpu_family, main  # noqa: E402

M = ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64,
              max_seq_len=16)
JOB = Job(global_batch=4, seq_len=16, precision="fp32")


@pytest.fixture(autouse=True)
def no_torchrun_env(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(k, raising=False)


def test_world_size_mismatch_is_refused(tmp_path, capsys):
    plan = write_plan_for_layout(tmp_path / "p.json", M, JOB, Layout(dp=2, micro_batch=2))
    rc = main(["--plan", str(plan), "--device", "cpu", "--out", str(tmp_path / "r.json")])
    assert rc == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "needs dp·pp·tp = 2 processes" in err and "WORLD_SIZE is 1" in err
    assert not (tmp_path / "r.json").exists()


def test_existing_results_are_kept_without_force(tmp_path, capsys):
    plan = write_plan_for_layout(tmp_path / "p.json", M, JOB, Layout(micro_batch=2))
    out = tmp_path / "r.json"
    out.write_text("{}")
    assert main(["--plan", str(plan), "--device", "cpu", "--out", str(out)]) == EXIT_BAD_INPUT
    assert "--force" in capsys.readouterr().err
    assert out.read_text() == "{}"


def test_bad_plan_file(tmp_path, capsys):
    p = tmp_path / "p.json"
    p.write_text('{"schema": "something else"}')
    assert main(["--plan", str(p), "--out", str(tmp_path / "r.json")]) == EXIT_BAD_INPUT
    assert "not a meshplan plan file" in capsys.readouterr().err


# checks the executor's --gc on this process's collector (tests/conftest.py: unfrozen)
@pytest.mark.gc_unfrozen
def test_one_process_run_writes_results(tmp_path, capsys):
    plan = write_plan_for_layout(tmp_path / "p.json", M, JOB, Layout(micro_batch=2))
    out = tmp_path / "r.json"
    rc = main(["--plan", str(plan), "--device", "cpu", "--out", str(out), "--steps", "3",
               "--warmup", "1", "--cpu-affinity", "split"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok" and doc["layout"]["dp"] == 1
    assert doc["environment"]["cpu_affinity"].startswith("split: ")   # one rank: every CPU
    m = doc["measured"]
    assert m["step_time_s"] > 0 and len(m["step_times_s"]) == 3 and len(m["loss_per_step"]) == 4
    assert m["tokens_per_s"] == pytest.approx(JOB.tokens_per_step / m["step_time_s"])
    assert m["memory_per_rank"][0]["rank"] == 0
    r0 = m["memory_per_rank"][0]
    assert r0["step_median_s"] == pytest.approx(m["step_time_s"])
    assert 0 < r0["host_probe_us"] < 10_000      # the host's dispatch speed after warm-up
    assert 0 < r0["host_step_median_s"] <= 1.5 * r0["step_median_s"]   # CPU: the same clock
    # the step's phases, in order; on CPU both clocks are the wall clock
    phases = r0["phase_median_ms"]
    # without a pipeline each micro-batch's forward and backward are marked; "passes" is
    # what follows the last backward (the loss average)
    n = JOB.global_batch // 2
    assert list(phases) == [f"{p} {i}" for i in range(n) for p in ("forward", "backward")] \
        + ["passes", "grads", "optimizer", "loss"]
    assert all(v["device_ms"] >= 0 and v["host_ms"] >= 0 for v in phases.values())
    assert phases["backward 0"]["device_ms"] > phases["grads"]["device_ms"]
    # each phase's median is at most the sum of its values over the steps, so the phases'
    # medians add up to at most the steps' total (a bound that holds however loaded the
    # CI machine is; comparing with the median step did not, at 2 cores under load)
    total_ms = sum(v["device_ms"] for v in phases.values())
    assert 0 < total_ms <= 1e3 * sum(m["step_times_s"])
    assert set(doc["errors_pct"]) == {"step_time_s", "tokens_per_s", "mfu", "memory_peak_bytes"}
    assert "step time" in capsys.readouterr().out
    # the default --gc manual: no automatic collection in 3 timed steps (period 50), and
    # the collector is back on afterwards
    assert m["gc"]["mode"] == "manual" and m["gc"]["period_steps"] == 50
    assert [m["gc"][g]["count"] for g in ("gen0", "gen1", "gen2")] == [0, 0, 0]
    import gc
    assert gc.isenabled() and gc.get_freeze_count() == 0


# checks the executor's --gc on this process's collector (tests/conftest.py: unfrozen)
@pytest.mark.gc_unfrozen
def test_gc_period_collects_inside_timed_steps(tmp_path):
    plan = write_plan_for_layout(tmp_path / "p.json", M, JOB, Layout(micro_batch=2))
    out = tmp_path / "r.json"
    assert main(["--plan", str(plan), "--device", "cpu", "--out", str(out), "--steps", "4",
                 "--warmup", "1", "--gc-period", "2"]) == 0
    g = json.loads(out.read_text())["measured"]["gc"]
    assert g["gen1"]["count"] == 2 and g["gen0"]["count"] == 0   # at timed steps 2 and 4


@pytest.mark.parametrize("flag,value,message", [
    ("--gc-period", "0", "--gc-period must be >= 1 step, got 0"),
    ("--first-step-settle-s", "-1", "--first-step-settle-s must be between 0 and 60 s, got -1.0"),
])
def test_bad_loop_options_are_refused(tmp_path, capsys, flag, value, message):
    plan = write_plan_for_layout(tmp_path / "p.json", M, JOB, Layout(micro_batch=2))
    rc = main(["--plan", str(plan), "--device", "cpu", "--out", str(tmp_path / "r.json"),
               flag, value])
    assert rc == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_first_step_settle_waits_once_on_gpu_only(monkeypatch):
    import time

    import torch

    from meshplan.executor.run import settle_after_first_step
    calls = []
    monkeypatch.setattr(time, "sleep", lambda s: calls.append(("sleep", s)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append(("sync", d)))
    settle_after_first_step(torch.device("cpu"), 0.25)       # CPU: nothing to wait for
    settle_after_first_step(torch.device("cuda", 1), 0.0)    # turned off
    assert calls == []
    settle_after_first_step(torch.device("cuda", 1), 0.25)
    assert calls == [("sync", torch.device("cuda", 1)), ("sleep", 0.25)]


def test_gpu_family():
    assert gpu_family("H100-SXM5-80GB") == gpu_family("NVIDIA H100 80GB HBM3") == "H100"
    assert gpu_family("NVIDIA H200") != gpu_family("H100-SXM5-80GB")


def test_step_timer_phases_split_each_timed_step():
    import time

    import torch

    from meshplan.executor.measure import StepTimer
    timer = StepTimer(torch.device("cpu"))
    timer.mark("outside")                 # no timed step running: ignored
    for _ in range(3):
        timer.start()
        time.sleep(0.004)
        timer.mark("a")
        time.sleep(0.001)
        timer.mark("b")
        timer.stop()
    timer.mark("after")
    phases = timer.phase_medians_ms()
    assert list(phases) == ["a", "b"]
    assert phases["a"]["device_ms"] >= 3.5 and phases["b"]["device_ms"] >= 0.5
    assert phases["a"]["device_ms"] > phases["b"]["device_ms"]
    assert phases["a"]["host_ms"] == pytest.approx(phases["a"]["device_ms"])   # CPU clock
    assert len(timer.durations_s()) == 3


def test_step_timer_numbers_a_phase_marked_twice_in_a_step():
    import torch

    from meshplan.executor.measure import StepTimer
    timer = StepTimer(torch.device("cpu"))
    for _ in range(2):
        timer.start()
        for name in ("x", "y", "x", "x"):
            timer.mark(name)
        timer.stop()
    assert list(timer.phase_medians_ms()) == ["x", "y", "x #2", "x #3"]


class _FakeAllocator:
    """torch.cuda's peak bookkeeping on the host: allocations by hand, the peak since the
    last reset, as the caching allocator keeps it."""

    def __init__(self):
        self.now = self.peak = 0.0

    def alloc(self, n: float) -> None:
        self.now += n
        self.peak = max(self.peak, self.now)

    def max_memory_allocated(self, device=None) -> float:
        return self.peak

    def reset_peak_memory_stats(self, device=None) -> None:
        self.peak = self.now


class _FakeEvent:
    def __init__(self, enable_timing=True):
        self.t = 0.0

    def record(self):
        import time
        self.t = time.perf_counter()

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


def test_phase_memory_gives_each_phase_its_peak_and_keeps_the_runs(monkeypatch):
    import torch

    from meshplan.executor.measure import StepTimer
    fake = _FakeAllocator()
    for name in ("max_memory_allocated", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    timer = StepTimer(torch.device("cuda"), phase_memory=True)
    fake.alloc(50)
    fake.alloc(-50)                        # warm-up's peak, before any timed step: 50
    for step_peak in (30, 40):
        timer.start()
        fake.alloc(10)                     # forward: 10 held, a transient 20 above it
        fake.alloc(20)
        fake.alloc(-20)
        timer.mark("forward")
        fake.alloc(step_peak - 10)         # backward: up to the step's peak, then freed
        fake.alloc(-(step_peak - 10) - 10)
        timer.mark("backward")
        timer.stop()
    phases = timer.phase_medians_ms()
    assert phases["forward"]["peak_allocated_bytes"] == 30
    assert phases["backward"]["peak_allocated_bytes"] == 40     # the higher of the two steps
    assert timer.running_peak_bytes() == 50                     # the warm-up's, kept


def test_phase_memory_is_off_on_cpu_and_by_default():
    import torch

    from meshplan.executor.measure import StepTimer
    for timer in (StepTimer(torch.device("cpu"), phase_memory=True),
                  StepTimer(torch.device("cpu"))):
        timer.start()
        timer.mark("a")
        timer.stop()
        assert not timer.memory and "peak_allocated_bytes" not in timer.phase_medians_ms()["a"]


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_block_marks_time_every_block_inside_the_step(tmp_path, recompute):
    plan = write_plan_for_layout(tmp_path / "p.json", M, JOB,
                                 Layout(micro_batch=2, recompute=recompute))
    out = tmp_path / "r.json"
    rc = main(["--plan", str(plan), "--device", "cpu", "--out", str(out), "--steps", "2",
               "--warmup", "1", "--block-marks"])
    assert rc == 0
    phases = json.loads(out.read_text())["measured"]["memory_per_rank"][0]["phase_median_ms"]
    for i in range(M.num_layers):
        for what in ("forward", "backward"):
            assert f"block {i} {what}" in phases and f"before block {i} {what}" in phases
    # two micro-batches: each micro-batch's own phases are still marked after its blocks,
    # and the second micro-batch's block phases are numbered
    assert {"forward 0", "backward 0", "forward 1", "backward 1"} <= set(phases)
    assert "block 0 forward #2" in phases and "block 1 backward #2" in phases
    assert "block 0 forward #3" not in phases
    names = list(phases)
    assert names.index("block 0 forward") < names.index("block 1 forward") \
        < names.index("forward 0") < names.index("block 1 backward") \
        < names.index("block 0 backward") < names.index("backward 0")


def test_block_marks_stay_out_of_compiled_blocks():
    """Every mark hook is Dynamo-disabled: a CUDA event made inside a traced hook is the
    trace's object and never recorded at run time (compiled tp 2 + SP on 2 x H200 failed
    at the report with "Both events must be recorded"), which the CPU timer cannot show."""
    from types import SimpleNamespace
    import torch
    from meshplan.executor.block_marks import add_block_marks
    blocks = torch.nn.ModuleDict({"0": torch.nn.Linear(4, 4), "1": torch.nn.Linear(4, 4)})
    trainer = SimpleNamespace(layout=Layout(), parts=[SimpleNamespace(
        module=SimpleNamespace(layers=blocks))])
    seen = []
    handles = add_block_marks(trainer, seen.append)
    assert len(handles) == 8
    compiled = torch.compile(torch.nn.Sequential(blocks["0"], blocks["1"]))
    x = torch.randn(2, 4, requires_grad=True)
    for _ in range(2):
        compiled(x).sum().backward()
    per_step = ["before block 0 forward", "block 0 forward", "before block 1 forward",
                "block 1 forward", "before block 1 backward", "block 1 backward",
                "before block 0 backward", "block 0 backward"]
    assert seen == per_step * 2
    for block in blocks.values():
        for hooks in (block._forward_pre_hooks, block._forward_hooks,
                      block._backward_pre_hooks, block._backward_hooks):
            for hook in hooks.values():
                cell = dict(zip(hook.__code__.co_freevars, hook.__closure__ or ()))["mark"]
                assert getattr(cell.cell_contents, "_torchdynamo_disable", False)


def test_block_marks_refuse_a_pipeline(tmp_path, capsys, monkeypatch):
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"),
                 ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(k, v)
    plan = write_plan_for_layout(tmp_path / "p.json", M, JOB, Layout(pp=2, micro_batch=2))
    rc = main(["--plan", str(plan), "--device", "cpu", "--out", str(tmp_path / "r.json"),
               "--block-marks"])
    assert rc == EXIT_BAD_INPUT
    assert "--block-marks" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()



def test_gpu_runs_get_expandable_segments_before_cuda_starts(tmp_path, monkeypatch, capsys):
    """Set before preflight (which starts CUDA): refused here for want of a GPU, with the
    allocator's environment already set. A CPU run leaves it alone."""
    import os
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for v in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(v, raising=False)
    plan = write_plan_for_layout(tmp_path / "p.json", M, JOB, Layout(micro_batch=2))
    kept = tmp_path / "kept.json"
    kept.write_text("{}")      # refused in preflight: the results file exists
    assert main(["--plan", str(plan), "--device", "cpu", "--out", str(kept)]) == EXIT_BAD_INPUT
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    rc = main(["--plan", str(plan), "--device", "cuda", "--out", str(tmp_path / "r.json")])
    assert rc == EXIT_BAD_INPUT and "no CUDA device" in capsys.readouterr().err
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
