"""Measured layer tables: what a calibrated profile knows about the executor's own layers.

``meshplan calibrate --model M`` times the executor's transformer block (its tensor-parallel
linears, recomputation and, for ZeRO-2/3, FSDP2 sharding over a data-parallel group) and its
first/last-stage ends (embedding; final norm + logits + loss) at the shapes of model ``M``.
The cost model then takes a layer's forward/backward seconds and activation bytes from these
rows instead of composing them from GEMM/attention/memory-bound curves, so every cost the
curves do not see — unfused element-wise kernels, Python dispatch of small kernels and
collectives, FSDP2's per-layer hooks — is in the prediction. Layouts are never measured:
the rows are per layer and micro-batch, the pipeline, data-parallel and optimizer terms stay
analytical (:mod:`meshplan.costmodel.estimate`). Rows from a calibration with CPU fields
carry GPU-busy seconds plus the CPU's dispatch seconds separately; older rows carry
synchronized timings and no CPU fields, and the cost model then uses them as before.

Rows are matched by the model's *shape key* (every field that changes a layer's work), the
sequence length, tp, sequence parallelism, recompute mode and (FSDP rows) ZeRO stage and dp
size; between measured micro-batch sizes the values are interpolated linearly, outside them
extrapolated from the two nearest (one point: proportional to the micro-batch). A model
whose shape has no row at all reads the nearest timed shape's rows, scaled by the
analytical model (:mod:`meshplan.costmodel.nearest_rows`; :func:`model_from_shape_key` reads
a row's shape back); a layout with no matching row otherwise falls back to the analytical
layer model. The rows and shape keys: :mod:`meshplan.hardware_profiles.measured_rows`; the
interpolation: :mod:`meshplan.hardware_profiles.measured_interp`; both are importable from here.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any, Iterable, Mapping

from meshplan.spec import FP8_RECIPES, ModelSpec
from meshplan.errors import ProfileError
from meshplan.hardware_profiles.measured_interp import (Interpolated, _interp,
                                                        split_backward_at, wgrad_bytes_at)
from meshplan.hardware_profiles.measured_rows import (ENDS, MeasuredEnd, MeasuredLayer,
                                                      ends_shape_key, layer_shape_key,
                                                      model_from_shape_key, ran_fp8_experts)


@dataclass(frozen=True)
class MeasuredTables:
    """The rows of a profile, indexed by everything but the micro-batch."""

    layers: tuple[MeasuredLayer, ...] = ()
    ends: tuple[MeasuredEnd, ...] = ()
    # the share of the rows' sustained_ratio − 1 the lookups add to their GPU seconds (the
    # correction ``sustained_clock``, meshplan.costmodel.clock); 0: as timed, in bursts
    sustained: float = 1.0
    # what the step's duty cycle leaves of the ratio: the ratio is read as ratio × duty_scale
    # (1: a GPU busy back to back, as the ratio was measured; meshplan.costmodel.clock
    # duty_scale)
    duty_scale: float = 1.0

    def __post_init__(self) -> None:
        idx: dict[tuple, list] = {}
        for r in (*self.layers, *self.ends):
            idx.setdefault(r.group, []).append(r)
        for rows in idx.values():
            rows.sort(key=lambda r: r.micro_batch)
        object.__setattr__(self, "_index", idx)
        object.__setattr__(self, "_has_sustained",
                           any(r.sustained_ratio != 1.0 for r in (*self.layers, *self.ends)))

    def __bool__(self) -> bool:
        return bool(self.layers or self.ends)

    def __hash__(self) -> int:
        return hash((len(self.layers), len(self.ends)))

    def layer(self, model: ModelSpec, *, seq_len: int, tp: int, sequence_parallel: bool,
              recompute: str, micro_batch: int, zero: int = 0, dp: int = 1,
              compile: bool = False, ep: int = 1) -> Interpolated | None:
        """The measured bf16 layer for these settings, or None (no row: use the analytical
        model).

        ``zero`` 2/3 with ``dp`` > 1 look for FSDP2 rows of that group size; ZeRO-0/1 (and
        ZeRO-2/3 with dp = 1) use the plain rows. ``compile``: the rows timed compiled.
        ``ep`` > 1: an MoE layer timed with its experts over that many ranks.
        """
        fsdp = zero >= 2 and dp > 1
        return self._layer_row(model, seq_len, tp, sequence_parallel, recompute, micro_batch,
                               zero if fsdp else 0, dp if fsdp else 1, compile, ep=ep)

    def fp8_layer(self, model: ModelSpec, *, recipe: str, seq_len: int, tp: int,
                  sequence_parallel: bool, recompute: str, micro_batch: int,
                  compile: bool = False) -> Interpolated | None:
        """The plain (ZeRO-0) layer timed with the executor's fp8 linears of ``recipe``
        (``meshplan calibrate --fp8-rows``), compiled or not as ``compile`` asks, or None
        where the profile has no such row (the cost model then composes fp8 from the bf16
        row: :mod:`meshplan.costmodel.fp8_cost`). Only rows of the same recipe match.

        Timed at one micro-batch only (a budget cut the others) and asked at another, its
        GPU seconds grow as its bf16 twin's (same settings) grew between those micro-batches
        where the twin was timed at both — the per-call part (launches, weight casts, small
        GEMMs' efficiency) is the layer's, not proportional to the micro-batch (fp8h4's k04,
        2 × H200: the bf16 row grew 1.55× from 4 to 8, the proportional extension 2×). The
        cost model grows such a row its own way, as the fp8 layer composed on the bf16 rows
        grows (``costmodel.parts.grown_fp8_row``: 5.4 % mean against this growth's 10.4 %
        over 166 pairs of stored rows); this growth stands where it cannot.

        An MoE layer's rows timed with the experts' weights cast beforehand
        (``fp8_weights_cached``) are preferred to rows that cast them in every pass; the
        returned row says which it is."""
        # an MoE layer's row counts where its experts ran as the executor runs them now
        experts = ran_fp8_experts(model, "fp8", recipe)
        for cached in ((True, False) if experts else (False,)):
            row = self._layer_row(model, seq_len, tp, sequence_parallel, recompute,
                                  micro_batch, 0, 1, compile, ("fp8", recipe), experts=experts,
                                  cached=cached)
            if row is not None:
                break
        if row is None or len(row.extended_from) != 1:
            return row
        timed = row.extended_from[0]
        twin = [self._layer_row(model, seq_len, tp, sequence_parallel, recompute, mb, 0, 1,
                                compile) for mb in (timed, micro_batch)]
        if None in twin or twin[1].extended_from or twin[0].forward_s <= 0 \
                or twin[0].backward_s <= 0:
            return row
        at = self._layer_row(model, seq_len, tp, sequence_parallel, recompute, timed, 0, 1,
                             compile, ("fp8", recipe), experts=experts, cached=cached)
        kf, kb = (twin[1].forward_s / twin[0].forward_s, twin[1].backward_s / twin[0].backward_s)
        return replace(row, forward_s=at.forward_s * kf, backward_s=at.backward_s * kb)

    @property
    def has_fp8(self) -> bool:
        return any(r.precision == "fp8" for r in self.layers)

    @property
    def has_compiled(self) -> bool:
        """Whether any layer row was timed compiled (the planner searches Layout.compile
        only then)."""
        return any(r.compile for r in self.layers)

    def compiled_settings(self, model: ModelSpec, seq_len: int) -> frozenset:
        """The (tp, sequence parallel, recompute) settings at which the profile timed this
        model's layer shape compiled at ``seq_len`` (compiled rows are not transferred to
        other shapes: :mod:`meshplan.costmodel.nearest_rows`)."""
        return frozenset((r.tp, r.sequence_parallel, r.recompute)
                         for r in self._compiled_rows(model, seq_len) if r.ep == 1)

    def eager_settings(self, model: ModelSpec, seq_len: int) -> frozenset:
        """The (tp, sequence parallel, recompute) settings of this model's plain (ZeRO-0,
        ep 1, bf16) layer rows timed eager at ``seq_len``."""
        key = layer_shape_key(model)
        return frozenset((r.tp, r.sequence_parallel, r.recompute) for r in self.layers
                         if not r.compile and r.shape == key and r.seq_len == seq_len
                         and r.zero == 0 and r.ep == 1 and r.precision == "bf16")

    def compiled_ep_settings(self, model: ModelSpec, seq_len: int) -> frozenset:
        """The (tp, sequence parallel, recompute, ep) settings, ep > 1, at which the profile
        timed this MoE model's layer compiled with its experts over ep ranks."""
        return frozenset((r.tp, r.sequence_parallel, r.recompute, r.ep)
                         for r in self._compiled_rows(model, seq_len) if r.ep > 1)

    def _compiled_rows(self, model: ModelSpec, seq_len: int):
        key = layer_shape_key(model)
        return (r for r in self.layers if r.compile and r.shape == key and r.seq_len == seq_len)

    def fsdp_compute_layer(self, model: ModelSpec, *, seq_len: int, tp: int,
                           sequence_parallel: bool, recompute: str, micro_batch: int
                           ) -> Interpolated | None:
        """FSDP2's compute alone: the ZeRO-2 row timed on a 1-rank mesh (bf16 parameters
        without autocast, no gather or reduce-scatter, held unsharded like a pipeline
        stage's), or None where the profile has none (calibrations before round 18)."""
        return self._layer_row(model, seq_len, tp, sequence_parallel, recompute, micro_batch,
                               2, 1)

    def _layer_row(self, model: ModelSpec, seq_len: int, tp: int, sequence_parallel: bool,
                   recompute: str, micro_batch: int, zero: int, dp: int,
                   compile: bool = False, precision: tuple[str, str] = ("bf16", ""),
                   ep: int = 1, experts: bool = False,
                   cached: bool = False) -> Interpolated | None:
        """The rows of exactly this group (:attr:`MeasuredLayer.group`) at ``micro_batch``;
        ``precision``: (precision, fp8 recipe); ``experts``, ``cached``: their fp8_experts
        and fp8_weights_cached."""
        key = (layer_shape_key(model), seq_len, tp, bool(sequence_parallel and tp > 1),
               recompute, zero, dp, bool(compile), *precision, ep, experts, cached)
        rows = self._index.get(key)  # type: ignore[attr-defined]
        return self._at_clock(rows, _interp(rows, micro_batch, "backward_peak_bytes"),
                              micro_batch) if rows else None

    def _at_clock(self, rows: list, r: Interpolated, micro_batch: int) -> Interpolated:
        """``r``'s GPU seconds times 1 + share × (max(1, ratio × duty_scale) − 1), the
        sustained ratio of the row nearest ``micro_batch`` (a module's rows share one:
        :mod:`meshplan.calibrate.sustained`); CPU seconds and bytes unchanged."""
        ratio = min(rows, key=lambda row: abs(row.micro_batch - micro_batch)).sustained_ratio
        # a ratio below 1 is not a clock (which only drops under load) but the loop's warm
        # caches (an embedding's gather back to back: 0.93), which a step's one pass per
        # micro-batch does not get (duty_scale ≤ 1 only lowers it further)
        k = 1.0 + self.sustained * (max(1.0, ratio * self.duty_scale) - 1.0)
        if ratio == 1.0 and self._has_sustained:  # type: ignore[attr-defined]
            r = replace(r, clock_unmeasured=True)
        if k == 1.0:
            return r
        return replace(r, forward_s=r.forward_s * k, backward_s=r.backward_s * k,
                       backward_input_s=r.backward_input_s * k,
                       backward_weight_s=r.backward_weight_s * k)

    @property
    def has_sustained(self) -> bool:
        """Whether any row carries a measured sustained ratio other than 1."""
        return self._has_sustained  # type: ignore[attr-defined]

    def at_share(self, share: float, duty_scale: float = 1.0) -> "MeasuredTables":
        """These rows with ``share`` of their sustained ratio's excess applied (0: at the
        clock they were timed at), each ratio first scaled by ``duty_scale`` (a step that
        idles part of the time). A shallow copy: it shares the rows' index, which depends on
        neither (the cost model asks for it on every tables lookup)."""
        if share == self.sustained and duty_scale == self.duty_scale:
            return self
        out = copy.copy(self)
        object.__setattr__(out, "sustained", float(share))
        object.__setattr__(out, "duty_scale", float(duty_scale))
        return out

    def fsdp_layer(self, model: ModelSpec, *, seq_len: int, tp: int, sequence_parallel: bool,
                   recompute: str, micro_batch: int, zero: int, dp: int, ep: int = 1,
                   compile: bool = False) -> tuple[Interpolated | None, bool]:
        """An FSDP2 layer (ZeRO-2/3 over ``dp`` > 1) and whether it was composed; ``ep`` > 1:
        an MoE layer timed under FSDP2 with its experts over that many ranks; ``compile``:
        the profile's row timed with the blocks compiled, or None (never composed).

        The profile's own row where it has one. Calibrations before round 8 timed FSDP2 on
        tp = 1 only, so for tp > 1 (FSDP2 over dp of tensor-parallel layers, a 2-D mesh)
        without a measured row the row is composed
        from three measured ones: the plain tp row plus what FSDP2 adds to the plain tp = 1
        row. FSDP2's per-layer hooks (pre-forward gather, post-backward reduce-scatter) cost
        the CPU per FSDP unit, whatever the tensor-parallel split of its parameters, so their
        CPU seconds are carried over as a difference; activation bytes scale by the tp = 1
        ratio (FSDP2 runs in bf16 without autocast's fp32 copies; the ratio is per element,
        so it holds for tp-sharded activations). GPU seconds stay the plain tp row's: the
        caller adds the gather/reduce analytically (their bytes shrink with tp). (None,
        False) where a row is missing."""
        row = self.layer(model, seq_len=seq_len, tp=tp, sequence_parallel=sequence_parallel,
                         recompute=recompute, micro_batch=micro_batch, zero=zero, dp=dp, ep=ep,
                         compile=compile)
        if row is not None or tp == 1 or compile:
            return row, False
        kw = dict(seq_len=seq_len, recompute=recompute, micro_batch=micro_batch, ep=ep)
        fsdp1 = self.layer(model, tp=1, sequence_parallel=False, zero=zero, dp=dp, **kw)
        plain1 = self.layer(model, tp=1, sequence_parallel=False, **kw)
        plain = self.layer(model, tp=tp, sequence_parallel=sequence_parallel, **kw)
        if fsdp1 is None or plain1 is None or plain is None or plain1.activation_bytes <= 0:
            return None, False
        ratio = fsdp1.activation_bytes / plain1.activation_bytes

        def added(name: str) -> float:
            return max(0.0, getattr(plain, name) + getattr(fsdp1, name) - getattr(plain1, name))
        cpu_known = fsdp1.cpu_measured and plain1.cpu_measured and plain.cpu_measured
        cpu = {n: added(n) if cpu_known else 0.0 for n in (
            "forward_cpu_s", "backward_cpu_s", "forward_cpu_fixed_s", "backward_cpu_fixed_s")}
        return Interpolated(plain.forward_s, plain.backward_s, plain.activation_bytes * ratio,
                            plain.peak_bytes, **cpu), True

    def end(self, model: ModelSpec, part: str, *, seq_len: int, tp: int,
            sequence_parallel: bool, micro_batch: int,
            compile: bool = False) -> Interpolated | None:
        """The measured embedding or output layer, or None. ``compile``: the output row
        timed with the compiled loss where the profile has one (``compiled_loss`` set), else
        the eager row."""
        key = (ends_shape_key(model), part, seq_len, tp, bool(sequence_parallel and tp > 1))
        compiled = compile and self._index.get((*key, True))  # type: ignore[attr-defined]
        rows = compiled or self._index.get((*key, False))  # type: ignore[attr-defined]
        if not rows:
            return None
        row = self._at_clock(rows, _interp(rows, micro_batch, "peak_bytes"), micro_batch)
        return replace(row, compiled_loss=True) if compiled else row

    def without_shape(self, layer_key: str) -> "MeasuredTables":
        """These tables less every row of the layer shape ``layer_key`` (its layers, and the
        ends of every vocabulary over it): what a profile that never timed that model holds
        (benchmarks/transfer_analysis.py's leave-shape-out re-prediction)."""
        return MeasuredTables(tuple(r for r in self.layers if r.shape != layer_key),
                              tuple(e for e in self.ends
                                    if not e.shape.startswith(layer_key + "-v")),
                              self.sustained, self.duty_scale)

    def to_rows(self, *, compact: bool = False) -> dict[str, list[dict[str, Any]]]:
        """The rows as dicts (:func:`tables_from_rows` reads them back); ``compact`` leaves
        out fields at their defaults (plan files keep the rows this way)."""
        return {"layers": [_asdict(r, compact) for r in self.layers],
                "ends": [_asdict(r, compact) for r in self.ends]}


