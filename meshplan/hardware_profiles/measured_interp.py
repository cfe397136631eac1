"""A measured row carried to another micro-batch and another stage depth.

:class:`Interpolated` is what a lookup of
:class:`~meshplan.hardware_profiles.measured.MeasuredTables` returns: a row's values linear
in the micro-batch between the two nearest measured sizes, beyond them extrapolated from the
two nearest (one point: proportional to the micro-batch, except the CPU's dispatch, which
the calibration pools over micro-batches because the CPU issues the same kernels whatever
their size: held). :func:`split_backward_at` and
:func:`wgrad_bytes_at` carry zero-bubble's split-backward seconds and memory, measured on one
stack, to a stage of another depth.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


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
    routed_imbalance: float = 0.0      # ep > 1 rows: ρ of the routing timed (0: unknown)
    # the timed micro-batches a value was extended from, where the one asked for lies outside
    # them (the caveat :data:`meshplan.costmodel.caveats.extended_rows_caveat`); () inside
    extended_from: tuple[int, ...] = ()
    # its rows timed fp8 experts with their weights cast beforehand (MeasuredLayer's field)
    fp8_weights_cached: bool = False
    # an output row timed with the compiled loss (MeasuredEnd.compile), not the eager row a
    # compiled layout falls back to where the profile has none
    compiled_loss: bool = False
    # the profile measured sustained-clock ratios, but not this row's module (its loop was
    # skipped: host-paced at the timed micro-batches, or out of memory), so it reads at the
    # burst clock (the caveat meshplan.costmodel.caveats.UNCLOCKED_ROWS_CAVEAT)
    clock_unmeasured: bool = False

    @property
    def cpu_measured(self) -> bool:
        """Whether the row timed the CPU's dispatch of its forward and of its backward: a
        pass's per-layer part plus its per-call part above 0. The per-layer part alone is
        not the test: a two-depth fit can put all of a call's CPU in the per-call part, per
        layer 0. Read as "not measured", such a row would drop the host-dispatch bound
        altogether (moeh67h100's compiled recompute-none layouts came out at host load 0 and
        `mb1-compiled` 42 % fast: docs/benchmarks/moe_checks.md, "A row whose per-layer CPU
        pooled to 0 stays CPU-measured")."""
        return (self.forward_cpu_s + self.forward_cpu_fixed_s > 0
                and self.backward_cpu_s + self.backward_cpu_fixed_s > 0)

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
# ... and the CPU's dispatch seconds: the same kernels whatever the micro-batch
# (layer_rows.pooled_cpu stores one value for every micro-batch of a setting), so a single
# timed size is held, not scaled (fp8h4's k04: an fp8 row timed at micro-batch 4 alone, its
# CPU doubled at 8, put the step 73 % above the run)
_PER_CALL = ("forward_cpu_s", "backward_cpu_s", "backward_input_cpu_s", "backward_weight_cpu_s",
             "routed_imbalance")     # ... and a ratio, not an amount
_SIGNED = ("backward_input_depth_s", "backward_weight_depth_s", "wgrad_pending_stage_bytes",
           "wgrad_transient_stage_bytes")


def _interp(rows: list, mb: int, peak_field: str) -> Interpolated:
    """Linear in the micro-batch between/beyond the two nearest measured sizes."""
    names = [f.name for f in fields(Interpolated)
             if f.name not in ("extended_from", "fp8_weights_cached", "compiled_loss",
                               "clock_unmeasured")]
    # a flag of the rows' group (MeasuredLayer.group): the same on each, not interpolated
    cached = bool(getattr(rows[0], "fp8_weights_cached", False))

    def vals(r):   # end rows lack the split fields: 0
        return [getattr(r, peak_field if n == "peak_bytes" else n, 0.0) for n in names]
    exact = [r for r in rows if r.micro_batch == mb]
    if exact:
        return Interpolated(*vals(exact[0]), fp8_weights_cached=cached)
    if len(rows) == 1:
        k = mb / rows[0].micro_batch
        return Interpolated(*(v if n in _PER_STACK + _PER_CALL else v * k
                              for n, v in zip(names, vals(rows[0]))),
                            extended_from=(rows[0].micro_batch,), fp8_weights_cached=cached)
    below = [r for r in rows if r.micro_batch < mb]
    above = [r for r in rows if r.micro_batch > mb]
    if below and above:
        a, b = below[-1], above[0]
    elif above:
        a, b = above[0], above[1]
    else:
        a, b = below[-2], below[-1]
    w = (mb - a.micro_batch) / (b.micro_batch - a.micro_batch)
    outside = () if below and above else (a.micro_batch, b.micro_batch)
    return Interpolated(*(v if n in _SIGNED else max(0.0, v) for n, v in zip(
        names, (x + w * (y - x) for x, y in zip(vals(a), vals(b))))), extended_from=outside,
        fp8_weights_cached=cached)


__all__ = ["Interpolated", "split_backward_at", "wgrad_bytes_at"]
