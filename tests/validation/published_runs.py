"""Published training runs as (model, cluster, job, layout, published value) records.

Data files in ``tests/validation/data/`` are copies of the published tables, each with its
source in its header. Used by ``tests/validation/test_published.py`` and
``benchmarks/validate_published.py``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from meshplan import Cluster, Job, Layout, ModelSpec

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
