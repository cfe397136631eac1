"""Draw random but realistic mixture-of-experts decoders from a seed (issue 38's GPU checks on
models never run before, the MoE counterpart of ``draw_models.py``).

Each decision follows the released MoE families:

- attention and embeddings Llama-style (every released MoE decoder of the last two years:
  Mixtral, DeepSeekMoE, Qwen-MoE, OLMoE), MHA or GQA, hidden 1024-2560 from heads × head dim;
- routed experts E ∈ {8, 16, 32, 64}; *fine-grained expert segmentation* (DeepSeekMoE, Dai et
  al. 2024, arXiv 2401.06066 §3.1): each of the dense MLP's would-be experts is split into
  g ∈ {1, 2, 4, 8} narrower ones (g grows with E: 8 experts → 1, 64 → 4 or 8), each of width
  ffn / g, and a token uses g × k of them for a base top-k ∈ {1, 2} (Switch: top-1, Fedus et al.
  2021; Mixtral: 8 experts top-2, Jiang et al. 2024; OLMoE: 64 experts top-8), at most 8;
- one shared expert of the routed width half of the time (DeepSeekMoE §3.2; Qwen1.5-MoE);
- every layer an MoE layer; layers a multiple of 4 such that the total parameters fall in
  [--min-params, --max-params] (the default fits one 141 GB GPU with Adam).

``--mla``: DeepSeek-style attention instead of Llama's — multi-head latent attention with the
per-head dimensions every released MLA model keeps (DeepSeek-V2, arXiv 2405.04434 §2.1 and
its Lite model, DeepSeek-V3, Moonlight, Kimi K2: key-value latent 512, no-RoPE query/key 128,
RoPE 64, value 128), the query either not compressed (V2-Lite, Moonlight) or through a 1536
latent (V2, V3), one head per drawn head, and half of the time a dense first layer of the
dense MLP's width (V2-Lite's and Moonlight's ``first_k_dense_replace = 1``). The drawn hidden
size is the same draw as without ``--mla``; the rng draws the MLA choices after the rest, so
a seed's draw without ``--mla`` is unchanged.

    PYTHONPATH=. python benchmarks/draw_moe.py --seed 3801 --count 1
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplan.spec import ModelSpec  # noqa: E402

LLAMA_STYLE = dict(activation="swiglu", norm="rmsnorm", position_embedding="rope",
                   tied_embeddings=False, bias=False, dropout=False)
EXPERTS_GRANULARITY = {8: (1,), 16: (1, 2), 32: (2, 4), 64: (4, 8)}
VOCABS = (32000, 32768, 50304, 65536, 100352, 151936)
SEQS = (1024, 2048, 4096)
HIDDEN_RANGE = (1024, 2560)


#: MLA's per-head and latent dimensions (the module docstring's sources)
MLA_DIMS = dict(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
MLA_Q_LORA = (None, 1536)


def _mla_fields(rng: random.Random, heads: int, dense_ffn: float, width: int) -> dict:
    """The attention and first-layer fields of an MLA draw (module docstring); ``width``:
    the routed experts', which ``ffn_hidden_size`` keeps without a dense layer."""
    dense_first = rng.random() < 0.5
    return dict(num_kv_heads=heads, q_lora_rank=rng.choice(MLA_Q_LORA), **MLA_DIMS,
                dense_layers=(0,) if dense_first else (),
                ffn_hidden_size=round(dense_ffn / 128) * 128 if dense_first else width)


def draw_moe_model(rng: random.Random, name: str, *, min_params: float = 1.0e9,
                   max_params: float = 3.0e9, min_hidden: int = HIDDEN_RANGE[0],
                   mla: bool = False) -> ModelSpec:
    """One random MoE decoder (the module docstring gives each decision); ``min_hidden``
    raises the hidden size's floor (a GPU-bound draw: moeh4's hidden 1024 was host-bound at
    two ranks); ``mla``: DeepSeek's multi-head latent attention (``--mla``)."""
    while True:
        heads = rng.randrange(8, 21, 2)
        head_dim = rng.choice((64, 128))
        hidden = heads * head_dim
        if not max(min_hidden, HIDDEN_RANGE[0]) <= hidden <= HIDDEN_RANGE[1]:
            continue
        kv = heads if rng.random() < 0.5 else rng.choice([d for d in (2, 4, 8)
                                                         if heads % d == 0 and d < heads])
        experts = rng.choice(sorted(EXPERTS_GRANULARITY))
        g = rng.choice(EXPERTS_GRANULARITY[experts])
        top_k = min(8, g * rng.choice((1, 2)))
        dense_ffn = rng.uniform(2.5, 4.0) * hidden
        width = max(128, round(dense_ffn / g / 128) * 128)
        shared = rng.random() < 0.5
        vocab, seq = rng.choice(VOCABS), rng.choice(SEQS)
        fields = dict(hidden_size=hidden, num_heads=heads, num_kv_heads=kv,
                      ffn_hidden_size=width, vocab_size=vocab, max_seq_len=seq,
                      num_experts=experts, experts_per_token=top_k,
                      moe_ffn_hidden_size=width, num_shared_experts=int(shared),
                      **LLAMA_STYLE)
        if mla:
            fields.update(_mla_fields(rng, heads, dense_ffn, width))
        # layer 1 is an MoE layer; layer 0 may be dense (an MLA draw's first layer)
        two = ModelSpec(name=name, num_layers=2, **fields)
        per = two.layer_params(1)
        base = two.num_params() - 2 * per
        layers = [n for n in range(8, 65, 4) if min_params <= base + n * per <= max_params]
        if not layers:
            continue
        n = rng.choice(layers)
        total = (base + n * per) / 1e9
        tag = f"{'mla-' if mla else ''}moe{experts}x{top_k}{'s' if shared else ''}"
        return ModelSpec(name=f"{name}-{tag}-{total:.2f}b", num_layers=n, **fields)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--min-params", type=float, default=1.0e9)
    p.add_argument("--max-params", type=float, default=3.0e9)
    p.add_argument("--min-hidden", type=int, default=HIDDEN_RANGE[0],
                   help=f"floor of the hidden size (default {HIDDEN_RANGE[0]}; at most "
                        f"{HIDDEN_RANGE[1]})")
    p.add_argument("--mla", action="store_true",
                   help="multi-head latent attention (DeepSeek-V2/V3 style; module docstring)")
    args = p.parse_args(argv)
    if not HIDDEN_RANGE[0] <= args.min_hidden <= HIDDEN_RANGE[1]:
        p.error(f"--min-hidden {args.min_hidden}: must be within {HIDDEN_RANGE}")
    if args.count < 1 or not 0 < args.min_params < args.max_params:
        p.error(f"--count {args.count} must be >= 1 and 0 < --min-params "
                f"({args.min_params:g}) < --max-params ({args.max_params:g})")
    rng = random.Random(args.seed)
    for i in range(args.count):
        m = draw_moe_model(rng, f"m{i + 1:02d}", min_params=args.min_params,
                           max_params=args.max_params, min_hidden=args.min_hidden,
                           mla=args.mla)
        print(json.dumps(m.to_dict()), f"# {m.num_params() / 1e9:.2f} B, "
              f"{m.num_active_params() / 1e9:.2f} B active")
    return 0


if __name__ == "__main__":
    sys.exit(main())
