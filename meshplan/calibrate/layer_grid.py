"""The layer tables' grid: which rows ``meshplan calibrate`` times, in which order.

A :class:`Config` is one row (model, sequence length, parallel setting, recompute mode,
micro-batch, part); :func:`plan_grid` lists every row, rows sharing a built module back to
back. What a row holds: :mod:`meshplan.calibrate.bench_layers`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from meshplan.calibrate.shapes import valid_tps
from meshplan.costmodel.moe_host import syncs_at
from meshplan.spec import ModelSpec
from meshplan.errors import ConfigError

RECOMPUTE = ("none", "selective", "full")
FSDP_ZERO = (2, 3)


@dataclass(frozen=True, kw_only=True)
class Config:
    """One row to measure. ``part`` "" = transformer layers, else an end."""

    model: ModelSpec
    seq_len: int
    tp: int
    sequence_parallel: bool
    micro_batch: int
    recompute: str = "none"
    zero: int = 0
    dp: int = 1
    part: str = ""
    compile: bool = False      # every block torch.compile'd, as Layout.compile runs them
    # "fp8": the blocks' linears are the executor's fp8 linears of ``fp8_recipe``, as
    # ParallelTrainer builds them for Job(precision="fp8") (meshplan.executor.fp8)
    precision: str = "bf16"
    fp8_recipe: str = ""
    # an MoE layer with its experts over ``ep`` ranks (ep folded over the row's tp and
    # data-parallel ranks, as the executor folds it): the dispatch and combine all-to-alls
    # run inside the timed passes
    ep: int = 1

    @property
    def communicates(self) -> bool:
        """FSDP2 over dp > 1 or experts over ep > 1: collectives inside the timed passes
        (the split backward of zero-bubble is timed only on rows without them)."""
        return self.zero >= 2 and self.dp > 1 or self.ep > 1

    @property
    def syncs_on_host(self) -> bool:
        """The executor's layer reads a device value on the host in its forward (the
        all-to-all's split lists at ep > 1, a capacity factor's kept copies:
        :mod:`meshplan.costmodel.moe_host`). Queued timing cannot time such a layer — the
        read waits for the spin kernel the GPU is held by — so its row is timed
        synchronized: max(CPU, GPU) seconds, no CPU fields (what a layer that drains the
        queue costs)."""
        return not self.part and self.model.is_moe and syncs_at(self.model, self.ep) > 0

    @property
    def build_key(self) -> tuple:
        """Configurations with the same key share one built module (recompute flags and
        the micro-batch change nothing in the parameters)."""
        return (self.model.name, self.model, self.seq_len, self.part, self.tp,
                self.sequence_parallel, self.zero, self.dp, self.compile, self.precision,
                self.fp8_recipe, self.ep)

    def label(self) -> str:
        what = self.part or "layer"
        par = f"tp{self.tp}{' sp' if self.sequence_parallel else ''}"
        if self.ep > 1:
            par += f" ep{self.ep}"
        if self.zero:
            par = f"zero{self.zero} dp{self.dp}" + (f" {par}" if self.tp > 1 or self.ep > 1
                                                    else "")
        rc = f" rc={self.recompute}" if not self.part else ""
        return (f"{what} {self.model.name} s{self.seq_len} {par}{rc} mb{self.micro_batch}"
                + (" compiled" if self.compile else "")
                + (f" fp8 {self.fp8_recipe}" if self.precision == "fp8" else ""))


def _tp_sp(model: ModelSpec, seq: int, world: int, max_tp: int,
           sp_only: bool = False) -> list[tuple[int, bool]]:
    """(tp, sequence parallel) settings of the rows: every tp dividing the world up to
    ``max_tp``, without SP and (where the sequence splits over tp) with it; ``sp_only``: a
    tp > 1 without SP only where the sequence does not split."""
    out = []
    for tp in valid_tps(model, min(world, max_tp)):
        if world % tp:
            continue
        sp = tp > 1 and seq % tp == 0
        if not (sp_only and sp):
            out.append((tp, False))
        if sp:
            out.append((tp, True))
    return out


def row_kind(cfg: Config) -> str:
    """The kind of row ``cfg`` is, as the calibration's summary names it."""
    if cfg.part:
        return "end"
    if cfg.zero >= 2 and cfg.ep > 1:
        return "expert-parallel FSDP2"
    if cfg.zero >= 2 and cfg.compile:
        return "compiled FSDP2"
    if cfg.zero >= 2:
        return "FSDP2" if cfg.dp > 1 else "FSDP2 compute-alone"
    if cfg.precision == "fp8":
        return "fp8"
    if cfg.ep > 1:
        return "expert-parallel"
    return "compiled" if cfg.compile else "plain"


