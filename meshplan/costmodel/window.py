"""Sliding-window attention: how many keys a query of each layer attends to, counted as the
model FLOPs convention counts them and as a fused (flash) kernel executes them.

A windowed layer (``ModelSpec.sliding_window`` = w on ``ModelSpec.window_layers``) lets each
query attend to itself and the w − 1 tokens before it (Longformer, Beltagy et al. 2020,
arXiv 2004.05150 §3.1: O(s·w) instead of O(s²); Mistral 7B, arXiv 2310.06825 §2; gpt-oss,
arXiv 2508.10925: a 128-token band on every other layer; Megatron-Core's
``window_size = (128, 0)`` with ``window_attn_skip_freq = 2``).

* **Model FLOPs** (:mod:`meshplan.costmodel.flops`' convention, Narayanan et al. 2021 eq. 3:
  the scores and the weighted sum 2·keys·q_dim each, per token, without the causal
  halving): a full layer's query counts s keys, a windowed layer's min(w, s)
  (:func:`keys_per_query`).
* **Executed by a fused kernel**: flash attention walks the score matrix in tiles of
  B query rows × B keys and skips a tile only when the mask hides all of it; a tile the
  mask cuts is computed whole (FlashAttention-2, Dao 2023, arXiv 2307.08691 §3.1.1 for the
  causal mask; the ``window_size`` of FlashAttention ≥ 2.3, FlashAttention-3 and cuDNN's
  sliding-window masks skip tiles outside the band the same way). Full causal layers keep
  the cost model's half of s² (:func:`meshplan.costmodel.compute.layer_cost`). A windowed
  layer's query block j (rows jB … jB + B − 1) needs the key tiles from ⌊max(0, jB − w + 1)/B⌋
  to j: about ⌈(w − 1)/B⌉ + 1 of them, so a 128-token window costs 2 tiles a query block,
  1/16 of s² at s = 4096, not 128/4096 (:func:`executed_fraction`). B = 128
  (``FLASH_TILE``): FlashAttention-2's key tile for head dims up to 128; FlashAttention-3 and
  cuDNN use 128-key tiles too on Hopper (their query tiles differ: 128-192 rows, which moves
  the count by under a tile a block).
* The tables price one layer kind per stage, so a model with both kinds gets the mean over
  its layers (:func:`layer_mix`): exact for the step's total work, and each kind's kernel
  runs at the attention efficiency of its own FLOPs.

Not priced: windowed attention under context parallelism (refused by
:func:`meshplan.spec.validate.check_modelled`); unfused attention materialises the full
s × s scores whatever the mask (no saving).

Measured error (read 2026-12-05 against NVIDIA's published cuDNN sweeps of GPT-OSS-shaped
windowed attention, head dim 64, causal, forward + backward; cudnn-frontend repository,
``benchmark/sdpa_benchmark_training/results``; not measured here): predicted / published
time − 1, the datasheet curves of gpus.toml priced at this module's executed FLOPs —

* H200, cuDNN 9.19, window 1024, batch 2, 64 query heads (``h200_919_only_cudnn/gpt_oss_*``):
  +22 % at s = 2k, +2 % at 4k, −5 % at 8k, −9 % at 16k, −12 % at 32k;
* GB200 (read as B200 at its datasheet peak, 2,500 TFLOP/s), cuDNN 9.22, window 128, batch
  2, 128 query heads (``gpt_oss/gb200/gpt_oss_20260424_*``; the B200 curve is cuDNN 9.13's):
  +6 % at 2k, −8 % at 4k, −18 % at 8k, −42 % at 16k, −63 % at 32k.

So the tile count holds where the window spans many tiles, and a narrow window over a long
sequence runs slower than priced: its kernel's efficiency stays flat (0.12-0.15 of peak at
128 keys from 2k to 32k) while the full-attention curve, keyed by the call's total FLOPs,
rises with the sequence. The published training rows with windows (GPT-OSS at 4k-8k) sit
where the gap is under a fifth of their windowed layers' attention time.
"""

from __future__ import annotations

import math
from functools import lru_cache

from meshplan.spec import ModelSpec

FLASH_TILE = 128          # key (and query) tile of the flash kernels, module docstring


def keys_per_query(model: ModelSpec, layer: int, seq_len: int) -> int:
    """Keys a query of ``layer`` counts in model FLOPs: s, or min(w, s) when windowed."""
    w = model.attention_window(layer)
    return seq_len if w is None else min(w, seq_len)


@lru_cache(maxsize=1024)        # a sum over s / 128 blocks, asked per layout by the search
def executed_fraction(seq_len: int, window: int | None) -> float:
    """Share of the s × s score matrix a causal flash kernel computes: 1/2 for full causal
    attention (the cost model's convention), else the tiles a window of ``window`` keys
    touches (module docstring); at least a window as long as the sequence costs no more
    than full causal."""
    if window is None or window >= seq_len:
        return 0.5
    b = FLASH_TILE
    blocks = math.ceil(seq_len / b)
    tiles = sum(j - max(0, j * b - window + 1) // b + 1 for j in range(blocks))
    return min(0.5, tiles * b * b / seq_len ** 2)


def layer_mix(model: ModelSpec, seq_len: int) -> tuple[tuple[float, float], ...]:
    """((share of the layers, executed fraction of s²), ...): one entry per kind of
    attention layer the model has (one for a model without windows)."""
    if model.sliding_window is None:
        return ((1.0, 0.5),)
    n = model.num_layers
    windowed = n if model.window_layers is None else len(model.window_layers)
    mix = [(windowed / n, executed_fraction(seq_len, model.sliding_window))]
    if windowed < n:
        mix.append(((n - windowed) / n, 0.5))
    return tuple(mix)


__all__ = ["FLASH_TILE", "keys_per_query", "executed_fraction", "layer_mix"]
