"""Read GPU and cluster profiles from TOML, naming the file, key and expected type on error."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from meshplan.errors import ProfileError
from meshplan.hardware_profiles.attention_published import (head_dim_of, head_dim_ratio,
                                                            published_attention_curve)
from meshplan.hardware_profiles.builtin_data import builtin_table
from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.grouped_gemm import GROUPED_GEMM_KEYS
from meshplan.hardware_profiles.gpu import (DEFAULT_OVERLAP_INTERFERENCE, FP8_CAST_KEYS, HOST_KEYS,
                                           GPUSpec)

_NUM = (int, float)


def read_toml(path: str | Path, what: str = "profile file") -> dict[str, Any]:
    path = Path(path)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ProfileError(f"{what} {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise ProfileError(f"{what} {str(path)!r} is a directory; give the path of a .toml "
                           f"file") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{what} {str(path)!r} is not UTF-8 text (byte "
                           f"{exc.object[exc.start]:#04x} at offset {exc.start}); TOML files "
                           f"must be UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{what} {str(path)!r} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ProfileError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None


def get(table: Mapping[str, Any], key: str, kind: type | tuple, where: str,
        default: Any = ...) -> Any:
    """``table[key]`` checked against ``kind``; ``where`` = 'file [section]' for messages."""
    if key not in table:
        if default is ...:
            raise ProfileError(f"{where}: missing key {key!r}")
        return default
    value = table[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (_NUM, int, float))
    if not ok:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ProfileError(f"{where}: key {key!r} must be {names}, got {value!r}")
    return value


def _grouped_key(table: Mapping[str, Any], where: str) -> str:
    """``grouped_gemm_key``: absent (files written before it) means "expert" (GPUSpec)."""
    key = get(table, "grouped_gemm_key", str, where, "expert")
    if key not in GROUPED_GEMM_KEYS:
        raise ProfileError(f"{where}: grouped_gemm_key must be one of "
                           f"{', '.join(map(repr, GROUPED_GEMM_KEYS))}, got {key!r}")
    if "grouped_fp8_gemm_efficiency" in table and key != "call":
        raise ProfileError(f"{where}: grouped_fp8_gemm_efficiency is keyed by the call; it "
                           f"needs grouped_gemm_key = \"call\", got {key!r}")
    return key


def _permute_by_top_k(table: Mapping[str, Any], where: str) -> Curve | None:
    """``moe_permute_efficiency_by_top_k`` (GPUSpec): [top-k, HBM efficiency] pairs, each
    efficiency in (0, 1]; None where absent."""
    key = "moe_permute_efficiency_by_top_k"
    if key not in table:
        return None
    c = curve(table, key, where)
    if not all(k >= 1 and 0 < e <= 1 for k, e in c.points):
        raise ProfileError(f"{where}: {key} must pair a top-k >= 1 with an efficiency in "
                           f"(0, 1], got {c.to_list()!r}")
    return c


def curve(table: Mapping[str, Any], key: str, where: str) -> Curve:
    pts = get(table, key, list, where)
    if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(v, _NUM) for v in p)
               for p in pts):
        raise ProfileError(f"{where}: key {key!r} must be a list of [size, value] number pairs, "
                           f"got {pts!r}")
    try:
        return Curve(tuple((p[0], p[1]) for p in pts))
    except ProfileError as exc:
        raise ProfileError(f"{where}: key {key!r}: {exc}") from None


def efficiency_curve(table: Mapping[str, Any], key: str, where: str) -> Curve:
    """:func:`curve` for a fraction of a peak: every value in (0, 1] (a 0 would price an
    operation at infinite time, a value above 1 faster than the hardware)."""
    c = curve(table, key, where)
    outside = [v for _, v in c.points if not 0 < v <= 1]
    if outside:
        raise ProfileError(f"{where}: key {key!r} holds efficiencies, fractions of the peak in "
                           f"(0, 1]; got {outside[0]!r} in {c.to_list()!r}")
    return c


def gpu_from_table(name: str, t: Mapping[str, Any], where: str) -> GPUSpec:
    peaks = get(t, "peak_tflops", dict, where)
    for k, v in peaks.items():
        if not isinstance(v, _NUM) or v < 0:
            raise ProfileError(f"{where}: peak_tflops.{k} must be a non-negative number, got {v!r}")
    positive = {"memory_bytes": get(t, "memory_bytes", int, where),
                "hbm_gbps": get(t, "hbm_gbps", _NUM, where),
                "nvlink_gbps": get(t, "nvlink_gbps", _NUM, where)}
    for k, v in positive.items():
        if v <= 0:
            raise ProfileError(f"{where}: key {k!r} must be positive, got {v!r}")
    optional = {k: float(get(t, k, _NUM, where, 0.0)) for k in FP8_CAST_KEYS + HOST_KEYS}
    for k, v in optional.items():
        if v < 0:
            raise ProfileError(f"{where}: key {k!r} must be >= 0 (0: not measured), got {v!r}")
    rerun = float(get(t, "compiled_full_rerun_share", _NUM, where, 0.0))
    if not 0 <= rerun <= 1:
        raise ProfileError(f"{where}: compiled_full_rerun_share must be in [0, 1] (0: not "
                           f"measured, the whole forward re-run), got {rerun!r}")
    hbm_eff = get(t, "hbm_efficiency", _NUM, where)
    if not 0 < hbm_eff <= 1:
        raise ProfileError(f"{where}: hbm_efficiency must be in (0, 1], got {hbm_eff!r}")
    ops = get(t, "membound_efficiency", dict, where, {})
    for k, v in ops.items():
        if isinstance(v, bool) or not isinstance(v, _NUM) or not 0 < v <= 1:
            raise ProfileError(f"{where}: membound_efficiency.{k} must be a number in (0, 1], "
                               f"got {v!r}")
    return GPUSpec(
        name=name, peak_tflops=dict(peaks), **positive,
        membound_efficiency={str(k): float(v) for k, v in ops.items()},
        gemm_efficiency=efficiency_curve(t, "gemm_efficiency", where),
        attention_efficiency=attention_curve(t, where),
        **attention_head_dims(t, where),
        hbm_efficiency=float(hbm_eff),
        nvlink_efficiency=efficiency_curve(t, "nvlink_efficiency", where),
        provenance=str(t.get("provenance", "datasheet")),
        layer_overhead_s=float(get(t, "layer_overhead_s", _NUM, where, 0.0)),
        microbatch_overhead_s=float(get(t, "microbatch_overhead_s", _NUM, where, 0.0)),
        pipeline_action_s=float(get(t, "pipeline_action_s", _NUM, where, 0.0)),
        optimizer_gbps=float(get(t, "optimizer_gbps", _NUM, where, 0.0)),
        overlap_interference=float(get(t, "overlap_interference", _NUM, where,
                                       DEFAULT_OVERLAP_INTERFERENCE)),
        ddp_overlap_interference=(float(get(t, "ddp_overlap_interference", _NUM, where))
                                  if "ddp_overlap_interference" in t else None),
        fp8_gemm_efficiency=(efficiency_curve(t, "fp8_gemm_efficiency", where)
                             if "fp8_gemm_efficiency" in t else None),
        **optional,
        fp8_torch_recipes=_names(t, "fp8_torch_recipes", where),
        **_block_shares(t, where),
        compiled_full_rerun_share=rerun,
        grouped_gemm_efficiency=(efficiency_curve(t, "grouped_gemm_efficiency", where)
                                 if "grouped_gemm_efficiency" in t else None),
        grouped_gemm_key=_grouped_key(t, where),
        grouped_fp8_gemm_efficiency=(efficiency_curve(t, "grouped_fp8_gemm_efficiency", where)
                                     if "grouped_fp8_gemm_efficiency" in t else None),
        moe_permute_efficiency_by_top_k=_permute_by_top_k(t, where),
        nvlink_broadcast_efficiency=(efficiency_curve(t, "nvlink_broadcast_efficiency", where)
                                     if "nvlink_broadcast_efficiency" in t else None),
        nvlink_all_to_all_efficiency=(efficiency_curve(t, "nvlink_all_to_all_efficiency", where)
                                      if "nvlink_all_to_all_efficiency" in t else None),
        microbench_timing=_timing(t, where),
    )


def _block_shares(t: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``fp8_cast_compiled_block_share_family`` (a string) and
    ``fp8_cast_compiled_block_share_by_family`` (``[[family, share], ...]``, each share in
    (0, 1]) of a GPU table, where present."""
    out: dict[str, Any] = {}
    fam = t.get("fp8_cast_compiled_block_share_family", "")
    if not isinstance(fam, str):
        raise ProfileError(f"{where}: fp8_cast_compiled_block_share_family must be a string "
                           f"(a layer family such as \"swiglu-rmsnorm-nobias\"), got {fam!r}")
    if fam:
        out["fp8_cast_compiled_block_share_family"] = fam
    pairs = t.get("fp8_cast_compiled_block_share_by_family")
    if pairs is None:
        return out
    ok = isinstance(pairs, list) and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
        and isinstance(p[1], _NUM) and not isinstance(p[1], bool) and 0 < p[1] <= 1
        for p in pairs)
    if not ok:
        raise ProfileError(f"{where}: fp8_cast_compiled_block_share_by_family must be a list "
                           f"of [family, share] pairs with each share in (0, 1], e.g. "
                           f"[[\"gelu-layernorm-bias\", 0.42]], got {pairs!r}")
    out["fp8_cast_compiled_block_share_by_family"] = tuple((f, float(v)) for f, v in pairs)
    return out