#: what an estimate does where a kind of row is missing (the calibration's summary says it)
MISSING_ROWS = {
    "plain": "layouts at those settings are priced from the curves",
    "end": "the embedding and output are priced from the curves",
    "compiled": "compiled layouts at those settings are priced as eager",
    "expert-parallel": "ep > 1 is priced from the ep = 1 rows plus the formulas",
    "fp8": "fp8 layers are composed from the bf16 rows",
    "expert-parallel FSDP2": "ZeRO-2/3 layouts at ep > 1 are priced from the ep rows with "
                             "FSDP2's gathers and copies analytical (moeh6-moeh9: 10.5 % "
                             "mean error over 13 layouts)",
    "FSDP2": "ZeRO-2/3 layouts are priced from the plain rows with analytical gathers "
             "(measured: 29-37 % fast host-paced, fp8h4; within 3.2 % GPU-bound, fp8h7)",
    "FSDP2 compute-alone": "pipelined ZeRO-2 stages are priced from the plain rows",
    "compiled FSDP2": "compiled ZeRO-2/3 layouts are priced from the eager FSDP2 rows with "
                      "compile's change carried from the plain rows (fp8h9's ZeRO-3 layout "
                      "7-12 % fast)",
}


def untimed_summary(grid: Sequence[Config]) -> dict[str, int]:
    """How many rows of each kind ``grid`` holds, in grid order (the rows a --time-budget
    left untimed)."""
    return dict(Counter(row_kind(cfg) for cfg in grid))


def expert_degrees(model: ModelSpec, world: int,
                   only: Sequence[int] | None = None) -> tuple[int, ...]:
    """The ep > 1 an MoE model's rows are timed at on ``world`` ranks: every divisor of the
    world that divides the routed experts (the executor folds ep over a stage's tp·dp ranks,
    so ep must divide them). Example: 16 experts on 4 ranks → (2, 4); 6 experts on 4 → (2,).
    ``only`` (``calibrate --ep``): those of them in it — the degrees the plans will run, so
    that 8 ranks need not time ep 2, 4 and 8 each (:func:`check_expert_degrees` refuses a
    degree no model can take)."""
    if not model.is_moe:
        return ()
    return tuple(e for e in range(2, world + 1)
                 if world % e == 0 and model.num_experts % e == 0
                 and (only is None or e in only))


def check_expert_degrees(models: Sequence[ModelSpec], world: int,
                         only: Sequence[int] | None) -> None:
    """``calibrate --ep``: every requested degree must be one some MoE model's rows can be
    timed at on ``world`` ranks (:func:`expert_degrees`), and there must be an MoE model."""
    if only is None:
        return
    moe = [m for m in models if m.is_moe]
    if not moe:
        raise ConfigError(f"--ep {','.join(map(str, only))}: no MoE --model to time at an "
                          f"expert-parallel degree")
    valid = sorted({e for m in moe for e in expert_degrees(m, world)})
    bad = [e for e in only if e not in valid]
    if bad:
        raise ConfigError(f"--ep {','.join(map(str, only))}: {bad} cannot be timed on "
                          f"{world} rank(s) for {', '.join(m.name for m in moe)} (ep must "
                          f"divide the world and the routed experts); valid: {valid or 'none'}")


def micro_batch_sizes(quick: bool, micro_batches: Sequence[int] | None = None
                      ) -> tuple[int, ...]:
    """The micro-batch sizes the layer tables are timed at, ascending and distinct
    (default 1, 2, 4; quick 1, 2). Choose them around the micro-batches you will plan with:
    between measured sizes the cost model interpolates, beyond them it extrapolates."""
    if micro_batches is None:
        return (1, 2) if quick else (1, 2, 4)
    bad = [m for m in micro_batches if not isinstance(m, int) or m < 1]
    if bad or not micro_batches:
        raise ConfigError(f"micro-batch sizes must be integers >= 1, got {list(micro_batches)}")
    return tuple(sorted(set(micro_batches)))


