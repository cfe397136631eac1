"""Draw a held-out context-parallel check (issue 39 item 5): one never-run model and 8 layouts
at 16k-64k tokens, cp 1/2/4 mixed with tp, dp and pp, ring and all-to-all, from a seed.

    PYTHONPATH=. python benchmarks/cp_draw.py --seed 40 --out benchmarks/sets/cp40/set.json
    python benchmarks/context_parallel_gpu.py --set benchmarks/sets/cp40/set.json --out $OUT
    PYTHONPATH=. python benchmarks/cp_draw.py --seed 44 --gpus 2 --out benchmarks/sets/cp44/set.json

The model is :func:`draw_models.draw_model`'s (GPT or Llama, MHA/GQA/MQA, 1.0-2.5 B
parameters) with its context window raised to 64k. A layout is admissible when
``check_layout`` and the executor's ``check_layout_runnable`` accept it on 4 GPUs and the
datasheet prediction of its peak memory is under 70 % of an H200's 141 GB (room for what
the prediction misses). Every layout trains 131,072 tokens a step (``global_batch =
131072 // seq``, micro-batch 1), as ``context_parallel_gpu.py``'s fixed set does. The draw
asks for cp 1 once or twice, cp 2 and cp 4 three times or more, and covers tp > 1, pp > 1 and
both cp styles (a model whose heads allow no tp or no all-to-all is redrawn); it is written
before any run and run as drawn.

``--gpus 2`` (cp44 on, when only two GPUs were lent): the same on two GPUs — cp 1 two or
three times, cp 2 for the rest — at half the tokens a step (65,536: the tokens a GPU of the
four-GPU sets). Four GPUs draw exactly as before (cp40-cp43 reproduce).

``--mla`` (the executor's multi-head latent attention under cp, first timed): the drawn
model is a Llama-style one (``draw_model(family="llama")``) with its attention replaced by
DeepSeek's MLA at ``draw_moe.py``'s dimensions (key-value latent 512, query-key 128 + 64,
value 128, the query through a 1536 latent or not; one MLA head per drawn head) — a dense
MLA decoder, as MiniCPM3-4B is. The rng draws the MLA choice after the model, so the draws
without ``--mla`` are unchanged.

``--gpus 8`` (issue 42's cp at 8 ranks): cp and tp up to 8, 262,144 tokens a step (32,768 a
GPU, as the others); cp 1 once, cp 2 twice, cp 4 and cp 8 the rest, and among them at least
one cp × tp layout, besides tp > 1, pp > 1 and both styles; admitted under 70 % of an H100's
80 GB, since either 8-GPU kind may run it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from draw_models import draw_model  # noqa: E402
from draw_moe import MLA_DIMS, MLA_Q_LORA  # noqa: E402
from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

TOKENS_PER_STEP = 131072       # on 4 GPUs; tokens_per_step() on others
SEQS = (16384, 32768, 65536)
MEMORY_SHARE = 0.70
N_LAYOUTS = 8


def tokens_per_step(gpus: int) -> int:
    """The tokens a step trains on ``gpus`` GPUs: 32,768 a GPU."""
    return TOKENS_PER_STEP * gpus // 4


def layouts(gpus: int = 4) -> list[tuple[int, Layout]]:
    """Every (seq, layout) on ``gpus`` GPUs before admission: cp, tp, pp, cp style, ZeRO
    (stage 3 only without pp, none where dp·cp = 1) and recompute at micro-batch 1, SP with
    tp."""
    out = []
    degrees = (1, 2, 4, 8) if gpus == 8 else (1, 2, 4)
    for seq, cp, tp, pp, style, zero, rc in itertools.product(
            SEQS, degrees, degrees, (1, 2), ("ring", "all-to-all"), (0, 1, 3),
            ("none", "selective", "full")):
        if gpus % (cp * tp * pp) or style == "all-to-all" and cp == 1:
            continue
        dp = gpus // (cp * tp * pp)
        if zero and dp * cp == 1 or zero == 3 and pp > 1:
            continue
        out.append((seq, Layout(dp=dp, cp=cp, tp=tp, pp=pp, cp_style=style, zero=zero,
                                recompute=rc, micro_batch=1, sequence_parallel=tp > 1,
                                schedule="1f1b")))
    return out


def memory_bytes(cluster: Cluster) -> float:
    """The memory a drawn layout must fit: the node's GPU's; on 8 GPUs the smaller of an
    H100's and an H200's, since either 8-GPU kind may run the set (docs/benchmarks/gpu8.md)."""
    if cluster.num_gpus == 8:
        return min(cluster.gpu.memory_bytes, Cluster.preset("dgx-h100").gpu.memory_bytes)
    return cluster.gpu.memory_bytes


def candidates(model: ModelSpec, cluster: Cluster) -> list[tuple[int, Layout, float]]:
    """Every admissible (seq, layout, predicted peak bytes) on the cluster's GPUs."""
    from meshplan.costmodel import estimate
    from meshplan.executor.parallelize import check_layout_runnable
    from meshplan.spec.validate import check_layout
    out = []
    gpus = cluster.num_gpus
    cap = MEMORY_SHARE * memory_bytes(cluster)
    for seq, lay in layouts(gpus):
        job = Job(global_batch=tokens_per_step(gpus) // seq, seq_len=seq, precision="bf16",
                  runtime="torch")
        try:
            check_layout(model, cluster, job, lay)
            check_layout_runnable(model, job, lay)
            peak = estimate(model, cluster, job, lay).memory_peak_bytes
        except (MeshplanError, ValueError):
            continue
        if peak <= cap:
            out.append((seq, lay, peak))
    return out


