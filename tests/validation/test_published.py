"""The cost model against published numbers: exact formulas and published training runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan import Cluster, ModelSpec
from meshplan.costmodel import estimate
from meshplan.costmodel.flops import (hardware_flops_per_step, model_flops_per_step)
from meshplan.costmodel.memory import layer_activations, model_state_bytes
from meshplan.spec import Job

from published_runs import (DATA, SHOEYBI_BASELINE_TFLOPS, bridge_dense_runs, dgxc_llama31_h100,
                            korthikanti2022, megatron_core_h100, megatron_model_flops,
                            mlperf_gpt3_fp8, mlperf_gpt_oss_20b, mlperf_llama31_fp8,
                            mlperf_llama31_partners, narayanan2021, nemo_h100_fp8,
                            read_rows, shoeybi2019)


def _fits_and_within(run, bound: float) -> None:
    """The published layout fits the prediction (it ran) and its step time is within
    ``bound`` of the published one."""
    est = estimate(run.model, run.cluster, run.job, run.layout)
    assert est.fits, f"{run.label}: the published layout ran, so it must fit"
    err = (est.step_time_s - run.published) / run.published
    assert abs(err) <= bound, f"{run.label}: predicted {est.step_time_s:.2f}s vs {run.published}s"


# ---- exact formulas -------------------------------------------------------------------

KORTHIKANTI_CASES = [  # (s, b, h, a, t)
    (2048, 1, 12288, 96, 8), (2048, 4, 4096, 32, 2), (1024, 8, 3072, 32, 4), (512, 2, 1024, 16, 1),
]


def _gpt(h, a):
    return ModelSpec(num_layers=2, hidden_size=h, num_heads=a, vocab_size=51200,
                     max_seq_len=4096, dropout=True)


@pytest.mark.parametrize("s,b,h,a,t", KORTHIKANTI_CASES)
def test_korthikanti_table2_activation_bytes(s, b, h, a, t):
    """Korthikanti et al. 2022 Table 2, every configuration, to the byte."""
    model = _gpt(h, a)
    job = Job(global_batch=b, seq_len=s, flash_attention=False)
    sbh = s * b * h
    tp = layer_activations(model, job, b, t, False)
    sp = layer_activations(model, job, b, t, True)
    one = layer_activations(model, job, b, 1, False)
    assert one.stored("none") == pytest.approx(sbh * (34 + 5 * a * s / h), rel=1e-12)
    assert tp.stored("none") == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert sp.stored("none") == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert tp.stored("selective") == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)
    assert sp.stored("selective") == pytest.approx(34 * sbh / t, rel=1e-12)
    assert tp.stored("full") == pytest.approx(2 * sbh, rel=1e-12)


def test_korthikanti_reference_file_is_the_one_checked():
    text = (DATA / "korthikanti2022_activation_memory.md").read_text()
    assert "s*b*h*(10 + 24/t + 5*a*s/(h*t))" in text and "34*s*b*h/t" in text


@pytest.mark.parametrize("row", read_rows("narayanan2021_table1.csv"), ids=lambda r: r["params_b"])
def test_narayanan_eq2_parameter_count(row):
    """Eq. 2: P = 12lh²(1 + 13/(12h) + (V + s)/(12lh)); the Table 1 sizes follow from it."""
    l, h, V, s = int(row["layers"]), int(row["hidden"]), 51200, 2048
    eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    model = ModelSpec(num_layers=l, hidden_size=h, num_heads=int(row["heads"]), vocab_size=V,
                      max_seq_len=s)
    # meshplan also counts the final LayerNorm (2h), which eq. 2 leaves out.
    assert model.num_params() - 2 * h == pytest.approx(eq2, rel=1e-12)
    assert model.num_params() / 1e9 == pytest.approx(float(row["params_b"]), abs=0.051)


@pytest.mark.parametrize("row", read_rows("narayanan2021_table1.csv"), ids=lambda r: r["params_b"])
def test_narayanan_eq3_flops_and_tflops_column(row):
    """Eq. 3 (full recompute): F = 96Bslh²(1 + s/(6h) + V/(16lh)); with the published step
    time it reproduces the table's TFLOP/s column."""
    l, h, V, s, B = int(row["layers"]), int(row["hidden"]), 51200, 2048, int(row["global_batch"])
    model = ModelSpec(num_layers=l, hidden_size=h, num_heads=int(row["heads"]), vocab_size=V,
                      max_seq_len=s)
    eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert hardware_flops_per_step(model, B, s, "full") == pytest.approx(eq3, rel=1e-12)
    tflops = eq3 / float(row["implied_step_time_s"]) / int(row["gpus"]) / 1e12
    assert tflops == pytest.approx(float(row["tflops_per_gpu"]), rel=0.01)


