"""What the user allows the planner to choose: :class:`Constraints`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from meshplan.spec import RECOMPUTE, SCHEDULES, Layout
from meshplan.spec.choices import CP_STYLES
from meshplan.errors import ConfigError

OBJECTIVES = ("throughput", "cost", "time_to_train")
_LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))


@dataclass(frozen=True, kw_only=True)
class Constraints:
    """Limits on the layouts the planner may return.

    ``fixed`` pins any :class:`~meshplan.Layout` field, e.g. ``fixed={"pp": 4, "zero": 1}``
    (``stage_layers`` may be pinned too; the solver then keeps that partition).
    ``min_layers_per_stage`` (≥ 1): the fewest layers a stage holds; the first and last may
    hold one fewer (they also run the embedding / loss: the interleaved account-for split).
    ``memory_headroom`` keeps that fraction of the cluster's usable memory free
    (0.1 = plan for 90 %). ``allow_idle_gpus``: the layout may use fewer GPUs than offered
    (None = only for the ``time_to_train`` objective). ``max_vpp`` caps virtual stages per
    pipeline rank (None = as many as the layers allow).

    ``cp``: the context-parallel degrees to search (None = automatic: from
    ``cp_min_seq_len`` tokens per sequence on, every power of two with 2·cp dividing
    ``seq_len``; below it cp = 1 only — the Llama 3 report trained 8k sequences without
    cp and 128k ones with cp = 16); ``cp_styles``: "ring" and/or "all-to-all" (the latter
    only where tp·cp divides the heads). ``ep`` / ``etp``: the expert-parallel degrees to
    search for MoE models (None = automatic: every ep dividing the routed experts and the
    stage's tp·cp·dp ranks; etp 1 and tp, Megatron-Core's two usual settings).

    ``host_bound_margin``: a layout the estimate calls host-bound (its CPU's dispatch sets
    the step, ``costmodel.caveats.is_host_bound``) ranks ahead of a GPU-bound one only when
    predicted more than this fraction faster (0: rank by the prediction alone). Host-bound
    layouts on the lent VM hosts missed their predictions by −47 % to +58 % and ran up to
    2× apart between runs, GPU-bound ones repeated within 2 % (docs/benchmarks/host.md,
    accuracy.md, fp8_checks.md "fp8h59h100"): within a few percent the GPU-bound layout is
    the safer pick. Only
    profiles with measured CPU dispatch (``meshplan calibrate --model``) have host-bound
    layouts.
    """

    max_tp: int | None = None
    tp_within_node: bool = True
    schedules: tuple[str, ...] = SCHEDULES
    recompute: tuple[str, ...] = RECOMPUTE
    zero: tuple[int, ...] = (0, 1, 2, 3)
    sequence_parallel: tuple[bool, ...] = (False, True)
    memory_headroom: float = 0.0
    allow_idle_gpus: bool | None = None
    max_micro_batch: int = 16
    max_vpp: int | None = None
    min_layers_per_stage: int = 1
    cp: tuple[int, ...] | None = None
    cp_styles: tuple[str, ...] = CP_STYLES
    cp_min_seq_len: int = 16384
    ep: tuple[int, ...] | None = None
    etp: tuple[int, ...] | None = None
    host_bound_margin: float = 0.03
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("cp", "ep", "etp"):
            value = getattr(self, name)
            if value is None:
                continue
            value = (value,) if isinstance(value, int) else value
            try:
                value = tuple(value)
            except TypeError:
                raise ConfigError(f"Constraints.{name} must be a list of degrees, "
                                  f"got {value!r}") from None
            if not value or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                for v in value):
                raise ConfigError(f"Constraints.{name} = {value!r} must list positive "
                                  f"integers (or be None: automatic)")
            object.__setattr__(self, name, value)
        _positive("cp_min_seq_len", self.cp_min_seq_len)
        for name in ("schedules", "recompute", "zero", "sequence_parallel", "cp_styles"):
            value = getattr(self, name)
            if isinstance(value, (str, int, bool)):
                value = (value,)
            try:
                value = tuple(value)
            except TypeError:
                raise ConfigError(f"Constraints.{name} must be a list of options, "
                                  f"got {value!r}") from None
            object.__setattr__(self, name, value)
            if not value:
                raise ConfigError(f"Constraints.{name} is empty: allow at least one option")
        _check_subset("schedules", self.schedules, SCHEDULES)
        _check_subset("recompute", self.recompute, RECOMPUTE)
        _check_subset("zero", self.zero, (0, 1, 2, 3))
        _check_subset("sequence_parallel", self.sequence_parallel, (False, True))
        _check_subset("cp_styles", self.cp_styles, CP_STYLES)
        if self.max_tp is not None:
            _positive("max_tp", self.max_tp)
        _positive("max_micro_batch", self.max_micro_batch)
        if self.max_vpp is not None:
            _positive("max_vpp", self.max_vpp)
        if isinstance(self.min_layers_per_stage, bool) or not isinstance(
                self.min_layers_per_stage, int) or self.min_layers_per_stage < 1:
            raise ConfigError(
                f"Constraints.min_layers_per_stage must be an integer >= 1, got "
                f"{self.min_layers_per_stage!r} (the first and last stage may hold one fewer; "
                f"pin any partition with fixed={{'stage_layers': (...)}})")
        if not isinstance(self.memory_headroom, (int, float)) or isinstance(
                self.memory_headroom, bool) or not 0 <= self.memory_headroom < 1:
            raise ConfigError(f"Constraints.memory_headroom must be a fraction in [0, 1), got "
                              f"{self.memory_headroom!r}")
        if not isinstance(self.host_bound_margin, (int, float)) or isinstance(
                self.host_bound_margin, bool) or not 0 <= self.host_bound_margin < 1:
            raise ConfigError(f"Constraints.host_bound_margin must be a fraction in [0, 1) "
                              f"(0.03: a host-bound layout must be predicted more than 3 % "
                              f"faster to rank first), got {self.host_bound_margin!r}")
        if not isinstance(self.fixed, Mapping):
            raise ConfigError(f"Constraints.fixed must be a mapping of Layout fields, got "
                              f"{type(self.fixed).__name__}")
        bad = sorted(set(self.fixed) - set(_LAYOUT_FIELDS))
        if bad:
            raise ConfigError(f"Constraints.fixed names unknown Layout field(s) {bad}; valid: "
                              f"{', '.join(_LAYOUT_FIELDS)}")
        fixed = dict(self.fixed)
        if fixed.get("stage_layers") is not None:
            fixed["stage_layers"] = tuple(fixed["stage_layers"])
        object.__setattr__(self, "fixed", fixed)
        # A fixed value must itself be a valid Layout value (dp, unless fixed, taken as
        # ep·etp so that the expert mesh can fold) ...
        probe = {k: v for k, v in fixed.items() if k != "stage_layers"}
        if "dp" not in probe:
            probe["dp"] = probe.get("ep", 1) * probe.get("etp", 1)
        try:
            Layout(**probe)
        except ConfigError as exc:
            raise ConfigError(f"Constraints.fixed = {fixed!r} is not a valid layout: {exc}") \
                from None
        # ... and must not contradict the option lists.
        for key, options in (("schedule", self.schedules), ("recompute", self.recompute),
                             ("zero", self.zero), ("sequence_parallel", self.sequence_parallel),
                             ("cp_style", self.cp_styles), ("cp", self.cp), ("ep", self.ep),
                             ("etp", self.etp)):
            if key in fixed and options is not None and fixed[key] not in options:
                plural = {"schedule": "schedules", "cp_style": "cp_styles"}.get(key, key)
                raise ConfigError(f"contradictory constraints: fixed {key}={fixed[key]!r} but "
                                  f"Constraints.{plural} allows only {list(options)}")
        if "tp" in fixed and self.max_tp is not None and fixed["tp"] > self.max_tp:
            raise ConfigError(f"contradictory constraints: fixed tp={fixed['tp']} exceeds "
                              f"max_tp={self.max_tp}")
        if "micro_batch" in fixed and fixed["micro_batch"] > self.max_micro_batch:
            raise ConfigError(f"contradictory constraints: fixed micro_batch="
                              f"{fixed['micro_batch']} exceeds max_micro_batch="
                              f"{self.max_micro_batch}")
        if "vpp" in fixed and self.max_vpp is not None and fixed["vpp"] > self.max_vpp:
            raise ConfigError(f"contradictory constraints: fixed vpp={fixed['vpp']} exceeds "
                              f"max_vpp={self.max_vpp}")

    def allows(self, layout: Layout) -> str | None:
        """None if ``layout`` satisfies these constraints, else the first violated one."""
        if self.max_tp is not None and layout.tp > self.max_tp:
            return f"tp={layout.tp} > max_tp={self.max_tp}"
        if layout.schedule not in self.schedules:
            return f"schedule {layout.schedule!r} not in {list(self.schedules)}"
        if layout.recompute not in self.recompute:
            return f"recompute {layout.recompute!r} not in {list(self.recompute)}"
        if layout.zero not in self.zero:
            return f"zero {layout.zero} not in {list(self.zero)}"
        if layout.sequence_parallel not in self.sequence_parallel:
            return f"sequence_parallel {layout.sequence_parallel} not allowed"
        if layout.micro_batch > self.max_micro_batch:
            return f"micro_batch {layout.micro_batch} > max_micro_batch {self.max_micro_batch}"
        if self.max_vpp is not None and layout.vpp > self.max_vpp:
            return f"vpp {layout.vpp} > max_vpp {self.max_vpp}"
        for key, options in (("cp", self.cp), ("ep", self.ep), ("etp", self.etp)):
            if options is not None and getattr(layout, key) not in options:
                return f"{key} {getattr(layout, key)} not in {list(options)}"
        if layout.cp > 1 and layout.cp_style not in self.cp_styles:
            return f"cp_style {layout.cp_style!r} not in {list(self.cp_styles)}"
        for key, value in self.fixed.items():
            if getattr(layout, key) != value:
                return f"{key}={getattr(layout, key)!r} but fixed {key}={value!r}"
        if layout.stage_layers is not None and "stage_layers" not in self.fixed:
            lo, sl = self.min_layers_per_stage, layout.stage_layers
            if any(n < m for n, m in zip(sl, stage_min_layers(len(sl), lo))):
                return (f"a stage has fewer than {lo} layers (the first and last: "
                        f"{end_stage_min_layers(len(sl), lo)}, besides the embedding / loss)")
        return None

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["fixed"] = dict(self.fixed)
        return d


def end_stage_min_layers(stages: int, min_layers: int) -> int:
    """The fewest layers the first and last of ``stages`` stages (or interleaved chunks) may
    hold: one fewer than ``min_layers`` with more than two, since they also run the embedding
    and the loss (Megatron's account-for-embedding/loss split: 0 at the minimum of 1); with
    one or two stages as many as the others. The planner's every partition rule reads it:
    :meth:`Constraints.allows`, the solver's and the exhaustive search's free partitions,
    the interleaved candidates and the bounds."""
    return min_layers - 1 if stages > 2 else min_layers


def stage_min_layers(stages: int, min_layers: int) -> tuple[int, ...]:
    """The fewest layers of each of ``stages`` stages (:func:`end_stage_min_layers` at the
    ends, ``min_layers`` between)."""
    if stages == 1:
        return (min_layers,)
    ends = end_stage_min_layers(stages, min_layers)
    return (ends, *(min_layers,) * (stages - 2), ends)


def _check_subset(name: str, values: tuple, valid: tuple) -> None:
    for v in values:
        if v not in valid or (isinstance(v, bool) and not isinstance(valid[0], bool)):
            raise ConfigError(f"Constraints.{name} contains {v!r}; valid options: "
                              f"{', '.join(repr(x) for x in valid)}")


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"Constraints.{name} must be a positive integer, got {value!r}")
