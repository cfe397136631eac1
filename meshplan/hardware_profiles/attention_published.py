"""A datasheet attention curve from a published kernel benchmark (data/attention_kernels.toml).

The curve the cost model reads (``GPUSpec.attention_efficiency``, meshplan/costmodel/
compute.py) is the efficiency of one causal fused-attention call, forward + backward, at
the forward's executed FLOPs ``E``: the call costs ``3.5·E / (peak · eff(E))`` (backward
2.5 × forward, Dao 2022, arXiv 2205.14135 §3.1) — what ``meshplan calibrate`` measures
(:mod:`meshplan.calibrate.profile`). A benchmark that prints TFLOP/s per pass over a
sweep of sequence lengths ``s``, ``h`` query heads of ``d``, either at ``T`` tokens a call
(key ``tokens``: batch ``T/s``, the FlashAttention papers' sweeps) or at a fixed batch ``B``
(key ``batch``: cuDNN frontend's sweeps), gives, per length (FLOPs counted as the
FlashAttention papers and cuDNN frontend's benchmark count them; grouped-query attention's
fewer K/V heads do not change them — every query head still does its s²/2 score and value
products):

    E(s)   = 4 · (T/s) · s² · h · d / 2 = 2·T·s·h·d      (tokens)
    E(s)   = 4 · B · s² · h · d / 2     = 2·B·s²·h·d     (batch)              (1)
    f(s)   = forward_causal_tflops / peak_tflops                             (2)
    b(s)   = backward_causal_tflops / peak_tflops, or, published unmasked only,
             backward_tflops / peak_tflops × forward_causal_tflops / forward_tflops   (3)
    eff(E) = (1 + 2.5) / (1 / f + 2.5 / b)                                   (4)

(3), second form, is an assumption: the causal mask costs the backward the share it costs
the forward at the same length (its diagonal blocks and uneven rows are the same). Below
the published range the GPU's own ``attention_efficiency`` points give the shape, scaled
to meet the first published point (:func:`curve_fit.extend_with_base`, as calibration
extends its measured points); beyond the last length the curve holds its last point
(:class:`Curve` clamps).

**Head dim.** At the same FLOPs a call's efficiency depends on its head dim: each tile does
``d`` multiply-adds per score element, while the softmax, masking and loads per element do
not shrink with ``d``. The figures publish head dims 64 and 128 for the same kernel; a GPU
whose profile names both gets, per other head dim ``d``, the ratio to its reference curve
(the ``attention_published`` table's head dim ``d_ref``) at the same forward FLOPs:

    r_d(E) = eff_d(E) / eff_ref(E)     (eq. (4) of both tables; E at the published points)  (5)

and a call of head dim ``d`` costs ``3.5·E / (peak · eff_ref(E) · r(d, E))``, ``r``
interpolated linearly in log2(d) between the published head dims (1 at ``d_ref``),
clamped to the nearest outside them (:meth:`GPUSpec.attention_efficiency_at`). A ratio,
not a second curve, so that a reference curve refitted on measured points (calibrate's
long-context timings, head dim 128) keeps the head-dim effect; a calibrated profile
carries no ratio (calibrate times attention at the model's own head dim). cuDNN on H100,
head dim 64: r = 0.87 at 512 tokens (E = 3.4·10¹⁰), 0.82-0.83 from 4k to 16k
(2.7·10¹¹-1.1·10¹²).

Measured error (post hoc, docs/benchmarks/cp_checks.md): on 1 × H200 (cuDNN 9.19, torch 2.11)
calibrate's own attention benchmark ran 0.52-0.55 of peak at 1.1e12-1.8e13 FLOPs (16k-64k
tokens), where the curve from the FlashAttention-3 paper's cuDNN bars holds 0.491 (6-11 %
slow), and −8..+19 % of the curve at 3.4e10-5.5e11. The GPU check's ten cp layouts (4 × H200,
datasheet profile) move from 7.8 % mean / 17.8 % max to 9.3 % / 16.2 %, all too fast: what
they miss lies outside attention. The head-dim ratio (5), post hoc on the cp40 check (8
layouts of a head-dim-64 model, 4 × H200, all too fast by 7-16 %, the gap 0.21 × their
attention time): 11.2 % mean / 15.5 % max → 2.4 % / 6.6 %; head-dim-128 rows unchanged.

**B200** (since 2026-12-05): NVIDIA's sweep of torch SDPA's cuDNN backend on one B200 in the
cuDNN frontend repository (cuDNN 9.13, batch 1, 128 query heads and 8 K/V heads of 128;
``[cudnn-b200-frontend]``, the ``batch`` form of (1)): 0.051 of peak at 8.6·10⁹ FLOPs (512
tokens), 0.18 at 1.4·10¹¹ (2k), 0.44 at 2.2·10¹² (8k), 0.526 at 3.5·10¹³ (32k), then falling
to 0.498 at 5.6·10¹⁴ (128k) as published. No head-dim-64 table for B200: no ratio (5), and
H100's is not borrowed. POST HOC on the published B200 training runs (docs/benchmarks/
published.md; every step time was known before): 14 dense rows 8.3 → 6.8 % mean, 23.6 →
10.9 % max (3.9 % fast → 6.0 % slow on average), 24 MoE rows 16.3 → 15.3 %. The same table
from NVIDIA's later GB200 sweep at cuDNN 9.22 (peak 2500, scratch, not adopted) reads 0.37
at 2k and 0.48 at 4k, 2.1x and 1.5x this one, where these runs' calls sit (5·10¹⁰-10¹²
FLOPs): dense 6.9 % mean / 24.3 % max, MoE 18.1 %; the curve stands for one cuDNN release.
"""

