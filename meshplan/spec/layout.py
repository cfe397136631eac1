"""How one step is cut over GPUs: :class:`Layout`, and the default layers per stage.

Checks that need more than the layout (tp divides heads, the GPU count) live in
:func:`meshplan.spec.validate.check_layout`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from meshplan.errors import ConfigError, require_bool, require_choice, require_positive_int
from meshplan.spec._dicts import from_dict
from meshplan.spec.choices import CP_STYLES, RECOMPUTE, SCHEDULES


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How one step is cut over GPUs.

    ``dp·pp·tp·cp`` GPUs are used; ``global_batch / (dp · micro_batch)`` micro-batches run
    through the pipeline per step. ``vpp`` is the number of model chunks per pipeline
    rank (interleaved 1F1B only). ``stage_layers`` gives the transformer layers of each
    pipeline stage (length pp, or pp·vpp for interleaved: chunk c lives on rank c % pp);
    None = as even as possible. The first and the last stage may hold none, running only the
    embedding or only the final norm, logits and loss (Megatron-LM's
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``
    with as many chunks as layers + 2).

    ``cp`` splits every sequence over ``cp`` ranks (context parallelism, style ``cp_style``:
    ``"ring"`` passes key/value blocks around the ring, ``"all-to-all"`` scatters heads as
    DeepSpeed-Ulysses does). Rank order as Megatron-Core: tp fastest, then cp, dp, pp.

    ``ep`` and ``etp`` (MoE models only) are the expert-parallel and expert-tensor-parallel
    degrees, folded over the same ranks as the dense layers within a pipeline stage
    (Megatron-Core "MoE parallel folding"): ``ep·etp`` divides ``tp·cp·dp`` and the expert
    data-parallel degree is ``edp = tp·cp·dp / (ep·etp)``.

    ``compile``: the executor compiles each transformer block with ``torch.compile``; the
    cost model prices it from calibrated compiled rows.
    """

    dp: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1
    cp_style: str = "ring"
    ep: int = 1
    etp: int = 1
    micro_batch: int = 1
    schedule: str = "1f1b"
    vpp: int = 1
    recompute: str = "none"
    zero: int = 0
    sequence_parallel: bool = False
    stage_layers: tuple[int, ...] | None = None
    compile: bool = False

    def __post_init__(self) -> None:
        for f in ("dp", "pp", "tp", "cp", "ep", "etp", "micro_batch", "vpp"):
            require_positive_int("Layout", f, getattr(self, f))
        require_choice("Layout", "schedule", self.schedule, SCHEDULES)
        require_choice("Layout", "recompute", self.recompute, RECOMPUTE)
        require_choice("Layout", "zero", self.zero, (0, 1, 2, 3))
        require_choice("Layout", "cp_style", self.cp_style, CP_STYLES)
        require_bool("Layout", "sequence_parallel", self.sequence_parallel)
        require_bool("Layout", "compile", self.compile)
        if self.vpp > 1 and self.schedule != "interleaved-1f1b":
            raise ConfigError(
                f"Layout.vpp = {self.vpp} needs schedule='interleaved-1f1b', "
                f"got schedule={self.schedule!r}")
        if self.vpp > 1 and self.pp == 1:
            raise ConfigError(
                f"Layout.vpp = {self.vpp} needs pp > 1: virtual stages interleave the chunks "
                f"of several pipeline ranks (got pp = 1; use vpp = 1)")
        dense_ranks = self.tp * self.cp * self.dp
        if dense_ranks % (self.ep * self.etp):
            raise ConfigError(
                f"Layout.ep·etp = {self.ep}·{self.etp} = {self.ep * self.etp} must divide "
                f"tp·cp·dp = {self.tp}·{self.cp}·{self.dp} = {dense_ranks}: the expert mesh "
                f"(ep × etp × expert-dp) folds over the ranks of one pipeline stage")
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("Layout.sequence_parallel=True needs tp > 1 (got tp=1)")
        if self.stage_layers is not None:
            if not isinstance(self.stage_layers, (list, tuple)):
                raise ConfigError(f"Layout.stage_layers must be a list of layer counts, one per "
                                  f"pipeline chunk (e.g. (12, 12) for pp 2), got "
                                  f"{self.stage_layers!r}")
            sl = tuple(self.stage_layers)
            object.__setattr__(self, "stage_layers", sl)
            if len(sl) != self.pp * self.vpp:
                raise ConfigError(
                    f"Layout.stage_layers has {len(sl)} entries; pp·vpp = "
                    f"{self.pp}·{self.vpp} = {self.pp * self.vpp} are needed")
            last = len(sl) - 1
            for i, n in enumerate(sl):
                if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                    raise ConfigError(
                        f"Layout.stage_layers[{i}] = {n!r} must be a non-negative integer")
                if n == 0 and i not in (0, last):
                    raise ConfigError(
                        f"Layout.stage_layers[{i}] = 0: only the first stage (the embedding) "
                        f"or the last (the loss) may hold no transformer layer; every stage "
                        f"between needs at least one")
            if sum(sl) < 1:
                raise ConfigError(f"Layout.stage_layers {list(sl)} hold no transformer layer")

    @property
    def num_gpus(self) -> int:
        return self.dp * self.pp * self.tp * self.cp

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: the stage's tp·cp·dp ranks over ep·etp."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    def num_microbatches(self, global_batch: int) -> int:
        return global_batch // (self.dp * self.micro_batch)

    def replace(self, **changes: Any) -> "Layout":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stage_layers"] = list(self.stage_layers) if self.stage_layers is not None else None
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Layout":
        data = dict(data)
        if data.get("stage_layers") is not None:
            data["stage_layers"] = tuple(data["stage_layers"])
        return from_dict(cls, data)

    def short(self) -> str:
        """A compact one-line description, e.g. ``dp8·pp16·tp8 mb1 interleaved-1f1b v2 rc=full
        z1``; an explicit partition is appended as ``layers 5/7/7/5`` (two layouts that differ
        only in it must not read alike), three or more equal stages in a row as ``1×126``."""
        s = f"dp{self.dp}·pp{self.pp}·tp{self.tp}"
        if self.cp > 1:
            s += f"·cp{self.cp}" + ("a2a" if self.cp_style == "all-to-all" else "")
        if self.ep > 1 or self.etp > 1:
            s += f" ep{self.ep}" + (f"·etp{self.etp}" if self.etp > 1 else "")
        s += f" mb{self.micro_batch} {self.schedule}"
        if self.vpp > 1:
            s += f" v{self.vpp}"
        s += f" rc={self.recompute} z{self.zero}"
        if self.sequence_parallel:
            s += " sp"
        if self.compile:
            s += " compiled"
        if self.stage_layers is not None:
            s += " layers " + _runs(self.stage_layers)
        return s