def test_korthikanti_eq7_model_flops():
    model = ModelSpec.preset("gpt3-175b")
    B, s, l, h, V = 1536, 2048, 96, 12288, 51200
    eq7 = 72 * B * l * s * h * h * (1 + s / (6 * h) + V / (12 * h * l))
    assert model_flops_per_step(model, B, s) == pytest.approx(eq7, rel=1e-12)


@pytest.mark.parametrize("row", read_rows("zero2019_model_states.csv"),
                         ids=lambda r: f"{r['params_b']}B-dp{r['dp']}")
def test_zero_table1_model_states(row):
    """Rajbhandari et al. 2019 Table 1 (GB = 1e9 bytes, as printed, to its rounding)."""
    params, dp = float(row["params_b"]) * 1e9, int(row["dp"])
    job = Job(global_batch=1, seq_len=1, precision="fp16")
    for zero, col in ((1, "zero1_gb"), (2, "zero2_gb"), (3, "zero3_gb")):
        got = sum(model_state_bytes(params, job, zero, dp)) / 1e9
        want = float(row[col])
        # the table prints 2-4 significant digits
        assert got == pytest.approx(want, rel=0.006, abs=0.006), (zero, got, want)


# ---- published runs ---------------------------------------------------------------------

NARAYANAN = narayanan2021()


@pytest.mark.parametrize("run", NARAYANAN, ids=lambda r: r.label)
def test_narayanan_table1_step_time_within_10pct(run):
    est = estimate(run.model, run.cluster, run.job, run.layout)
    err = (est.step_time_s - run.published) / run.published
    assert abs(err) <= 0.10, f"{run.label}: predicted {est.step_time_s:.2f}s vs {run.published}s"
    assert est.fits, f"{run.label}: the published layout ran, so it must fit"


def test_narayanan_table1_mean_error_within_5pct():
    errs = [abs(estimate(r.model, r.cluster, r.job, r.layout).step_time_s - r.published)
            / r.published for r in NARAYANAN]
    assert sum(errs) / len(errs) <= 0.05, [round(e, 3) for e in errs]


def test_shoeybi_2019_baseline_and_scaling():
    runs = {(r.model.name, r.layout.num_gpus): r for r in shoeybi2019()}
    def hw_tflops(key):
        r = runs[key]
        return estimate(r.model, r.cluster, r.job, r.layout).hardware_tflops_per_gpu
    base = hw_tflops(("megatron-1.2b", 1))
    assert base == pytest.approx(SHOEYBI_BASELINE_TFLOPS, rel=0.05)
    for key in (("megatron-8.3b", 8), ("megatron-8.3b", 512)):
        eff = 100 * hw_tflops(key) / base
        assert abs(eff - runs[key].published) <= 5.0, (key, eff, runs[key].published)


# ---- Korthikanti et al. 2022 Table 5 (SP + selective recompute vs full, A100) ----------------

KORTHIKANTI = korthikanti2022()


@pytest.mark.parametrize("row", [r for r in read_rows("korthikanti2022_table5.csv")
                                 if r["mfu_pct"]], ids=lambda r: r["model"])
def test_korthikanti_table5_times_reproduce_its_mfu_and_hfu(row):
    """The copied iteration times, layouts and eq. 7 / eq. 8 give Table 5's MFU and HFU."""
    l, h, B, g = int(row["layers"]), int(row["hidden"]), int(row["global_batch"]), int(row["gpus"])
    t, s, V = float(row["iteration_time_s"]), 2048, 51200
    peak = g * 312e12 * t
    hfu = 72 * B * l * s * h * h * (1 + s / (3 * h) + V / (12 * h * l))
    assert 100 * megatron_model_flops(l, h, V, s, B) / peak == pytest.approx(
        float(row["mfu_pct"]), abs=0.25)
    assert 100 * hfu / peak == pytest.approx(float(row["hfu_pct"]), abs=0.25)


