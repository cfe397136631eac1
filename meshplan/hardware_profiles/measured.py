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
layer model.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, fields
from typing import Any, Iterable, Mapping

from meshplan.spec import ModelSpec
from meshplan.errors import MeshplanError, ProfileError

ENDS = ("embedding", "output")


def layer_shape_key(model: ModelSpec) -> str:
    """Every ModelSpec field that changes one transformer layer's work or memory."""
    return (f"h{model.hidden_size}-f{model.ffn_hidden_size}-q{model.num_heads}"
            f"-kv{model.num_kv_heads}-d{model.head_dim}-{model.activation}-{model.norm}"
            f"-{model.position_embedding}-{'bias' if model.bias else 'nobias'}"
            f"-drop{model.dropout:g}")


_SHAPE_KEY = re.compile(
    r"h(?P<h>\d+)-f(?P<f>\d+)-q(?P<q>\d+)-kv(?P<kv>\d+)-d(?P<d>\d+)-(?P<act>[a-z0-9]+)"
    r"-(?P<norm>[a-z]+)-(?P<pos>[a-z]+)-(?P<bias>bias|nobias)-drop(?P<drop>[0-9.e+-]+)"
    r"(?:-v(?P<v>\d+)-(?P<tied>tied|untied))?$")


def model_from_shape_key(key: str, *, num_layers: int = 1) -> ModelSpec | None:
    """A ModelSpec of the layer (and, for an ends key, vocabulary) shape a row was timed at,
    or None for a key this version does not read: what
    :mod:`meshplan.costmodel.nearest_rows` scales another shape's rows from."""
    m = _SHAPE_KEY.match(key)
    if m is None:
        return None
    try:
        return ModelSpec(name=key, num_layers=num_layers, hidden_size=int(m["h"]),
                         ffn_hidden_size=int(m["f"]), num_heads=int(m["q"]),
                         num_kv_heads=int(m["kv"]), head_dim=int(m["d"]),
                         vocab_size=int(m["v"] or 32000), activation=m["act"],
                         norm=m["norm"], position_embedding=m["pos"],
                         bias=m["bias"] == "bias", dropout=float(m["drop"]) > 0,
                         tied_embeddings=m["tied"] != "untied")
    except (MeshplanError, TypeError, ValueError):
        return None


def ends_shape_key(model: ModelSpec) -> str:
    """The layer key plus what the embedding and output layer add (vocabulary, tying)."""
    return (f"{layer_shape_key(model)}-v{model.vocab_size}"
            f"-{'tied' if model.tied_embeddings else 'untied'}")


@dataclass(frozen=True, kw_only=True)
class MeasuredLayer:
    """One transformer layer, one micro-batch, on one GPU (seconds and bytes per layer)."""

    shape: str                  # layer_shape_key(model)
    seq_len: int
    tp: int
    sequence_parallel: bool
    recompute: str
    micro_batch: int
    zero: int = 0               # 0: parameters local (ZeRO-0/1); 2/3: FSDP2 over ``dp`` ranks
    dp: int = 1
    forward_s: float
    backward_s: float           # includes the recomputation
    activation_bytes: float     # kept from forward to backward
    backward_peak_bytes: float  # working memory of one layer's backward above what is kept
    model: str = ""             # the model it was measured for (information only)
    # zero-bubble's split backward (input gradients, then weight gradients; 0: not measured)
    backward_input_s: float = 0.0
    backward_weight_s: float = 0.0
    # CPU time to dispatch the forward / backward (0: not measured; then forward_s and
    # backward_s are synchronized timings, which are max(CPU, GPU) rather than GPU time)
    forward_cpu_s: float = 0.0
    backward_cpu_s: float = 0.0
    # the split backward's CPU dispatch (0: not measured; then backward_input_s and
    # backward_weight_s are synchronized timings, else GPU-busy ones)
    backward_input_cpu_s: float = 0.0
    backward_weight_cpu_s: float = 0.0
    # the stack the split backward was timed on, and how much its B / W per layer grow per
    # extra layer in a stage (torch's W walks the rest of the stage's graph once per
    # parameter group: CPU time, so these are the CPU fields' growth where those exist;
    # 0: not measured, no growth)
    split_layers: int = 0
    backward_input_depth_s: float = 0.0
    backward_weight_depth_s: float = 0.0
    # where the split was timed queued: its synchronized timing on the same stack, kept for
    # comparison (not used by the cost model; 0: not measured)
    backward_input_sync_s: float = 0.0
    backward_weight_sync_s: float = 0.0
    # CPU dispatch of one forward / backward call that does not grow with the blocks in it
    # (timed on two stack depths); forward_cpu_s / backward_cpu_s are then the per-layer
    # rest. 0: not measured (the per-layer fields then hold it, spread over the stack)
    forward_cpu_fixed_s: float = 0.0
    backward_cpu_fixed_s: float = 0.0
    # zero-bubble with full recomputation, per layer: what a micro-batch keeps between its
    # B and its W, and what W needs while it runs (measured on the deep split stack,
    # meshplan/calibrate/split_memory.py; 0: not measured, the cost model's constants)
    wgrad_pending_bytes: float = 0.0
    wgrad_transient_bytes: float = 0.0
    # ... the stack they were measured on, and the part of a stage's total that does not
    # grow with its layers (from a second, shallower stack; see wgrad_bytes_at; 0: not
    # measured, the per-layer values then hold at every depth)
    wgrad_memory_layers: int = 0
    wgrad_pending_stage_bytes: float = 0.0
    wgrad_transient_stage_bytes: float = 0.0
    # timed with every block torch.compile'd, as the executor runs Layout.compile (`meshplan
    # calibrate --compile-rows`; compile time kept out of the timed iterations)
    compile: bool = False

    @property
    def group(self) -> tuple:
        return (self.shape, self.seq_len, self.tp, self.sequence_parallel, self.recompute,
                self.zero, self.dp if self.zero >= 2 else 1, self.compile)


