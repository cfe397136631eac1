"""How many 16-bit copies of a pipeline rank's weights autocast keeps alive (runtime torch).

The executor runs ZeRO-0/1 layouts under ``torch.autocast(bfloat16)`` around the whole step,
so each fp32 weight is cast once and the cast is cached for the step; the estimate counts
that one copy (``compute_copy_bytes``). Selective recompute breaks the "once": its
``torch.utils.checkpoint`` (non-reentrant) re-runs the attention core inside the backward,
under a fresh ``torch.autocast`` context entered on the autograd engine's device thread,
where the autocast nesting count is 0; leaving that context clears autocast's cast cache,
which is shared by all threads (``at::autocast::clear_cache`` on the outermost exit,
``aten/src/ATen/autocast_mode.cpp``). The next forward then casts every weight again, while
each micro-batch still in flight keeps the casts its linear layers saved for backward
(``mm`` saves its 16-bit weight for the input gradient). A rank therefore holds one copy
of a chunk's weights per *generation* among that chunk's in-flight micro-batches: a
generation is the stretch of the rank's action order between two backward passes.

Full recomputation clears the cache too, but its forward saves no casts (only the block
input), so one copy stays; without recomputation nothing clears it inside the step; GPipe
runs every forward before the first backward. 1F1B over ``pp`` ranks thus holds
``min(pp - rank, m)`` generations on rank ``rank`` at its activation peak and interleaved
1F1B up to about ``pp + 1`` (per chunk, averaged over the rank's chunks).

Evidence (4 × H100 → 2 × H100, torch 2.11, round 12): Llama-1.64B pp 2 interleaved vpp 2,
micro-batch 4, selective (holdout6 j12) against the same layout without recomputation
(h12): after each steady-state forward rank 0 held 2.6 GiB more and rank 1 1.0 GiB more;
the calibrated selective layer keeps 15.5 MiB more per layer and micro-batch than the plain
one (0.5 / 0.3 GiB of it), and the rest is 1.5 / 0.5 extra generations of the rank's 12
layers' 16-bit weights (1.41 GiB per copy): 2.1 / 0.7 GiB. The CPU reproduction: autocast
on CPU with the backward run on another thread (as CUDA's engine does) gets a new cast per
micro-batch with ``checkpoint`` and the same cast without it.
"""

from __future__ import annotations

from functools import lru_cache

from meshplan.costmodel.pipeline_sim import rank_order

_F, _B, _W = 0, 1, 2


@lru_cache(maxsize=1024)
def live_cast_generations(schedule: str, pp: int, vpp: int, m: int, rank: int) -> float:
    """Copies of rank ``rank``'s 16-bit weights alive at its activation peak, in units of
    "all the rank's layers" (a chunk's copy counts 1/vpp), when every backward clears
    autocast's cache (module docstring). The peak is the moment after an action with the
    most micro-batch activation sets in flight; of several such moments, the one with the
    most copies. A micro-batch stays in flight until its backward (zero-bubble: its weight
    pass, which still holds the saved casts).

    Example, 1F1B, pp = 2, m = 8, rank 0: F0 F1 | B0 F2 | B1 F3 ... — after F2 the rank
    holds micro-batches 1 (cast before B0) and 2 (cast after it): 2.0.
    """
    gen = 0
    cache: dict[int, int] = {}          # chunk -> generation of the cached cast
    inflight: dict[tuple[int, int], int] = {}   # (chunk, mb) -> generation it saved
    best = (0, 0.0)
    for kind, chunk, mb in rank_order(schedule, pp, vpp, m, rank):
        if kind == _F:
            inflight[(chunk, mb)] = cache.setdefault(chunk, gen)
        else:
            if kind == _W or schedule != "zero-bubble":
                inflight.pop((chunk, mb), None)
            if kind == _B:
                gen += 1
                cache.clear()
        copies = sum(len({g for (c, _), g in inflight.items() if c == ch}
                         | ({cache[ch]} if ch in cache else set()))
                     for ch in range(vpp)) / vpp
        best = max(best, (len(inflight), copies))
    return best[1]


def extra_cast_copies(runtime: str, precision: str, zero: int, recompute: str,
                      schedule: str, pp: int, vpp: int, m: int) -> tuple[float, ...]:
    """Per pipeline rank: copies of the rank's 16-bit weights beyond the one the estimate
    already counts (0 where autocast's cache is not cleared inside the step or there is no
    pipeline: the executor's ZeRO-0/1 under bf16 autocast with selective recompute)."""
    if (runtime != "torch" or precision == "fp32" or zero >= 2 or recompute != "selective"
            or pp == 1):
        return (0.0,) * pp
    return tuple(max(0.0, live_cast_generations(schedule, pp, vpp, m, r) - 1.0)
                 for r in range(pp))


__all__ = ["live_cast_generations", "extra_cast_copies"]
