"""``meshplan plan``: search layouts, print the ranked table and the winner's breakdown, write
the plan file.

    meshplan plan --model llama3-70b --cluster dgx-h100 --nodes 32 --global-batch 1024 \\
        --seq-len 8192 --top-k 10 -o plan.json

Without ``-o`` nothing is written (the README's first command only prints).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from meshplan.commands.common import (add_job_args, add_model_cluster_args, job_from_args,
                                      model_cluster_from_args, positive_int)
from meshplan.commands.format import format_estimate
from meshplan.spec import RECOMPUTE, SCHEDULES
from meshplan.errors import ConfigError, MeshplanError
from meshplan.planner.planfile import check_output_file


def _gpus(text: str):
    try:
        if "-" in text:
            a, b = (int(x) for x in text.split("-", 1))
            if a < 1 or b < a:
                raise ValueError
            return range(a, b + 1)
        if "," in text:
            return [int(x) for x in text.split(",")]
        return int(text)
    except ValueError:
        raise ConfigError(f"--gpus {text!r} must be N, A-B (A ≤ B) or a comma list") from None


def add_arguments(p) -> None:
    add_model_cluster_args(p)
    add_job_args(p)
    g = p.add_argument_group("search")
    g.add_argument("--gpus", default=None, help="GPUs to use: N, a range A-B or a list "
                   "N1,N2 (the planner picks); default all GPUs of the cluster")
    g.add_argument("--objective", default="throughput",
                   choices=["throughput", "cost", "time_to_train"])
    g.add_argument("--top-k", type=positive_int, default=10)
    g.add_argument("--solver", default="cp-sat", choices=["cp-sat", "exhaustive"])
    g.add_argument("--max-tp", type=positive_int, default=None)
    g.add_argument("--tp-across-nodes", action="store_true",
                   help="allow tensor parallel groups to span nodes")
    g.add_argument("--schedules", default=None,
                   help=f"comma list of allowed schedules ({','.join(SCHEDULES)})")
    g.add_argument("--recompute-options", default=None,
                   help=f"comma list of allowed recompute modes ({','.join(RECOMPUTE)})")
    g.add_argument("--zero-options", default=None, help="comma list of ZeRO stages (0,1,2,3)")
    g.add_argument("--cp-options", default=None,
                   help="comma list of context-parallel degrees (default: automatic, powers "
                        "of two from 16k tokens per sequence)")
    g.add_argument("--cp-styles", default=None, help="comma list of cp styles (ring,all-to-all)")
    g.add_argument("--ep-options", default=None,
                   help="comma list of expert-parallel degrees (MoE; default: automatic)")
    g.add_argument("--etp-options", default=None,
                   help="comma list of expert-tensor-parallel degrees (MoE; default: 1 and "
                        "tp, or 1 under runtime torch)")
    g.add_argument("--max-micro-batch", type=positive_int, default=16)
    g.add_argument("--memory-headroom", type=float, default=0.0,
                   help="fraction of usable memory to keep free (e.g. 0.1)")
    g.add_argument("--host-bound-margin", type=float, default=0.03, metavar="FRACTION",
                   help="a layout whose CPU dispatch sets the step ranks first only when "
                        "predicted more than this fraction faster than a GPU-bound one "
                        "(0: by the prediction alone) [0.03]")
    g.add_argument("--fix", action="append", default=[], metavar="FIELD=VALUE",
                   help="pin a layout field, e.g. --fix pp=4 --fix schedule=1f1b")
    g.add_argument("-o", "--output", default=None,
                   help="plan file to write (default: none; the table is printed either way)")
    g.add_argument("--force", action="store_true", help="overwrite an existing plan file")
    g.add_argument("--launch-dir", default=None, metavar="DIR",
                   help="also write plan.json and a launch script for every node into DIR")
    g.add_argument("--launcher", choices=["torchrun", "slurm"], default=None,
                   help="launch script kind for --launch-dir [torchrun]")
    g.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _split(text, cast=str):
    return None if text is None else tuple(cast(x.strip()) for x in text.split(",") if x.strip())


def _fixed(items) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--fix {item!r} must be FIELD=VALUE")
        k, v = item.split("=", 1)
        k = k.strip().replace("-", "_")
        if k in ("sequence_parallel", "compile"):
            truth = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
            if v.strip().lower() not in truth:
                raise ConfigError(f"--fix {item!r}: {k} needs true or false (also 1/0, yes/no)")
            out[k] = truth[v.strip().lower()]
        elif k in ("schedule", "recompute", "cp_style"):
            out[k] = v
        elif k == "stage_layers":
            try:
                out[k] = tuple(int(x) for x in v.split(","))
            except ValueError:
                raise ConfigError(f"--fix {item!r}: stage_layers needs comma-separated "
                                  f"integers, e.g. stage_layers=9,10,10,9") from None
        else:
            try:
                out[k] = int(v)
            except ValueError:
                raise ConfigError(f"--fix {item!r}: {k} needs an integer") from None
    return out


def constraints_from_args(args):
    from meshplan.planner import Constraints
    kw = dict(max_tp=args.max_tp, tp_within_node=not args.tp_across_nodes,
              max_micro_batch=args.max_micro_batch, memory_headroom=args.memory_headroom,
              host_bound_margin=args.host_bound_margin,
              fixed=_fixed(args.fix))
    for key, text, cast in (("schedules", args.schedules, str),
                            ("recompute", args.recompute_options, str),
                            ("zero", args.zero_options, int),
                            ("cp", getattr(args, "cp_options", None), int),
                            ("cp_styles", getattr(args, "cp_styles", None), str),
                            ("ep", getattr(args, "ep_options", None), int),
                            ("etp", getattr(args, "etp_options", None), int)):
        try:
            val = _split(text, cast)
        except ValueError:
            raise ConfigError(f"--{key.replace('_', '-')}-options {text!r} is not a comma "
                              f"list of integers") from None
        if val is not None:
            kw[key] = val
    return Constraints(**kw)


def main(args) -> int:
    from meshplan.planner import plan as run_plan
    model, cluster = model_cluster_from_args(args)
    job = job_from_args(args)
    out = Path(args.output) if args.output else None
    if out is not None:   # before the search: a bad path fails in milliseconds
        check_output_file(out, overwrite=args.force, what="plan file", flag="--force")
    if args.launch_dir:
        _check_launch_dir(args, out)
    elif args.launcher:
        raise ConfigError(f"--launcher {args.launcher} writes a launch script only with "
                          f"--launch-dir DIR")
    constraints = constraints_from_args(args)
    gpus = _gpus(args.gpus) if args.gpus else None
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - t0:6.2f}s] {msg}", file=sys.stderr, flush=True)

    progress(f"planning {model.name} ({_params(model)}) on {cluster.name} "
             f"({cluster.num_gpus} GPUs), objective {args.objective}")
    p = run_plan(model, cluster, job, gpus=gpus, objective=args.objective, top_k=args.top_k,
                 constraints=constraints, solver=args.solver, progress=progress)
    st = p.stats
    progress(f"done: {st.get('configurations', 0):,} configurations "
             f"({st.get('space_layouts', 0):,} layouts with stage partitions); "
             f"{st.get('tables_built', st.get('layouts_evaluated', 0)):,} evaluated, "
             f"{st.get('survivors', '-')} in the CP-SAT model, {st['wall_s']:.2f} s")
    print(f"{model.name} ({_params(model)} params) on {cluster.name} "
          f"({cluster.nodes}×{cluster.gpus_per_node} {cluster.gpu.name}); batch "
          f"{job.global_batch}×{job.seq_len}; objective {args.objective}\n")
    print(_table(p))
    # short() ends with the stage partition, run-length coded ("layers 2×40", not 40 numbers)
    print(f"\nbest: {p.best.layout.short()}")
    if st.get("host_bound_preferred_over"):
        print(f"(ranked ahead of the host-bound {st['host_bound_preferred_over']}, predicted "
              f"faster by less than --host-bound-margin {args.host_bound_margin:g})")
    print(format_estimate(p.best.estimate))
    if out is not None:
        p.to_json(out, overwrite=True)
        print(f"\nplan written to {out}")
        hint = calibrate_hint(p.best.estimate.caveats, profile_given=bool(args.profile),
                              plan_path=out, gpus_per_node=cluster.gpus_per_node)
        if hint:
            print(hint)
    elif not args.launch_dir:
        print("\n(no plan file written; add -o plan.json to save it)")
    if args.launch_dir:
        script = p.write_launch_script(args.launch_dir, args.launcher or "torchrun",
                                       overwrite=args.force)
        print(f"launch script written to {script} (with {script.parent / 'plan.json'})")
        from meshplan.executor.run_results import warn_if_too_big
        from meshplan.planner.planfile import load_plan_file
        warn_if_too_big(load_plan_file(script.parent / "plan.json"))
    return 0


def calibrate_hint(caveats, *, profile_given: bool, plan_path, gpus_per_node: int) -> str:
    """The command that prices a written plan from its own model's rows, where the plan was
    not: priced from the datasheet, or with a caveat that asks for ``meshplan calibrate``
    (another model's rows, untimed micro-batches, compiled or fp8 rows composed); "" else."""
    if profile_given and not any("meshplan calibrate" in c for c in caveats):
        return ""
    return (f"to price it from the model's own layer rows (on one-GPU checks mostly within "
            f"1-4 % mean step time, another model's rows within 1-11 %: docs/calibrate.md), "
            f"run on one training node: meshplan calibrate --for-plan {plan_path} --nproc "
            f"{gpus_per_node} --out profile.toml, then plan again with --profile profile.toml")


def _params(model) -> str:
    n = model.num_params()
    return f"{n / 1e9:.2f}B" if n < 1e13 else f"{n:.3g}"


def _check_launch_dir(args, out: Path | None) -> None:
    """Refuse an existing script or plan in --launch-dir before the search, not after."""
    d = Path(args.launch_dir)
    if d.exists() and not d.is_dir():
        raise MeshplanError(f"--launch-dir {str(d)!r} exists and is not a directory")
    if out is not None and out.resolve() == (d / "plan.json").resolve():
        raise MeshplanError(f"-o {str(out)!r} is the plan file --launch-dir writes; drop -o "
                            f"(the launch directory gets plan.json) or name another file")
    name = "run_slurm.sbatch" if args.launcher == "slurm" else "run_torchrun.sh"
    for f in (d / name, d / "plan.json"):
        if f.exists() and not args.force:
            raise MeshplanError(f"{str(f)!r} exists; refusing to overwrite it (pass --force)")


def _table(p) -> str:
    df = p.table
    cols = ["gpus", "dp", "pp", "tp", "micro_batch", "schedule", "vpp", "recompute", "zero",
            "sequence_parallel", "step_time_s", "tokens_per_s", "mfu", "memory_peak_gib",
            "bubble_s", "dp_comm_exposed_s"]
    extra = [c for c in ("usd_per_million_tokens", "time_to_train_s") if c in df.columns]
    # context and expert parallelism: their columns where a candidate uses them
    if (df["cp"] > 1).any():
        df["cp"] = [f"{c}" + (" a2a" if c > 1 and st == "all-to-all" else "")
                    for c, st in zip(df["cp"], df["cp_style"])]
        cols.insert(cols.index("tp") + 1, "cp")
    for c in ("etp", "ep"):
        if (df[c] > 1).any():
            cols.insert(cols.index("tp") + 1 + ("cp" in cols), c)
    df = df[cols + extra].copy()
    df["mfu"] = (df["mfu"] * 100).map("{:.1f}%".format)
    df["tokens_per_s"] = df["tokens_per_s"].map("{:,.0f}".format)
    for c in ("step_time_s", "bubble_s", "dp_comm_exposed_s"):
        df[c] = df[c].map("{:.3f}".format)
    df["memory_peak_gib"] = df["memory_peak_gib"].map("{:.1f}".format)
    df = df.rename(columns={"micro_batch": "mb", "sequence_parallel": "sp",
                            "memory_peak_gib": "peak GiB", "dp_comm_exposed_s": "dp_exposed_s"})
    return df.to_string()