def test_korthikanti_layouts_are_table3s():
    by = {(r.model.name, r.row["mode"]): r for r in KORTHIKANTI}
    assert len(by) == 8
    r = by[("gpt3-175b", "seqsel")]
    assert (r.layout.tp, r.layout.pp, r.layout.dp, r.layout.micro_batch, r.job.global_batch) == \
        (8, 8, 1, 1, 64)
    assert r.layout.recompute == "selective" and r.layout.sequence_parallel
    full = by[("gpt3-175b", "full")]
    assert full.layout.recompute == "full" and not full.layout.sequence_parallel
    assert by[("megatron-22b", "full")].model.num_params() / 1e9 == pytest.approx(22, rel=0.02)


@pytest.mark.parametrize("run", KORTHIKANTI, ids=lambda r: r.label)
def test_korthikanti_table5_step_time_within_10pct(run):
    _fits_and_within(run, 0.10)


# ---- Megatron-Core H100 2024 (layout partly published) ----------------------------------------

@pytest.mark.parametrize("row", read_rows("megatron_core_h100_2024.csv"), ids=lambda r: r["model"])
def test_megatron_core_table_is_consistent(row):
    """The copied row: tp·pp·dp = GPUs, whole micro-batches, TFLOP/s over the BF16 dense peak
    (989) = the MFU column to its rounding."""
    tp, pp, dp, g = int(row["tp"]), int(row["pp"]), int(row["dp"]), int(row["gpus"])
    assert tp * pp * dp == g and int(row["global_batch"]) % dp == 0
    assert 100 * float(row["tflops_per_gpu"]) / 989 == pytest.approx(float(row["mfu_pct"]), abs=0.6)


@pytest.mark.parametrize("run", megatron_core_h100(), ids=lambda r: r.label)
def test_megatron_core_defaults_fit(run):
    """The runs ran on 80 GB, so the stated default layout must fit the prediction too."""
    assert estimate(run.model, run.cluster, run.job, run.layout).fits


# ---- NeMo FP8 H100 2024 (Megatron-Core + TransformerEngine) ------------------------------------

NEMO_FP8 = nemo_h100_fp8()


@pytest.mark.parametrize("run", NEMO_FP8, ids=lambda r: r.label)
def test_nemo_fp8_step_time_within_10pct(run):
    """The same bound as the bf16 tables (each run within 10 %), with the datasheet fp8 curve;
    the cp = 2 rows too since their attention is priced in bf16 as the runs ran it."""
    _fits_and_within(run, 0.10)


def test_nemo_fp8_rows_are_the_copied_table():
    """tokens/s/GPU × GPUs × step = the step's tokens; the copied model TFLOP/s over the fp8
    rows' tokens/s is NeMo's own FLOPs per token, in the range of 6·N for these models."""
    for r in NEMO_FP8:
        tok = float(r.row["tokens_per_s_per_gpu"]) * r.layout.num_gpus
        assert tok * r.published == pytest.approx(r.job.global_batch * r.job.seq_len)
        per_token = float(r.row["model_tflops_per_gpu"]) * 1e12 / float(r.row["tokens_per_s_per_gpu"])
        assert 6 * r.model.num_params() * 0.9 < per_token < 6 * r.model.num_params() * 1.6


# ---- Llama 3 405B, Table 4 (layout partly published, context parallelism) -----------------

@pytest.mark.parametrize("row", read_rows("llama3_2024_table4.csv"), ids=lambda r: r["gpus"] + "-" + r["seq_len"])
def test_llama3_table_is_consistent(row):
    """The copied row: tp·cp·pp·dp = GPUs, 16M tokens a batch, TFLOP/s over the BF16 dense
    peak (989) = the MFU column to its rounding."""
    tp, cp, pp, dp, g = (int(row[k]) for k in ("tp", "cp", "pp", "dp", "gpus"))
    assert tp * cp * pp * dp == g
    tokens = int(row["batch_per_dp"]) * dp * int(row["seq_len"])
    assert tokens / 2**20 == pytest.approx(float(row["tokens_per_batch_m"]), rel=0.01)
    assert 100 * float(row["tflops_per_gpu"]) / 989 == pytest.approx(float(row["mfu_pct"]), abs=1.0)