MICROBENCH_TIMINGS = ("", "queued")


def _timing(t: Mapping[str, Any], where: str) -> str:
    """``microbench_timing`` (GPUSpec): "queued", or absent."""
    v = t.get("microbench_timing", "")
    if v not in MICROBENCH_TIMINGS:
        raise ProfileError(f"{where}: microbench_timing must be \"queued\" or absent "
                           f"(synchronized timings), got {v!r}")
    return str(v)


def attention_curve(t: Mapping[str, Any], where: str) -> Curve:
    """``attention_efficiency``, or, where the table names a published kernel benchmark
    (``attention_published``, a table of data/attention_kernels.toml), the curve derived
    from it with ``attention_efficiency`` as the shape below its range
    (:mod:`meshplan.hardware_profiles.attention_published`)."""
    shape = efficiency_curve(t, "attention_efficiency", where)
    if "attention_published" not in t:
        return shape
    name = get(t, "attention_published", str, where)
    kernels = builtin_table("attention_kernels.toml")
    if name not in kernels:
        raise ProfileError(f"{where}: attention_published {name!r} is not a table of the "
                           f"built-in attention_kernels.toml; known: {', '.join(kernels)}")
    return published_attention_curve(kernels[name], shape,
                                     f"built-in attention_kernels.toml [{name}]")


