"""Draw the 8-GPU held-out set of issue 42: new models, layouts from the planner's 8-GPU space.

The 4-GPU machinery (``draw_models.py``, ``draw_holdout.py``), extended to one 8-GPU node:

- Models: :func:`draw_models.draw_model` with layers a multiple of 8 (even stages at pp 8
  and at interleaved pp 4 × vpp 2), ``--min-params``-``--max-params`` (3-6 B: large enough
  that tp 8 and ZeRO-3 over dp 8 have GPU-bound layouts; small enough for the executor,
  which trains the whole model with fp32 weights and Adam, 16 bytes a parameter, on 80 GB
  cards), a layer shape no GPU set has run, tp 8 possible (heads, kv heads, MLP width and
  vocabulary divisible by 8: tp inside the node is the point of the issue) and each family
  (GPT, Llama) at most half of the models (tp 8 favours multi-head attention; a draw of GPT
  alone would leave SwiGLU/RMSNorm/RoPE blocks out). A model is kept if at least
  ``--per-model`` of its layouts are admissible and one of them is tp 8.
- Job: ``--tokens-per-step`` 64 k tokens (``global_batch = max(4, 65536 // seq)``), twice
  the 4-GPU rounds' 32 k: 8 k tokens per GPU, as there.
- Layouts: :func:`draw_holdout.candidates` on 8 ranks (the planner's own space, accepted by
  ``check_layout`` and the executor's ``check_layout_runnable``, fitting an 80 GB H100 and
  ≤ ``--max-mem-gib`` 60 GiB on the screening profile: transfer36 under-predicted the
  memory of models without layer rows by up to 22 %), screened steps 0.25-1.5 s, drawn
  split → schedule → configuration by :func:`draw_holdout.draw` until the set covers
  :data:`FAMILIES` (the issue's list) *and* every schedule, ZeRO stage, recompute mode and
  SP (:func:`draw_holdout.covers`), with screened steps adding up to ≤ ``--max-total-s``
  16 s (16 layouts of ~20-25 s start-up and 8 steps each in ~8 min of validate calls).
- GPU-bound screen (:func:`host_load_proxy`): a model never run has no calibrated CPU rows,
  so the cost model's own host load reads 0 for it (transfer36 drew host-bound models that
  way). The proxy is ``Estimate.host_load``'s formula with borrowed rows: the CPU dispatch
  that ``--cpu-profiles`` measured for blocks of the *same family* (GPT and Llama blocks
  issue the same kernels whatever their width) — per micro-batch, the layers a rank holds
  times the row's forward + backward CPU seconds, the per-call part, the schedule's
  actions and the ends, plus the backward path through the earlier stages — over the
  screened GPU time. tp 8 takes the tp 4 rows (the same kernels and collectives per
  layer); where several profiles match, the largest CPU time counts (their hosts differ by
  ~1.4×). Admitted: ≤ ``--max-host-load`` 0.6 (the 4-GPU draws take 0.75 of the model's
  own load on calibrated models). On round 26's own models and profile the proxy gives
  the model's host load within −0.14..+0.21 (holdout22-25, 64 layouts, mean +0.02; with
  the three profiles' maximum −0.01..+0.33, mean +0.09); it calls transfer36's t19 (GPT
  2.69 B ZeRO-3, −47.8 % there without CPU rows) host-bound at 1.7. (After this set was
  drawn, the cost model itself learned to borrow the nearest timed shape's CPU rows,
  ``costmodel/nearest_rows.py``; it has none to borrow for tp 8 or FSDP2 over dp from 4-GPU
  profiles, where the proxy extrapolates.)

Not drawn: context and expert parallelism. ``meshplan.spec.validate.check_modelled`` refuses
cp > 1 and ep > 1 (the cost model does not price them yet), so the planner's space has
neither; the issue asks for them "once they exist".

    PYTHONPATH=. python benchmarks/gpu8_draw.py --seed 42 \\
        --profile docs/benchmarks/data/profiles/profile_h200x4_round26.toml \\
        --out benchmarks/sets/gpu8_42
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import random
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import draw_holdout as dh  # noqa: E402
import draw_models as dm  # noqa: E402
from meshplan.calibrate.shapes import valid_tps  # noqa: E402
from meshplan.costmodel.measured import layer_shape_key  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402

NPROC = 8
TOKENS_PER_STEP = 65536
# the layout families at 8 ranks: name -> predicate on a Layout
FAMILIES = {
    "tp 8": lambda l: (l.dp, l.pp, l.tp) == (1, 1, 8),
    "tp 4 × dp 2": lambda l: (l.dp, l.pp, l.tp) == (2, 1, 4),
    "pp 8": lambda l: (l.dp, l.pp, l.tp) == (1, 8, 1),
    "interleaved pp 4 × tp 2": lambda l: (l.dp, l.pp, l.tp) == (1, 4, 2)
    and l.schedule == "interleaved-1f1b",
    "ZeRO-3 over dp 8": lambda l: l.dp == 8 and l.zero == 3,
}


def families_of(layout) -> list[str]:
    return [name for name, has in FAMILIES.items() if has(layout)]


def covers8(layouts) -> bool:
    """tp 8, tp 4 × dp 2, pp 8, interleaved pp 4 × tp 2, ZeRO-3 over dp 8, and every
    schedule, ZeRO stage, recompute mode and sequence parallelism"""
    return (all(any(has(l) for l in layouts) for has in FAMILIES.values())
            and dh.covers(layouts))


# ---- the GPU-bound screen --------------------------------------------------------------------
def _family(shape: str) -> str:
    return "gpt" if "-gelu-" in shape else "llama"


def model_family(model) -> str:
    return "gpt" if model.activation == "gelu" else "llama"


class CpuRows:
    """The CPU dispatch fields of the layer and end rows of one or more profiles, by family
    (GPT / Llama), and their largest pipeline action cost. Where several profiles have a
    matching row the largest CPU time counts: the hosts differ (transfer36's 4 × H100 host
    dispatched ~1.4× slower than round 26's 4 × H200 one; their host probes 10.5 vs 7.2 us)
    and the 8-GPU machine's host is unknown."""

    def __init__(self, *profiles: str | Path):
        self.layers, self.ends, self.action_s = [], [], 0.0
        for profile in profiles:
            doc = tomllib.loads(Path(profile).read_text())
            self.layers += [r for r in doc.get("layers", []) if r.get("backward_cpu_s", 0) > 0]
            self.ends += [r for r in doc.get("ends", []) if r.get("backward_cpu_s", 0) > 0]
            self.action_s = max(self.action_s,
                                float(doc.get("gpu", {}).get("pipeline_action_s", 0.0)))
        if not self.layers:
            raise SystemExit(f"{', '.join(map(str, profiles))}: no layer rows with CPU "
                             f"dispatch times (a profile calibrated with --model on a GPU is "
                             f"needed to screen)")

    def _tp(self, family: str, tp: int) -> int:
        tps = [r["tp"] for r in self.layers if _family(r["shape"]) == family]
        if not tps:
            raise SystemExit(f"the screening profile has no {family} layer rows")
        return max(t for t in tps if t <= tp) if any(t <= tp for t in tps) else min(tps)

    def _rows(self, family: str, tp: int, sp: bool, recompute: str, zero: int):
        return [r for r in self.layers if _family(r["shape"]) == family and r["tp"] == tp
                and bool(r["sequence_parallel"]) == (sp and tp > 1)
                and r["recompute"] == recompute and r["zero"] == zero
                and (r["dp"] > 1 if zero else r["dp"] == 1)]

    def layer_s(self, family: str, layout) -> tuple[float, float]:
        """(per layer, per call) CPU seconds of one micro-batch's forward + backward: the
        largest over the matching rows (conservative). FSDP2 (ZeRO-2/3 over dp > 1) at a tp
        the profiles did not time with it (tp 4 on 4 GPUs): the plain tp row plus what
        FSDP2 adds at the largest tp that was, as ``MeasuredTables.fsdp_layer`` composes."""
        tp = self._tp(family, layout.tp)
        sp, rc = layout.sequence_parallel, layout.recompute
        zero = layout.zero if layout.zero >= 2 and layout.dp > 1 else 0

        def backward(r):
            split = r.get("backward_input_cpu_s", 0) + r.get("backward_weight_cpu_s", 0)
            return max(r["backward_cpu_s"], split) if layout.schedule == "zero-bubble" \
                else r["backward_cpu_s"]

        def worst(rows):
            if not rows:
                raise SystemExit(f"the CPU profiles have no {family} row for tp {tp} sp {sp} "
                                 f"rc={rc} zero {zero}")
            return (max(r["forward_cpu_s"] + backward(r) for r in rows),
                    max(r.get("forward_cpu_fixed_s", 0) + r.get("backward_cpu_fixed_s", 0)
                        for r in rows))
        plain = worst(self._rows(family, tp, sp, rc, 0))
        if not zero:
            return plain
        fsdp = self._rows(family, tp, sp, rc, zero)
        if fsdp:
            return worst(fsdp)
        tf = max((r["tp"] for r in self.layers if _family(r["shape"]) == family
                  and r["zero"] == zero and r["dp"] > 1 and r["tp"] <= tp), default=1)
        added = [f - p for f, p in zip(worst(self._rows(family, tf, sp, rc, zero)),
                                       worst(self._rows(family, tf, sp, rc, 0)))]
        return plain[0] + max(0.0, added[0]), plain[1] + max(0.0, added[1])

    def end_s(self, family: str, layout, part: str) -> float:
        tp = self._tp(family, layout.tp)
        sp = layout.sequence_parallel and tp > 1
        rows = [r for r in self.ends if _family(r["shape"]) == family and r["part"] == part
                and r["tp"] == tp and bool(r["sequence_parallel"]) == sp]
        return max((r["forward_cpu_s"] + r["backward_cpu_s"] for r in rows), default=0.0)


def host_dispatch_s(rows: CpuRows, model, job, layout, stage_backward_s) -> float:
    """When the busiest rank's GPU can finish at the earliest, given its CPU: per
    :meth:`meshplan.costmodel.host.HostDispatch.host_bound_s`, rank r's CPU dispatch of the
    step (its layers' rows, the per-call part, the schedule's actions, the embedding on
    rank 0 and the output on the last) plus the backward path of the last micro-batch
    through the stages before it (``stage_backward_s``: the estimate's, per virtual stage;
    first chunk only), maximised over ranks; with borrowed rows."""
    fam = model_family(model)
    per_layer, per_call = rows.layer_s(fam, layout)
    actions = 3 if layout.schedule == "zero-bubble" else 2
    layers = math.ceil(model.num_layers / layout.pp)
    per_mb = layers * per_layer + layout.vpp * per_call
    if layout.pp > 1:
        per_mb += actions * layout.vpp * rows.action_s
    emb, out = rows.end_s(fam, layout, "embedding"), rows.end_s(fam, layout, "output")
    nmb = layout.num_microbatches(job.global_batch)
    worst, path = 0.0, 0.0
    for r in range(layout.pp):
        ends = (emb if r == 0 else 0.0) + (out if r == layout.pp - 1 else 0.0)
        worst = max(worst, nmb * (per_mb + ends) + path)
        path += stage_backward_s[r]
    return worst


def host_load_proxy(rows: CpuRows, model, job, layout, est) -> float:
    """CPU dispatch over GPU time, as ``Estimate.host_load`` with borrowed CPU rows."""
    return host_dispatch_s(rows, model, job, layout, est.stage_backward_s) / est.pipeline_s


# ---- the draw --------------------------------------------------------------------------------
def job_for(model, tokens_per_step: int = TOKENS_PER_STEP):
    return dm.job_for(model, tokens_per_step)


def screened_pool(model, rows: CpuRows, cluster, h100, *, max_host_load: float,
                  max_step_s: float, min_step_s: float, max_mem_gib: float,
                  tokens_per_step: int = TOKENS_PER_STEP):
    """(layout, estimate, proxy host load) of every admissible 8-GPU layout of ``model``."""
    job = job_for(model, tokens_per_step)
    out = []
    for lay, e in dh.candidates(model, cluster, h100, job, set(), max_host_load=math.inf,
                                max_step_s=max_step_s, max_mem_gib=max_mem_gib, nproc=NPROC):
        load = host_load_proxy(rows, model, job, lay, e)
        if e.step_time_s >= min_step_s and load <= max_host_load:
            out.append((lay, e, load))
    return out


CPU_PROFILES = tuple(f"docs/benchmarks/data/profiles/{n}.toml" for n in (
    "profile_h200x4_round26", "profile_h100x4_round18", "profile_h100x4_transfer36_part1"))


def draw_set(seed: int, *, profile: str, gpu: str, cpu_profiles=CPU_PROFILES,
             n_models: int = 2, per_model: int = 8,
             min_params: float = 3e9, max_params: float = 6e9, max_host_load: float = 0.6,
             max_step_s: float = 1.5, min_step_s: float = 0.25, max_total_s: float = 16.0,
             max_mem_gib: float = 60.0, tokens_per_step: int = TOKENS_PER_STEP,
             prefix: str = "g42", except_set: str | None = None):
    """Models and layouts of the set; returns (models, chosen, attempt, rejected, proxy)
    where ``proxy[(model name, layout)]`` is the layout's screened host load.
    ``except_set``: the set being drawn, whose own shapes are not "run before" (so the draw
    can be repeated once it is committed)."""
    rng = random.Random(seed)
    rows = CpuRows(*(ROOT / p for p in cpu_profiles))
    cluster = apply_profile(Cluster.preset("dgx-h200" if "H200" in gpu else "dgx-h100",
                                           nodes=1, gpus_per_node=NPROC), profile)
    h100 = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=NPROC)
    seen = dm.known_shapes(except_set=except_set)
    models, pools, rejected, proxy = {}, {}, [], {}
    while len(models) < n_models:
        m = dm.draw_model(rng, f"{prefix}m{len(models) + len(rejected) + 1:02d}",
                          min_params=min_params, max_params=max_params, layer_multiple=8)
        if layer_shape_key(m) in seen:
            rejected.append((m.name, "a shape run before"))
            continue
        if sum(model_family(k) == model_family(m) for k in models.values()) \
                >= math.ceil(n_models / 2):
            rejected.append((m.name, f"{model_family(m)} has its share of the models"))
            continue
        if NPROC not in valid_tps(m, NPROC) or m.vocab_size % NPROC:
            rejected.append((m.name, "no tp 8 (heads, kv heads, MLP or vocabulary)"))
            continue
        pool = screened_pool(m, rows, cluster, h100, max_host_load=max_host_load,
                             max_step_s=max_step_s, min_step_s=min_step_s,
                             max_mem_gib=max_mem_gib, tokens_per_step=tokens_per_step)
        if len(pool) < per_model or not any(FAMILIES["tp 8"](l) for l, _, _ in pool):
            rejected.append((m.name, f"{len(pool)} admissible layouts, "
                                     f"{sum(FAMILIES['tp 8'](l) for l, _, _ in pool)} tp 8"))
            continue
        models[m.name] = m
        pools[m.name] = [(l, e) for l, e, _ in pool]
        fam = {f: sorted(e.step_time_s for l, e, _ in pool if has(l))
               for f, has in FAMILIES.items()}
        print(f"# {m.name}: {len(pool)} admissible layouts over "
              f"{len({(l.dp, l.pp, l.tp) for l, _, _ in pool})} splits; " + ", ".join(
                  f"{f} {len(v)}" + (f" (from {v[0]:.2f} s)" if v else "")
                  for f, v in fam.items()), file=sys.stderr)
        proxy.update({(m.name, l): p for l, _, p in pool})
    union = [l for p in pools.values() for l, _ in p]
    missing = [f for f, has in FAMILIES.items() if not any(has(l) for l in union)]
    if missing:
        raise SystemExit(f"gpu8_draw: no admissible layout of {missing} in the drawn models "
                         f"{list(models)}; another seed, or a wider --max-step-s / "
                         f"--max-host-load")
    chosen, attempt = dh.draw(pools, per_model, seed, max_total_s, covers=covers8)
    return models, chosen, attempt, rejected, proxy