def test_llama3_long_context_row_is_priced_with_its_ring():
    from published_runs import llama3_2024
    runs = {r.job.seq_len: r for r in llama3_2024() if r.layout.num_gpus == 16384}
    long, short = (estimate(r.model, r.cluster, r.job, r.layout) for r in
                   (runs[131072], runs[8192]))
    assert runs[131072].layout.cp == 16 and long.time.cp_comm_s > 0
    # same tokens per step and per rank: the 128k row differs by its attention
    assert long.time.gemm_s == pytest.approx(short.time.gemm_s, rel=1e-9)
    assert long.time.attention_s > 10 * short.time.attention_s


# ---- MLPerf Training v3.1, GPT-3 175B on DGX H100 (FP8) ----------------------------------

MLPERF = mlperf_gpt3_fp8()


def test_mlperf_rows_are_the_logged_runs():
    """GPUs = nodes · 8 = tp · pp · dp, and the logged global batch = dp · micro-batches ·
    micro-batch (gradient_accumulation_steps as logged), both rounds."""
    both = mlperf_gpt3_fp8(("v3.1", "v4.0"))
    assert len(MLPERF) == 7 and len(both) == 10
    for r in both:
        d = r.row
        assert int(d["gpus"]) == 8 * int(d["nodes"]) == r.layout.num_gpus
        assert r.layout.dp * int(d["micro_batches"]) * r.layout.micro_batch == r.job.global_batch
        assert r.layout.num_microbatches(r.job.global_batch) == int(d["micro_batches"])
        assert 96 % (r.layout.pp * r.layout.vpp) == 0     # whole layers per virtual stage
        assert r.layout.num_microbatches(r.job.global_batch) % r.layout.pp == 0


@pytest.mark.parametrize("run", MLPERF, ids=lambda r: r.label)
def test_mlperf_fp8_step_time_within_10pct(run):
    """The same bound as the NeMo FP8 rows (each run within 10 %), datasheet profile."""
    _fits_and_within(run, 0.10)


MLPERF_V41 = mlperf_gpt3_fp8(("v4.1",))


def test_mlperf_v41_rows_are_the_logged_runs_with_the_configs_settings():
    """Three systems (8 DGX B200, 32 and 64 DGX H100); GPUs = nodes · 8 = tp · pp · dp, the
    logged global batch = dp · micro-batches · micro-batch (gradient_accumulation_steps as
    logged), and the configs' settings (tp 4, pp 8, vp 6, micro-batch 2, delayed fp8 with the
    fp8 weight gather, SP, ZeRO-1, no recompute) on the row's preset. No error bound: an
    as-run set."""
    assert [(r.row["preset"], int(r.row["nodes"])) for r in MLPERF_V41] == [
        ("dgx-b200", 8), ("dgx-h100", 32), ("dgx-h100", 64)]
    for r in MLPERF_V41:
        lay, job, d = r.layout, r.job, r.row
        assert r.cluster.gpu.name.startswith("B200" if d["preset"] == "dgx-b200" else "H100")
        assert int(d["gpus"]) == 8 * int(d["nodes"]) == lay.num_gpus == r.cluster.num_gpus
        assert (lay.tp, lay.pp, lay.vpp, lay.micro_batch) == (4, 8, 6, 2)
        assert lay.dp * int(d["micro_batches"]) * lay.micro_batch == job.global_batch == 2048
        assert lay.num_microbatches(job.global_batch) == int(d["micro_batches"])
        assert lay.sequence_parallel and lay.zero == 1 and lay.recompute == "none"
        assert (job.precision, job.fp8_recipe, job.fp8_param_gather) == ("fp8", "delayed", True)
        assert job.overlap_tp_comm and job.overlap_dp_comm and int(d["result_files"]) == 3
        assert (d["cuda_graphs"] == "per-layer") == (d["preset"] == "dgx-b200")


# ---- MLPerf Training v5.0 Llama 3.1 405B, DGX Cloud Benchmarking 25.04 Llama 3.1 (H100) -------

MLPERF_LLAMA = mlperf_llama31_fp8()
DGXC_LLAMA = dgxc_llama31_h100()


