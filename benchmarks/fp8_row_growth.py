"""How well an fp8 layer row timed at one micro-batch prices another, over the stored
profiles' own rows (CPU; no GPU).

Where a calibration's budget cuts fp8 rows, the cost model grows the fp8 row it has to the
asked micro-batch as its bf16 twin (same settings) grew between the two
(``MeasuredTables.fp8_layer``). This checks that rule where the answer is known: every pair
of fp8 rows of one profile that differ only in micro-batch, each with its bf16 twin at
both, priced one from the other by three rules, against the row timed there:

* ``ratio`` (the cost model's): fp8(b) = fp8(a) × bf16(b) / bf16(a), forward and backward
  apart;
* ``additive``: fp8(b) = bf16(b) + [fp8(a) − bf16(a)] (the difference held);
* ``proportional``: fp8(b) = fp8(a) × b / a.

    python benchmarks/fp8_row_growth.py [profiles ...]    # default: the stored profiles
    python benchmarks/fp8_row_growth.py --cost-model      # through costmodel.parts

moeh27 (docs/benchmarks/moe_checks.md) is the check that asked: its one fp8 row was grown
from micro-batch 2 to 4 and the arm read +8.0 %.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import statistics
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RULES = ("ratio", "additive", "proportional")


def _settings(r: dict) -> tuple:
    return (r.get("shape") or r.get("model"), r.get("seq_len"), r.get("tp", 1),
            bool(r.get("sequence_parallel")), r.get("recompute"), bool(r.get("compile")),
            r.get("zero", 0), r.get("dp", 1), r.get("ep", 1))


def _total(r: dict) -> float:
    return r["forward_s"] + r["backward_s"]


def grown(rule: str, fa: dict, ta: dict, tb: dict, a: int, b: int) -> float:
    """Forward + backward seconds of the fp8 row at ``b`` from the one at ``a`` (fa) and
    the bf16 twins at both (ta, tb)."""
    if rule == "ratio":
        return (fa["forward_s"] * tb["forward_s"] / ta["forward_s"]
                + fa["backward_s"] * tb["backward_s"] / ta["backward_s"])
    if rule == "additive":
        return _total(tb) + _total(fa) - _total(ta)
    return _total(fa) * b / a


def pairs(path: str):
    """(profile, settings, a, b, fp8(a), bf16(a), bf16(b), fp8(b)) for every ordered pair."""
    doc = tomllib.loads(Path(path).read_text())
    fp8: dict[tuple, dict[int, dict]] = {}
    bf16: dict[tuple, dict[int, dict]] = {}
    for r in doc.get("layers", []):
        if r.get("forward_s", 0) <= 0 or r.get("backward_s", 0) <= 0:
            continue
        if r.get("precision") == "fp8":
            k = _settings(r) + (r.get("fp8_recipe"), bool(r.get("fp8_weights_cached")))
            fp8.setdefault(k, {})[r["micro_batch"]] = r
        else:
            bf16.setdefault(_settings(r), {})[r["micro_batch"]] = r
    for k, rows in fp8.items():
        twins = bf16.get(k[:-2], {})
        for a, b in itertools.permutations(sorted(rows), 2):
            if a in twins and b in twins:
                yield Path(path).name, k, a, b, rows[a], twins[a], twins[b], rows[b]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="*")
    ap.add_argument("--cost-model", action="store_true",
                    help="the fp8hN sets' compiled rows through costmodel.parts instead")
    args = ap.parse_args(argv)
    if args.cost_model:
        print(cost_model_table())
        return 0
    paths = args.profiles or sorted(glob.glob(str(ROOT / "docs/benchmarks/data/profiles/*.toml")))
    errs: dict[str, dict[str, list[float]]] = {d: {r: [] for r in RULES}
                                                for d in ("up", "down", "all")}
    profiles = set()
    for path in paths:
        for name, _k, a, b, fa, ta, tb, fb in pairs(path):
            profiles.add(name)
            for rule in RULES:
                e = grown(rule, fa, ta, tb, a, b) / _total(fb) - 1
                errs["up" if b > a else "down"][rule].append(e)
                errs["all"][rule].append(e)
    n = len(errs["all"]["ratio"])
    if not n:
        raise SystemExit("no profile holds two fp8 rows of one setting with their bf16 twins")
    print(f"{n} ordered pairs of fp8 rows from {len(profiles)} profiles\n")
    print("| rule | pairs | mean abs. error | median | max | mean signed error |")
    print("|---|---|---|---|---|---|")
    for d in ("all", "up", "down"):
        for rule in RULES:
            v = errs[d][rule]
            a = [abs(x) for x in v]
            print(f"| {rule}, {d if d != 'all' else 'every pair'} | {len(v)} | "
                  f"{statistics.mean(a) * 100:.1f} % | {statistics.median(a) * 100:.1f} % | "
                  f"{max(a) * 100:.1f} % | {statistics.mean(v) * 100:+.1f} % |")
    return 0



def cost_model_pairs(through: int = 99):
    """The same check through the cost model itself (``costmodel.parts.layer_parts``), on
    every fp8hN set's own calibration (dense models): each compiled fp8 row (no SP, ZeRO-0,
    ep 1) priced with its setting's other fp8 rows removed but the one at micro-batch a;
    yields (set, tp, recompute, a, b, priced s, the tables' own growth s, timed s)."""
    import dataclasses
    import warnings

    sys.path.insert(0, str(ROOT))
    from fp8_composed_rows import _sets     # the fp8hN sets' own calibrations and models

    from meshplan.costmodel.data_parallel import group_links
    from meshplan.costmodel.parts import layer_parts
    from meshplan.hardware_profiles import Cluster
    from meshplan.hardware_profiles.calibrated import apply_profile
    from meshplan.spec import Job, Layout
    for path, model, gpus in _sets(through):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cluster = apply_profile(Cluster.preset("dgx-h200", nodes=1, gpus_per_node=gpus),
                                    path)
        meas = cluster.gpu.measured
        rows = [r for r in meas.layers if r.precision == "fp8" and r.compile
                and not r.sequence_parallel and not r.zero and r.dp == 1 and r.ep == 1]
        groups: dict[tuple, dict[int, object]] = {}
        for r in rows:
            groups.setdefault((r.shape, r.seq_len, r.tp, r.recompute, r.fp8_recipe,
                               r.fp8_weights_cached), {})[r.micro_batch] = r
        for (shape, seq, tp, mode, recipe, _c), by_mb in groups.items():
            for a, b in itertools.permutations(sorted(by_mb), 2):
                drop = {id(r) for mb, r in by_mb.items() if mb != a}
                kept = dataclasses.replace(meas, layers=tuple(r for r in meas.layers
                                                              if id(r) not in drop))
                cut = cluster.with_gpu(dataclasses.replace(cluster.gpu, measured=kept))
                job = Job(global_batch=2 * b, seq_len=seq, runtime="torch", precision="fp8",
                          fp8_recipe=recipe)
                lay = Layout(tp=tp, micro_batch=b, recompute=mode, compile=True)
                links = group_links(cut, lay)
                parts = layer_parts(model, cut, job, b, tp, False, mode, links.tp, links.pp,
                                    True, False)
                if parts.fp8 is None or not parts.fp8.row:
                    continue
                twin = kept.fp8_layer(model, recipe=recipe, seq_len=seq, tp=tp,
                                      sequence_parallel=False, recompute=mode,
                                      micro_batch=b, compile=True)
                yield (path.name.split("_")[2], tp, mode, a, b,
                       parts.layer.forward.total_s + parts.layer.backward.total_s,
                       twin.forward_s + twin.backward_s,
                       by_mb[b].forward_s + by_mb[b].backward_s)


def cost_model_table() -> str:
    got = list(cost_model_pairs())
    lines = ["| rule | pairs | mean abs. error | median | max | mean signed error |",
             "|---|---|---|---|---|---|"]
    for label, j in (("the cost model (grown as the composed layer grows)", 5),
                     ("the bf16 twin's growth (the tables' own)", 6)):
        e = [r[j] / r[7] - 1 for r in got]
        a = [abs(x) for x in e]
        lines.append(f"| {label} | {len(e)} | {statistics.mean(a) * 100:.1f} % | "
                     f"{statistics.median(a) * 100:.1f} % | {max(a) * 100:.1f} % | "
                     f"{statistics.mean(e) * 100:+.1f} % |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
