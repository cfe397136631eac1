"""Zero-bubble's split-backward memory on CPU, in no-recompute activation sets per layer.

Builds stacks of 2, 6 and 12 blocks shaped like the two GPU validation models (hidden size
and heads scaled down, their block structure kept: GPT = LayerNorm, biases, GELU; Llama =
RMSNorm, SwiGLU, grouped KV heads), runs one forward, torch's ``stage_backward_input`` (B)
and ``stage_backward_weight`` (W) under bf16 autocast, and reports with
:func:`meshplan.calibrate.split_memory.split_memory_per_layer` what a micro-batch keeps
between B and W and what W needs while it runs — divided by the no-recompute activation
set of one layer (what a forward without recomputation keeps, the input included once).
The cost model's constants (``ZB_FULL_PENDING_SETS`` 0.42, ``ZB_FULL_W_TRANSIENT_SETS`` 4.1)
are in the same unit.

    python benchmarks/emulate_split_memory.py [--out docs/benchmarks/split_memory_cpu.md]
"""
from __future__ import annotations

import argparse
import platform
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_device as vd  # noqa: E402

from meshplan.calibrate.bench_layers import Config, _build, _Groups, _set_recompute  # noqa: E402
from meshplan.calibrate.split_memory import _live_bytes_mode, split_memory_per_layer  # noqa: E402

H, HEADS, SEQ, MB = 256, 4, 128, 2
MODELS = {
    "GPT-style (gpt-0.54b blocks)": replace(vd.GPT_05B, hidden_size=H, num_heads=HEADS,
                                            num_kv_heads=HEADS, ffn_hidden_size=4 * H,
                                            vocab_size=512, max_seq_len=SEQ),
    "Llama-style (llama-1.64b blocks)": replace(vd.LLAMA_16B, hidden_size=H, num_heads=HEADS,
                                                num_kv_heads=HEADS // 2, ffn_hidden_size=4 * H,
                                                vocab_size=512, max_seq_len=SEQ),
}
DEPTHS = (2, 6, 12)


def _module(model, layers: int, recompute: str):
    cfg = Config(model=model, seq_len=SEQ, tp=1, sequence_parallel=False, micro_batch=MB,
                 recompute=recompute)
    m, _ = _build(cfg, layers, torch.device("cpu"), _Groups(1, 0, "cpu"))
    _set_recompute(m, recompute)
    return m


def _input():
    return torch.randn(MB, SEQ, H, dtype=torch.bfloat16, requires_grad=True)


def activation_set(model, layers: int) -> float:
    """Bytes one forward without recomputation keeps per layer (input once, output not)."""
    m = _module(model, layers, "none")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m(_input())                                    # autocast's weight copies
        mode = _live_bytes_mode()
        with mode:
            x = _input()
            y = m(x)
            kept = mode.cur - y.numel() * y.element_size()
        del x, y
    return kept / layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="also write the table as Markdown here")
    args = ap.parse_args()
    torch.manual_seed(0)
    lines = ["| block | stack depth | pending after B (sets/layer) | W transient (sets/layer) |",
             "|---|---|---|---|"]
    for label, model in MODELS.items():
        for depth in DEPTHS:
            s = activation_set(model, depth)
            m = _module(model, depth, "full")
            with torch.autocast("cpu", dtype=torch.bfloat16):
                pending, transient = split_memory_per_layer(m, _input, depth,
                                                            torch.device("cpu"))
            lines.append(f"| {label} | {depth} | {pending / s:.2f} | {transient / s:.2f} |")
            print(lines[-1], flush=True)
    if args.out:
        head = [
            "# Zero-bubble split-backward memory with full recomputation, CPU emulation",
            "",
            f"{datetime.now(timezone.utc):%Y-%m-%d}, "
            f"{(platform.processor() or platform.machine()).strip()}, this project's 2-core CPU "
            f"machine, torch {torch.__version__}; "
            f"`python benchmarks/emulate_split_memory.py --out {args.out}`.",
            "",
            f"Blocks of the validation models' structure at hidden size {H}, {HEADS} heads, "
            f"sequence {SEQ}, micro-batch {MB}, bf16 autocast. One set = what a forward "
            "without recomputation keeps per layer. The cost model's constants, read off "
            "Llama stages on 4 × H200: pending 0.42, W transient 4.1; GPT stages on 4 × H100 "
            "implied 2.2-3.0 (docs/benchmarks/accuracy.md, round 10). Since round 10 "
            "`meshplan calibrate` measures both on the GPU for each full-recompute row.",
            ""]
        args.out.write_text("\n".join(head + lines) + "\n")


if __name__ == "__main__":
    main()