@dataclass(frozen=True, kw_only=True)
class MeasuredEnd:
    """The embedding (first stage) or the output (last stage: final norm, logits, loss)."""

    shape: str                  # ends_shape_key(model)
    part: str                   # "embedding" | "output"
    seq_len: int
    tp: int
    sequence_parallel: bool
    micro_batch: int
    forward_s: float
    backward_s: float
    activation_bytes: float     # kept from forward to backward, per micro-batch
    peak_bytes: float           # working memory of forward + backward above what is kept
    model: str = ""
    forward_cpu_s: float = 0.0  # as MeasuredLayer
    backward_cpu_s: float = 0.0

    @property
    def group(self) -> tuple:
        return (self.shape, self.part, self.seq_len, self.tp, self.sequence_parallel)


@dataclass(frozen=True)
class Interpolated:
    forward_s: float
    backward_s: float
    activation_bytes: float
    peak_bytes: float
    backward_input_s: float = 0.0
    backward_weight_s: float = 0.0
    forward_cpu_s: float = 0.0
    backward_cpu_s: float = 0.0
    backward_input_cpu_s: float = 0.0
    backward_weight_cpu_s: float = 0.0
    split_layers: float = 0.0
    backward_input_depth_s: float = 0.0
    backward_weight_depth_s: float = 0.0
    forward_cpu_fixed_s: float = 0.0
    backward_cpu_fixed_s: float = 0.0
    wgrad_pending_bytes: float = 0.0
    wgrad_transient_bytes: float = 0.0
    wgrad_memory_layers: float = 0.0
    wgrad_pending_stage_bytes: float = 0.0
    wgrad_transient_stage_bytes: float = 0.0

    @property
    def cpu_measured(self) -> bool:
        return self.forward_cpu_s > 0 and self.backward_cpu_s > 0

    @property
    def split_backward(self) -> tuple[float, float] | None:
        """(input-gradient s, weight-gradient s) of zero-bubble's split backward, if measured."""
        if self.backward_input_s > 0 and self.backward_weight_s > 0:
            return self.backward_input_s, self.backward_weight_s
        return None

    @property
    def split_cpu(self) -> tuple[float, float] | None:
        """(B's, W's CPU dispatch seconds) of the split backward, if timed apart from the GPU."""
        if self.split_backward is not None and self.backward_input_cpu_s > 0 \
                and self.backward_weight_cpu_s > 0:
            return self.backward_input_cpu_s, self.backward_weight_cpu_s
        return None

    @property
    def split_depth(self) -> tuple[float, float, float] | None:
        """(B growth, W growth, stack timed on) for :func:`split_backward_at`, if measured."""
        if self.split_backward is None or self.split_layers <= 0:
            return None
        return self.backward_input_depth_s, self.backward_weight_depth_s, self.split_layers


