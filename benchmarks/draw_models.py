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
fitting an 80 GB H100 with room, GPU-bound on every ``--profile``), then draws the layouts
with ``draw_holdout.draw`` (split, then schedule, then configuration; every schedule, ZeRO
stage, recompute mode and SP covered). Each model's job: ``global_batch = max(4, 32768 //
seq)`` sequences (32 k tokens a step; the round's 24 layouts run in two validate calls of
12, ~25-30 s of each layout being start-up). GPU-bound: each screening profile is a
calibration with layer rows and CPU dispatch times (default: round 26's H200 one, GPT-0.54B
and Llama-1.64B, and transfer36's H100 one, two Llama shapes); a model never run before
gets its CPU dispatch from the nearest timed shape's rows (same family: as measured; another
family: scaled by the operator count, meshplan/costmodel/nearest_rows.py), so its layouts'
host load is screened like any other's. Round 36 screened with a proxy instead (a step of at
least 0.3 s and 4096 tokens per micro-batch, ``--min-step-s`` / ``--min-mb-tokens``, now off
by default) and drew two host-bound 0.5 B models. The set is written as data (``--out
DIR``): ``set.json`` with everything, and for the GPU tooling one ModelSpec JSON and one
layout list per model (``meshplan calibrate --model DIR/models/X.json``, ``meshplan validate
--layout-list DIR/layouts/X.json``; docs/benchmarks/transfer.md).

    PYTHONPATH=. python benchmarks/draw_models.py --seed 37 --count 6      # print models
    PYTHONPATH=. python benchmarks/draw_models.py --round --seed 37 --prefix u \
        --out benchmarks/sets/transfer37
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
# the calibrated 4-GPU profiles a round's layouts are screened on (both machine kinds lent;
# each holds GPT- and/or Llama-style layer rows with CPU dispatch times)
DEFAULT_SCREEN_PROFILES = ("docs/benchmarks/data/profiles/profile_h200x4_round26.toml",
                           "docs/benchmarks/data/profiles/profile_h100x4_transfer36_part1.toml")
DEFAULT_SCREEN_GPUS = ("NVIDIA H200", "NVIDIA H100 80GB HBM3")


def _kv_heads(rng: random.Random, heads: int, attention: str) -> int | None:
    if attention == "mha":
        return heads
    if attention == "mqa":
        return 1
    divisors = [d for d in (2, 4, 8) if d < heads and heads % d == 0]
    return rng.choice(divisors) if divisors else None


def draw_model(rng: random.Random, name: str, *, min_params: float = 0.5e9,
               max_params: float = 3.0e9, family: str | None = None,
               attention: str | None = None, layer_multiple: int = 4) -> ModelSpec:
    """One random decoder (see the module docstring for each decision); ``family`` /
    ``attention`` fix those two decisions (a round's coverage, :func:`round_plan`);
    ``layer_multiple`` 8 for even stages at pp 8 and interleaved pp 4 × vpp 2 (8 GPUs)."""
    fixed_family, fixed_attention = family, attention
    while True:
        family = fixed_family or rng.choice(("gpt", "llama"))
        attention = fixed_attention or rng.choice(("mha", "gqa", "mqa"))
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


def round_plan(rng: random.Random, n_models: int) -> list[tuple[str, str]]:
    """(family, attention) of each model of a round, so that ≥ 4 models cover both families
    and all three attention kinds (seed 36's independent draws gave no MQA model and three
    Llama to one GPT): the families alternate and the attention kinds are a shuffled
    repetition of (MHA, GQA, MQA), each list shuffled by ``rng``. A model rejected at
    screening is redrawn with the same plan entry."""
    families = [("gpt", "llama")[i % 2] for i in range(n_models)]
    kinds = [("mha", "gqa", "mqa")[i % 3] for i in range(n_models)]
    rng.shuffle(families)
    rng.shuffle(kinds)
    return list(zip(families, kinds))


