"""A few of the calibration's MoE layer rows, at ep 1 and at ep = world, on the local GPUs
(issue 38): what expert parallelism adds to the layer as the executor runs it, measured, for
a model whose runs were priced from its ep = 1 rows plus the formulas (moeh4: the tp 2 + SP ·
ep 2 layouts ran 7-19 % slower than that price).

Runs ``meshplan.calibrate.bench_layers.bench_layer_rows`` on the rows the options select
(its ``only`` predicate): the model's layer at one tp / SP setting, the given recompute modes
and micro-batches, at ep 1 and ep = world (``--no-ep1``: ep = world only), of the kinds
``--kinds`` names — eager plain rows (default), compiled plain rows, FSDP2 rows (ZeRO-2 and
3 over the rest of the world, eager) — with ``--sync-deep`` each plain ep module's first
row timed again on 4 blocks (logged). The same code and the same paused collector as
``meshplan calibrate``, in a fresh process: moeh9's compiled ep rows, timed so after its
runs, read 7.8 ms a layer where its calibration read 12.4 (docs/benchmarks/moe_checks.md "moeh9").
Each rank writes nothing; rank 0 writes the rows (the profile's ``[[layers]]`` fields, with ``ep``)
and the progress lines to ``--out``.

    torchrun --standalone --nproc-per-node 2 benchmarks/moe_ep_rows_gpu.py \\
        --model benchmarks/sets/moeh4/m01.json --seq-len 4096 --tp 2 --sp \\
        --recompute none,full --micro-batches 1,2 --out $OUT/ep_rows.json \\
        --base-profile docs/benchmarks/data/profiles/profile_h200x2_moeh4_20261129.toml \\
        --profile-out $OUT/profile_ep.toml
    # the ep rows read three times in one process, as a budget-bound calibration re-times
    # them (moeh13)
    torchrun --standalone --nproc-per-node 2 benchmarks/moe_ep_rows_gpu.py \\
        --model benchmarks/sets/moeh13/m01.json --seq-len 2048 --tp 2 --sp \\
        --recompute none,full --micro-batches 4 --kinds eager,compiled --no-ep1 --rounds 3 \\
        --out $OUT/ep_rows.json
    # the compiled ep rows alone, as a check's calibration times them (moeh10)
    torchrun --standalone --nproc-per-node 2 benchmarks/moe_ep_rows_gpu.py \\
        --model benchmarks/sets/moeh10/m01.json --seq-len 1024 --tp 2 --sp \\
        --recompute selective,full --micro-batches 8 --kinds compiled --no-ep1 --sync-deep \\
        --out $OUT/ep_rows.json
    # CPU check (gloo, tiny rows)
    torchrun --standalone --nproc-per-node 2 benchmarks/moe_ep_rows_gpu.py --device cpu \\
        --model /tmp/tiny_moe.json --seq-len 32 --out /tmp/ep_rows.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _add_rows(base: Path, out: Path, rows: list[dict]) -> None:
    """``base`` with ``rows`` appended to its ``[[layers]]`` (a row of the same group and
    micro-batch replaced), written to ``out``; provenance says what was added."""
    import tomllib

    from meshplan.calibrate.tomlfile import dumps, write_text_atomic
    from meshplan.hardware_profiles.calibrated import load_profile
    from meshplan.hardware_profiles.measured import MeasuredLayer
    doc = tomllib.loads(base.read_text())
    new = {(MeasuredLayer(**r).group, r["micro_batch"]) for r in rows}
    kept = [r for r in doc.get("layers", [])
            if (MeasuredLayer(**r).group, r["micro_batch"]) not in new]
    doc["layers"] = kept + rows
    prov = dict(doc.get("provenance", {}))
    prov["ep_rows"] = {"rows": len(rows), "command": " ".join(sys.argv),
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    doc["provenance"] = prov
    write_text_atomic(out, dumps(doc))
    load_profile(out)      # what was written reads back


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="an MoE ModelSpec JSON")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism (tp > 1)")
    p.add_argument("--recompute", default="none", help="comma-separated modes")
    p.add_argument("--micro-batches", default="1", help="comma-separated sizes")
    p.add_argument("--kinds", default="eager",
                   help="comma-separated: eager (plain rows), compiled (plain rows, "
                        "torch.compile'd), fsdp (ZeRO-2/3 rows, eager)")
    p.add_argument("--no-ep1", action="store_true", help="only the rows at ep = world")
    p.add_argument("--rounds", type=int, default=1,
                   help="time the rows this many times in this process, each row the median "
                        "(every reading logged; compiled ep rows recompiled each round)")
    p.add_argument("--sync-deep", action="store_true",
                   help="each plain ep module's first row timed again on 4 blocks (logged)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--out", required=True)
    p.add_argument("--base-profile", default=None,
                   help="also write a copy of this profile with the ep > 1 rows added "
                        "(to --profile-out): its runs re-predicted from rows of their ep")
    p.add_argument("--profile-out", default=None)
    args = p.parse_args(argv)
    if (args.base_profile is None) != (args.profile_out is None):
        p.error("--base-profile and --profile-out go together")
    if args.base_profile and not Path(args.base_profile).is_file():
        p.error(f"--base-profile {args.base_profile!r}: no such file")
    from meshplan.calibrate.layer_grid import RECOMPUTE
    bad = [m for m in args.recompute.split(",") if m not in RECOMPUTE]
    if bad:
        p.error(f"--recompute {args.recompute!r}: {bad} not among {list(RECOMPUTE)}")
    try:
        mbs = [int(x) for x in args.micro_batches.split(",")]
    except ValueError:
        mbs = []
    if not mbs or min(mbs) < 1:
        p.error(f"--micro-batches {args.micro_batches!r}: comma-separated integers >= 1")
    kinds = set(args.kinds.split(","))
    if not kinds or kinds - {"eager", "compiled", "fsdp"}:
        p.error(f"--kinds {args.kinds!r}: comma-separated among eager, compiled, fsdp")
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: an integer >= 1")
    if args.tp < 1 or (args.sp and args.tp == 1):
        p.error(f"--tp {args.tp}{' --sp' if args.sp else ''}: tp >= 1, and --sp needs tp > 1")

    import torch

    from meshplan.calibrate import bench_layers
    from meshplan.spec import ModelSpec
    from torchrun_group import init_torchrun_group
    model = ModelSpec.from_dict(json.loads(Path(args.model).read_text()))
    if not model.is_moe:
        raise SystemExit(f"--model {args.model}: {model.name} is dense; this times MoE rows")
    import torch.distributed as dist
    device = init_torchrun_group(args.device == "cuda")
    rank, world = dist.get_rank(), dist.get_world_size()
    modes = tuple(args.recompute.split(","))
    mbs = tuple(mbs)
    sp = bool(args.sp)

    def kind(cfg) -> str:
        return "fsdp" if cfg.zero >= 2 else "compiled" if cfg.compile else "eager"

    def only(cfg) -> bool:
        return (not cfg.part and kind(cfg) in kinds and cfg.tp == args.tp
                and cfg.sequence_parallel == sp
                and cfg.recompute in modes
                and cfg.ep in ((world,) if args.no_ep1 else (1, world))
                and (cfg.zero == 0 or cfg.dp * cfg.tp == world))
    lines: list[str] = []

    class Log:
        def step(self, message: str) -> None:
            lines.append(message)
            if rank == 0:
                print(message, flush=True)
        note = step
    from meshplan.executor.gc_control import gc_paused
    t0 = time.perf_counter()
    # the collector paused as `meshplan calibrate` pauses it (calibrate.run.calibrate): its
    # pauses would otherwise land in the rows' CPU and synchronized times
    with gc_paused():
        tables = bench_layers.bench_layer_rows(
            [model], args.seq_len, device, world, rank, quick=False, max_tp=args.tp,
            micro_batches=mbs, rounds=args.rounds, only=only, progress=Log(),
            compile_rows=modes if "compiled" in kinds else (), sync_deep=args.sync_deep)
    if rank == 0:
        doc = {"model": model.name, "seq_len": args.seq_len, "world": world,
               "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "seconds": time.perf_counter() - t0,
               "layers": list(tables.layers), "lines": lines}
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        if args.base_profile:
            _add_rows(Path(args.base_profile), Path(args.profile_out),
                      [r for r in tables.layers if r["ep"] > 1])
        for r in tables.layers:
            print(f"{'zero%d dp%d ' % (r['zero'], r['dp']) if r['zero'] else ''}"
                  f"tp{r['tp']}{' sp' if r['sequence_parallel'] else ''} ep{r['ep']} "
                  f"{'compiled ' if r['compile'] else ''}"
                  f"rc={r['recompute']} mb{r['micro_batch']}: fwd {r['forward_s'] * 1e3:.3f} "
                  f"bwd {r['backward_s'] * 1e3:.3f} ms, cpu {r['forward_cpu_s'] * 1e3:.3f} / "
                  f"{r['backward_cpu_s'] * 1e3:.3f} ms, act {r['activation_bytes'] / 2**20:.1f}"
                  f" MiB", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