def test_mlperf_llama_rows_are_the_logged_runs_with_the_configs_settings():
    """Five systems (64-1,024 nodes); GPUs = nodes · 8 = tp · pp · cp · dp, the logged global
    batch = dp · micro-batches (gradient_accumulation_steps as logged), and the configs'
    settings (tp 8, pp 8, vp 8, cp 2, delayed fp8 with the fp8 weight gather, the
    account-for-embedding/loss split, vocabulary 32,000). No error bound: an as-run set."""
    assert [int(r.row["nodes"]) for r in MLPERF_LLAMA] == [64, 256, 304, 320, 1024]
    for r in MLPERF_LLAMA:
        lay, job, d = r.layout, r.job, r.row
        assert int(d["gpus"]) == 8 * int(d["nodes"]) == lay.num_gpus
        assert (lay.tp, lay.pp, lay.vpp, lay.cp, lay.micro_batch) == (8, 8, 8, 2, 1)
        assert lay.num_microbatches(job.global_batch) == int(d["micro_batches"])
        assert lay.sequence_parallel and lay.zero == 1 and lay.recompute == "none"
        assert lay.stage_layers[0] == lay.stage_layers[-1] == 1 and sum(lay.stage_layers) == 126
        assert (job.precision, job.fp8_recipe, job.fp8_param_gather) == ("fp8", "delayed", True)
        assert job.seq_len == 8192 and r.model.vocab_size == 32000
        assert job.overlap_tp_comm and job.overlap_dp_comm and int(d["result_files"]) == 3


def test_dgxc_llama_rows_are_the_printed_layouts():
    """28 rows (8B and 70B at 5 and 6 GPU counts, 405B at 3, each in BF16 and FP8): the
    printed DP and GA agree with GPUs and GBS; FP8 rows take delayed scaling and the fp8
    weight gather, BF16 rows neither; only 405B takes the account-for-embedding/loss split."""
    assert len(DGXC_LLAMA) == 28
    for r in DGXC_LLAMA:
        lay, job, d = r.layout, r.job, r.row
        assert lay.tp * lay.pp * lay.cp * lay.dp == int(d["gpus"]) and lay.dp == int(d["dp"])
        assert lay.num_microbatches(job.global_batch) == int(d["grad_accum"])
        assert r.model.num_layers == int(d["layers"]) and job.precision == d["precision"]
        assert job.fp8_param_gather == (d["precision"] == "fp8")
        assert (lay.stage_layers is not None) == (r.model.name == "llama3-405b")


# ---- MLPerf Training v5.0 / v5.1 Llama 3.1, other submitters (H200, B200) ---------------------

MLPERF_PARTNERS_V50 = mlperf_llama31_partners("v5.0")
MLPERF_PARTNERS_V51 = mlperf_llama31_partners("v5.1")
MLPERF_PARTNERS = MLPERF_PARTNERS_V50 + MLPERF_PARTNERS_V51


