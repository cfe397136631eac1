"""The held-out section of ``benchmarks/validate_published.py`` for Megatron's host work per
MoE layer (``megatron_moe_layer_host_ops``, fitted post hoc on the other published MoE rows):
Megatron-Bridge's 26.02.01 / 26.04 / 26.04.01 GPT-OSS-120B BF16 rows on DGX-H100 and
DGX-B200, gathered while the number was fitted and predicted only after its rule was
committed (``benchmarks/sets/megatron_moe_host/README.md``), with and without the correction;
then three runs reported outside NVIDIA's tables, gathered after it. Data:
``tests/validation/data/moe_heldout_2026_12.csv`` and ``moe_user_reports_2026_12.csv``;
loaders ``tests/validation/published_runs.py`` :func:`moe_heldout_runs`,
:func:`moe_user_report_runs`.
"""

from __future__ import annotations

from meshplan.costmodel import estimate
from published_runs import moe_heldout_runs, moe_user_report_runs, with_corrections
from published_summary import summarize_signed

NAME = ("MoE, BF16, held out for Megatron's host work per MoE layer (GPT-OSS-120B, "
        "Megatron-Bridge 26.02.01-26.04.01)")
NAME_OFF = NAME + ", without the correction"
USER = "MoE, held out for Megatron's host work per MoE layer, user-reported single-node runs"
USER_OFF = USER + ", without the correction"


def heldout_table(runs) -> tuple[list[str], list[float], list[float]]:
    lines = ["| run | t·p·d | mb | published s | predicted s | error | without the correction s "
             "| error |", "|---|---|---|---|---|---|---|---|"]
    errs, errs_off = [], []
    for r in runs:
        lay = r.layout
        on = estimate(r.model, r.cluster, r.job, lay).step_time_s
        off = estimate(r.model, with_corrections(r.cluster, megatron_moe_layer_host_ops=0.0),
                       r.job, lay).step_time_s
        e, e_off = ((t / r.published - 1) * 100 for t in (on, off))
        errs.append(e)
        errs_off.append(e_off)
        lines.append(f"| {r.label} | {lay.tp}·{lay.pp}·{lay.dp} | {lay.micro_batch} | "
                     f"{r.published:.2f} | {on:.2f} | {e:+.1f}% | {off:.2f} | {e_off:+.1f}% |")
    return lines, errs, errs_off


def moe_heldout_report() -> tuple[dict[str, str], list[str], list[str]]:
    """(summary lines by name, the table for stdout, the Markdown section)."""
    runs, left_out = moe_heldout_runs()
    lines, errs, errs_off = heldout_table(runs)
    user_runs, user_left = moe_user_report_runs()
    u_lines, u_errs, u_off = heldout_table(user_runs)
    s = {NAME: summarize_signed(NAME, errs), NAME_OFF: summarize_signed(NAME_OFF, errs_off),
         USER: summarize_signed(USER, u_errs), USER_OFF: summarize_signed(USER_OFF, u_off)}
    stdout = [*lines, s[NAME], s[NAME_OFF], "", *u_lines, s[USER], s[USER_OFF], ""]
    return s, stdout, section(lines, s, left_out) + user_section(u_lines, s, user_left)


def section(lines: list[str], s: dict[str, str], left_out) -> list[str]:
    return [
        "## Held out: Megatron's host work per MoE layer (GPT-OSS-120B BF16, Megatron-Bridge "
        "26.02.01 to 26.04.01)", "",
        "Megatron-Core runs an MoE layer eagerly unless the run captures CUDA graphs; where "
        "the host's work a layer (router, permutation, the dispatcher's host "
        "synchronisation, TransformerEngine's per-expert GEMM launches) exceeds the GPU's, "
        "the layer costs the host's time. Since 2026-12-05 runtime \"megatron\" prices it "
        "as `megatron_moe_layer_host_ops` · `host_op_dispatch_s` per MoE layer and "
        "micro-batch (900 operators, 9.2 ms on the H100 host; the B200 host assumed alike), "
        "**fitted post hoc on the 33 MoE rows of the sections above: 23.4 → 13.8 % mean** "
        "(docs/costmodel.md, \"Megatron's host work per MoE layer\"; 13.2 % since B200's "
        "attention curve came from its published cuDNN sweep on 2026-12-05, not refitted). "
        "The rule "
        "(`benchmarks/sets/megatron_moe_host/README.md`) was committed before these rows "
        "were predicted: keep the number if their mean error falls with it, else set it to "
        "0. They are Megatron-Bridge's own later GPT-OSS-120B tables "
        "(`tests/validation/data/moe_heldout_2026_12.csv`, gathered while the number was "
        "fitted; sources and every setting in its header), read as `moe_bf16` reads the "
        "earlier ones. A weak hold-out, said plainly: one model, and four of the five rows "
        "repeat layouts of the fitted set in later releases; only the 26.04.01 DGX-B200 "
        "all-to-all row is a new configuration. As run:", "",
        *lines, "",
        f"**{s[NAME]}**", "",
        f"- {s[NAME_OFF]}", "",
        "Rule met (the mean fell), so the number stays. The three DGX-H100 rows (micro-batch "
        "1, 16 local experts: host-bound as priced) moved 7 points nearer; the two DGX-B200 "
        "rows (micro-batch 4, GPU-bound as priced) did not move and stay 38-42 % fast — "
        "GPT-OSS's own miss, which its CUDA-graph MLPerf rows show too (GPU work the "
        "datasheet path underprices, not the host).", "",
        *([f"Left out: {'; '.join(f'{label} ({why})' for label, why in left_out)}.", ""]
          if left_out else []),
    ]


def user_section(lines: list[str], s: dict[str, str], left_out) -> list[str]:
    return [
        "The same check on runs reported outside NVIDIA's performance tables, gathered after "
        "the rule and its first hold-out (`tests/validation/data/moe_user_reports_2026_12."
        "csv`, 6199f8f6, committed without predictions; sources and settings in its "
        "header): Megatron-Bridge's GPT-OSS-20B verification card (full fine-tuning, one "
        "8 × H100 node, micro-batch 1 of 2,048 packed tokens, no distributed optimizer, no "
        "gradient-reduce overlap) and a user's Qwen3-30B-A3B runs on one DGX B200 "
        "(Megatron-Bridge issue 4439, micro-batch 4, MXFP8 and BF16, their step time derived "
        "from the reported \"~562\" and \"~552\" TFLOP/s with Megatron-Bridge's own FLOPs "
        "a token). As run:", "",
        *lines, "",
        f"**{s[USER]}**", "",
        f"- {s[USER_OFF]}", "",
        "The GPT-OSS-20B fine-tuning row is host-bound as priced (2,048 tokens a micro-batch) "
        "and moves most, but stays 42 % fast: GPT-OSS again. The Qwen3-30B rows ran 8-10 % "
        "slower than Megatron-Bridge's own table for the same configuration (9.66-9.82 s).",
        "",
        *([f"Left out: {'; '.join(f'{label} ({why})' for label, why in left_out)}.", ""]
          if left_out else []),
    ]
