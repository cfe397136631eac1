"""Published training runs as (model, cluster, job, layout, published value) records.

Data files in ``tests/validation/data/`` are copies of the published tables, each with its
source in its header. Used by ``tests/validation/test_published.py``,
``benchmarks/validate_published.py`` and ``benchmarks/calculon_compare.py``.

Every run is predicted with the datasheet profile of its GPU (no calibration) and with the
implementation facts of the software that ran it, the same for every row of a table; nothing
is tuned per row.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

from meshplan import Cluster, Job, Layout, ModelSpec
from meshplan.errors import ConfigError
from meshplan.spec import embedding_loss_stage_layers

DATA = Path(__file__).parent / "data"

NARAYANAN_MODELS = {1.7: "gpt-1.7b", 3.6: "gpt-3.6b", 7.5: "gpt-7.5b", 18.4: "gpt-18.4b",
                    39.1: "gpt-39.1b", 76.1: "gpt-76.1b", 145.6: "gpt-145.6b",
                    310.1: "gpt-310.1b", 529.6: "gpt-529.6b", 1008.0: "gpt-1t"}
SHOEYBI_MODELS = {1536: "megatron-1.2b", 1920: "megatron-2.5b", 2304: "megatron-4.2b",
                  3072: "megatron-8.3b"}


def read_rows(name: str) -> list[dict[str, str]]:
    with open(DATA / name) as fh:
        lines = [ln for ln in fh if ln.strip() and not ln.startswith("#")]
    return list(csv.DictReader(lines))


@dataclass(frozen=True)
class PublishedRun:
    label: str
    model: ModelSpec
    cluster: Cluster
    job: Job
    layout: Layout
    published: float          # the published figure the row is checked against
    row: dict


def narayanan2021() -> list[PublishedRun]:
    """Narayanan et al. 2021 Table 1: A100-80GB DGX nodes, fp16, Megatron-LM of 2021.

    Implementation facts of that Megatron-LM (not tuned per row): unfused attention
    (no flash attention), gradient all-reduce after the backward pass (not overlapped),
    full activation recomputation, no ZeRO; the interleaved schedule where the row gives
    layers per virtual stage.
    """
    runs = []
    for d in read_rows("narayanan2021_table1.csv"):
        model = ModelSpec.preset(NARAYANAN_MODELS[float(d["params_b"])])
        tp, pp, gpus = int(d["tp"]), int(d["pp"]), int(d["gpus"])
        lpvs = d["layers_per_virtual_stage"]
        vpp = model.num_layers // pp // int(lpvs) if lpvs else 1
        layout = Layout(dp=gpus // (tp * pp), pp=pp, tp=tp, micro_batch=int(d["micro_batch"]),
                        schedule="interleaved-1f1b" if vpp > 1 else "1f1b", vpp=vpp,
                        recompute="full", zero=0)
        job = Job(global_batch=int(d["global_batch"]), seq_len=2048, precision="fp16",
                  flash_attention=False, overlap_dp_comm=False)
        cluster = Cluster.preset("dgx-a100-80gb", nodes=gpus // 8)
        runs.append(PublishedRun(f"{model.name} ({gpus} GPUs)", model, cluster, job, layout,
                                 float(d["implied_step_time_s"]), d))
    return runs


def shoeybi2019() -> list[PublishedRun]:
    """Shoeybi et al. 2019 weak scaling: DGX-2H V100 nodes, fp16, activation checkpointing.

    Model-parallel runs: batch 8 on tp GPUs. Model+data parallel: global batch 512 on 64×tp
    GPUs (micro-batch 8 per replica). The gradient all-reduce overlaps backward (PyTorch DDP);
    without that overlap the 74% at 512 GPUs is out of reach for the network the paper
    describes (8×100 Gb/s per 16 GPUs). ``published`` is the scaling efficiency in percent.
    """
    runs = []
    for d in read_rows("shoeybi2019_scaling.csv"):
        model = ModelSpec.preset(SHOEYBI_MODELS[int(d["hidden"])])
        tp, gpus, batch = int(d["tp"]), int(d["gpus"]), int(d["global_batch"])
        layout = Layout(dp=gpus // tp, tp=tp, micro_batch=8, recompute="full")
        job = Job(global_batch=batch, seq_len=1024, precision="fp16", flash_attention=False,
                  overlap_dp_comm=True)
        cluster = Cluster.preset("dgx2h-v100", nodes=max(1, gpus // 16))
        runs.append(PublishedRun(f"{model.name} ({gpus} GPUs)", model, cluster, job, layout,
                                 float(d["scaling_efficiency_pct"]), d))
    return runs


SHOEYBI_BASELINE_TFLOPS = 39.0   # 1.2B on one V100, Shoeybi et al. 2019 §5.1


def gpt_model(name: str, layers: int, hidden: int, heads: int, vocab: int, seq: int) -> ModelSpec:
    """A GPT-style model as Megatron builds it (GELU MLP of 4h, LayerNorm, learned positions,
    tied embeddings, biases, dropout)."""
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads,
                     vocab_size=vocab, max_seq_len=seq, activation="gelu", norm="layernorm",
                     position_embedding="learned", tied_embeddings=True, bias=True, dropout=True)


def megatron_model_flops(layers: int, hidden: int, vocab: int, seq: int, batch: int) -> float:
    """Model FLOPs of one step of a GPT model, Korthikanti et al. 2022 eq. 7 (the formula
    Megatron-LM's ``num_floating_point_operations`` reduces to for MHA and a 4h MLP):
    72·B·l·s·h²·(1 + s/(6h) + V/(12hl))."""
    return 72 * batch * layers * seq * hidden ** 2 * (
        1 + seq / (6 * hidden) + vocab / (12 * hidden * layers))


def korthikanti2022() -> list[PublishedRun]:
    """Korthikanti et al. 2022 Table 5: A100-80GB, Megatron-LM of 2022, dp = 1.

    ``full`` rows: full recomputation, tensor-parallel all-reduces; ``seqsel`` rows: sequence
    parallelism + selective recomputation (the attention core). Implementation facts (every
    row): 16-bit mixed precision, unfused attention (the selective recompute of the paper is
    the recompute of the unfused softmax/dropout/attention-over-values), no ZeRO.
    """
    runs = []
    for d in read_rows("korthikanti2022_table5.csv"):
        model = gpt_model(d["model"], int(d["layers"]), int(d["hidden"]), int(d["heads"]),
                          51200, 2048)
        tp, pp, gpus, vpp = int(d["tp"]), int(d["pp"]), int(d["gpus"]), int(d["virtual_stages"])
        seqsel = d["mode"] == "seqsel"
        layout = Layout(dp=gpus // (tp * pp), pp=pp, tp=tp, micro_batch=int(d["micro_batch"]),
                        schedule="interleaved-1f1b" if vpp > 1 else "1f1b", vpp=vpp,
                        recompute="selective" if seqsel else "full", sequence_parallel=seqsel,
                        zero=0)
        job = Job(global_batch=int(d["global_batch"]), seq_len=2048, precision="fp16",
                  flash_attention=False, overlap_dp_comm=False)
        cluster = Cluster.preset("dgx-a100-80gb", nodes=max(1, gpus // 8))
        runs.append(PublishedRun(f"{model.name} {d['mode']} ({gpus} GPUs)", model, cluster, job,
                                 layout, float(d["iteration_time_s"]), d))
    return runs


MEGATRON_CORE_DEFAULTS = dict(micro_batch=1, vpp=1, recompute="none")


def megatron_core_h100() -> list[PublishedRun]:
    """Megatron-LM README weak-scaling table (Megatron-Core r0.8.0, 2024): H100, BF16.

    The table gives tp, pp, dp, batch and TFLOP/s but not the micro-batch, the virtual
    stages or the recompute mode; every row is predicted with the same stated defaults
    (``MEGATRON_CORE_DEFAULTS``: micro-batch 1, no interleaving, no recompute), with what the
    README says the runs did: the distributed optimizer (ZeRO-1) and overlapped DP
    reduce-scatter / all-gather, overlapped TP communication (which in Megatron-Core needs
    sequence parallelism, so SP wherever tp > 1), flash attention, BF16.
    ``published`` = the model FLOPs of a step (eq. 7) over the published TFLOP/s × GPUs.
    """
    runs = []
    for d in read_rows("megatron_core_h100_2024.csv"):
        layers, hidden, batch = int(d["layers"]), int(d["hidden"]), int(d["global_batch"])
        model = gpt_model(d["model"], layers, hidden, int(d["heads"]), 131072, 4096)
        tp, pp, dp, gpus = int(d["tp"]), int(d["pp"]), int(d["dp"]), int(d["gpus"])
        layout = Layout(dp=dp, pp=pp, tp=tp, schedule="1f1b", sequence_parallel=tp > 1,
                        zero=1 if dp > 1 else 0, **MEGATRON_CORE_DEFAULTS)
        job = Job(global_batch=batch, seq_len=4096, precision="bf16", flash_attention=True,
                  overlap_dp_comm=True, overlap_tp_comm=True)
        cluster = Cluster.preset("dgx-h100", nodes=max(1, gpus // 8))
        step_s = (megatron_model_flops(layers, hidden, 131072, 4096, batch)
                  / (float(d["tflops_per_gpu"]) * 1e12 * gpus))
        runs.append(PublishedRun(f"{model.name} ({gpus} GPUs)", model, cluster, job, layout,
                                 step_s, d))
    return runs


NEMO_FP8_DEFAULTS = dict(recompute="none")


def nemo_h100_fp8() -> list[PublishedRun]:
    """NeMo 24.07 performance summary, FP8 pre-training on DGX-H100 (Megatron-Core with
    TransformerEngine). Published: GPUs, global batch, micro-batch, sequence length, tp, pp,
    cp, virtual stages and tokens/s per GPU. Predicted as those runs ran, the same for every
    row: runtime "megatron" (TE's fp8 linears), recipe "delayed" (NeMo 24.07's fp8 default:
    TE ``DelayedScaling``, hybrid e4m3/e5m2), the distributed optimizer (ZeRO-1) with
    overlapped DP and TP communication, SP wherever tp > 1, flash attention; not published:
    the recompute mode (``NEMO_FP8_DEFAULTS``: none). ``published`` = global batch · seq /
    (tokens/s/GPU · GPUs). Rows with cp > 1: context parallelism, ring style (the cost model
    prices cp since issue 39)."""
    runs = []
    for d in read_rows("nemo_h100_fp8_2024.csv"):
        model = ModelSpec.preset(d["model"])
        gpus, tp, pp, cp = int(d["gpus"]), int(d["tp"]), int(d["pp"]), int(d["cp"])
        vp, batch, seq = int(d["vp"]), int(d["global_batch"]), int(d["seq_len"])
        dp = gpus // (tp * pp * cp)
        layout = Layout(dp=dp, pp=pp, tp=tp, cp=cp, micro_batch=int(d["micro_batch"]),
                        schedule="interleaved-1f1b" if vp > 1 else "1f1b", vpp=vp,
                        sequence_parallel=tp > 1, zero=1 if dp > 1 else 0,
                        **NEMO_FP8_DEFAULTS)
        job = Job(global_batch=batch, seq_len=seq, precision="fp8", fp8_recipe="delayed",
                  flash_attention=True, overlap_dp_comm=True, overlap_tp_comm=True)
        cluster = Cluster.preset("dgx-h100", nodes=max(1, gpus // 8))
        step_s = batch * seq / (float(d["tokens_per_s_per_gpu"]) * gpus)
        runs.append(PublishedRun(f"{model.name} ({gpus} GPUs)", model, cluster, job, layout,
                                 step_s, d))
    return runs


MLPERF_GPT3_FILES = {"v3.1": "mlperf_training_v31_gpt3_h100.csv",
                     "v4.0": "mlperf_training_v40_gpt3_h100.csv",
                     "v4.1": "mlperf_training_v41_gpt3.csv"}


def mlperf_gpt3_fp8(versions: tuple[str, ...] = ("v3.1",)) -> list[PublishedRun]:
    """MLPerf Training's GPT-3 175B (NVIDIA's closed-division submissions: v3.1, NeMo 23.09 on
    64-1,344 DGX H100; v4.0, NeMo 24.04 on 64-1,452 DGX H100; v4.1, NeMo 24.09 on 32 and 64 DGX
    H100 and a NeMo preview container on 8 DGX B200, status Preview): every setting from the
    submissions' configs and logs (the CSVs' headers), the same for every row — runtime
    "megatron", fp8 recipe "delayed" (TE ``DelayedScaling``, hybrid; the v4.1 file's
    ``fp8_recipe`` column, delayed on every row, B200 included), tp 4, pp and virtual stages and
    micro-batch as each config sets them, SP with overlapped TP communication, the distributed
    optimizer (ZeRO-1) with overlapped DP communication, no recompute, no dropout; v4.0's and
    v4.1's ``FP8_PARAMS``: the linears' weights kept and all-gathered in fp8
    (``Job.fp8_param_gather``; v4.1: its ``fp8_params`` column). The cluster: ``dgx-h100``, or
    the v4.1 file's ``preset`` column (``dgx-b200`` for the B200 row, whose sourced
    ``config_common_blackwell.sh`` is not stored: the file's header says what that leaves
    open). Not modelled: CUDA graphs, SHARP, DP bucket sizes. ``published``: v3.1 and v4.1 the
    median logged ``train_step_timing``, v4.0 (no per-step log) the median training block's
    time per step. Sources: github.com/mlcommons/training_results_v3.1, _v4.0, _v4.1."""
    model = replace(ModelSpec.preset("gpt3-175b"), dropout=False)
    runs = []
    rows = [(v, d) for v in versions for d in read_rows(MLPERF_GPT3_FILES[v])]
    for version, d in rows:
        nodes, tp, pp, vp = int(d["nodes"]), int(d["tp"]), int(d["pp"]), int(d["vp"])
        dp = int(d["gpus"]) // (tp * pp)
        layout = Layout(dp=dp, pp=pp, tp=tp, micro_batch=int(d["micro_batch"]),
                        schedule="interleaved-1f1b", vpp=vp, sequence_parallel=True, zero=1,
                        recompute="none")
        fp8_params = d["fp8_params"] == "True" if "fp8_params" in d else version == "v4.0"
        job = Job(global_batch=int(d["global_batch"]), seq_len=int(d["seq_len"]),
                  precision="fp8", fp8_recipe=d.get("fp8_recipe", "delayed"),
                  flash_attention=True, overlap_dp_comm=True, overlap_tp_comm=True,
                  fp8_param_gather=fp8_params)
        preset = d.get("preset", "dgx-h100")
        gpu = f" {preset.removeprefix('dgx-').upper()}" if "preset" in d else ""
        runs.append(PublishedRun(f"gpt3-175b MLPerf {version}{gpu} ({nodes * 8} GPUs)", model,
                                 Cluster.preset(preset, nodes=nodes), job, layout,
                                 float(d["step_s"]), d))
    return runs


def _nemo_llama_run(label: str, model: ModelSpec, d: dict, precision: str, split: bool, *,
                    fp8_recipe: str = "delayed", system: str = "dgx-h100",
                    published: float | None = None,
                    overlap_tp: bool | None = None) -> PublishedRun:
    """One row of a NeMo 2 / Megatron-Bridge Llama run as :func:`mlperf_llama31_fp8`,
    :func:`dgxc_llama31_h100` and :func:`bridge_dense_runs` read it: the row's tp, pp, cp, vp and
    micro-batch, SP with overlapped TP communication where tp > 1, the distributed optimizer
    (ZeRO-1) with overlapped DP communication, no recompute, flash attention, at fp8
    ``fp8_recipe`` (default TE's delayed scaling) with the weights gathered in fp8; ``split``:
    Megatron's account-for-embedding/loss pipeline split (:func:`llama3_stage_layers`);
    ``system``: the cluster preset; ``published``: the step time (default the row's
    ``step_s``); ``overlap_tp``: TP communication overlap (default: where tp > 1)."""
    gpus, tp, pp, cp, vp = (int(d[k]) for k in ("gpus", "tp", "pp", "cp", "vp"))
    dp = gpus // (tp * pp * cp)
    stages = llama3_stage_layers(model.num_layers, pp, vp) if split and pp > 1 else None
    layout = Layout(dp=dp, pp=pp, tp=tp, cp=cp, micro_batch=int(d["micro_batch"]),
                    schedule="interleaved-1f1b" if vp > 1 else "1f1b", vpp=vp,
                    sequence_parallel=tp > 1, zero=1, recompute="none", stage_layers=stages)
    fp8 = dict(fp8_recipe=fp8_recipe, fp8_param_gather=True) if precision == "fp8" else {}
    job = Job(global_batch=int(d["global_batch"]), seq_len=int(d["seq_len"]),
              precision=precision, flash_attention=True, overlap_dp_comm=True,
              overlap_tp_comm=tp > 1 if overlap_tp is None else overlap_tp, **fp8)
    return PublishedRun(label, model, Cluster.preset(system, nodes=max(1, gpus // 8)), job,
                        layout, float(d["step_s"]) if published is None else published, d)


def mlperf_llama31_fp8() -> list[PublishedRun]:
    """MLPerf Training v5.0's llama31_405b on DGX H100 (NVIDIA's closed-division submissions,
    NeMo 25.01, 64-1,024 nodes; ``mlperf_training_v50_llama31_405b_h100.csv``, every setting
    in its header): the same implementation facts as :func:`mlperf_gpt3_fp8` — runtime
    "megatron", fp8 recipe "delayed" (TE ``DelayedScaling``), SP with overlapped TP
    communication, the distributed optimizer (ZeRO-1) with overlapped DP communication, no
    recompute, the weights all-gathered in fp8 (``FP8_PARAMS``: ``Job.fp8_param_gather``) — with
    this benchmark's tp 8, pp 8, 8 virtual stages, cp 2 (ring), micro-batch 1, seq 8192 and the
    account-for-embedding/loss pipeline split (``ASYM_PP_EMBED`` / ``ASYM_PP_LOSS``). The model:
    the Llama 3.1 405B architecture (``llama3-405b`` preset) with the benchmark's vocabulary of
    32,000 (the Mixtral 8x22B tokenizer; mlcommons/training's reference README). ``published``:
    the median logged per-step ``train_step_time``."""
    model = mlperf_llama31_model("llama31_405b")
    return [_nemo_llama_run(f"llama3.1-405b MLPerf v5.0 ({d['gpus']} GPUs)", model, d, "fp8",
                            True) for d in read_rows("mlperf_training_v50_llama31_405b_h100.csv")]


MLPERF_LLAMA31_FILES = {"v5.0": "mlperf_training_v50_llama31_405b_h200.csv",
                        "v5.1": "mlperf_training_v51_llama31_b200.csv"}


def mlperf_llama31_model(benchmark: str) -> ModelSpec:
    """The model of MLPerf's ``llama31_405b`` (the Llama 3.1 405B architecture with the
    benchmark's Mixtral 8x22B tokenizer, vocabulary 32,000: :func:`mlperf_llama31_fp8`) or
    ``llama31_8b`` (the ``llama3-8b`` preset: Llama 3.1 8B with its own tokenizer)."""
    if benchmark == "llama31_405b":
        return replace(ModelSpec.preset("llama3-405b"), name="llama3.1-405b-mlperf",
                       vocab_size=32000)
    return replace(ModelSpec.preset("llama3-8b"), name="llama3.1-8b-mlperf")


def mlperf_llama31_partners(version: str) -> list[PublishedRun]:
    """MLPerf Training's Llama 3.1 rows of other submitters on the H200 / B200 presets, as run
    (``MLPERF_LLAMA31_FILES``; every setting, source and left-out row in the file's header):
    v5.0, Nebius's llama31_405b on 64 and 128 HGX H200 nodes on InfiniBand (``dgx-h200``;
    NVIDIA's v5.0 code: tp 4, pp 8, vp 8, cp 2, TE delayed scaling); v5.1, the University of
    Florida's llama31_405b on 32 and 56 DGX B200 (tp 4, pp 8, vp 8, cp 2, TP communication
    overlap off as its configs leave it) and llama31_8b on 1-32 DGX B200 (tp 1, cp 1 or 2,
    micro-batch 2 or 1), and the other submitters' v5.1 llama31_8b on InfiniBand nodes of these
    presets at FP8 (HPE's 8 HGX H200 nodes, ``dgx-h200``, and Verda's 8 HGX B200 nodes; tp 1,
    cp 2, micro-batch 1), all at TE per-tensor current scaling (``"tensorwise"``). Read with
    :func:`_nemo_llama_run`'s facts (SP where tp > 1, ZeRO-1 with overlapped DP communication,
    no recompute, flash attention, the weights gathered in fp8 — every row's ``fp8_params`` is
    True), the row's ``fp8_recipe``, ``preset`` and ``tp_overlap``, the
    account-for-embedding/loss split for llama31_405b (ASYM_PP_EMBED / ASYM_PP_LOSS) and
    :func:`mlperf_llama31_model`. Not modelled: CUDA graphs (the v5.1 rows' full-iteration
    graphs; the cost model prices GPU time), SHARP, deferred embedding weight gradients.
    ``published``: the median logged ``train_step_time`` without each file's first 10 values.
    Sources: github.com/mlcommons/training_results_v5.0 (0fdc28f), _v5.1 (441d65f)."""
    runs = []
    for d in read_rows(MLPERF_LLAMA31_FILES[version]):
        benchmark = d.get("benchmark", "llama31_405b")
        gpu = d["preset"].removeprefix("dgx-").upper()
        label = (f"{benchmark} MLPerf {version} {d['submitter']} {gpu} "
                 f"({d['gpus']} GPUs)")
        runs.append(_nemo_llama_run(label, mlperf_llama31_model(benchmark), d, "fp8",
                                    benchmark == "llama31_405b", fp8_recipe=d["fp8_recipe"],
                                    system=d["preset"],
                                    overlap_tp=d["tp_overlap"] == "True"))
    return runs


def dgxc_llama31_h100() -> list[PublishedRun]:
    """NVIDIA's DGX Cloud Benchmarking recipes, release 25.04: Llama 3.1 8B / 70B / 405B on
    H100 at BF16 and FP8 (``dgxc_benchmarking_llama31_h100_2504.csv``, sources and settings in
    its header; NeMo 25.02.01's performance recipes). Every row as printed (tp, pp, cp, dp, vp,
    micro-batch, global batch) with the same implementation facts as :func:`mlperf_llama31_fp8`
    (FP8 rows: TE delayed scaling, fp8 weight gather: ``bf16_with_fp8_mixed``'s
    ``fp8_params``), the account-for-embedding/loss split for 405B only (its recipe) and the
    ``llama3-8b`` / ``llama3-70b`` / ``llama3-405b`` presets (vocabulary 128,256).
    ``published``: the README's step time (the last step of a 50-step run)."""
    return [_nemo_llama_run(f"{d['model']} {d['precision']} DGXC 25.04 ({d['gpus']} GPUs)",
                            ModelSpec.preset(d["model"]), d, d["precision"],
                            d["model"] == "llama3-405b")
            for d in read_rows("dgxc_benchmarking_llama31_h100_2504.csv")]