def test_mlperf_partner_rows_are_the_logged_runs_with_the_configs_settings():
    """Nebius's two v5.0 H200 405B systems, the University of Florida's two v5.1 B200 405B
    and six 8B systems, and the other submitters' v5.1 8B systems on InfiniBand (HPE's 8 H200
    nodes, Verda's 8 B200 nodes); GPUs = nodes · 8 = tp · pp · cp · dp, the logged global batch =
    dp · micro-batches · micro-batch (gradient_accumulation_steps as logged), and the configs'
    settings (fp8 with the weights gathered in fp8 at the row's recipe: v5.0 delayed, v5.1
    tensorwise; the 405B layout and split, TP overlap as each config leaves it: on in v5.0, off
    in v5.1; no recompute). No error bound: an as-run set."""
    assert [(r.row["preset"], int(r.row["nodes"])) for r in MLPERF_PARTNERS] == [
        ("dgx-h200", 64), ("dgx-h200", 128)] + [("dgx-b200", n) for n in (32, 56, 1, 2, 4, 8,
                                                                          16, 32)] + [
        ("dgx-h200", 8), ("dgx-b200", 8)]
    others = [r for r in MLPERF_PARTNERS_V51 if r.row["submitter"] != "University-of-Florida"]
    # the other submitters' rows as logged: median train_step_time of 10 files each, without
    # each file's first 10 logged values
    assert [(r.row["submitter"], r.row["system"], r.published, int(r.row["steps_timed"]),
             int(r.row["result_files"])) for r in others] == [
        ("HPE", "HPE-Cray-XD670-H200-SXM5-141GB_n8_25.09", 0.3532, 2078, 10),
        ("Verda", "b200_8x8_ngc25.09", 0.1911, 1850, 10)]
    for r in others:
        assert r.row["benchmark"] == "llama31_8b" and r.row["cuda_graphs"] == "full-iteration"
        assert (r.layout.cp, r.layout.micro_batch, r.job.global_batch) == (2, 1, 32)
    for r in MLPERF_PARTNERS:
        lay, job, d = r.layout, r.job, r.row
        v50 = any(r is s for s in MLPERF_PARTNERS_V50)
        big = d.get("benchmark", "llama31_405b") == "llama31_405b"
        assert r.cluster.gpu.name.startswith("H200" if d["preset"] == "dgx-h200" else "B200")
        assert int(d["gpus"]) == 8 * int(d["nodes"]) == lay.num_gpus == r.cluster.num_gpus
        assert lay.dp * int(d["micro_batches"]) * lay.micro_batch == job.global_batch
        assert lay.num_microbatches(job.global_batch) == int(d["micro_batches"])
        assert lay.zero == 1 and lay.recompute == "none" and job.seq_len == 8192
        assert (job.precision, job.fp8_param_gather) == ("fp8", True) and d["fp8_params"] == "True"
        assert job.fp8_recipe == ("delayed" if v50 else "tensorwise")
        assert job.overlap_tp_comm == v50 and job.overlap_dp_comm
        if big:
            assert (lay.tp, lay.pp, lay.vpp, lay.cp, lay.micro_batch) == (4, 8, 8, 2, 1)
            assert lay.stage_layers[0] == lay.stage_layers[-1] == 1
            assert sum(lay.stage_layers) == 126 and r.model.vocab_size == 32000
        else:
            assert (lay.tp, lay.pp, lay.stage_layers, r.model.num_layers) == (1, 1, None, 32)
            assert (lay.cp, lay.micro_batch) == ((1, 2) if lay.num_gpus <= 16 else (2, 1))


# ---- MLPerf Training v6.0 gpt_oss_20b, other submitters (one 8x B200 node) -------------------

MLPERF_GPT_OSS = mlperf_gpt_oss_20b()


def test_mlperf_gpt_oss_rows_are_the_logged_runs_with_the_configs_settings():
    """Lambda's, Supermicro's and Dell's 1x8 B200 runs, as their logs' configuration summaries
    give them (mlperf_training_v60_gpt_oss_20b.csv): GPUs = tp · pp · cp · dp = 8 with tp, pp,
    cp, ep and etp 1, the logged global batch 16 = dp · micro-batch 2 (one micro-batch a step),
    seq 8192, MXFP8 with the weights gathered in fp8, HybridEP (as "deepep"), learned routing
    (the profile's ρ), ZeRO-1, no recompute, no all-to-all overlap; the gpt-oss-20b architecture
    with vocabulary 128,256, no auxiliary loss, and the logged 20,495,244,864 parameters less the
    24 x 64 attention sinks meshplan does not count. No error bound: an as-run set."""
    assert [r.row["submitter"] for r in MLPERF_GPT_OSS] == ["Lambda", "Supermicro", "Dell"]
    base = ModelSpec.preset("gpt-oss-20b")
    for r in MLPERF_GPT_OSS:
        lay, job, d, m = r.layout, r.job, r.row, r.model
        assert r.cluster.gpu.name.startswith("B200") and r.cluster.num_gpus == 8
        assert (lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.vpp, lay.dp) == (1, 1, 1, 1, 1, 1, 8)
        assert lay.num_microbatches(job.global_batch) == int(d["micro_batches"]) == 1
        assert (job.global_batch, lay.micro_batch, job.seq_len) == (16, 2, 8192)
        assert (job.precision, job.fp8_recipe, job.fp8_param_gather) == ("fp8", "mxfp8", True)
        assert job.moe_dispatcher == "deepep" and d["dispatcher"] == "hybridep"
        assert d["a2a_overlap"] == "False" and d["balanced"] == "no"
        assert r.cluster.gpu.corrections.moe_load_imbalance == (
            Cluster.preset("dgx-b200", nodes=1).gpu.corrections.moe_load_imbalance)
        assert lay.zero == 1 and lay.recompute == "none" and not lay.sequence_parallel
        assert (m.vocab_size, m.router_aux_loss_coeff) == (128256, 0.0)
        assert m.num_params() == 20_495_244_864 - 24 * 64
        assert replace(m, name=base.name, vocab_size=base.vocab_size,
                       router_aux_loss_coeff=base.router_aux_loss_coeff) == base
        assert 0.45 < r.published < 0.46


