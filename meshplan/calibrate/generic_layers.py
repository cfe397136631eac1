"""The layer grid of a calibration without ``--model`` (``meshplan calibrate --layer-grid``).

Without layer rows the cost model composes a layer from the GEMM, attention and
memory-bound curves; on the executor's eager blocks that composition ran 7 % slow on average
(round 41 of issue 36, 2 × H200: every layout re-predicted without its model's layer rows,
+7.3 % mean signed error; docs/benchmarks/transfer.md). With rows of *other* models the
nearest-shape lookup (:mod:`meshplan.costmodel.nearest_rows`: same family first, then the
nearest widths, scaled by the analytical ratio) predicted the same layouts at 4.6 % / 9.4 %.
A user who cannot time the model they plan (too large, not yet built) has no other model
to time either, so ``--layer-grid`` times stand-ins: the executor's block at four
representative shapes, the two families the executor builds (GPT: GELU, LayerNorm, learned
positions, biases; Llama: SwiGLU, RMSNorm, RoPE, no biases), each at a small and a large
width and at different query/kv-head ratios and head dims, so that a planned model finds a
source of its own family near its widths.

The widths are the geometric thirds of the range of dense decoders of 1-10 B parameters
(hidden 1024-5120: 1792 and 3072), the FFN ratio the middle of 2.5-4 (3.25, rounded to 256)
and the sequence 2048; they come from those ranges (those of ``benchmarks/draw_models.py``),
not from any measured model. Each costs what a ``--model`` costs in the layer tables (about
50 s a round on 2 × H200 at micro-batches 2-16).
"""

from __future__ import annotations

from meshplan.spec import ModelSpec

GPT = dict(activation="gelu", norm="layernorm", position_embedding="learned",
           tied_embeddings=True, bias=True)
LLAMA = dict(activation="swiglu", norm="rmsnorm", position_embedding="rope",
             tied_embeddings=False, bias=False)

GENERIC_LAYER_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(name="grid-gpt-h1792-mha-d64", num_layers=16, hidden_size=1792, num_heads=28,
              ffn_hidden_size=5888, vocab_size=50304, max_seq_len=2048, **GPT),
    ModelSpec(name="grid-gpt-h3072-gqa8-d128", num_layers=16, hidden_size=3072, num_heads=24,
              num_kv_heads=8, ffn_hidden_size=9984, vocab_size=50304, max_seq_len=2048, **GPT),
    ModelSpec(name="grid-llama-h1792-gqa2-d128", num_layers=16, hidden_size=1792, num_heads=14,
              num_kv_heads=2, ffn_hidden_size=5888, vocab_size=50304, max_seq_len=2048,
              **LLAMA),
    ModelSpec(name="grid-llama-h3072-mha-d128", num_layers=16, hidden_size=3072, num_heads=24,
              ffn_hidden_size=9984, vocab_size=50304, max_seq_len=2048, **LLAMA),
)

#: on CPU (tests, dry runs): the same families and head layouts, tiny
CPU_LAYER_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(name="grid-gpt-tiny", num_layers=2, hidden_size=64, num_heads=4,
              ffn_hidden_size=192, vocab_size=128, max_seq_len=32, **GPT),
    ModelSpec(name="grid-llama-tiny", num_layers=2, hidden_size=64, num_heads=4,
              num_kv_heads=2, ffn_hidden_size=192, vocab_size=128, max_seq_len=32, **LLAMA),
)


def layer_grid_models(device_kind: str) -> tuple[ModelSpec, ...]:
    """The stand-in models whose layers ``--layer-grid`` times on ``device_kind``."""
    return GENERIC_LAYER_MODELS if device_kind == "cuda" else CPU_LAYER_MODELS


__all__ = ["GENERIC_LAYER_MODELS", "CPU_LAYER_MODELS", "layer_grid_models"]
