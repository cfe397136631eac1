"""Draw random but realistic dense decoders, and a transfer round's set of them (issue 36, item 5).

A model (:func:`draw_model`) is drawn one decision at a time from a ``random.Random``:

- family: GPT (GELU MLP, LayerNorm, learned positions, tied embeddings, biases) or Llama
  (SwiGLU, RMSNorm, RoPE, untied, no biases), evenly;
- attention: multi-head, grouped-query (2, 4 or 8 kv heads, dividing the heads) or
  multi-query (one kv head), evenly;
- an even number of heads in 8-40 (released models of this size have 12, 14, 16, 20, 24,
  28, 32 or 40 heads; odd counts would also leave no tensor-parallel layout) and head dim (64, 80, 96, 128 for GPT; 64 or 128 for Llama) until the hidden
  size heads·head_dim lies in 1024-5120;
- ffn ratio uniform in 2.5-4 (of the hidden size; SwiGLU's gate and up matrices each that
  wide), rounded to a multiple of 256;
- vocabulary from the sizes released models use (32000 ... 151936), sequence 1k-8k;
- layers: a multiple of 4 (even pipeline stages at pp 2 and 4), at least 8, with the aspect
  ratio of released models (hidden / layers between 32 and 320: GPT-3 XL 85, Llama 2 7B
  128, Qwen2 1.5B 55), uniformly among those that put the model between ``min_params`` and
  ``max_params`` (0.5-3 B by default: the executor trains the whole model with fp32 master
  weights on 4 GPUs of 80 GB; at that size hidden sizes above ~4k have no admissible depth).

A round (:func:`draw_round`, ``--round``) draws ``--models`` such models, keeps those with at
least ``--per-model`` admissible 4-GPU layouts (``draw_holdout.candidates``: the planner's
space, refused by neither ``check_layout`` nor the executor's ``check_layout_runnable``,
fitting an 80 GB H100 with room, GPU-bound on ``--profile``), then draws the layouts with
``draw_holdout.draw`` (split, then schedule, then configuration; every schedule, ZeRO stage,
recompute mode and SP covered). Each model's job: ``global_batch = max(8, 65536 // seq)``
sequences (32 k tokens a step: 24 layouts must run in one validate call of ≤ 560 s, ~15 s
of each being torchrun's start-up). GPU-bound: the screening profile's host load comes from
the CPU fields of calibrated layer rows, which models never run before do not have (it
reads 0), so two stated proxies stand in for it: a screened step of at least
``--min-step-s`` and at least ``--min-mb-tokens`` tokens per micro-batch (the layouts that
were host-bound in rounds 16-26 had short steps of small micro-batches). The set is written as data (``--out DIR``): ``set.json`` with
everything, and for the GPU tooling one ModelSpec JSON and one layout list per model
(``meshplan calibrate --model DIR/models/X.json``, ``meshplan validate --layout-list
DIR/layouts/X.json``; docs/benchmarks/transfer.md).

    PYTHONPATH=. python benchmarks/draw_models.py --seed 36 --count 6      # print models
    PYTHONPATH=. python benchmarks/draw_models.py --round --seed 36 \\
        --profile docs/benchmarks/profile_h200x4_round26.toml --out benchmarks/sets/transfer36
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from meshplan.costmodel.measured import layer_shape_key  # noqa: E402
from meshplan.spec import Job, ModelSpec  # noqa: E402

GPT_STYLE = dict(activation="gelu", norm="layernorm", position_embedding="learned",
                 tied_embeddings=True, bias=True, dropout=False)
LLAMA_STYLE = dict(activation="swiglu", norm="rmsnorm", position_embedding="rope",
                   tied_embeddings=False, bias=False, dropout=False)
HEAD_DIMS = {"gpt": (64, 80, 96, 128), "llama": (64, 128)}
# vocabularies of released models: Llama 2, Mistral, GPT-2 (padded), Megatron GPT, a 64 k
# one, cl100k (padded), Llama 3, Qwen 2
VOCABS = (32000, 32768, 50304, 51200, 65536, 100352, 128256, 151936)
SEQS = (1024, 2048, 4096, 8192)
HIDDEN_RANGE = (1024, 5120)
HEADS_RANGE = (8, 40)
FFN_RATIO = (2.5, 4.0)
ASPECT_RANGE = (32, 320)         # hidden / layers
TOKENS_PER_STEP = 32768


def _kv_heads(rng: random.Random, heads: int, attention: str) -> int | None:
    if attention == "mha":
        return heads
    if attention == "mqa":
        return 1
    divisors = [d for d in (2, 4, 8) if d < heads and heads % d == 0]
    return rng.choice(divisors) if divisors else None


def draw_model(rng: random.Random, name: str, *, min_params: float = 0.5e9,
               max_params: float = 3.0e9, layer_multiple: int = 4) -> ModelSpec:
    """One random decoder (see the module docstring for each decision); ``layer_multiple``
    8 for even stages at pp 8 and interleaved pp 4 × vpp 2 (8 GPUs)."""
    while True:
        family = rng.choice(("gpt", "llama"))
        attention = rng.choice(("mha", "gqa", "mqa"))
        heads = rng.randrange(HEADS_RANGE[0], HEADS_RANGE[1] + 1, 2)
        head_dim = rng.choice(HEAD_DIMS[family])
        hidden = heads * head_dim
        kv = _kv_heads(rng, heads, attention)
        if not HIDDEN_RANGE[0] <= hidden <= HIDDEN_RANGE[1] or kv is None:
            continue
        ffn = max(256, round(rng.uniform(*FFN_RATIO) * hidden / 256) * 256)
        vocab, seq = rng.choice(VOCABS), rng.choice(SEQS)
        style = GPT_STYLE if family == "gpt" else LLAMA_STYLE
        one = ModelSpec(name=name, num_layers=1, hidden_size=hidden, num_heads=heads,
                        num_kv_heads=kv, ffn_hidden_size=ffn, vocab_size=vocab,
                        max_seq_len=seq, **style)
        base = one.num_params() - one.layer_params()
        layers = [n for n in range(max(8, layer_multiple), 129, layer_multiple)
                  if min_params <= base + n * one.layer_params() <= max_params
                  and ASPECT_RANGE[0] <= hidden / n <= ASPECT_RANGE[1]]
        if not layers:
            continue
        n = rng.choice(layers)
        size = (base + n * one.layer_params()) / 1e9
        tag = f"{family}-{attention}"
        return ModelSpec(name=f"{name}-{tag}-{size:.2f}b", num_layers=n, hidden_size=hidden,
                         num_heads=heads, num_kv_heads=kv, ffn_hidden_size=ffn,
                         vocab_size=vocab, max_seq_len=seq, **style)


def job_for(model: ModelSpec, tokens_per_step: int = TOKENS_PER_STEP) -> Job:
    """The round's job for a model: 32 k tokens a step (``tokens_per_step``) at its own
    sequence length, as the executor runs it (runtime="torch")."""
    return Job(global_batch=max(4, tokens_per_step // model.max_seq_len),
               seq_len=model.max_seq_len, runtime="torch")


def known_shapes() -> set[str]:
    """Layer shapes of every model the project has run on GPUs (validate_device's sets)."""
    import validate_device as vd
    return {layer_shape_key(m) for entries in vd.SETS.values() for _, m, _ in entries}


def draw_round(seed: int, *, n_models: int, per_model: int, profile: str, gpu: str,
               max_step_s: float, max_total_s: float, max_host_load: float,
               max_mem_gib: float, min_step_s: float = 0.3, min_mb_tokens: int = 4096,
               prefix: str = "t36"):
    """Models and layouts of one round; returns (models, chosen, attempts, rejected)."""
    import draw_holdout as dh
    import validate_device as vd
    from meshplan.hardware_profiles import Cluster
    from meshplan.hardware_profiles.calibrated import apply_profile

    rng = random.Random(seed)
    cluster = apply_profile(vd._gpu_cluster(gpu, 4), profile)
    h100 = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    seen_shapes = known_shapes()
    models, pools, rejected = {}, {}, []
    while len(models) < n_models:
        m = draw_model(rng, f"{prefix}m{len(models) + len(rejected) + 1:02d}")
        if layer_shape_key(m) in seen_shapes:
            rejected.append((m.name, "a shape run before"))
            continue
        pool = [(lay, e) for lay, e in dh.candidates(
                    m, cluster, h100, job_for(m), set(), max_host_load=max_host_load,
                    max_step_s=max_step_s, max_mem_gib=max_mem_gib)
                if e.step_time_s >= min_step_s
                and lay.micro_batch * m.max_seq_len >= min_mb_tokens]
        if len(pool) < per_model:
            rejected.append((m.name, f"{len(pool)} admissible layouts"))
            continue
        models[m.name], pools[m.name] = m, pool
    chosen, attempt = dh.draw(pools, per_model, seed, max_total_s)
    return models, chosen, attempt, rejected


def _git_head() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_set(out: Path, models, chosen, meta: dict, *,
              tokens_per_step: int = TOKENS_PER_STEP) -> dict:
    """set.json plus models/<name>.json and layouts/<name>.json for the CLI."""
    (out / "models").mkdir(parents=True, exist_ok=True)
    (out / "layouts").mkdir(parents=True, exist_ok=True)
    doc = dict(meta, models=[])
    i = 0
    for name, model in models.items():
        job = job_for(model, tokens_per_step)
        entries = []
        for layout, e in sorted(chosen[name], key=lambda x: (x[0].pp, x[0].tp, x[0].dp,
                                                            x[0].micro_batch)):
            i += 1
            entries.append({"name": f"{meta['prefix']}{i:02d}", **layout.to_dict(),
                            "screen_step_s": round(e.step_time_s, 4),
                            "screen_host_load": round(e.host_load, 3),
                            "screen_memory_gib": round(e.memory_peak_bytes / 2**30, 2)})
        (out / "models" / f"{name}.json").write_text(json.dumps(model.to_dict(), indent=1) + "\n")
        lay_list = [{k: v for k, v in x.items() if not k.startswith("screen_")} for x in entries]
        (out / "layouts" / f"{name}.json").write_text(json.dumps(lay_list, indent=1) + "\n")
        doc["models"].append({"name": name, "params_b": round(model.num_params() / 1e9, 3),
                              "spec": model.to_dict(), "job": job.to_dict(),
                              "layouts": entries})
    (out / "set.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, default=4, help="models to print (without --round)")
    ap.add_argument("--min-params", type=float, default=0.5e9)
    ap.add_argument("--max-params", type=float, default=3.0e9)
    ap.add_argument("--round", action="store_true", help="draw a round's models and layouts")
    ap.add_argument("--models", type=int, default=4)
    ap.add_argument("--per-model", type=int, default=6)
    ap.add_argument("--profile", default="docs/benchmarks/profile_h200x4_round26.toml",
                    help="4-GPU profile that screens the layouts (GPU-bound, step time)")
    ap.add_argument("--gpu", default="NVIDIA H200", help="the profile's GPU")
    ap.add_argument("--max-step-s", type=float, default=1.0)
    ap.add_argument("--max-total-s", type=float, default=12.0,
                    help="predicted steps of all layouts together (one validate call ≤ 560 s)")
    ap.add_argument("--max-host-load", type=float, default=0.75)
    ap.add_argument("--min-step-s", type=float, default=0.3,
                    help="GPU-bound proxy: screened step at least this long")
    ap.add_argument("--min-mb-tokens", type=int, default=4096,
                    help="GPU-bound proxy: tokens per micro-batch at least this many")
    ap.add_argument("--max-mem-gib", type=float, default=70.0)
    ap.add_argument("--prefix", default="t")
    ap.add_argument("--out", type=Path, default=None, help="directory for the drawn set")
    args = ap.parse_args(argv)
    if not args.round:
        rng = random.Random(args.seed)
        for i in range(args.count):
            m = draw_model(rng, f"m{i + 1:02d}", min_params=args.min_params,
                           max_params=args.max_params)
            print(json.dumps(m.to_dict()), f"# {m.num_params() / 1e9:.2f} B")
        return 0
    if not Path(args.profile).is_file():
        ap.error(f"--profile {args.profile}: no such file")
    models, chosen, attempt, rejected = draw_round(
        args.seed, n_models=args.models, per_model=args.per_model, profile=args.profile,
        gpu=args.gpu, max_step_s=args.max_step_s, max_total_s=args.max_total_s,
        max_host_load=args.max_host_load, max_mem_gib=args.max_mem_gib,
        min_step_s=args.min_step_s, min_mb_tokens=args.min_mb_tokens)
    total = sum(e.step_time_s for picks in chosen.values() for _, e in picks)
    print(f"# seed {args.seed}: {len(models)} models ({len(rejected)} drawn and rejected: "
          f"{rejected}), layouts on attempt {attempt}, {total:.1f} s of screened steps")
    for name, picks in chosen.items():
        print(f"# {name}: {len(picks)} layouts")
    if args.out:
        meta = {"set": args.out.name, "seed": args.seed, "prefix": args.prefix,
                "drawn_at_commit": _git_head(), "date": datetime.date.today().isoformat(),
                "command": " ".join(["python", "benchmarks/draw_models.py", *(argv or
                                                                              sys.argv[1:])]),
                "screen_profile": args.profile, "screen_gpu": args.gpu,
                "rejected_models": [list(r) for r in rejected], "layout_attempt": attempt,
                "tokens_per_step": TOKENS_PER_STEP}
        write_set(args.out, models, chosen, meta)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