# ---- Megatron-Bridge 25.11-26.06 dense pre-training tables (DGX-H100, DGX-B200) ---------------

BRIDGE_DENSE, BRIDGE_DENSE_SKIPPED = bridge_dense_runs()


def test_bridge_dense_rows_are_the_printed_layouts_with_their_recipes():
    """13 rows predicted (B200: 8B and 405B of 25.11, each FP8-CS and FP8-MX; H100: 70B of five
    containers, 405B of four) and the 25.11 H100 8B FSDP row left out with its reason. Each row
    as printed (GPUs = tp · pp · cp · dp, the printed GA where there is one), the published
    tokens/s as a step, fp8 with the weights gathered in fp8 — per-tensor current scaling, or
    MXFP8 on the FP8-MX rows —, SP and TP overlap where tp > 1, ZeRO-1, no recompute, and the
    account-for-embedding/loss split for 405B only. No error bound: an as-run set."""
    assert len(BRIDGE_DENSE) == 13
    assert BRIDGE_DENSE_SKIPPED == [
        ("llama3-8b megatron-bridge-25.11 dgx-h100 FP8-CS (8 GPUs)",
         "FSDP 8 printed where the container's preset sets no Megatron-FSDP (and full "
         "recompute of 5 layers): how it ran is not known")]
    systems = [(r.row["system"], r.model.name) for r in BRIDGE_DENSE]
    assert systems.count(("dgx-b200", "llama3-8b")) == systems.count(
        ("dgx-b200", "llama3-405b")) == 2
    assert systems.count(("dgx-h100", "llama3-70b")) == 5
    assert systems.count(("dgx-h100", "llama3-405b")) == 4
    for r in BRIDGE_DENSE:
        lay, job, d = r.layout, r.job, r.row
        assert r.cluster.gpu.name.startswith("B200" if d["system"] == "dgx-b200" else "H100")
        assert (lay.tp, lay.pp, lay.cp, lay.vpp, lay.micro_batch) == tuple(
            int(d[k]) for k in ("tp", "pp", "cp", "vp", "micro_batch"))
        assert lay.num_gpus == int(d["gpus"]) and d["fsdp"] == "0"
        if d["grad_accum"]:
            assert lay.num_microbatches(job.global_batch) == int(d["grad_accum"])
        assert r.published == pytest.approx(
            job.global_batch * job.seq_len / (float(d["tokens_per_s_per_gpu"]) * lay.num_gpus))
        assert job.precision == "fp8" and job.fp8_param_gather
        assert job.fp8_recipe == ("mxfp8" if d["precision"] == "FP8-MX" else "tensorwise")
        assert lay.sequence_parallel == job.overlap_tp_comm == (lay.tp > 1)
        assert lay.zero == 1 and lay.recompute == "none" and job.overlap_dp_comm
        if r.model.name == "llama3-405b":
            assert len(lay.stage_layers) == lay.pp * lay.vpp and sum(lay.stage_layers) == 126
            assert lay.stage_layers[0] == lay.stage_layers[-1] == 1
        else:
            assert lay.stage_layers is None
    # the one run whose parameter all-gather was not overlapped (recorded, not modelled)
    assert [r.label for r in BRIDGE_DENSE if r.row["param_gather_overlap"] == "no"] == [
        "llama3-405b megatron-bridge-25.11 dgx-b200 FP8-MX (128 GPUs)"]


# the as-run sets (no error bound: reported as first run, docs/benchmarks/published.md)
AS_RUN = (MLPERF_V41 + MLPERF_LLAMA + DGXC_LLAMA + MLPERF_PARTNERS + MLPERF_GPT_OSS
          + BRIDGE_DENSE)


@pytest.mark.parametrize("run", AS_RUN, ids=lambda r: r.label)
def test_as_run_published_layouts_fit(run):
    """Every as-run set's published layouts ran (80 GB H100, 141 GB H200, 180 GB B200), so the
    prediction must fit them."""
    assert estimate(run.model, run.cluster, run.job, run.layout).fits