def calibrate_micro_batches(picks) -> list[int]:
    """The micro-batch sizes one model's calibration times: the smallest and the largest
    of its layouts (the layer tables interpolate linearly between them; a third size would
    add half again to the plain and end rows, which at 8 ranks do not fit the device
    budget). Each model is calibrated in its own call (``gpu8_round.py calibrate --part``),
    so each gets its own sizes."""
    mbs = sorted({l.micro_batch for l, _ in picks})
    return sorted({mbs[0], mbs[-1]})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--profile", required=True,
                    help="calibrated profile the layouts are screened on (step, memory)")
    ap.add_argument("--gpu", default="NVIDIA H200", help="the profile's GPU")
    ap.add_argument("--cpu-profiles", default=",".join(CPU_PROFILES),
                    help="profiles whose CPU rows the GPU-bound screen borrows (the largest "
                         "matching row counts) [%(default)s]")
    ap.add_argument("--models", type=int, default=2)
    ap.add_argument("--per-model", type=int, default=8)
    ap.add_argument("--min-params", type=float, default=3e9)
    ap.add_argument("--max-params", type=float, default=6e9)
    ap.add_argument("--max-host-load", type=float, default=0.6)
    ap.add_argument("--max-step-s", type=float, default=1.5)
    ap.add_argument("--min-step-s", type=float, default=0.25)
    ap.add_argument("--max-total-s", type=float, default=16.0,
                    help="screened steps of the whole set at most: 16 layouts of ~20-25 s "
                         "start-up and 8 steps each in ~8 min of validate calls "
                         "[%(default)s]")
    ap.add_argument("--max-mem-gib", type=float, default=60.0,
                    help="screened peak memory at most (transfer36 under-predicted memory "
                         "of models without layer rows by up to 22 %%) [%(default)s]")
    ap.add_argument("--tokens-per-step", type=int, default=TOKENS_PER_STEP)
    ap.add_argument("--prefix", default="g42")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not Path(args.profile).is_file():
        ap.error(f"--profile {args.profile}: no such file")
    models, chosen, attempt, rejected, proxy = draw_set(
        args.seed, profile=args.profile, gpu=args.gpu,
        cpu_profiles=tuple(args.cpu_profiles.split(",")), n_models=args.models,
        per_model=args.per_model, min_params=args.min_params, max_params=args.max_params,
        max_host_load=args.max_host_load, max_step_s=args.max_step_s,
        min_step_s=args.min_step_s, max_total_s=args.max_total_s,
        max_mem_gib=args.max_mem_gib, tokens_per_step=args.tokens_per_step,
        prefix=args.prefix, except_set=args.out.name if args.out else None)
    total = sum(e.step_time_s for picks in chosen.values() for _, e in picks)
    mbs = {name: calibrate_micro_batches(picks) for name, picks in chosen.items()}
    print(f"# seed {args.seed}: {len(models)} models ({len(rejected)} drawn and rejected: "
          f"{rejected}), layouts on attempt {attempt}, {total:.1f} s of screened steps, "
          f"calibrate micro-batches {mbs}")
    for name, picks in chosen.items():
        for l, e in sorted(picks, key=lambda x: (x[0].pp, x[0].tp, x[0].dp, x[0].micro_batch)):
            print(f"  {name} {l.short()}: {e.step_time_s:.3f} s, proxy CPU "
                  f"{proxy[(name, l)]:.2f}, {e.memory_peak_bytes / 2**30:.1f} GiB "
                  f"{' '.join(families_of(l))}")
    if args.out:
        meta = {"set": args.out.name, "seed": args.seed, "prefix": "g", "nproc": NPROC,
                "drawn_at_commit": dm._git_head(), "date": datetime.date.today().isoformat(),
                "command": " ".join(["python", "benchmarks/gpu8_draw.py", *(argv or
                                                                            sys.argv[1:])]),
                "screen_profile": args.profile, "screen_gpu": args.gpu,
                "screen_max_host_load": args.max_host_load,
                "screen_cpu_profiles": args.cpu_profiles.split(","),
                "rejected_models": [list(r) for r in rejected], "layout_attempt": attempt,
                "tokens_per_step": args.tokens_per_step,
                "families": list(FAMILIES)}
        doc = dm.write_set(args.out, models, chosen, meta,
                           tokens_per_step=args.tokens_per_step)
        from meshplan.spec import Layout
        for m in doc["models"]:
            m["calibrate_micro_batches"] = mbs[m["name"]]
            for x in m["layouts"]:
                lay = Layout.from_dict({k: v for k, v in x.items()
                                        if k != "name" and not k.startswith("screen_")})
                x["screen_host_proxy"] = round(proxy[(m["name"], lay)], 3)
                x["families"] = families_of(lay)
        (args.out / "set.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