def _runs(counts) -> str:
    """``0/1/1/1/0`` as ``0/1×3/0``: runs of three or more equal counts as value×length."""
    out, i = [], 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out += [f"{counts[i]}×{j - i}"] if j - i >= 3 else [str(counts[i])] * (j - i)
        i = j
    return "/".join(out)


def default_stage_layers(num_layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible, extra layers on the middle stages.

    The first and last stages also carry the embedding and the logits, so when the
    split is uneven the remainder goes to the stages in between first.
    """
    base, extra = divmod(num_layers, stages)
    counts = [base] * stages
    order = list(range(1, stages - 1)) + [0, stages - 1] if stages > 2 else list(range(stages))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


def embedding_loss_stage_layers(num_layers: int, stages: int) -> tuple[int, ...] | None:
    """Megatron-LM's ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split``: the embedding and the loss each count as one
    layer, the ``num_layers + 2`` units spread as evenly as possible (extra ones on the
    chunks after the first), the first and the last chunk one layer short — 0 where a chunk
    holds only its end. None where there are fewer than three chunks or a middle one would
    hold no layer. E.g. 94 layers over 32 chunks: 2, 3, …, 3, 2; over 96: 0, 1, …, 1, 0."""
    if stages < 3:
        return None
    per, extra = divmod(num_layers + 2, stages)
    counts = [per + (1 if 0 < i <= extra else 0) for i in range(stages)]
    counts[0] -= 1
    counts[-1] -= 1
    if min(counts[1:-1]) < 1 or min(counts) < 0:
        return None
    return tuple(counts)