def split_backward_at(split: tuple[float, float], depth: tuple[float, float, float] | None,
                      stage_layers: float) -> tuple[float, float]:
    """Zero-bubble's (B, W) seconds per layer in a stage of ``stage_layers`` layers.

    The split backward was timed on ``depth[2]`` blocks; per layer, B and W grow linearly
    with the stack (``depth[0]``, ``depth[1]`` seconds per extra layer): each of W's
    ``torch.autograd.grad`` calls (one per parameter group) first walks the graph reachable
    from its roots, the rest of the stage. Never below 0."""
    if depth is None:
        return split
    extra = stage_layers - depth[2]
    return (max(0.0, split[0] + depth[0] * extra), max(0.0, split[1] + depth[1] * extra))


def wgrad_bytes_at(row: Interpolated, stage_layers: float) -> tuple[float, float]:
    """Zero-bubble with full recomputation: (pending, W-transient) bytes per layer in a
    stage of ``stage_layers`` layers.

    Both are a stage total ``c + d·L`` over its L layers, not ``d·L``: part of what W's
    per-parameter-group recomputation keeps does not grow with the stack (CPU emulation,
    docs/benchmarks/split_memory_cpu.md: GPT-style W transient 2.90 / 2.42 / 2.30 sets per
    layer on 2 / 6 / 12 blocks, exactly ``d + c/L`` with c = 1.44, d = 2.18). The profile
    measures per layer on ``wgrad_memory_layers`` blocks and the fixed part c from a
    shallower stack; per layer at L that is ``measured + c·(1/L − 1/measured-on)``. Rows
    without c keep their per-layer value at every depth. Never below 0."""
    base = (row.wgrad_pending_bytes, row.wgrad_transient_bytes)
    if row.wgrad_memory_layers <= 0 or stage_layers <= 0:
        return base
    k = 1.0 / stage_layers - 1.0 / row.wgrad_memory_layers
    return (max(0.0, base[0] + row.wgrad_pending_stage_bytes * k),
            max(0.0, base[1] + row.wgrad_transient_stage_bytes * k))


# Interpolated fields that describe the timed stack or one call, not one micro-batch's work:
# never scaled with the micro-batch; the depth growths may be negative (timing noise), the
# rest are >= 0
_PER_STACK = ("split_layers", "backward_input_depth_s", "backward_weight_depth_s",
              "forward_cpu_fixed_s", "backward_cpu_fixed_s", "wgrad_memory_layers")
# ... and the stage parts of the split memory scale with the micro-batch but may be negative
_SIGNED = ("backward_input_depth_s", "backward_weight_depth_s", "wgrad_pending_stage_bytes",
           "wgrad_transient_stage_bytes")


def _interp(rows: list, mb: int, peak_field: str) -> Interpolated:
    """Linear in the micro-batch between/beyond the two nearest measured sizes."""
    names = [f.name for f in fields(Interpolated)]

    def vals(r):   # end rows lack the split fields: 0
        return [getattr(r, peak_field if n == "peak_bytes" else n, 0.0) for n in names]
    exact = [r for r in rows if r.micro_batch == mb]
    if exact:
        return Interpolated(*vals(exact[0]))
    if len(rows) == 1:
        k = mb / rows[0].micro_batch
        return Interpolated(*(v if n in _PER_STACK else v * k
                              for n, v in zip(names, vals(rows[0]))))
    below = [r for r in rows if r.micro_batch < mb]
    above = [r for r in rows if r.micro_batch > mb]
    if below and above:
        a, b = below[-1], above[0]
    elif above:
        a, b = above[0], above[1]
    else:
        a, b = below[-2], below[-1]
    w = (mb - a.micro_batch) / (b.micro_batch - a.micro_batch)
    return Interpolated(*(v if n in _SIGNED else max(0.0, v) for n, v in zip(
        names, (x + w * (y - x) for x, y in zip(vals(a), vals(b))))))


