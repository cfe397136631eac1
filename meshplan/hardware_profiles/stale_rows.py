"""Layer rows a profile holds that time an executor which no longer runs that way.

A calibrated profile's layer rows time meshplan's own executor. Where the executor later runs
a configuration differently, the rows of that configuration in older profiles price a step
that no longer happens; the loader leaves them out (with a warning naming them and the
remedy, recalibration), and the cost model prices the configuration as for a profile that
never timed it. Where no other pricing exists, the loader only warns
(:func:`warn_defective_compiled_rows`).

**Compiled selective recomputation, before commit 4656ba4 (2026-12-01 16:40 UTC).** Inside a
compiled block the executor re-ran the attention core through a custom autograd function
that dynamo cannot trace: the block was split into five graphs with the core eager between
them, and the compiled backward lost its fusions. Since then the core is checkpointed inside
the block's one graph (``executor.attention_core.recomputed_core``). Layer rows at tp 1, the
compiled row's cost of selective recomputation over recompute none against the eager row's,
the same model and micro-batch (``python`` over the committed 1 × H200 profiles):

- timed before: fp8h1 +16.1 / +16.5 % compiled against +6.6 / +7.0 % eager; fp8h3 +7.6 /
  +7.7 against +3.2 / +3.4; fp8h17 +4.2..+6.0 against +1.2..+1.5; fp8h19 +7.7..+11.4 against
  +5.7..+7.6; fp8h20 +7.4..+9.2 against +5.4..+7.2;
- timed after: fp8h20b (fp8h20's model again) +4.3..+4.7 against +5.2..+6.4; fp8h21 +4.0..+4.9
  against +3.7..+4.5; fp8h22 +2.9 / +3.5 against +3.8 / +4.0; host22 +5.0 / +5.1 against
  +5.6 / +5.9.

The checks run by the later executor measured what the later rows show: fp8h35, fp8h36 and
fp8h38 (never-run models priced from fp8h17's and fp8h1's rows) ran their compiled selective
arms 2.5-4.0 % above recompute none where those rows priced 7.7-9.1 %
(docs/benchmarks/fp8_checks.md, "Compiled selective rows of the earlier executor"). Without
the rows a compiled selective layer is its eager selective row moved by the compiled/eager
pair at recompute none (:func:`meshplan.costmodel.compiled_rows.compiled_from_pair`), which
carries compile's gain and keeps the eager cost of the re-run, as the later rows do.
Held out, as run (1 × H200, fp8h39-41 from fp8h1's and fp8h2's rows): the predicted selective
/ none ratio nearer the measured on six of six profile-checks (4.9 → 1.0 points off on
average), the selective arms' step error lower on three of six (fp8h39 8.8 → 3.1 % and 2.5 →
1.4 %; fp8h41 from fp8h1 7.4 → 6.4 %); on fp8h40 (both profiles) and fp8h41 (fp8h2's) larger,
where the profiles price the whole model 2-10 % fast and the stale rows' slow selective price
had offset it.

**Kept where they are a module's only compiled pair.** A module timed compiled at selective
and full recomputation only (fp8h18, moeh18, fp8h6, fp8h9, fp8h15, moeh10) prices its
compiled recompute-none layouts from its eager none row moved by a compiled/eager pair; without
the selective rows that pair is the full one, whose blocks keep only their input either way,
so it carries nothing of what compile keeps less at recompute none: fp8h29's derived arms
(a never-run Llama from fp8h18's rows, 1 × H200) read their peak memory +12.8 to +37.4 % and
their step 6-13 % fast that way, and within 3.3 % and 0.3-6.7 % fast from the selective pair
(as run, before these rows were left out; POST HOC, docs/benchmarks/fp8_checks.md "fp8h43 /
fp8h44"). Such a module keeps its stale selective rows: its compiled selective layouts then
read them as timed (the earlier executor's rows priced those 4-9 % slow). Held out on fp8h45
(a never-run Llama 1.90 B, 1 × H200; docs/benchmarks/fp8_checks.md "fp8h45"): the 16
predictions it moves (fp8h6/9/15/18's profiles, two recompute-none layouts, bf16 and fp8)
step 9.2 → 5.9 % mean error, peak memory 13.0 → 3.0 % (within 5 % on 13 of 16, none without).
"""