def job_for(model: ModelSpec, tokens_per_step: int = TOKENS_PER_STEP) -> Job:
    """The round's job for a model: 32 k tokens a step (``tokens_per_step``) at its own
    sequence length, as the executor runs it (runtime="torch")."""
    return Job(global_batch=max(4, tokens_per_step // model.max_seq_len),
               seq_len=model.max_seq_len, runtime="torch")


def known_shapes(*, except_set: str | None = None) -> set[str]:
    """Layer shapes of every model the project has run on GPUs: validate_device's sets and
    every drawn transfer round's (``benchmarks/sets/*/set.json``; but ``except_set``)."""
    import validate_device as vd
    shapes = {layer_shape_key(m) for entries in vd.SETS.values() for _, m, _ in entries}
    for path in sorted((ROOT / "benchmarks" / "sets").glob("*/set.json")):
        if path.parent.name == except_set:
            continue
        for m in json.loads(path.read_text()).get("models", []):
            shapes.add(layer_shape_key(ModelSpec.from_dict(m["spec"])))
    return shapes


def screening_clusters(profiles: list[str], gpus: list[str], nproc: int = 4):
    """An ``nproc``-GPU cluster on each screening profile (a 4-GPU profile screens a
    2-GPU round too: its rows and collectives at 2 ranks are what it prices). Each must hold layer rows with CPU
    dispatch times: a model never run before gets its CPU dispatch from them (the nearest
    timed shape's rows, costmodel/nearest_rows.py), and without them every layout would
    screen GPU-bound (round 36 drew two host-bound 0.5 B models that way)."""
    import validate_device as vd
    from meshplan.hardware_profiles.calibrated import apply_profile
    if len(gpus) not in (1, len(profiles)):
        raise SystemExit(f"--gpu: give one GPU name or one per --profile ({len(profiles)})")
    out = []
    for i, profile in enumerate(profiles):
        path = profile if Path(profile).is_file() else ROOT / profile
        cluster = apply_profile(vd._gpu_cluster(gpus[i if len(gpus) > 1 else 0], nproc), path)
        if not any(r.forward_cpu_s > 0 for r in cluster.gpu.measured.layers):
            raise SystemExit(f"--profile {profile}: no layer rows with CPU dispatch times; "
                             f"screen on a profile from `meshplan calibrate --model ...`")
        out.append(cluster)
    return out


def draw_round(seed: int, *, n_models: int, per_model: int, profiles: list[str],
               gpus: list[str], max_step_s: float, max_total_s: float, max_host_load: float,
               max_mem_gib: float, min_step_s: float = 0.0, min_mb_tokens: int = 0,
               prefix: str | None = None, nproc: int = 4,
               tokens_per_step: int = TOKENS_PER_STEP):
    """Models and layouts of one round; returns (models, chosen, attempts, rejected).

    A layout is admissible where every screening profile predicts it GPU-bound with room
    (CPU dispatch ≤ ``max_host_load`` of the GPU's time), no longer than ``max_step_s`` and
    within ``max_mem_gib``; the CPU dispatch of a model never run before comes from the
    profile's nearest timed shape, scaled by operator count. ``min_step_s`` and
    ``min_mb_tokens`` are round 36's proxies for it (off by default)."""
    import draw_holdout as dh
    from meshplan.costmodel import estimate
    from meshplan.errors import MeshplanError
    from meshplan.hardware_profiles import Cluster

    rng = random.Random(seed)
    clusters = screening_clusters(profiles, gpus, nproc)
    h100 = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=nproc)
    seen_shapes = known_shapes()
    prefix = prefix or f"t{seed}"
    models, pools, rejected = {}, {}, []

    def admissible(m, job, layout) -> bool:
        for c in clusters[1:]:
            try:
                e = estimate(m, c, job, layout)
            except MeshplanError:
                return False
            if (e.host_load > max_host_load or e.step_time_s > max_step_s
                    or e.memory_peak_bytes > max_mem_gib * 2**30):
                return False
        return True
    plan = round_plan(rng, n_models)
    while len(models) < n_models:
        family, attention = plan[len(models)]
        m = draw_model(rng, f"{prefix}m{len(models) + len(rejected) + 1:02d}", family=family,
                       attention=attention)
        if layer_shape_key(m) in seen_shapes:
            rejected.append((m.name, "a shape run before"))
            continue
        job = job_for(m, tokens_per_step)
        pool = [(lay, e) for lay, e in dh.candidates(
                    m, clusters[0], h100, job, set(), max_host_load=max_host_load,
                    max_step_s=max_step_s, max_mem_gib=max_mem_gib, nproc=nproc)
                if e.step_time_s >= min_step_s
                and lay.micro_batch * m.max_seq_len >= min_mb_tokens
                and admissible(m, job, lay)]
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
    ap.add_argument("--profile", action="append", default=None,
                    help="4-GPU profile with layer rows (CPU dispatch) that screens the "
                         "layouts: GPU-bound, step time, memory; repeat it to screen on "
                         "several (every one must admit a layout) [default: the round 26 "
                         "H200 profile and the transfer36 H100 one]")
    ap.add_argument("--gpu", action="append", default=None,
                    help="the GPU of each --profile (one for all, or one per profile)")
    ap.add_argument("--max-step-s", type=float, default=1.0)
    ap.add_argument("--max-total-s", type=float, default=12.0,
                    help="predicted steps of all layouts together (one validate call ≤ 560 s)")
    ap.add_argument("--max-host-load", type=float, default=0.5,
                    help="screened CPU dispatch over GPU time at most this, on every "
                         "profile: a margin for a host whose CPU dispatches slower and for "
                         "the operator-count scaling of another family's rows (measured "
                         "1.3-2.5 x where it counts 1.6-2.1 x) [%(default)s]")
    ap.add_argument("--min-step-s", type=float, default=0.0,
                    help="round 36's GPU-bound proxy: screened step at least this long "
                         "(off: the profiles' CPU dispatch screens)")
    ap.add_argument("--min-mb-tokens", type=int, default=0,
                    help="round 36's GPU-bound proxy: tokens per micro-batch at least this "
                         "many (off)")
    ap.add_argument("--max-mem-gib", type=float, default=70.0)
    ap.add_argument("--prefix", default="t")
    ap.add_argument("--nproc", type=int, default=4, choices=[2, 4, 8],
                    help="GPUs of the round's machine: the layouts are the planner's space "
                         "on this many ranks [%(default)s]")
    ap.add_argument("--tokens-per-step", type=int, default=None,
                    help="tokens a step [8192 per GPU: 32768 on 4 GPUs, as rounds 36-37]")
    ap.add_argument("--out", type=Path, default=None, help="directory for the drawn set")
    args = ap.parse_args(argv)
    if args.tokens_per_step is not None and args.tokens_per_step < 1:
        ap.error(f"--tokens-per-step must be a positive number of tokens, got "
                 f"{args.tokens_per_step}")
    tokens = args.tokens_per_step or TOKENS_PER_STEP * args.nproc // 4
    if not args.round:
        rng = random.Random(args.seed)
        for i in range(args.count):
            m = draw_model(rng, f"m{i + 1:02d}", min_params=args.min_params,
                           max_params=args.max_params)
            print(json.dumps(m.to_dict()), f"# {m.num_params() / 1e9:.2f} B")
        return 0
    profiles = args.profile or list(DEFAULT_SCREEN_PROFILES)
    gpus = args.gpu or list(DEFAULT_SCREEN_GPUS if args.profile is None else ["NVIDIA H200"])
    for profile in profiles:
        if not (ROOT / profile).is_file() and not Path(profile).is_file():
            ap.error(f"--profile {profile}: no such file")
    models, chosen, attempt, rejected = draw_round(
        args.seed, n_models=args.models, per_model=args.per_model, profiles=profiles,
        gpus=gpus, max_step_s=args.max_step_s, max_total_s=args.max_total_s,
        max_host_load=args.max_host_load, max_mem_gib=args.max_mem_gib,
        min_step_s=args.min_step_s, min_mb_tokens=args.min_mb_tokens, nproc=args.nproc,
        tokens_per_step=tokens)
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
                "screen_profile": ", ".join(profiles), "screen_gpu": ", ".join(gpus),
                "rejected_models": [list(r) for r in rejected], "layout_attempt": attempt,
                "tokens_per_step": tokens, "nproc": args.nproc}
        write_set(args.out, models, chosen, meta, tokens_per_step=tokens)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