@dataclass(frozen=True)
class MeasuredTables:
    """The rows of a profile, indexed by everything but the micro-batch."""

    layers: tuple[MeasuredLayer, ...] = ()
    ends: tuple[MeasuredEnd, ...] = ()

    def __post_init__(self) -> None:
        idx: dict[tuple, list] = {}
        for r in (*self.layers, *self.ends):
            idx.setdefault(r.group, []).append(r)
        for rows in idx.values():
            rows.sort(key=lambda r: r.micro_batch)
        object.__setattr__(self, "_index", idx)

    def __bool__(self) -> bool:
        return bool(self.layers or self.ends)

    def __hash__(self) -> int:
        return hash((len(self.layers), len(self.ends)))

    def layer(self, model: ModelSpec, *, seq_len: int, tp: int, sequence_parallel: bool,
              recompute: str, micro_batch: int, zero: int = 0, dp: int = 1,
              compile: bool = False) -> Interpolated | None:
        """The measured layer for these settings, or None (no row: use the analytical model).

        ``zero`` 2/3 with ``dp`` > 1 look for FSDP2 rows of that group size; ZeRO-0/1 (and
        ZeRO-2/3 with dp = 1) use the plain rows. ``compile``: the rows timed compiled.
        """
        fsdp = zero >= 2 and dp > 1
        return self._layer_row(model, seq_len, tp, sequence_parallel, recompute, micro_batch,
                               zero if fsdp else 0, dp if fsdp else 1, compile)

    @property
    def has_compiled(self) -> bool:
        """Whether any layer row was timed compiled (the planner searches Layout.compile
        only then)."""
        return any(r.compile for r in self.layers)

    def compiled_settings(self, model: ModelSpec, seq_len: int) -> frozenset:
        """The (tp, sequence parallel, recompute) settings at which the profile timed this
        model's layer shape compiled at ``seq_len`` (compiled rows are not transferred to
        other shapes: :mod:`meshplan.costmodel.nearest_rows`)."""
        key = layer_shape_key(model)
        return frozenset((r.tp, r.sequence_parallel, r.recompute) for r in self.layers
                         if r.compile and r.shape == key and r.seq_len == seq_len)

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
                   compile: bool = False) -> Interpolated | None:
        """The rows of exactly this group (:attr:`MeasuredLayer.group`) at ``micro_batch``."""
        key = (layer_shape_key(model), seq_len, tp, bool(sequence_parallel and tp > 1),
               recompute, zero, dp, bool(compile))
        rows = self._index.get(key)  # type: ignore[attr-defined]
        return _interp(rows, micro_batch, "backward_peak_bytes") if rows else None

    def fsdp_layer(self, model: ModelSpec, *, seq_len: int, tp: int, sequence_parallel: bool,
                   recompute: str, micro_batch: int, zero: int, dp: int
                   ) -> tuple[Interpolated | None, bool]:
        """An FSDP2 layer (ZeRO-2/3 over ``dp`` > 1) and whether it was composed.

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
                         recompute=recompute, micro_batch=micro_batch, zero=zero, dp=dp)
        if row is not None or tp == 1:
            return row, False
        kw = dict(seq_len=seq_len, recompute=recompute, micro_batch=micro_batch)
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
            sequence_parallel: bool, micro_batch: int) -> Interpolated | None:
        key = (ends_shape_key(model), part, seq_len, tp, bool(sequence_parallel and tp > 1))
        rows = self._index.get(key)  # type: ignore[attr-defined]
        return _interp(rows, micro_batch, "peak_bytes") if rows else None

    def without_shape(self, layer_key: str) -> "MeasuredTables":
        """These tables less every row of the layer shape ``layer_key`` (its layers, and the
        ends of every vocabulary over it): what a profile that never timed that model holds
        (benchmarks/transfer_analysis.py's leave-shape-out re-prediction)."""
        return MeasuredTables(tuple(r for r in self.layers if r.shape != layer_key),
                              tuple(e for e in self.ends
                                    if not e.shape.startswith(layer_key + "-v")))

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
              "wgrad_pending_bytes", "wgrad_transient_bytes"):
        v = getattr(r, k, 0.0)
        if not isinstance(v, (int, float)) or v < 0:
            raise ProfileError(f"{where}: {k} must be a number >= 0, got {v!r}")
    for k in ("backward_input_depth_s", "backward_weight_depth_s",
              "wgrad_pending_stage_bytes", "wgrad_transient_stage_bytes"):
        v = getattr(r, k, 0.0)
        if not isinstance(v, (int, float)):
            raise ProfileError(f"{where}: {k} must be a number, got {v!r}")
    if not isinstance(getattr(r, "compile", False), bool):
        raise ProfileError(f"{where}: compile must be true or false, got {r.compile!r}")
    for k in ("split_layers", "wgrad_memory_layers"):
        v = getattr(r, k, 0)
        if not isinstance(v, int) or v < 0:
            raise ProfileError(f"{where}: {k} must be an integer >= 0, got {v!r}")
    for k in ("seq_len", "tp", "micro_batch"):
        v = getattr(r, k)
        if not isinstance(v, int) or v < 1:
            raise ProfileError(f"{where}: {k} must be an integer >= 1, got {v!r}")
    return r


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
