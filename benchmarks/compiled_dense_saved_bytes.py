"""What one executor DENSE block compiled by Inductor keeps for its backward (bf16 autocast;
recompute none, selective, full), against the cost model's count of a compiled block and
its eager count: the mechanism of the named memory correction ``compiled_dense_block_kept``
(:mod:`meshplan.costmodel.compiled_block_memory`).

Counts the bytes of every distinct storage autograd saves during one block's forward
(``saved_tensors_hooks``; ``compiled_moe_saved_bytes.saved``), parameters apart and the
block's input included, at two token counts (two sequences a micro-batch): the bytes at the
larger count and the per-token slope (the rotary tables grow with the sequence, so they
are in the slope). The block runs ``torch.compile`` (Inductor) as ``Layout.compile`` does;
selective recomputation checkpoints its attention core inside the graph, full
recomputation the whole block.

    python benchmarks/compiled_dense_saved_bytes.py          # CPU: Llama- and GPT-style
    python benchmarks/compiled_dense_saved_bytes.py --list   # every saved tensor
    python benchmarks/compiled_dense_saved_bytes.py --rows   # the profiles' compiled GPU rows

Besides the formula, every checkpointed block (selective, full) saves about 5 KB of RNG
state, and with rotary embedding the fully recomputed block the fp32 cos / sin tables
(2·s·d·4 B: this script builds them per call, the executor once for the model and all its
layers; not a layer's cost). CPU autocast runs ``layer_norm`` in bf16 (its mean and rstd
2 B each), CUDA autocast in fp32 (4 B each, as the formula counts): the CPU prediction of a
LayerNorm block takes 2·4 B a token off. ``--rows`` reads no block: it sets the formula
beside every 1-GPU dense profile's compiled bf16 rows at tp 1 (per token: the slope between
a shape's micro-batches).
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import meshplan as mp  # noqa: E402
from compiled_moe_saved_bytes import (against_row, kept, saved,  # noqa: E402
                                      slope_per_token, timed_rows)
from meshplan.costmodel.compiled_block_memory import (compiled_dense_kept_bytes,  # noqa: E402
                                                      linear_copy_bytes)
from meshplan.costmodel.torch_activations import torch_layer_activations  # noqa: E402
from meshplan.executor.model import Transformer  # noqa: E402

MODES = ("none", "selective", "full")


def model_spec(gpt: bool = False, hidden: int = 160, heads: int = 4, kv_heads: int = 2,
               ffn: int = 224, head_dim: int = 64, seq: int = 1024) -> mp.ModelSpec:
    """One executor dense layer: Llama-style (RMSNorm, rotary, SwiGLU, no biases) or
    ``gpt`` (LayerNorm, learned positions, GELU, biases)."""
    style = (dict(activation="gelu", norm="layernorm", position_embedding="learned",
                  tied_embeddings=True, bias=True) if gpt else
             dict(activation="swiglu", norm="rmsnorm", position_embedding="rope",
                  tied_embeddings=False, bias=False))
    return mp.ModelSpec(name="dense-block", num_layers=1, hidden_size=hidden,
                        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                        ffn_hidden_size=ffn, vocab_size=128, max_seq_len=seq, **style)


def compiled_block(spec: mp.ModelSpec, recompute: str = "none"):
    """The executor's block of ``spec`` at ``recompute`` as ``parallelize`` sets it,
    compiled."""
    torch._dynamo.reset()
    model = Transformer(spec)
    model.init_weights(1)
    block = next(iter(model.layers.values()))
    block.recompute_block = recompute == "full"
    block.attn.recompute_core = recompute == "selective"
    block.compile(dynamic=False)
    return block


def predicted(spec: mp.ModelSpec, tokens: int, recompute: str = "none",
              eager: bool = False, cpu: bool = True) -> float:
    """The cost model's bytes for the block at ``tokens`` (two sequences): the compiled
    block's with its 16-bit copies (none under full recomputation), or (``eager``) the
    eager count at that mode, which holds neither the input nor the copies. ``cpu``: CPU
    autocast's bf16 LayerNorm statistics (module docstring)."""
    job = mp.Job(global_batch=2, seq_len=tokens // 2, precision="bf16", runtime="torch")
    if eager:
        return torch_layer_activations(spec, job, 2, 1, False).stored(recompute)
    got = compiled_dense_kept_bytes(spec, job, tokens, recompute)
    if recompute == "full":
        return got
    stats = 2 * 4 * tokens if cpu and spec.norm == "layernorm" else 0
    return got - stats + linear_copy_bytes(spec, job, spec.ffn_hidden_size)


def measure(spec: mp.ModelSpec, tokens: tuple[int, int], recompute: str = "none") -> dict:
    """Measured and predicted bytes of the compiled block at ``tokens``."""
    block = compiled_block(spec, recompute)
    got = [kept(saved(block, spec, t)) for t in tokens]
    want = [predicted(spec, t, recompute) for t in tokens]
    eager = [predicted(spec, t, recompute, eager=True) for t in tokens]
    span = tokens[1] - tokens[0]
    return dict(bytes=got[1], formula=want[1], per_token=(got[1] - got[0]) / span,
                formula_per_token=(want[1] - want[0]) / span,
                eager_per_token=(eager[1] - eager[0]) / span)


_SHAPE = re.compile(r"h(\d+)-f(\d+)-q(\d+)-kv(\d+)-d(\d+)-(swiglu-rmsnorm-rope-nobias|"
                    r"gelu-layernorm-learned-bias)-drop0$")


def gpu_rows(pattern: str) -> list[tuple]:
    """(profile, shape, seq, recompute, micro-batches, measured, formula, eager) per token
    for every compiled bf16 dense row shape at tp 1, ZeRO 0, timed at two micro-batches
    (recompute none and selective: full keeps the input only)."""
    out = []
    for prof, (shape, seq, mode), by_mb in timed_rows(pattern, lambda r: (
            _SHAPE.match(r["shape"]) and r.get("compile")
            and r.get("precision", "bf16") == "bf16" and r["recompute"] != "full"
            and r.get("zero", 0) == 0 and r.get("tp", 1) == 1),
            key=lambda r: (r["shape"], r["seq_len"], r["recompute"])):
        m = _SHAPE.match(shape)
        h, f, q, kv, d = (int(v) for v in m.groups()[:5])
        spec = model_spec(gpt=m[6].startswith("gelu"), hidden=h, heads=q, kv_heads=kv,
                          ffn=f, head_dim=d, seq=seq)
        job = mp.Job(global_batch=max(by_mb), seq_len=seq, precision="bf16", runtime="torch")
        got = slope_per_token(lambda mb: by_mb[mb], by_mb, seq)
        want = slope_per_token(lambda mb: compiled_dense_kept_bytes(spec, job, mb * seq, mode),
                               by_mb, seq)
        eager = slope_per_token(lambda mb: torch_layer_activations(
            spec, job, mb, 1, False).stored(mode), by_mb, seq)
        out.append((prof, shape, seq, mode, (min(by_mb), max(by_mb)), got, want, eager))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="512,1024", help="two token counts a micro-batch")
    ap.add_argument("--list", action="store_true", help="list every saved tensor")
    ap.add_argument("--rows", action="store_true", help="the profiles' compiled GPU rows")
    ap.add_argument("--profiles", default=str(
        ROOT / "docs/benchmarks/data/profiles/profile_h*x1_*.toml"))
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if a.rows:
        print("| profile | block | seq | recompute | mb | row B/token | formula | eager |")
        print("|---|---|---|---|---|---|---|---|")
        for prof, shape, seq, mode, mbs, got, want, eager in gpu_rows(a.profiles):
            print(f"| {prof} | {shape} | {seq} | {mode} | {mbs[0]}, {mbs[1]} | "
                  + against_row(got, want, eager))
        return 0
    tokens = tuple(int(v) for v in a.tokens.split(","))
    cases = [("Llama h 160, q 4x64, kv 2, f 224", dict()),
             ("... multi-head (kv 4)", dict(kv_heads=4)),
             ("GPT h 160, q 4x64, kv 2, f 224", dict(gpt=True)),
             ("... multi-head (kv 4)", dict(gpt=True, kv_heads=4))]
    if a.list:
        for name, kw in cases:
            spec = model_spec(seq=max(tokens), **kw)
            for mode in MODES:
                print(f"{name}, {mode}, {max(tokens)} tokens:")
                st = saved(compiled_block(spec, mode), spec, max(tokens))
                for v in sorted(st.values(), key=lambda v: (v[3], -v[0])):
                    print(f"    {v[0]:>10,} B {v[1]:>8} {v[2]} {v[3]}")
        return 0
    print(f"bytes a compiled dense block keeps (input included, 16-bit weight copies too), "
          f"CPU, torch {torch.__version__}, tokens {tokens}")
    print("| block | recompute | kept at the larger | formula | B/token | formula | eager |")
    print("|---|---|---|---|---|---|---|")
    for name, kw in cases:
        for mode in MODES:
            r = measure(model_spec(seq=max(tokens), **kw), tokens, mode)
            print(f"| {name} | {mode} | {r['bytes']:,} | {r['formula']:,.0f} | "
                  f"{r['per_token']:,.0f} | {r['formula_per_token']:,.0f} | "
                  f"{r['eager_per_token']:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