def plan_grid(models: Sequence[ModelSpec], seq_len: int | None, world: int, *, quick: bool,
              max_tp: int = 8, micro_batches: Sequence[int] | None = None,
              compile_rows: Sequence[str] = (), fp8_rows: str = "",
              sp_only: bool = False, ep_degrees: Sequence[int] | None = None) -> list[Config]:
    """Every configuration, in run order (grouped by :attr:`Config.build_key`). FSDP2 rows
    (ZeRO-2/3 over dp) are timed at the two smallest micro-batch sizes only. ``compile_rows``:
    the recompute modes whose plain rows (every tp, SP and micro-batch) are also timed with
    their blocks compiled (timed in the first round only:
    :func:`~meshplan.calibrate.bench_layers.bench_layer_rows`). ``fp8_rows``: an fp8 recipe
    whose plain rows (every tp, SP and micro-batch) are also timed with the executor's fp8
    linears: compiled at the ``compile_rows`` modes where those are given, else eager at
    recompute none.
    ``sp_only`` (``--sp-only``): tp > 1 rows with sequence parallelism only, where the
    sequence splits over tp (plans that run tp without SP then price it from the curves).

    An MoE model on more than one rank also has rows with its experts over each ep of
    :func:`expert_degrees` (tp 1 and every tp > 1 with SP, every recompute mode, eager and at
    the ``compile_rows`` modes); ``ep_degrees`` (``--ep``): those degrees only.

    The order puts what a model's estimates need most first, for every model before the
    next kind: each model's plain rows and its ends, then each model's compiled rows, its
    expert-parallel rows, its fp8 rows, its FSDP2 rows, FSDP2's compute alone, then (a dense
    model, with ``compile_rows``) its FSDP2 rows compiled over the widest dp. A
    calibration that its ``--time-budget`` stops inside a round
    (:func:`~meshplan.calibrate.bench_layers.bench_layer_rows`) then holds the basic rows of
    every model rather than every row of the first."""
    check_expert_degrees(models, world, ep_degrees)
    phases: list[list[Config]] = [[], [], [], [], [], [], [], []]
    mbs = micro_batch_sizes(quick, micro_batches)
    for model in models:
        seq = seq_len or model.max_seq_len
        if seq > model.max_seq_len:
            raise ConfigError(f"--seq-len {seq} exceeds {model.name}'s max_seq_len "
                              f"{model.max_seq_len}; the executor cannot run it")
        tpsp = _tp_sp(model, seq, world, max_tp, sp_only)
        for tp, sp in tpsp:
            for rc in RECOMPUTE:
                for mb in mbs:
                    phases[0].append(Config(model=model, seq_len=seq, tp=tp,
                                            sequence_parallel=sp, recompute=rc,
                                            micro_batch=mb))
        for part in ("embedding", "output"):
            for tp, sp in tpsp:
                if model.vocab_size % tp:
                    continue   # apply_tensor_parallel splits the vocabulary over tp
                for mb in mbs:
                    phases[1].append(Config(model=model, seq_len=seq, tp=tp,
                                            sequence_parallel=sp, micro_batch=mb, part=part))
        # the output layer with its loss compiled, as Layout.compile runs it at tp = 1
        for mb in mbs if compile_rows and (1, False) in tpsp else ():
            phases[2].append(Config(model=model, seq_len=seq, tp=1, sequence_parallel=False,
                                    micro_batch=mb, part="output", compile=True))
        for tp, sp in tpsp:
            for rc in (r for r in RECOMPUTE if r in compile_rows):
                for mb in mbs:
                    phases[2].append(Config(model=model, seq_len=seq, tp=tp,
                                            sequence_parallel=sp, recompute=rc,
                                            micro_batch=mb, compile=True))
        # an MoE layer with its experts over ep ranks, eager and at the compiled modes:
        # what expert parallelism adds (all-to-alls, the split exchange's host sync,
        # regrouping) measured rather than priced from counts (moeh4, 2 x H200: the
        # tp 2 · ep 2 layouts ran 7-19 % slower than the ep = 1 rows plus that price)
        # (tp > 1 with SP only, as plans with tp > 1 mostly run: without SP the ep = 1 row
        # plus the formulas price it; that keeps 8 ranks at 108 eager rows, not 189)
        ep_tpsp = [(t, s) for t, s in tpsp if t == 1 or s]
        for ep in expert_degrees(model, world, ep_degrees):
            for tp, sp in ep_tpsp:
                for compiled in (False, True):
                    modes = (r for r in RECOMPUTE if not compiled or r in compile_rows)
                    for rc in modes:
                        for mb in mbs:
                            phases[6].append(Config(model=model, seq_len=seq, tp=tp,
                                                    sequence_parallel=sp, recompute=rc,
                                                    micro_batch=mb, compile=compiled, ep=ep))
        # the same layer under FSDP2 at each ep, over the whole stage (dp = world / tp;
        # eager: compiled FSDP2 layers are derived as the ep 1 ones are): what ZeRO-2/3
        # at ep > 1 adds to the ep row — the dense gathers, FSDP2's hooks, its copies of
        # the experts over edp (one rank where ep = dp·tp) in place of autocast's casts —
        # measured rather than priced (moeh6-moeh9, 2 x H200: priced, 13 such layouts
        # 10.5 % mean error, −38 to +22 %, the sets disagreeing in sign)
        # (ep divides the world, so it folds over any dp·tp = world)
        for ep in expert_degrees(model, world, ep_degrees):
            for tp, sp in ep_tpsp:
                dp = world // tp
                if dp < 2:
                    continue
                for zero in FSDP_ZERO:
                    for rc in RECOMPUTE:
                        for mb in mbs[:2]:
                            phases[6].append(Config(model=model, seq_len=seq, tp=tp,
                                                    sequence_parallel=sp, recompute=rc,
                                                    micro_batch=mb, zero=zero, dp=dp, ep=ep))
        for tp, sp in tpsp if fp8_rows else ():
            for rc in (r for r in RECOMPUTE if r in (compile_rows or ("none",))):
                for mb in mbs:
                    phases[5].append(Config(model=model, seq_len=seq, tp=tp,
                                            sequence_parallel=sp, recompute=rc, micro_batch=mb,
                                            compile=bool(compile_rows), precision="fp8",
                                            fp8_recipe=fp8_rows))
        # FSDP2 over dp, of plain (tp 1) and of tensor-parallel layers (a (dp, tp) mesh as
        # the executor's: holdout8's FSDP-over-tp layouts ran 22-48 % slower than rows
        # composed from tp 1's FSDP increment predicted)
        # (an MoE model's too, at ep 1: its experts sharded over edp = dp·tp as the executor
        # shards them; moeh4's ZeRO-2 layouts, priced from the curves without them, ran
        # 12-17 % faster than predicted)
        # (the widest dp first, ZeRO-2 and 3 side by side: FSDP2 over the whole node is what
        # one-node plans run, and a short --time-budget ends inside this phase — fp8h4's
        # ZeRO-3 pair, priced without its row, missed by 29-37 %)
        fsdp = world > 1
        fsdp_tpsp = [(1, False)] + [x for x in tpsp if x[0] > 1] if fsdp else []
        for tp, sp in fsdp_tpsp:
            for dp in sorted((d for d in range(2, world // tp + 1) if world % (d * tp) == 0),
                             reverse=True):
                for zero in FSDP_ZERO:
                    for rc in RECOMPUTE:
                        for mb in mbs[:2]:
                            phases[3].append(Config(model=model, seq_len=seq, tp=tp,
                                                    sequence_parallel=sp, recompute=rc,
                                                    micro_batch=mb, zero=zero, dp=dp))
        # FSDP2's compute alone: ZeRO-2 on a 1-rank mesh runs the executor's bf16 parameters
        # without autocast and without gather or reduce-scatter. A pipeline's ZeRO-2 stage
        # gathers once per step, so its layers run at this speed: not the plain rows'
        # (autocast: GPT-0.54B's LayerNorms in fp32, 6-12 % slower) nor the FSDP rows'
        # (their per-micro-batch communication included; round 18 of
        # docs/benchmarks/accuracy.md)
        for rc in RECOMPUTE if fsdp else ():
            for mb in mbs:
                phases[4].append(Config(model=model, seq_len=seq, tp=1, sequence_parallel=False,
                                        recompute=rc, micro_batch=mb, zero=2, dp=1))
        # FSDP2 over the widest dp with its blocks compiled, at the compiled modes, last (a
        # budget that stops before them leaves compile's change derived from the plain pair,
        # compiled_rows): the derivation put fp8h9's compiled ZeRO-3 layout 7-12 % fast,
        # fp8h8's 7 % slow (2 x H200). Dense models only (MoE layers under FSDP2 compiled are
        # derived as before)
        for tp, sp in fsdp_tpsp if compile_rows and not model.is_moe else ():
            dp = world // tp
            if dp < 2:
                continue
            for zero in FSDP_ZERO:
                for rc in (r for r in RECOMPUTE if r in compile_rows):
                    for mb in mbs[:2]:
                        phases[7].append(Config(model=model, seq_len=seq, tp=tp,
                                                sequence_parallel=sp, recompute=rc,
                                                micro_batch=mb, zero=zero, dp=dp, compile=True))
    order = (0, 1, 2, 6, 5, 3, 4, 7)  # expert-parallel, then fp8 rows after the compiled ones
    return [c for i in order for c in phases[i]]


__all__ = ["Config", "expert_degrees", "micro_batch_sizes", "plan_grid", "row_kind",
           "untimed_summary", "MISSING_ROWS", "RECOMPUTE", "FSDP_ZERO"]