def bridge_dense_runs() -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """Published dense pre-training runs of Megatron-Bridge's performance tables on DGX-H100 and
    DGX-B200 (``bridge_dense_2025_2026.csv``: the 25.11 to 26.06 containers' Llama 3 8B / 70B and
    Llama 3.1 405B rows; how each ran, from its container's performance recipe, in the file's
    header): (runs predicted, [(label, why not), ...]).

    Every row as printed (tp, pp, cp, vp, micro-batch, global batch, GPUs) and read with the
    implementation facts of :func:`_nemo_llama_run`: SP with overlapped TP communication where
    tp > 1, the distributed optimizer (ZeRO-1) with overlapped DP communication, no recompute,
    flash attention; at ``precision = "fp8"`` with the row's recipe (``fp8_recipe``: the "FP8-CS"
    and H100 "FP8" rows TransformerEngine's per-tensor current scaling, ``"tensorwise"``; the
    B200 "FP8-MX" rows ``"mxfp8"``) and the weights kept and gathered in fp8 (both recipes set
    ``fp8_param_gather = True``); Megatron's account-for-embedding/loss pipeline split where the
    recipe keeps it (``stage_split``: Llama 3.1 405B); the ``llama3-8b`` / ``llama3-70b`` /
    ``llama3-405b`` presets (vocabulary 128,256; the runs' padding of it is not modelled) on
    the ``dgx-h100`` / ``dgx-b200`` datasheet presets. Not modelled: CUDA graphs (the 8B B200
    rows' full-iteration graphs; the cost model prices GPU time) and the 405B B200 FP8-MX run's
    parameter all-gather without overlap (``param_gather_overlap = no``; meshplan's
    ``Job.overlap_dp_comm`` overlaps both DP collectives or neither). ``published`` = GBS·seq /
    (tokens/s/GPU · GPUs). Rows the loader cannot say how they ran (``not_predicted``) come back
    with the reason instead."""
    runs, skipped = [], []
    for d in read_rows("bridge_dense_2025_2026.csv"):
        gpus, batch, seq = int(d["gpus"]), int(d["global_batch"]), int(d["seq_len"])
        label = (f"{d['model']} {d['source']} {d['system']} {d['precision']} "
                 f"({gpus} GPUs)")
        if d["not_predicted"]:
            skipped.append((label, d["not_predicted"]))
            continue
        step_s = batch * seq / (float(d["tokens_per_s_per_gpu"]) * gpus)
        runs.append(_nemo_llama_run(label, ModelSpec.preset(d["model"]), d, "fp8",
                                    d["stage_split"] == "embedding_loss",
                                    fp8_recipe=d["fp8_recipe"], system=d["system"],
                                    published=step_s))
    return runs, skipped