def covers(layouts: list[Layout], gpus: int = 4) -> bool:
    """tp > 1, pp > 1 and both cp styles among the drawn layouts; on 8 GPUs also cp × tp."""
    return (any(lay.tp > 1 for lay in layouts) and any(lay.pp > 1 for lay in layouts)
            and {lay.cp_style for lay in layouts if lay.cp > 1} == {"ring", "all-to-all"}
            and (gpus != 8 or any(lay.cp > 1 and lay.tp > 1 for lay in layouts)))


def with_mla(rng: random.Random, model: ModelSpec) -> ModelSpec:
    """``model`` with DeepSeek's multi-head latent attention, one head per head (``--mla``)."""
    m = dataclasses.replace(model, num_kv_heads=model.num_heads, head_dim=None,
                            q_lora_rank=rng.choice(MLA_Q_LORA), **MLA_DIMS)
    return dataclasses.replace(m, name=f"{model.name.split('-')[0]}-mla-"
                                       f"{m.num_params() / 1e9:.2f}b")


def draw(seed: int, gpus: int = 4, mla: bool = False) -> dict:
    if gpus not in (2, 4, 8):
        raise SystemExit(f"--gpus {gpus}: 2, 4 or 8")
    rng = random.Random(seed)
    cluster = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=gpus)
    for attempt in range(1, 51):
        base = draw_model(rng, f"c{seed}m{attempt:02d}", min_params=1.0e9, max_params=2.5e9,
                          family="llama" if mla else None)
        if mla:
            base = with_mla(rng, base)
        model = dataclasses.replace(base, max_seq_len=65536)
        pool = candidates(model, cluster)
        by_cp = {c: [p for p in pool if p[1].cp == c] for c in (1, 2, 4, 8)}
        if gpus == 2:
            want = {1: rng.choice((2, 3))}
            want[2] = N_LAYOUTS - want[1]
        elif gpus == 8:
            want = {1: 1, 2: 2, 4: rng.choice((2, 3))}
            want[8] = N_LAYOUTS - sum(want.values())
        elif len(by_cp[1]) < 1 or len(by_cp[2]) < 3 or len(by_cp[4]) < 3:
            continue
        else:
            want = {1: rng.choice((1, 2))}
            want[2] = rng.choice((3, 4)) if want[1] == 1 else 3
            want[4] = N_LAYOUTS - want[1] - want[2]
        if any(len(by_cp[c]) < want[c] for c in want):
            continue
        for _ in range(200):
            chosen = [p for c in want for p in rng.sample(by_cp[c], want[c])]
            if covers([lay for _, lay, _ in chosen], gpus):
                return {"seed": seed, "attempt": attempt, "model": model.to_dict(),
                        "tokens_per_step": tokens_per_step(gpus), "pool": len(pool),
                        "cases": [{"name": f"c{seed}-{i + 1:02d}", "seq_len": seq,
                                   "layout": lay.to_dict(),
                                   "datasheet_peak_gib": round(peak / 2**30, 1)}
                                  for i, (seq, lay, peak) in enumerate(chosen)]}
    raise SystemExit(f"seed {seed}: no model with enough admissible cp layouts in 50 draws")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True, help="the set's JSON file")
    ap.add_argument("--gpus", type=int, default=4, choices=(2, 4, 8),
                    help="GPUs of the node the set runs on (default 4)")
    ap.add_argument("--mla", action="store_true",
                    help="a dense model with multi-head latent attention (module docstring)")
    args = ap.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: a drawn set is not redrawn over (pick another "
                         f"--out or --seed)")
    doc = draw(args.seed, args.gpus, args.mla)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    m = ModelSpec.from_dict(doc["model"])
    print(f"{m.name}: {m.num_layers} layers, hidden {m.hidden_size}, heads {m.num_heads}/"
          f"{m.num_kv_heads}, ffn {m.ffn_hidden_size}, vocab {m.vocab_size}, "
          f"{m.num_params() / 1e9:.2f} B; {doc['pool']} admissible layouts")
    for c in doc["cases"]:
        print(f"  {c['name']} seq {c['seq_len']:6d} {Layout.from_dict(c['layout']).short()} "
              f"({c['datasheet_peak_gib']} GiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
