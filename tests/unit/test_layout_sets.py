"""The GPU layout sets (benchmarks/sets/*.toml, read by benchmarks/layout_sets.py): a held-out
set must be new, cover the space, and the data must load with clear errors."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import layout_sets as vd  # noqa: E402
from meshplan.errors import ConfigError  # noqa: E402

ORDER = ["holdout3", "holdout4", "holdout5", "holdout6", "holdout7", "holdout8", "holdout9",
         "holdout10", "holdout11", "holdout12", "holdout13", "casts2", "pair12", "ddp13",
         "pair14", "holdout16", "pair16", "holdout17", "holdout18", "holdout19", "holdout20",
         "holdout21", "holdout22", "holdout23", "holdout24", "holdout25"]


def test_every_set_has_unique_names():
    for name, entries in vd.SETS.items():
        if name in ("all", "cpu"):
            continue
        names = [n for n, _, _ in entries]
        assert len(names) == len(set(names)), name


def test_newest_holdout_sets_repeat_no_earlier_layout():
    seen: dict = {}
    for s in ("dev", "test", "holdout2", "check3", *ORDER):
        for n, model, layout in vd.SETS[s]:
            key = (model.name, layout)
            if s in ("holdout11", "holdout12", "holdout13", "casts2", "pair12", "ddp13",
                     "pair14", "holdout16", "pair16", "holdout17", "holdout18",
                     "holdout19", "holdout20", "holdout21", "holdout22", "holdout23",
                     "holdout24", "holdout25"):
                assert key not in seen, f"{s} {n} repeats {seen.get(key)}"
            seen.setdefault(key, f"{s} {n}")


COVERING = ["holdout12", "holdout13", "holdout16", "holdout17", "holdout18", "holdout19",
            "holdout20", "holdout21", "holdout22", "holdout23", "holdout24", "holdout25",
            "pair12", "pair14", "pair16"]


@pytest.mark.parametrize("name", COVERING)
def test_set_covers_every_schedule_zero_stage_recompute_mode_and_sp(name):
    entries = vd.SETS[name]
    ls = [layout for _, _, layout in entries]
    assert {l.schedule for l in ls} == {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"}
    assert {l.zero for l in ls} == {0, 1, 2, 3}
    assert {l.recompute for l in ls} == {"none", "selective", "full"}
    assert any(l.sequence_parallel for l in ls)
    assert {m.name for _, m, _ in entries} == {vd.GPT_05B.name, vd.LLAMA_16B.name}
    assert all(l.num_gpus == vd.SET_NPROC.get(name, 4) for l in ls)


def test_holdout13_holds_out_round_11s_changes():
    ls = [layout for _, _, layout in vd.SETS["holdout13"]]
    # torch's p2p order: interleaved over pp 4 at micro-batch counts on both sides of 4·pp
    counts = {vd.JOB4.global_batch // (l.dp * l.micro_batch)
              for l in ls if l.schedule == "interleaved-1f1b" and l.pp == 4}
    assert min(counts) <= 4 and max(counts) > 16
    # FSDP2 under a pipeline, ZeRO-2 and ZeRO-3
    assert {l.zero for l in ls if l.pp > 1 and l.dp > 1 and l.zero >= 2} == {2, 3}


def test_holdout16_holds_out_round_15s_changes():
    ls = [layout for _, _, layout in vd.SETS["holdout16"]]
    # interleaved with as many micro-batches as stages (ranks run all forwards first)
    assert any(l.schedule == "interleaved-1f1b" and l.pp == 4
               and vd.JOB4.global_batch // (l.dp * l.micro_batch) == l.pp for l in ls)
    # ZeRO-3 under the schedules whose stage keeps FSDP2's weights gathered after backward
    assert {l.schedule for l in ls if l.zero == 3 and l.pp > 1} == {"1f1b", "interleaved-1f1b"}


def test_holdout17_holds_out_round_16s_changes():
    ls = [layout for _, _, layout in vd.SETS["holdout17"]]
    gpt = [l for _, m, l in vd.SETS["holdout17"] if m.name == vd.GPT_05B.name]
    # the √vpp p2p slowdown: interleaved pp 2 at vpp 2 and 3, on both models
    for model in (vd.GPT_05B, vd.LLAMA_16B):
        assert {l.vpp for _, m, l in vd.SETS["holdout17"] if m.name == model.name
                and l.schedule == "interleaved-1f1b" and l.pp == 2} == {2, 3}
    # GPT's tp collectives now bf16: tp 2 with and without SP, and tp 4
    assert {(l.tp, l.sequence_parallel) for l in gpt if l.tp > 1} >= {(2, True), (2, False),
                                                                     (4, False)}
    assert len(ls) == 16


def test_holdout18_holds_out_round_17s_change():
    job = vd.SET_JOBS["holdout18"]

    def m(l):
        return job.global_batch // (l.dp * l.micro_batch)
    entries = vd.SETS["holdout18"]
    # one micro-batch per step without a pipeline: FSDP2 (ZeRO-2 and 3, plain and over tp,
    # both models), and DDP beside it; FSDP2 with two micro-batches
    fsdp1 = [(mod.name, l) for _, mod, l in entries
             if l.pp == 1 and l.dp > 1 and l.zero >= 2 and m(l) == 1]
    assert {l.zero for _, l in fsdp1} == {2, 3}
    assert {name for name, _ in fsdp1} == {vd.GPT_05B.name, vd.LLAMA_16B.name}
    assert {l.tp for _, l in fsdp1} == {1, 2}
    assert any(l.pp == 1 and l.dp > 1 and l.zero == 0 and m(l) == 1 for _, _, l in entries)
    assert any(l.pp == 1 and l.zero >= 2 and m(l) == 2 for _, _, l in entries)
    assert len(entries) == 16


def test_holdout19_holds_out_round_18s_change():
    entries = vd.SETS["holdout19"]
    # FSDP2's ZeRO-2 under a pipeline: every schedule, both models, zero-bubble with and
    # without full recomputation
    piped = [(m.name, l) for _, m, l in entries if l.pp > 1 and l.dp > 1 and l.zero == 2]
    assert {l.schedule for _, l in piped} == {"gpipe", "1f1b", "interleaved-1f1b",
                                              "zero-bubble"}
    assert {name for name, _ in piped} == {vd.GPT_05B.name, vd.LLAMA_16B.name}
    assert {l.recompute for _, l in piped if l.schedule == "zero-bubble"} >= {"selective",
                                                                             "full"}
    assert len(entries) == 16


def test_holdout20_keeps_round_19s_open_questions():
    entries = vd.SETS["holdout20"]
    job = vd.SET_JOBS["holdout20"]
    # pipelined FSDP2 ZeRO-2 on both models, in shapes holdout19 did not run
    piped = {(m.name, l.schedule) for _, m, l in entries
             if l.pp > 1 and l.dp > 1 and l.zero == 2}
    assert {name for name, _ in piped} == {vd.GPT_05B.name, vd.LLAMA_16B.name}
    assert len({s for _, s in piped}) >= 3
    # rank 1 of a 4-stage zero-bubble GPT pipeline; Llama GPipe last stages under ZeRO-0/1
    assert any(m.name == vd.GPT_05B.name and l.pp == 4 and l.schedule == "zero-bubble"
               for _, m, l in entries)
    gpipe = [l for _, m, l in entries
             if m.name == vd.LLAMA_16B.name and l.schedule == "gpipe" and l.zero <= 1]
    assert {l.pp for l in gpipe} == {2, 4}
    assert max(job.global_batch // (l.dp * l.micro_batch) for l in gpipe) >= 8
    assert len(entries) == 16


def test_holdout21_holds_out_round_20s_change_and_asks_its_open_questions():
    entries = vd.SETS["holdout21"]
    job = vd.SET_JOBS["holdout21"]
    # zero-bubble with full recomputation on 4 stages, middle stages deeper than the rest
    zb = [l for _, _, l in entries if l.schedule == "zero-bubble" and l.recompute == "full"]
    assert any(l.pp == 4 and l.stage_layers and min(l.stage_layers[1:3]) >
               max(l.stage_layers[0], l.stage_layers[3]) for l in zb)
    # FSDP2 over 4 data-parallel GPUs without a pipeline, both models
    fsdp4 = {m.name for _, m, l in entries if l.dp == 4 and l.pp == 1 and l.zero >= 2}
    assert fsdp4 == {vd.GPT_05B.name, vd.LLAMA_16B.name}
    # Llama GPipe last stages under autocast (ZeRO-0/1) with full recomputation
    assert any(m.name == vd.LLAMA_16B.name and l.schedule == "gpipe" and l.zero <= 1
               and l.recompute == "full" for _, m, l in entries)
    assert job.global_batch == 64 and len(entries) == 16


def test_casts2_holds_out_the_autocast_casts_on_two_gpus():
    ls = [layout for _, _, layout in vd.SETS["casts2"]]
    assert vd.SET_NPROC["casts2"] == 2 and all(l.num_gpus == 2 and l.pp == 2 for l in ls)
    selective = {l.schedule for l in ls if l.recompute == "selective"}
    assert selective == {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"}
    assert {l.recompute for l in ls} == {"none", "selective", "full"}


@pytest.mark.parametrize("name", ["pair12", "pair14", "pair16"])
def test_pair_sets_run_on_two_gpus_in_every_split(name):
    ls = [layout for _, _, layout in vd.SETS[name]]
    assert vd.SET_NPROC[name] == 2
    assert {(l.dp, l.pp, l.tp) for l in ls} == {(2, 1, 1), (1, 2, 1), (1, 1, 2)}


def test_ddp13_holds_out_ddp_over_unsplit_layers_on_two_gpus():
    ls = [layout for _, _, layout in vd.SETS["ddp13"]]
    assert vd.SET_NPROC["ddp13"] == 2
    assert all((l.dp, l.pp, l.tp) == (2, 1, 1) and l.zero in (0, 1) for l in ls)
    assert {l.zero for l in ls} == {0, 1}
    assert {l.recompute for l in ls} == {"none", "selective", "full"}
    counts = {vd.SET_JOBS["ddp13"].global_batch // (l.dp * l.micro_batch) for l in ls}
    assert 1 in counts and max(counts) >= 8     # with and without DDP's no_sync copy
    assert {m.name for _, m, _ in vd.SETS["ddp13"]} == {vd.GPT_05B.name, vd.LLAMA_16B.name}


@pytest.mark.parametrize("name", ["pair14", "pair16", "holdout16", "holdout17", "holdout18",
                                  "holdout19", "holdout20", "holdout21", "holdout22",
                                  "holdout23", "holdout24", "holdout25"])
def test_sets_have_eight_layouts_per_model(name):
    for model in (vd.GPT_05B, vd.LLAMA_16B):
        assert sum(m.name == model.name for _, m, _ in vd.SETS[name]) == 8


def test_pair16_has_interleaved_ranks_that_run_every_forward_first():
    job = vd.SET_JOBS["pair16"]
    assert any(l.schedule == "interleaved-1f1b" and job.global_batch // l.micro_batch == l.pp
               for _, _, l in vd.SETS["pair16"])


@pytest.mark.parametrize("name", ["fsdp18"])
def test_sets_not_run_yet_are_valid_runnable_and_fit_an_h100(name):
    """A set waiting for its GPU round must not fail there on a layout the cost model or the
    executor refuses, or on one that cannot fit 80 GB (the device may lend H100s)."""
    pytest.importorskip("torch")
    from meshplan.costmodel import estimate
    from meshplan.spec.validate import check_layout
    from meshplan.executor.parallelize import check_layout_runnable
    from meshplan.hardware_profiles import Cluster
    cluster = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=vd.SET_NPROC.get(name, 4))
    job = vd.SET_JOBS[name]
    for n, model, layout in vd.SETS[name]:
        check_layout(model, cluster, job, layout)
        check_layout_runnable(model, job, layout)
        assert estimate(model, cluster, job, layout).fits, n


def test_validate_device_reads_the_same_sets(load_benchmark):
    vdev = load_benchmark("validate_device")
    assert vdev.SETS is vd.SETS and vdev.GPT_05B == vd.GPT_05B
    assert vdev.SET_JOBS["holdout25"] == vd.JOB4 and vdev.SET_NPROC["pair16"] == 2
    assert vd.SETS["all"] == (vd.SETS["dev"] + vd.SETS["test"] + vd.SETS["holdout2"]
                              + vd.SETS["check3"])


def test_bad_set_data_names_the_set_and_layout(tmp_path):
    models = vd.load_models()
    bad = tmp_path / "sets.toml"
    bad.write_text('[jobs.j]\nglobal_batch = 8\nseq_len = 64\n[sets.s1]\njob = "j"\n'
                   'layouts = [{ name = "a01", model = "gpt-9b", dp = 2 }]\n')
    with pytest.raises(ConfigError, match=r"\[sets.s1\] layout 'a01': model 'gpt-9b'"):
        vd.load_sets(bad, models)
    bad.write_text('[jobs.j]\nglobal_batch = 8\nseq_len = 64\n[sets.s1]\njob = "j"\n'
                   'layouts = [{ name = "a01", model = "gpt-0.54b", schedule = "2f2b" }]\n')
    with pytest.raises(ConfigError, match=r"\[sets.s1\] layout 'a01': .*2f2b"):
        vd.load_sets(bad, models)
    bad.write_text('[sets.s1]\njob = "nope"\nlayouts = []\n')
    with pytest.raises(ConfigError, match="job 'nope'"):
        vd.load_sets(bad, models)
    bad.write_text("not toml = [\n")
    with pytest.raises(ConfigError, match="sets.toml"):
        vd.load_sets(bad, models)
