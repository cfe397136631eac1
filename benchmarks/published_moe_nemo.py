"""The NeMo / DGX Cloud MoE section of ``benchmarks/validate_published.py``: the MoE
pre-training rows of NVIDIA's NeMo 25.02 performance summary (Mixtral 8x7B and 8x22B on
DGX-B200, FP8) and of the DGX Cloud Benchmarking 25.05 / 25.05.04 recipes (DeepSeek-V3 on
DGX-H100, BF16), predicted on datasheet profiles as first run, apart from the other MoE
means. Data: ``tests/validation/data/moe_nemo_dgxc_2025.csv`` (sources, recipe files,
commits, every setting and the rows left out in its header); loader
``tests/validation/published_runs.py`` :func:`moe_nemo_dgxc_runs`.
"""

from __future__ import annotations

from published_fp8 import fp8_table
from published_runs import moe_nemo_dgxc_runs
from published_summary import summarize_signed

FP8_NAME = "MoE, FP8, NeMo 25.02 performance summary (Mixtral 8x7B / 8x22B, DGX-B200)"
BF16_NAME = "MoE, BF16, DGX Cloud Benchmarking 25.05 (DeepSeek-V3, DGX-H100)"


def moe_nemo_report(step_table) -> tuple[dict[str, str], list[str], list[str]]:
    """(summary lines by name, the tables for stdout, the Markdown section); ``step_table``:
    validate_published.py's BF16 table."""
    runs = moe_nemo_dgxc_runs()
    fp8_runs = [r for r in runs if r.job.precision == "fp8"]
    bf16_runs = [r for r in runs if r.job.precision == "bf16"]
    f_lines, f_errs = fp8_table(fp8_runs)
    b_lines, b_errs = step_table(bf16_runs)
    s = {}
    if f_errs:
        s[FP8_NAME] = summarize_signed(FP8_NAME, f_errs)
    if b_errs:
        s[BF16_NAME] = summarize_signed(BF16_NAME, b_errs)
    stdout = [*f_lines, s.get(FP8_NAME, ""), "", *b_lines, s.get(BF16_NAME, ""), ""]
    return s, stdout, section(f_lines, b_lines, s)


def section(f_lines: list[str], b_lines: list[str], s: dict[str, str]) -> list[str]:
    return [
        "## Mixture-of-experts pre-training, NeMo 25.02 (FP8) and DGX Cloud 25.05 (BF16)", "",
        "The MoE rows of NVIDIA's NeMo performance summaries and DGX Cloud Benchmarking "
        "recipes whose layout and speed are both public on DGX-H100 / DGX-B200 for a model "
        "meshplan has a preset of, each read as its release's recipe ran it "
        "(`tests/validation/data/moe_nemo_dgxc_2025.csv`, whose header cites the pages, "
        "releases, recipe files and commits, and every row left out with the reason). "
        "Settings decided and committed before the first prediction (d726582b); as first "
        "run, its own tables and summary lines, not in the MoE means above. Datasheet "
        "profiles; no number here was fitted on these rows.", "",
        "NeMo 25.02, DGX-B200 (NeMo 2.2.0's `scripts/llm/performance` and "
        "`pretrain_recipe(performance_mode=True)`): Mixtral 8x7B (64 GPUs, tp 1 · pp 1 · "
        "ep 8, micro-batch 2, GBS 256, seq 4096) and 8x22B (256 GPUs, tp 2 · pp 4 · cp 8 · "
        "vp 14 · ep 8 · etp 1, micro-batch 1, GBS 64 — the table prints \"1 | 64\" under "
        "\"GBS | MBS\" — seq 65,536); fp8 with TransformerEngine's delayed scaling "
        "(`bf16_with_fp8_mixed`) and the weights gathered in fp8; the all-to-all "
        "dispatcher; routing learned with an auxiliary loss (not forced: the profile's "
        "ρ); NeMo's token dropping, capacity factor 1.0 padded to capacity "
        "(`ModelSpec.capacity_factor`, whose bound caps the busiest expert at the padded "
        "capacity); the distributed optimizer with overlapped DP communication, SP where "
        "tp > 1, no TP communication overlap, no recompute. Not modelled: the 8x7B run's "
        "CUDA graphs (the cost model prices GPU time). Step time = GBS·seq / "
        "(tokens/s/GPU · GPUs).", "",
        *f_lines, "",
        f"**{s.get(FP8_NAME, FP8_NAME + ': no row predicted')}**", "",
        "DGX Cloud Benchmarking 25.05 / 25.05.04, DGX-H100 (NeMo at 7a8f1cc7, "
        "`scripts/performance/llm/pretrain_deepseek_v3.py`, the NeMo 25.04.01 container): "
        "DeepSeek-V3 at BF16 on 1,024 and 512 GPUs, tp 2 · pp 16 / 8 · ep 64 · etp 1, "
        "micro-batch 1, GBS 8 × GPUs, seq 4096; its MTP layer; selective recompute of "
        "`mla_up_proj`; the recipe's uneven stages (first 64 / pp − 1 layers, last 64 / pp − "
        "2); the all-to-all dispatcher; learned routing (sequence auxiliary loss, not "
        "forced); token dropping at capacity factor 1.0, padded; the distributed "
        "optimizer, SP, no TP communication overlap, no CUDA graphs. Not modelled: the "
        "precision-aware optimizer. Step time as the README prints it (the mean of "
        "iterations 11-44).", "",
        *b_lines, "",
        f"**{s.get(BF16_NAME, BF16_NAME + ': no row predicted')}**", "",
        "Left out (the data file's header): the NeMo repository's performance summary, "
        "whose only versions (24.07, DGX-H100) have no MoE row; the docs.nvidia.com "
        "summaries of 24.09 to 25.07 beyond 25.02's DGX-B200 table, stored only as excerpts "
        "that end before their MoE rows; the 25.09 tables (no precision column); every "
        "GB200 / GB300 row; DGX Cloud releases from 25.07 on (layouts, no step time); "
        "Grok-1, Llama 4 and Nemotron-H (no preset).", "",
    ]
