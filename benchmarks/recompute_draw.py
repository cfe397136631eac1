"""Draw a one-GPU memory check of full recomputation with one micro-batch a step (issue 36):
one never-run model from :func:`draw_models.draw_model` and five layouts at dp = pp = tp = 1,
written before any run.

The cast-cache relief (``MemoryReliefs.cast_cache_relief_bytes``) counts, since 2026-11-29,
every gradient not yet allocated at the first recompute of a step that has one micro-batch
(its only backward is its first); before, it did so only on a last rank holding two
micro-batches. Round 41's x04 and x18 (post hoc) moved from +5..+8 % to within 3.2 %. This
set holds that rule out on a model it was not read from: full recomputation at m = 1 (the
rule), at m = 2 and m = 4 (controls, where it does not apply), selective and none at m = 1
(other memory paths at the same micro-batch). The job is ``draw_models.job_for`` at 16,384
tokens a step, so micro-batch = global batch is m = 1.

    PYTHONPATH=. python benchmarks/recompute_draw.py --seed 44 --out benchmarks/sets/rc44
    # one GPU: calibrate on the model, then validate (transfer_round.py, --nproc 1)
    python benchmarks/transfer_round.py calibrate --set benchmarks/sets/rc44 --nproc 1 \\
        --micro-batches 1,2,4,8,16 --budget 240 --out $OUT
    python benchmarks/transfer_round.py validate --set benchmarks/sets/rc44 --nproc 1 \\
        --profile PROFILE --budget 240 --out $OUT
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from draw_models import _git_head, draw_model, job_for, write_set  # noqa: E402
from meshplan.costmodel import estimate  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.spec import Layout  # noqa: E402

TOKENS_PER_STEP = 16384


def layouts(global_batch: int) -> list[Layout]:
    """m = 1 full (the rule), m = 2 and m = 4 full (controls), m = 1 selective and none."""
    g = global_batch
    return [Layout(micro_batch=g, recompute="full"),
            Layout(micro_batch=g // 2, recompute="full"),
            Layout(micro_batch=max(1, g // 4), recompute="full"),
            Layout(micro_batch=g, recompute="selective"),
            Layout(micro_batch=g, recompute="none")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefix", default="r")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    cluster = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=1)
    while True:
        model = draw_model(rng, f"rc{args.seed}m01", min_params=1.0e9, max_params=3.0e9)
        job = job_for(model, TOKENS_PER_STEP)
        chosen = [(lay, estimate(model, cluster, job, lay)) for lay in layouts(job.global_batch)]
        if job.global_batch >= 4 and all(e.fits for _, e in chosen):
            break
    meta = {"set": Path(args.out).name, "seed": args.seed, "prefix": args.prefix,
            "drawn_at_commit": _git_head(), "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(["python", "benchmarks/recompute_draw.py", *sys.argv[1:]]),
            "tokens_per_step": TOKENS_PER_STEP, "nproc": 1}
    doc = write_set(Path(args.out), {model.name: model}, {model.name: chosen}, meta,
                    tokens_per_step=TOKENS_PER_STEP)
    for m in doc["models"]:
        print(m["name"], m["params_b"], "B,", m["job"]["global_batch"], "x",
              m["job"]["seq_len"])
        for e in m["layouts"]:
            print(f"  {e['name']} mb {e['micro_batch']} {e['recompute']}: "
                  f"{e['screen_memory_gib']} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