from __future__ import annotations

import re
import warnings

from meshplan.errors import MeshplanWarning

#: the provenance mark ``meshplan calibrate`` writes since the change (``calibrate/run.py``)
COMPILED_SELECTIVE_MARK = "compiled_selective"


def _stale_compiled_selective(row: object) -> bool:
    return isinstance(row, dict) and bool(row.get("compile")) \
        and row.get("recompute") == "selective"


def _module(row: dict) -> tuple:
    """What one built module of a calibration shares: every key of a layer row but its
    micro-batch, recompute mode and timings (the rows a compiled/eager pair is read from)."""
    return tuple(row.get(k) for k in ("shape", "seq_len", "tp", "sequence_parallel", "zero",
                                       "dp", "ep", "precision", "fp8_recipe"))


def without_stale_rows(prov: dict, layers: list, where: str) -> list:
    """``layers`` less the rows that time an executor since changed (module docstring), with a
    warning naming how many and why. A GPU profile's compiled selective rows are stale where
    its provenance lacks the ``compiled_selective`` mark, which calibrate writes since the
    change (its first marked profiles: 2026-12-01 16:55 UTC; every committed profile timed
    before 16:40 lacks it, every one after has it), and left out where their module has a
    compiled recompute-none row (else they are its only pair: module docstring); a CPU
    profile's rows are its own."""
    if prov.get("device") != "cuda" or prov.get(COMPILED_SELECTIVE_MARK):
        return layers
    with_none = {_module(r) for r in layers if isinstance(r, dict) and r.get("compile")
                 and r.get("recompute") == "none"}
    kept = [r for r in layers
            if not (_stale_compiled_selective(r) and _module(r) in with_none)]
    if len(kept) < len(layers):
        when = f" (calibrated {prov['date']})" if prov.get("date") else ""
        warnings.warn(MeshplanWarning(
            f"{where}: {len(layers) - len(kept)} compiled layer row(s) at recompute "
            f"'selective'{when} were timed by an executor that ran the attention core eager "
            "between five compiled graphs (no 'compiled_selective' mark in the provenance: "
            "calibrations before 2026-12-01 16:55 UTC) and are not read: compiled selective "
            "recomputation is priced from the eager selective rows moved by the "
            "compiled/eager rows at recompute 'none' (the old rows priced it 4-9 % slow). "
            "Recalibrate with this meshplan (`meshplan calibrate --compile-rows "
            "none,selective,full`) for rows of today's executor."), stacklevel=4)
    return kept


def _torch_before_2_13(version: str) -> bool:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return m is not None and (int(m.group(1)), int(m.group(2))) < (2, 13)


def warn_defective_compiled_rows(prov: dict, layers: list, where: str) -> None:
    """Warn where a GPU profile holds compiled layer rows at tp + SP or ep > 1 timed by an
    executor whose collectives lost their backward when compiled (torch before 2.13, and no
    ``compiled_collectives`` mark in the provenance: docs/benchmarks/compiled_grads.md)."""
    if prov.get("device") != "cuda" or prov.get("compiled_collectives"):
        return
    if not _torch_before_2_13(str(prov.get("torch", ""))):
        return
    bad = sum(1 for r in layers if isinstance(r, dict) and r.get("compile")
              and ((r.get("tp", 1) > 1 and r.get("sequence_parallel")) or r.get("ep", 1) > 1))
    if bad:
        warnings.warn(MeshplanWarning(
            f"{where}: {bad} compiled layer row(s) at tp + SP or ep > 1 were timed under torch "
            f"{prov.get('torch')} by an executor whose compiled collectives skipped part of "
            "the backward (docs/benchmarks/compiled_grads.md); layouts priced from them are "
            "too fast. Recalibrate with this meshplan (`meshplan calibrate`)."), stacklevel=3)
