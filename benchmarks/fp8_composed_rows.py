"""Compiled fp8 layers composed from bf16 rows against the measured fp8 rows of the same
profiles (issue 41; CPU, seconds; docs/benchmarks/fp8_checks.md, "Compiled fp8 composed
from bf16 rows").

Every profile calibrated with ``--fp8-rows`` holds, at each setting, the compiled bf16 layer
row and the compiled fp8 row the executor measured. Without the fp8 row the cost model
composes fp8 from the bf16 row (``costmodel/fp8_cost.py``: the linears' GEMMs at the fp8
curve, the casts at ``fp8_cast_compiled_gbps``). This re-prices each fp8 row that way, the
profile's fp8 rows removed, and fits the one number the comparison leaves: the share of the
casts' price, timed cast alone, that they cost inside a compiled block (least squares through
the origin of the measured minus the composed-without-casts time against the casts' price;
``fp8_cast_compiled_block_share``). Rows with sequence parallelism are left out: their
compiled rows were timed by an executor whose compiled collectives skipped part of the
backward (docs/benchmarks/compiled_grads.md), bf16 and fp8 alike.

    python benchmarks/fp8_composed_rows.py            # the fp8h1-fp8h15 profiles
    python benchmarks/fp8_composed_rows.py --through 18   # and the later sets' own
    python benchmarks/fp8_composed_rows.py --json out.json
    python benchmarks/fp8_composed_rows.py --by-family   # the share per layer family too

``--by-family`` fits the share per layer family (``measured_rows.cast_family``: GeLU /
LayerNorm / biased GPT layers against SwiGLU / RMSNorm / unbiased Llama ones), the
datasheet's ``fp8_cast_compiled_block_share_by_family``, and prices the later sets' rows
(fp8h16 on) at the pooled and at their family's share.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.calibrate.fp8_block_share import composed_rows, fit_share  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402

PROFILES = "docs/benchmarks/data/profiles/profile_h200x*_fp8h*_2026*.toml"
#: the sets the H200 datasheet's share was fitted on (fp8h1-fp8h15); later sets are checks
FIT_THROUGH = 15


def _sets(through: int = FIT_THROUGH) -> list[tuple[Path, ModelSpec, int]]:
    """(profile, its set's model, GPUs) of every fp8hN set's own calibration, N ≤
    ``through``."""
    out = []
    for f in sorted(ROOT.glob(PROFILES)):
        m = re.fullmatch(r"profile_h200x(\d)_(fp8h\d+)_2026\d{4}\.toml", f.name)
        model = ROOT / "benchmarks" / "sets" / (m.group(2) if m else "") / "m01.json"
        if m and model.is_file() and int(m.group(2).removeprefix("fp8h")) <= through:
            out.append((f, ModelSpec.from_dict(json.loads(model.read_text())), int(m.group(1))))
    return out


def rows(share: float = 0.0, through: int = FIT_THROUGH) -> list[dict]:
    """Every set's compiled fp8 rows (meshplan.calibrate.fp8_block_share.composed_rows), the
    casts composed at ``share`` (0: cast alone)."""
    out = []
    for path, model, gpus in _sets(through):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")    # the void compiled SP rows: left out anyway
            cluster = apply_profile(Cluster.preset("dgx-h200", nodes=1, gpus_per_node=gpus),
                                    path, keep_stale_rows=True)   # the rows the fit read
        out += [dict(r, set=path.name.split("_")[2]) for r in composed_rows(model, cluster,
                                                                            share)]
    return out


def dispatch_deltas(through: int = FIT_THROUGH) -> list[dict]:
    """Per compiled fp8 setting of every set's profile (no SP, dp 1, ep 1, ZeRO-0; the CPU
    pooled per setting, so one entry per recompute mode and tp): the host's dispatch of the
    fp8 block and of its bf16 twin, forward + backward per layer per micro-batch — what the
    composition, which keeps the bf16 dispatch, leaves out."""
    out = {}
    for path, model, gpus in _sets(through):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            meas = apply_profile(Cluster.preset("dgx-h200", nodes=1, gpus_per_node=gpus),
                                 path, keep_stale_rows=True).gpu.measured
        rows = [r for r in meas.layers if r.compile and r.forward_cpu_s > 0 and r.dp == 1
                and r.ep == 1 and not r.sequence_parallel and not r.zero]
        for r in (r for r in rows if r.precision == "fp8"):
            twin = next((b for b in rows if b.precision == "bf16" and (
                b.shape, b.seq_len, b.tp, b.recompute, b.micro_batch) == (
                r.shape, r.seq_len, r.tp, r.recompute, r.micro_batch)), None)
            if twin is not None:
                out[(path.name, r.tp, r.recompute)] = dict(
                    set=path.name.split("_")[2], tp=r.tp, recompute=r.recompute,
                    fp8_cpu_s=r.forward_cpu_s + r.backward_cpu_s,
                    bf16_cpu_s=twin.forward_cpu_s + twin.backward_cpu_s)
    return list(out.values())


def _errors(rs: list[dict], key: str) -> str:
    e = [r[key] / r["measured_s"] - 1 for r in rs]
    return (f"mean {100 * statistics.mean(map(abs, e)):.1f} %, max "
            f"{100 * max(map(abs, e)):.1f} %, signed {100 * statistics.mean(e):+.1f} %")


def _priced(rs: list[dict], share: float) -> list[dict]:
    return [dict(r, composed_s=r["composed_without_casts_s"] + share * r["casts_alone_s"])
            for r in rs]


def by_family(through: int) -> None:
    """The share per layer family on the sets through ``through``, and the rows of every
    later set priced at the pooled share and at their family's."""
    from meshplan.hardware_profiles.measured_rows import cast_family
    family = {p.name.split("_")[2]: cast_family(m) for p, m, _ in _sets(99)}
    every = rows(0.0, 99)
    fit_rows = [r for r in every if int(r["set"].removeprefix("fp8h")) <= through]
    later = [r for r in every if int(r["set"].removeprefix("fp8h")) > through]
    pooled = fit_share(fit_rows)
    for fam in sorted({family[r["set"]] for r in fit_rows}):
        mine = [r for r in fit_rows if family[r["set"]] == fam]
        share = fit_share(mine)
        print(f"{fam}: {len(mine)} rows of {len({r['set'] for r in mine})} models, share "
              f"{share:.3f}; in the fit {_errors(_priced(mine, share), 'composed_s')} (pooled "
              f"{_errors(_priced(mine, pooled), 'composed_s')})")
        out = [r for r in later if family[r["set"]] == fam]
        if out:
            print(f"  later sets ({len(out)} rows of {len({r['set'] for r in out})} models): "
                  f"at {share:.3f} {_errors(_priced(out, share), 'composed_s')}; at the "
                  f"pooled {pooled:.3f} {_errors(_priced(out, pooled), 'composed_s')}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--by-family", action="store_true",
                   help="fit the share per layer family and check it on the later sets")
    p.add_argument("--through", type=int, default=FIT_THROUGH, metavar="N",
                   help=f"the sets fp8h1..fp8hN (default {FIT_THROUGH}: the datasheet's fit; "
                        "later sets are held out)")
    args = p.parse_args(argv)
    before = rows(0.0, args.through)
    share = fit_share(before)
    after = rows(share, args.through)
    print(f"{len(before)} compiled fp8 rows of {len({r['set'] for r in before})} models")
    print(f"composed, casts priced alone: {_errors(before, 'composed_s')}")
    print(f"fitted fp8_cast_compiled_block_share = {share:.3f}")
    print(f"composed at that share: {_errors(after, 'composed_s')}")
    for rc in ("none", "selective", "full"):
        sub = [r for r in after if r["recompute"] == rc]
        if sub:
            print(f"  recompute {rc} ({len(sub)}): {_errors(sub, 'composed_s')}")
    host = dispatch_deltas(args.through)
    d = [r["fp8_cpu_s"] - r["bf16_cpu_s"] for r in host]
    print(f"host dispatch, fp8 block minus its bf16 twin, per layer per micro-batch "
          f"({len(host)} settings of {len({r['set'] for r in host})} models): "
          f"{1e3 * min(d):.2f} to {1e3 * max(d):.2f} ms, mean {1e3 * statistics.mean(d):.2f} "
          f"ms, {statistics.mean(x / r['bf16_cpu_s'] for x, r in zip(d, host)):.2f}x the "
          f"bf16 block's mean (not in the composition)")
    if args.by_family:
        by_family(args.through)
    if args.json:
        Path(args.json).write_text(json.dumps({"share": share, "rows": after,
                                               "dispatch": host}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