from __future__ import annotations

from typing import Any, Mapping

from meshplan.errors import ProfileError
from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.curve_fit import extend_with_base, sig

FORWARD_BACKWARD_PASSES = 3.5     # forward 1 + backward 2.5 (Dao 2022 §3.1)
_SIZES = ("heads", "head_dim")
_REQUIRED = ("source", "peak_tflops", *_SIZES, "seq", "forward_causal_tflops")
# the sweep's call size: exactly one of them (eq. (1))
_CALL_SIZES = ("tokens", "batch")


def _numbers(table: Mapping[str, Any], key: str, n: int, where: str) -> list[float]:
    vals = table.get(key)
    if (not isinstance(vals, list) or len(vals) != n
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                       for v in vals)):
        raise ProfileError(f"{where}: key {key!r} must be a list of {n} positive numbers (one "
                           f"per entry of 'seq'), got {vals!r}")
    return [float(v) for v in vals]


def _positive(table: Mapping[str, Any], key: str, where: str) -> float:
    v = table[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ProfileError(f"{where}: key {key!r} must be a positive number, got {v!r}")
    return float(v)


def published_points(table: Mapping[str, Any], where: str) -> list[tuple[float, float]]:
    """``(E, eff)`` per published length, eq. (1)-(4); errors name ``where`` and the key."""
    missing = [k for k in _REQUIRED if k not in table]
    if missing:
        raise ProfileError(f"{where}: missing key(s) {missing}; a published attention "
                           f"benchmark needs {list(_REQUIRED)}")
    if not isinstance(table["source"], str) or not table["source"].strip():
        raise ProfileError(f"{where}: key 'source' must name the publication, got "
                           f"{table['source']!r}")
    seq = table["seq"]
    if (not isinstance(seq, list) or not seq
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in seq)
            or seq != sorted(set(seq))):
        raise ProfileError(f"{where}: key 'seq' must be a strictly increasing list of positive "
                           f"integers, got {seq!r}")
    given = [k for k in _CALL_SIZES if k in table]
    if len(given) != 1:
        raise ProfileError(f"{where}: needs exactly one of 'tokens' (batch x sequence length, "
                           f"fixed over the sweep) or 'batch' (fixed batch at every length), "
                           f"got {given or 'neither'}")
    call_size = _positive(table, given[0], where)
    peak, heads, head_dim = (_positive(table, k, where) for k in ("peak_tflops", *_SIZES))
    n = len(seq)
    fwd = _numbers(table, "forward_causal_tflops", n, where)
    if "backward_causal_tflops" in table:
        bwd = _numbers(table, "backward_causal_tflops", n, where)
    elif "backward_tflops" in table and "forward_tflops" in table:
        unmasked_fwd = _numbers(table, "forward_tflops", n, where)
        bwd = [b * f / u for b, f, u in zip(_numbers(table, "backward_tflops", n, where),
                                             fwd, unmasked_fwd)]
    else:
        raise ProfileError(f"{where}: needs 'backward_causal_tflops', or 'backward_tflops' "
                           f"with 'forward_tflops' (both without the causal mask)")
    pts = []
    for s, f, b in zip(seq, fwd, bwd):
        eff = FORWARD_BACKWARD_PASSES / (peak / f + (FORWARD_BACKWARD_PASSES - 1) * peak / b)
        if eff > 1:
            raise ProfileError(f"{where}: at seq {s} the published TFLOP/s exceed "
                               f"peak_tflops {peak:g} (efficiency {eff:.3f})")
        tokens = call_size if given[0] == "tokens" else call_size * s
        pts.append((2.0 * tokens * s * heads * head_dim, sig(eff, 4)))
    return pts


def published_attention_curve(table: Mapping[str, Any], shape: Curve, where: str) -> Curve:
    """The attention curve of a GPU whose profile names ``table``: its published points,
    ``shape``'s points below them scaled to meet the first (module docstring)."""
    full = extend_with_base(published_points(table, where), shape)
    return Curve(tuple((x, sig(y, 4)) for x, y in full.points))


def head_dim_of(table: Mapping[str, Any], where: str) -> int:
    """The head dim a published table was benchmarked at (a positive integer)."""
    d = table.get("head_dim")
    if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
        raise ProfileError(f"{where}: key 'head_dim' must be a positive integer, got {d!r}")
    return d


def head_dim_ratio(table: Mapping[str, Any], reference: Mapping[str, Any], where: str,
                   reference_where: str) -> Curve:
    """Eq. (5): ``table``'s efficiency over ``reference``'s at the same forward FLOPs, at
    ``table``'s published points (``reference``'s curve interpolated there)."""
    ref = Curve(tuple(published_points(reference, reference_where)))
    return Curve(tuple((x, sig(y / ref(x), 4)) for x, y in published_points(table, where)))


__all__ = ["FORWARD_BACKWARD_PASSES", "head_dim_of", "head_dim_ratio", "published_points",
           "published_attention_curve"]