def _asdict(r, compact: bool = False) -> dict[str, Any]:
    return {f.name: getattr(r, f.name) for f in fields(r)
            if not compact or f.default is MISSING or getattr(r, f.name) != f.default}


def _row(cls, raw: Mapping[str, Any], where: str):
    names = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {unknown}; expected {sorted(names)}")
    try:
        r = cls(**dict(raw))
    except TypeError as exc:
        missing = sorted(n for n, f in names.items() if n not in raw
                         and f.default is MISSING and f.default_factory is MISSING)
        raise ProfileError(f"{where}: missing key(s) {missing} ({exc})") from None
    for k in ("forward_s", "backward_s", "activation_bytes", "forward_cpu_s", "backward_cpu_s",
              "backward_input_cpu_s", "backward_weight_cpu_s", "backward_input_sync_s",
              "backward_weight_sync_s", "forward_cpu_fixed_s", "backward_cpu_fixed_s",
              "forward_cpu_deep_s", "backward_cpu_deep_s", "wgrad_pending_bytes",
              "wgrad_transient_bytes", "routed_imbalance"):
        v = getattr(r, k, 0.0)
        if not isinstance(v, (int, float)) or v < 0:
            raise ProfileError(f"{where}: {k} must be a number >= 0, got {v!r}")
    v = getattr(r, "sustained_ratio", 1.0)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
        raise ProfileError(f"{where}: sustained_ratio must be a number > 0, got {v!r}")
    for k in ("backward_input_depth_s", "backward_weight_depth_s",
              "wgrad_pending_stage_bytes", "wgrad_transient_stage_bytes"):
        v = getattr(r, k, 0.0)
        if not isinstance(v, (int, float)):
            raise ProfileError(f"{where}: {k} must be a number, got {v!r}")
    for k in ("compile", "fp8_experts", "fp8_weights_cached"):
        v = getattr(r, k, False)
        if not isinstance(v, bool):
            raise ProfileError(f"{where}: {k} must be true or false, got {v!r}")
    if getattr(r, "fp8_weights_cached", False) and not r.fp8_experts:
        raise ProfileError(f"{where}: fp8_weights_cached = true needs fp8_experts = true (only "
                           "fp8 routed experts cache their weights' casts)")
    if cls is MeasuredLayer:
        _check_precision(r, where)
    for k in ("split_layers", "wgrad_memory_layers", "cpu_deep_layers"):
        v = getattr(r, k, 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ProfileError(f"{where}: {k} must be an integer >= 0, got {v!r}")
    for k in ("seq_len", "tp", "micro_batch", "ep"):
        v = getattr(r, k, 1)
        if not isinstance(v, int) or v < 1:
            raise ProfileError(f"{where}: {k} must be an integer >= 1, got {v!r}")
    return r


def _check_precision(r: MeasuredLayer, where: str) -> None:
    if r.precision not in ("bf16", "fp8"):
        raise ProfileError(f"{where}: precision must be 'bf16' or 'fp8', got {r.precision!r}")
    if r.precision == "fp8" and r.fp8_recipe not in FP8_RECIPES:
        raise ProfileError(f"{where}: an fp8 row needs fp8_recipe, one of "
                           f"{list(FP8_RECIPES)}; got {r.fp8_recipe!r}")
    if r.precision == "bf16" and r.fp8_recipe:
        raise ProfileError(f"{where}: fp8_recipe {r.fp8_recipe!r} applies only to rows with "
                           f"precision = 'fp8'")
    if r.precision == "fp8" and r.zero:
        raise ProfileError(f"{where}: fp8 rows are plain (zero = 0) rows, got zero = {r.zero}")


def tables_from_rows(layers: Iterable[Mapping[str, Any]], ends: Iterable[Mapping[str, Any]],
                     where: str) -> MeasuredTables:
    """Parse ``[[layers]]`` / ``[[ends]]`` rows of a profile; errors name the row."""
    ls = tuple(_row(MeasuredLayer, r, f"{where} [[layers]] #{i + 1}")
               for i, r in enumerate(layers))
    es = tuple(_row(MeasuredEnd, r, f"{where} [[ends]] #{i + 1}") for i, r in enumerate(ends))
    for i, e in enumerate(es):
        if e.part not in ENDS:
            raise ProfileError(f"{where} [[ends]] #{i + 1}: part {e.part!r} is not one of {ENDS}")
    return MeasuredTables(ls, es)


__all__ = ["split_backward_at", "wgrad_bytes_at", "MeasuredLayer", "MeasuredEnd",
           "MeasuredTables", "Interpolated", "model_from_shape_key",
           "layer_shape_key", "ends_shape_key", "tables_from_rows"]