def attention_head_dims(t: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``attention_head_dim`` and ``attention_head_dim_ratio`` of a GPU table: from the
    published tables it names (``attention_published`` the reference,
    ``attention_published_head_dims`` the others; attention_published.py eq. (5)), or as a
    plan file stores them; empty where the table has neither."""
    if "attention_head_dim_ratio" in t:
        ref = get(t, "attention_head_dim", int, where)
        return {"attention_head_dim": ref, "attention_head_dim_ratio": tuple(
            _head_dim_curves(t, "attention_head_dim_ratio", where).items())}
    names = _names(t, "attention_published_head_dims", where)
    # head dims measured on the GPU itself against the reference table's (benchmarks/
    # attention_head_dim_gpu.py), added to (or replacing) the published ratios
    measured = _head_dim_curves(t, "attention_head_dim_ratio_measured", where)
    if not names:
        if measured:
            raise ProfileError(f"{where}: attention_head_dim_ratio_measured needs "
                               f"attention_published_head_dims (the ratios are to the "
                               f"published reference head dim)")
        return {}
    if "attention_published" not in t:
        raise ProfileError(f"{where}: attention_published_head_dims needs attention_published "
                           f"(the reference table the others are ratios to)")
    kernels = builtin_table("attention_kernels.toml")
    ref_name = get(t, "attention_published", str, where)
    unknown = [n for n in names if n not in kernels]
    if unknown:
        raise ProfileError(f"{where}: attention_published_head_dims {unknown} are not tables "
                           f"of the built-in attention_kernels.toml; known: "
                           f"{', '.join(kernels)}")
    tw = {n: f"built-in attention_kernels.toml [{n}]" for n in (ref_name, *names)}
    ref_dim = head_dim_of(kernels[ref_name], tw[ref_name])
    ratios = []
    for n in names:
        d = head_dim_of(kernels[n], tw[n])
        if d == ref_dim or d in (r[0] for r in ratios):
            raise ProfileError(f"{where}: attention_published_head_dims {n!r} repeats head dim "
                               f"{d} (each table must add a new head dim)")
        ratios.append((d, head_dim_ratio(kernels[n], kernels[ref_name], tw[n],
                                         tw[ref_name])))
    ratios = [r for r in ratios if r[0] not in measured] + list(measured.items())
    return {"attention_head_dim": ref_dim, "attention_head_dim_ratio": tuple(sorted(ratios))}


def _head_dim_curves(t: Mapping[str, Any], key: str, where: str) -> dict[int, Any]:
    """Key ``key``'s [head_dim, [[flops, ratio], ...]] pairs as {head dim: ratio curve}
    (empty where the table has no such key)."""
    rows = get(t, key, list, where, [])
    if not all(isinstance(r, list) and len(r) == 2 and isinstance(r[0], int) for r in rows):
        raise ProfileError(f"{where}: key {key!r} must be a list of "
                           f"[head_dim, [[flops, ratio], ...]] pairs, got {rows!r}")
    return {d: curve({"r": c}, "r", f"{where} {key}[{d}]") for d, c in rows}


def _names(t: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    names = get(t, key, list, where, [])
    if not all(isinstance(n, str) for n in names):
        raise ProfileError(f"{where}: key {key!r} must be a list of strings, got {names!r}")
    return tuple(names)


def builtin_gpu(name: str) -> GPUSpec:
    from meshplan.errors import unknown_name_error
    table = builtin_table("gpus.toml")
    if name not in table:
        raise unknown_name_error("GPU", name, table)
    return gpu_from_table(name, table[name], f"built-in gpus.toml [{name}]")


def builtin_gpu_names() -> list[str]:
    return list(builtin_table("gpus.toml"))