LLAMA3_DEFAULTS = dict(micro_batch=1, schedule="interleaved-1f1b", vpp=2, recompute="none",
                       zero=1)


def llama3_stage_layers(layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """The report's balancing (one layer fewer on the first and the last pipeline stage) over
    pp·vpp chunks: Megatron's account-for-embedding/loss split
    (:func:`meshplan.spec.embedding_loss_stage_layers`)."""
    return embedding_loss_stage_layers(layers, pp * vpp)


def llama3_2024(**overrides) -> list[PublishedRun]:
    """The Llama 3 report's Table 4 (arXiv 2407.21783 §3.3.2): Llama 3 405B pre-training on
    H100, BF16, at 8k tokens (cp = 1) and 128k tokens (cp = 16).

    Published: tp, cp, pp, dp, sequence length, batch per dp group and TFLOP/s per GPU. Every
    row is predicted with the same stated defaults (``LLAMA3_DEFAULTS``: micro-batch 1, the
    interleaved schedule the report describes with the fewest virtual stages, 2 — the number
    is not published —, no recompute, optimizer states sharded over the gradient group),
    what the report says (sequence parallelism with tp, one layer fewer on the first and last
    pipeline stage: :func:`llama3_stage_layers`), the ring style for cp (the report's
    all-gather style moves the same K/V bytes; meshplan has no all-gather style) and the
    datasheet ``dgx-h100`` cluster (its 400 Gb/s per GPU like Meta's RoCE). ``overrides``
    replace layout defaults (the sensitivity rows of validate_published.py).
    ``published`` = model FLOPs of a step (:func:`meshplan.costmodel.flops.
    model_flops_per_step`: attention counted without the causal halving, as Narayanan et al.
    2021 eq. 3) over the published TFLOP/s × GPUs; the report does not say which convention
    its TFLOP/s uses.
    """
    from meshplan.costmodel.flops import model_flops_per_step
    defaults = {**LLAMA3_DEFAULTS, **overrides}
    runs = []
    for d in read_rows("llama3_2024_table4.csv"):
        model = ModelSpec.preset(d["model"])
        tp, cp, pp, dp, gpus = (int(d[k]) for k in ("tp", "cp", "pp", "dp", "gpus"))
        seq, batch = int(d["seq_len"]), int(d["batch_per_dp"]) * dp
        if seq > model.max_seq_len:   # the long-context stage trains a 128k-context model
            model = replace(model, max_seq_len=seq)
        stages = llama3_stage_layers(model.num_layers, pp, defaults["vpp"])
        layout = Layout(dp=dp, pp=pp, tp=tp, cp=cp, sequence_parallel=True,
                        stage_layers=stages, **defaults)
        job = Job(global_batch=batch, seq_len=seq, precision="bf16")
        cluster = Cluster.preset("dgx-h100", nodes=gpus // 8)
        step_s = (model_flops_per_step(model, batch, seq)
                  / (float(d["tflops_per_gpu"]) * 1e12 * gpus))
        runs.append(PublishedRun(f"{model.name} s{seq} cp{cp} ({gpus} GPUs)", model, cluster,
                                 job, layout, step_s, d))
    return runs


MOE_DEFAULTS = dict(recompute="none", zero=1)
# the data files' dispatcher names -> Job.moe_dispatcher (HybridEP de-duplicates like DeepEP)
MOE_DISPATCHER = {"alltoall": "alltoall", "a2a": "alltoall", "deepep": "deepep",
                  "hybridep": "deepep"}


def with_corrections(cluster: Cluster, **numbers) -> Cluster:
    """``cluster`` with its GPU profile's correction ``numbers`` replaced."""
    gpu = cluster.gpu
    return cluster.replace(gpu=replace(gpu, corrections=replace(gpu.corrections, **numbers)))


def _balanced(cluster: Cluster, balanced: str) -> Cluster:
    """Forced-balanced routing (a fact of the run, not a fit): the profile's
    ``moe_load_imbalance`` is 1; other rows keep the built-in ρ."""
    if balanced != "yes":
        return cluster
    return with_corrections(cluster, moe_load_imbalance=1.0)


def moe_runs() -> list[PublishedRun]:
    """Published BF16 MoE pre-training runs (``moe_bf16_2024_2026.csv``, sources in its
    header) on the datasheet profile of their system.

    Published: GPUs, batch, micro-batch, sequence length, tp, pp, virtual stages, ep and the
    speed (tokens/s/GPU, or for the Megatron-Core README's Mixtral only TFLOP/s/GPU). Every
    row uses the stated defaults ``MOE_DEFAULTS`` (the distributed optimizer: ZeRO-1; no
    recompute where the recipe names no modules), the recipe's selective recompute modules
    (``recompute_modules``: Megatron-Bridge's "layernorm" and "moe_act" as
    ``Job.recompute_modules`` with ``recompute = "selective"``), sequence parallelism where
    tp > 1 (Megatron-Core requires it for MoE), the interleaved schedule where VP > 1 and
    1F1B otherwise, the recipe's dispatcher (``dispatcher``: ``Job.moe_dispatcher``) and,
    where the table's EP disagrees with its
    container's recipe, the recipe's (``ep_as_run``, evidence in the file's header).
    ``balanced`` rows ran with forced-balanced routing (:func:`_balanced`). ``published`` =
    GBS·seq / (tokens/s/GPU · GPUs), or where only TFLOP/s is published, the model FLOPs
    (:func:`meshplan.costmodel.flops.model_flops_per_step`, active experts only) over
    TFLOP/s × GPUs.
    """
    runs = []
    for d in read_rows("moe_bf16_2024_2026.csv"):
        as_run = f" (table: ep {d['ep']})" if d["ep_as_run"] else ""
        runs.append(_bridge_moe_run(d, int(d["ep_as_run"] or d["ep"]), as_run))
    return runs


def _fp8_fields(d: dict) -> dict:
    """The Job fields of an MoE data file's row at fp8: its recipe with the weights gathered in
    fp8 (what every Megatron-Bridge / NeMo fp8 MoE recipe read here sets); none at bf16."""
    return (dict(precision="fp8", fp8_recipe=d["fp8_recipe"], fp8_param_gather=True)
            if d["precision"] == "fp8" else {})


def kept_and_left_out(pairs) -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """(runs, [(label, reason), ...]) of (run, reason) pairs in file order: a run with a
    reason is left out (built for its label only)."""
    return ([r for r, why in pairs if not why], [(r.label, why) for r, why in pairs if why])


def _bridge_moe_run(d: dict, ep: int, note: str = "", **job_fields) -> PublishedRun:
    """One row of a Megatron-Core / Megatron-Bridge MoE table as :func:`moe_runs`,
    :func:`moe_fp8_runs` and :func:`moe_nemo_dgxc_runs` read it (``job_fields``: the precision
    and fp8 recipe; optional columns ``etp``, ``capacity_factor`` and a printed ``step_s``)."""
    from meshplan.costmodel.flops import model_flops_per_step
    model = ModelSpec.preset(d["model"])
    if d.get("capacity_factor"):   # token dropping (NeMo's MegatronTokenDropCallback)
        model = replace(model, capacity_factor=float(d["capacity_factor"]))
    tp, cp, gpus = (int(d[k]) for k in ("tp", "cp", "gpus"))
    # pp and vp as the container's recipe ran them where the table prints others (the FP8
    # file's pp_as_run / vp_as_run; the table's stay in the row)
    pp, vp = (int(d.get(f"{k}_as_run") or d[k]) for k in ("pp", "vp"))
    batch, seq = int(d["global_batch"]), int(d["seq_len"])
    modules = recompute_modules(d.get("recompute_modules", ""))
    split = d.get("stage_split") == "embedding_loss" and pp > 1
    stages = (tuple(int(n) for n in d["stage_layers"].split()) if d.get("stage_layers")
              else llama3_stage_layers(model.num_layers, pp, vp) if split else None)
    layout = Layout(dp=gpus // (tp * pp * cp), pp=pp, tp=tp, cp=cp, ep=ep,
                    etp=int(d.get("etp") or 1), micro_batch=int(d["micro_batch"]), vpp=vp,
                    schedule="interleaved-1f1b" if vp > 1 else "1f1b",
                    sequence_parallel=tp > 1, stage_layers=stages,
                    **{**MOE_DEFAULTS, "recompute": "selective" if modules else "none"})
    job = Job(global_batch=batch, seq_len=seq, moe_dispatcher=MOE_DISPATCHER[d["dispatcher"]],
              recompute_modules=modules, **{"precision": "bf16", **job_fields})
    cluster = _balanced(Cluster.preset(d["system"], nodes=gpus // 8), d["balanced"])
    if d.get("step_s"):
        step_s = float(d["step_s"])
    elif d["tokens_per_s_per_gpu"]:
        step_s = batch * seq / (float(d["tokens_per_s_per_gpu"]) * gpus)
    else:
        step_s = (model_flops_per_step(model, batch, seq)
                  / (float(d["model_tflops_per_gpu"]) * 1e12 * gpus))
    precision = f" {job.fp8_recipe}" if job.precision == "fp8" else ""
    label = (f"{model.name} {d['source']} {d['system']}{precision} ep {ep}{note} "
             f"{d['dispatcher']} ({gpus} GPUs)")
    return PublishedRun(label, model, cluster, job, layout, step_s, d)


def moe_fp8_runs() -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """Published FP8 / MXFP8 MoE pre-training runs (``moe_fp8_2025_2026.csv``, Megatron-Bridge
    25.11 to 26.06 tables; how each ran, from its container's recipes, in the file's
    header): (runs predicted, [(label, why not), ...]).

    Read as :func:`moe_runs` reads the BF16 rows (the distributed optimizer, SP where
    tp > 1, the interleaved schedule where VP > 1, forced-balanced routing, the dispatcher),
    at ``precision = "fp8"`` with the row's recipe (TransformerEngine's per-tensor current
    scaling, ``"tensorwise"``, on H100; ``"mxfp8"`` on B200), no recompute (the Qwen3
    performance scripts cancel the recipes') or the recipe's selective modules
    (``recompute_modules``: DeepSeek-V3's ``mla_up_proj``), and Megatron's
    account-for-embedding/loss pipeline split where the recipe keeps it (``stage_split``) or
    the recipe's own pipeline layout (``stage_layers``), and the fp8 weights both recipes
    keep and all-gather (``Job.fp8_param_gather``: Megatron-Bridge's
    ``bf16_with_fp8_current_scaling_mixed`` and ``bf16_with_mxfp8_mixed`` set
    ``fp8_param_gather = True``; applied since 2026-12-01, post hoc). Where the table's pp / vp / ep
    disagree with its container's recipe, the recipe's (``pp_as_run``, ``vp_as_run``,
    ``ep_as_run``; evidence in the file's header; the label says the table's). Rows whose run
    used a mechanism the cost model does not model (``not_predicted``) come back with that
    reason instead.
    """
    pairs = []
    for d in read_rows("moe_fp8_2025_2026.csv"):
        as_run = [k for k in ("pp", "vp", "ep") if d[f"{k}_as_run"]]
        note = (f" (table: {' '.join(f'{k} {d[k]}' for k in as_run)})" if as_run else "")
        # a skipped row is built for its label only: its recompute modules may be ones
        # Job.recompute_modules cannot express (e.g. "mlp", the reason it is skipped)
        row = {**d, "recompute_modules": ""} if d["not_predicted"] else d
        run = _bridge_moe_run(row, int(d["ep_as_run"] or d["ep"]), note, precision="fp8",
                              fp8_recipe=d["fp8_recipe"], fp8_param_gather=True)
        pairs.append((run, d["not_predicted"]))
    return kept_and_left_out(pairs)


def moe_nemo_dgxc_runs() -> list[PublishedRun]:
    """MoE pre-training rows of NVIDIA's NeMo 25.02 performance summary (Mixtral 8x7B and 8x22B
    on DGX-B200, FP8) and DGX Cloud Benchmarking 25.05 / 25.05.04 (DeepSeek-V3 on DGX-H100,
    BF16): ``moe_nemo_dgxc_2025.csv``, sources, recipe files, commits and the rows left out
    in its header. Settings fixed before the first prediction, the same for every row of a
    source: tp, pp, cp, vp, ep, etp, micro-batch and global batch as printed; the distributed
    optimizer (ZeRO-1) with overlapped DP communication, SP where tp > 1 without TP
    communication overlap (NeMo's ``tp_comm_overlap`` off in both), the all-to-all dispatcher
    (both recipes' config default), routing learned with an auxiliary loss (not forced: the
    profile's ρ), NeMo's token dropping (``MegatronTokenDropCallback``: capacity factor 1.0,
    padded to capacity: ``ModelSpec.capacity_factor``, whose bound caps the busiest expert at
    the padded capacity); Mixtral at fp8 with TE's delayed scaling (NeMo 2.2's
    ``bf16_with_fp8_mixed``) and the weights gathered in fp8 (its ``fp8_params``), no
    recompute; DeepSeek-V3 at bf16 with its MTP layer (the preset's), selective recompute of
    ``mla_up_proj`` and the recipe's uneven pipeline stages (``stage_layers``); CUDA graphs
    where the row ran them (``Job.cuda_graphs``: Mixtral 8x7B on B200). Not modelled: the
    precision-aware optimizer (DeepSeek-V3).
    ``published``: the printed step time, else GBS·seq / (tokens/s/GPU · GPUs)."""
    runs = []
    for d in read_rows("moe_nemo_dgxc_2025.csv"):
        note = f" cf {d['capacity_factor']}" if d["capacity_factor"] else ""
        runs.append(_bridge_moe_run(d, int(d["ep"]), note, **_fp8_fields(d),
                                    cuda_graphs=d["cuda_graphs"] == "yes"))
    return runs


def mlperf_gpt_oss_model(vocab_size: int) -> ModelSpec:
    """MLPerf Training v6.0's ``gpt_oss_20b`` model: the ``gpt-oss-20b`` preset's architecture
    (NVIDIA's pretrain.py: 24 layers, hidden 2880, 64 / 8 heads, 32 experts top-4, the
    128-token window on alternate layers) with the benchmark's vocabulary (the logged 128,256)
    and no auxiliary load-balancing loss (``moe_router_load_balancing_type 'none'``)."""
    return replace(ModelSpec.preset("gpt-oss-20b"), name="gpt-oss-20b-mlperf",
                   vocab_size=vocab_size, router_aux_loss_coeff=0.0)


def mlperf_gpt_oss_20b() -> list[PublishedRun]:
    """MLPerf Training v6.0's gpt_oss_20b on single 8x B200 nodes of other submitters
    (``mlperf_training_v60_gpt_oss_20b.csv``: Lambda, Supermicro and Dell; every setting, the
    files read and the rows left out with reasons in its header), read as logged: tp, pp, cp,
    ep and etp 1 (dp 8), micro-batch 2, global batch 16, seq 8192, MXFP8 (``fp8_recipe
    "mxfp8"``) with the weights gathered in fp8 (``fp8_param_gather``), the distributed
    optimizer (ZeRO-1) with overlapped DP communication, no recompute, HybridEP
    (``MOE_DISPATCHER``: ``"deepep"``; with ep 1 no token leaves its GPU), routing learned on
    the real data (not forced-balanced: the profile's ρ, which ep 1 makes 1) and
    :func:`mlperf_gpt_oss_model`, full-iteration CUDA graphs (``Job.cuda_graphs``). Not
    modelled: HybridEP's static receive buffer (``moe_expert_rank_capacity_factor``
    1.2; no token is dropped), the CuteDSL fused grouped MLP, the attention sinks.
    ``published``: the median logged ``train_step_time`` (one value per 32 steps) in the file
    span the header names. Source: github.com/Richardyu114/training_results_v6.0 (eabf23a)."""
    runs = []
    for d in read_rows("mlperf_training_v60_gpt_oss_20b.csv"):
        gpus, tp, pp, cp, ep, etp, vp = (int(d[k]) for k in
                                         ("gpus", "tp", "pp", "cp", "ep", "etp", "vp"))
        layout = Layout(dp=gpus // (tp * pp * cp), pp=pp, tp=tp, cp=cp, ep=ep, etp=etp,
                        micro_batch=int(d["micro_batch"]), vpp=vp,
                        schedule="interleaved-1f1b" if vp > 1 else "1f1b",
                        sequence_parallel=tp > 1, **MOE_DEFAULTS)
        job = Job(global_batch=int(d["global_batch"]), seq_len=int(d["seq_len"]),
                  precision="fp8", fp8_recipe=d["fp8_recipe"],
                  fp8_param_gather=d["fp8_params"] == "True",
                  moe_dispatcher=MOE_DISPATCHER[d["dispatcher"]],
                  cuda_graphs=d["cuda_graphs"] == "full-iteration")
        cluster = _balanced(Cluster.preset(d["preset"], nodes=int(d["nodes"])), d["balanced"])
        label = (f"gpt_oss_20b MLPerf v6.0 {d['submitter']} B200 {d['fp8_recipe']} ep {ep} "
                 f"{d['dispatcher']} ({gpus} GPUs)")
        runs.append(PublishedRun(label, mlperf_gpt_oss_model(int(d["vocab_size"])), cluster,
                                 job, layout, float(d["step_s"]), d))
    return runs


MODELZOO_RECOMPUTE = {"": "none", "norm+act": "selective", "full": "full"}
# the data files' recompute module lists -> Job.recompute_modules (Megatron's names)
RECOMPUTE_MODULE_NAMES = {"layernorm": "layernorm", "norm": "layernorm", "moe_act": "moe_act",
                          "act": "moe_act", "mla_up_proj": "mla_up_proj"}


def recompute_modules(cell: str) -> tuple[str, ...] | None:
    """A data file's "layernorm+moe_act" / "norm+act" as ``Job.recompute_modules`` (None:
    no selective modules published)."""
    if cell in ("", "full"):
        return None
    return tuple(RECOMPUTE_MODULE_NAMES[m] for m in cell.split("+"))


def moe_modelzoo_runs() -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """The Megatron-Core MoE Model Zoo's Qwen3-235B-A22B H100 rows
    (``moe_modelzoo_qwen3_h100_2025.csv``): (runs predicted, [(label, why not), ...]).

    Every published field is used as printed: tp, ep, pp, vpp, dp, micro-batch, global
    batch, recompute ("norm, act": ``recompute = "selective"`` with ``Job.recompute_modules
    = ("layernorm", "moe_act")``; "full" as full), FSDP
    (Megatron's ``optim_grads_params``: ZeRO-3; else the distributed optimizer: ZeRO-1),
    the dispatcher (``Job.moe_dispatcher``), forced-balanced routing (the published
    commands), sequence parallelism (the model config), and Megatron's
    ``--account-for-embedding/loss-in-pipeline-split`` (:func:`llama3_stage_layers`: the
    first and last chunk one layer short). ``published`` = the step time as printed. Rows
    the cost model cannot take as printed are returned with the reason instead: the
    one-micro-batch-ahead overlap of dispatch and compute ("+1f1b overlap": predicted apart
    by :func:`moe_a2a_overlap_runs`), a layout its published command contradicts, and a
    layout meshplan cannot express (the ConfigError's text).
    """
    runs, skipped = [], []
    for d in read_rows("moe_modelzoo_qwen3_h100_2025.csv"):
        label = _modelzoo_label(d)
        if "overlap" in d["notes"]:
            skipped.append((label, "dispatch/combine overlapped with another micro-batch's "
                                   "compute: predicted apart, in the combined-1F1B section"))
            continue
        if d["command_matches"] != "yes":
            skipped.append((label, "the published command gives another layout"))
            continue
        try:
            runs.append(_modelzoo_run(d))
        except ConfigError as exc:
            skipped.append((label, str(exc).split(";")[0]))
    return runs, skipped


def _modelzoo_label(d: dict, note: str = "") -> str:
    return (f"{d['model']} {d['dispatcher']} tp {d['tp']} ep {d['ep']} pp {d['pp']} "
            f"vpp {d['vpp']}{' fsdp' if d['fsdp'] == 'On' else ''}{note} ({d['gpus']} GPUs)")


def _modelzoo_run(d: dict, note: str = "", **job_fields) -> PublishedRun:
    """One row of the Model Zoo's Qwen3-235B table as :func:`moe_modelzoo_runs` reads it
    (``note`` in its label; ``job_fields``: e.g. ``moe_a2a_overlap``)."""
    model = ModelSpec.preset(d["model"])
    tp, ep, pp, vpp, dp, gpus = (int(d[k]) for k in ("tp", "ep", "pp", "vpp", "dp", "gpus"))
    layout = Layout(dp=dp, pp=pp, tp=tp, ep=ep, micro_batch=int(d["mbs"]), vpp=vpp,
                    schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
                    sequence_parallel=tp > 1, recompute=MODELZOO_RECOMPUTE[d["recompute"]],
                    zero=3 if d["fsdp"] == "On" else 1,
                    stage_layers=(llama3_stage_layers(model.num_layers, pp, vpp)
                                  if pp > 1 else None))
    job = Job(global_batch=int(d["gbs"]), seq_len=int(d["seq_len"]), precision="bf16",
              moe_dispatcher=MOE_DISPATCHER[d["dispatcher"]],
              recompute_modules=recompute_modules(d["recompute"]), **job_fields)
    cluster = _balanced(Cluster.preset(d["system"], nodes=gpus // 8), d["balanced"])
    return PublishedRun(_modelzoo_label(d, note), model, cluster, job, layout,
                        float(d["step_s"]), d)


OVERLAP_ONLY = ("expert-parallel all-to-all overlapped with another micro-batch's compute "
                "(moe_a2a_overlap): predicted apart")


def moe_a2a_overlap_runs() -> list[PublishedRun]:
    """The published MoE rows that ran Megatron-Core's combined 1F1B and nothing else the
    cost model does not price, read as their tables' other rows are read
    (:func:`moe_fp8_runs`, :func:`moe_modelzoo_runs`) with ``Job.moe_a2a_overlap = True``:
    the Megatron-Bridge FP8 H100 rows whose ``not_predicted`` names only the overlap, and the
    Model Zoo's "+1f1b overlap" row (its published command matching its table). The rule they
    were first predicted under: ``benchmarks/sets/moe_a2a_overlap/README.md``."""
    runs = []
    for d in read_rows("moe_fp8_2025_2026.csv"):
        if d["not_predicted"].startswith(OVERLAP_ONLY):
            runs.append(_bridge_moe_run(d, int(d["ep_as_run"] or d["ep"]), " a2a overlap",
                                        precision="fp8", fp8_recipe=d["fp8_recipe"],
                                        fp8_param_gather=True, moe_a2a_overlap=True))
    for d in read_rows("moe_modelzoo_qwen3_h100_2025.csv"):
        if "overlap" in d["notes"] and d["command_matches"] == "yes":
            runs.append(_modelzoo_run(d, " a2a overlap", moe_a2a_overlap=True))
    return runs


def moe_heldout_runs() -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """HELD-OUT MoE pre-training rows gathered 2026-12-05 (``moe_heldout_2026_12.csv``:
    Megatron-Bridge's 26.02.01, 26.04 and 26.04.01 GPT-OSS-120B BF16 rows on DGX-H100 /
    DGX-B200; sources, releases, recipe files, commits and every row left out with its reason
    in the file's header), transcribed for a cost-model change and not predicted before that
    change's rule is committed: (runs, [(label, why not), ...]).

    Each row is read as :func:`_bridge_moe_run` reads the other Megatron-Bridge tables: tp,
    pp, cp, vp, ep, etp, micro-batch and global batch as printed, the distributed optimizer
    (ZeRO-1), SP where tp > 1, forced-balanced dropless routing (``balanced``), the
    release's dispatcher (``dispatcher``: all-to-all or HybridEP) and selective recompute
    modules (``recompute_modules``), at the row's ``precision`` (fp8 rows with their
    ``fp8_recipe`` and fp8 weight gather, as :func:`moe_fp8_runs`). ``published`` = GBS·seq /
    (tokens/s/GPU · GPUs) (the file's ``step_s_derived``). Rows with a ``left_out`` reason
    are built for their label only and come back with it."""
    pairs = []
    for d in read_rows("moe_heldout_2026_12.csv"):
        pairs.append((_bridge_moe_run(d, int(d["ep"]), "", **_fp8_fields(d)), d["left_out"]))
    return kept_and_left_out(pairs)


def dense_heldout_runs() -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """HELD-OUT dense pre-training rows gathered 2026-12-05 (``dense_heldout_2026_12.csv``:
    DGX Cloud Benchmarking v25.05.01's Llama 3.1 405B on 512 H100 at BF16 and FP8, NeMo
    25.04.01; and MLPerf v6.0 Cisco's 2-node H200 llama31_8b, left out; sources, commits,
    settings and every candidate left out with its reason in the file's header), transcribed
    for a cost-model change and not predicted before that change's rule is committed:
    (runs, [(label, why not), ...]).

    Each row is read with :func:`_nemo_llama_run`'s facts (SP where tp > 1, ZeRO-1 with
    overlapped DP communication, no recompute, flash attention, fp8 rows with the row's
    ``fp8_recipe`` and the weights gathered in fp8), the row's tp, pp, cp, vp, micro-batch,
    global batch, ``system`` preset and ``tp_overlap``, the account-for-embedding/loss split
    where ``stage_split`` says so; the model is the ``model`` preset, or
    :func:`mlperf_llama31_model` for the MLPerf row. Not modelled: ``ddp_bucket_size``,
    ``cuda_graphs``. ``published`` = ``step_s``. Rows with a ``left_out`` reason are built for
    their label only and come back with it."""
    pairs = []
    for d in read_rows("dense_heldout_2026_12.csv"):
        mlperf = d["source"].startswith("mlperf")
        model = (mlperf_llama31_model("llama31_8b") if mlperf and d["model"] == "llama3-8b"
                 else ModelSpec.preset(d["model"]))
        gpu = d["system"].removeprefix("dgx-").upper()
        label = f"{d['model']} {d['source']} {gpu} {d['precision']} ({d['gpus']} GPUs)"
        run = _nemo_llama_run(label, model, d, d["precision"],
                              d["stage_split"] == "embedding_loss",
                              fp8_recipe=d["fp8_recipe"] or "delayed", system=d["system"],
                              overlap_tp=d["tp_overlap"] == "True")
        pairs.append((run, d["left_out"]))
    return kept_and_left_out(pairs)


# CUDA-graph scopes (a data file's ``cuda_graphs`` cell) that capture whole layers or the whole
# step: only these take an eager MoE layer's host dispatch off the step (``Job.cuda_graphs``);
# TransformerEngine graphs of attention / router / preprocessing leave the token dispatch and
# the experts eager
WHOLE_GRAPH_SCOPES = ("full", "full_iteration")


def moe_user_report_runs() -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """MoE training runs reported outside the performance-summary tables, gathered 2026-12-05
    (``moe_user_reports_2026_12.csv``: Megatron-Bridge's gpt-oss-20b verification card, full
    SFT on one 8x H100 node, and Megatron-Bridge issue #4439, Qwen3-30B-A3B on one DGX B200 at
    MXFP8 and BF16; sources, recipe files, commits and every candidate left out with its reason
    in the file's header), transcribed and not predicted: (runs, [(label, why not), ...]).

    Each row is read as :func:`_bridge_moe_run` reads the Megatron-Bridge tables: tp, pp, cp,
    vp, ep, etp, micro-batch and global batch as read from the run's recipe, SP where tp > 1,
    forced-balanced routing where ``balanced`` says so (else the profile's ρ), the dispatcher
    (``dispatcher``), fp8 rows with their ``fp8_recipe`` and fp8 weight gather (as
    :func:`moe_fp8_runs`); with the row's optimizer sharding (``zero``: 0 where the recipe runs
    no distributed optimizer), its data-parallel overlap (``overlap_dp_comm``) and CUDA graphs
    where the scope captures whole layers or the step (:data:`WHOLE_GRAPH_SCOPES`).
    ``workload`` "sft-packed" rows are read as one causal sequence of ``seq_len`` (the packed
    documents' own attention is not expressed). ``published`` = ``step_s`` (printed, or derived
    in the header). Rows with a ``left_out`` reason are built for their label only."""
    pairs = []
    for d in read_rows("moe_user_reports_2026_12.csv"):
        run = _bridge_moe_run(d, int(d["ep"]), f" {d['workload']}", **_fp8_fields(d),
                              overlap_dp_comm=d["overlap_dp_comm"] == "True",
                              cuda_graphs=d["cuda_graphs"] in WHOLE_GRAPH_SCOPES)
        pairs.append((replace(run, layout=replace(run.layout, zero=int(d["zero"]))),
                      d["left_out"]))
    return kept_and_left_out(pairs)
