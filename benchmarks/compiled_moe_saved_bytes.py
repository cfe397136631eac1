"""What one executor MoE block compiled by Inductor keeps for its backward (bf16 autocast),
against the cost model's count of a compiled block and its eager count: the mechanism of
the named memory correction ``compiled_moe_block_kept``
(:func:`meshplan.costmodel.moe_torch_memory.compiled_block_kept_bytes`,
``with_compiled_block_memory``).

Counts the bytes of every distinct storage autograd saves during one block's forward
(``saved_tensors_hooks``), parameters apart and the block's own input included (the
compiled block saves it, to re-run its first RMSNorm from), at two token counts (two
sequences a micro-batch): the bytes at the larger count, and the per-token slope. The
block runs ``torch.compile`` (Inductor) as ``Layout.compile`` does at ep = 1; with
``--full`` it is checkpointed as under full recomputation, and what it saves is listed.

    python benchmarks/compiled_moe_saved_bytes.py            # CPU: h 320, 6 heads, 16 x 96
    python benchmarks/compiled_moe_saved_bytes.py --full     # the checkpointed block
    python benchmarks/compiled_moe_saved_bytes.py --rows     # the profiles' compiled GPU rows

``--rows`` reads no block: it sets the formula beside every 1-GPU MoE profile's compiled
bf16 rows without recomputation (per token: the slope between a shape's micro-batches;
a row keeps its layer's input once, as the compiled block does).
"""

from __future__ import annotations

import argparse
import collections
import glob
import re
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import meshplan as mp  # noqa: E402
from meshplan.costmodel.moe_torch_memory import (compiled_block_copy_bytes,  # noqa: E402
                                                 compiled_block_kept_bytes,
                                                 eager_block_kept_bytes)
from meshplan.executor.model import Transformer, rope_tables  # noqa: E402


def model_spec(hidden: int = 320, heads: int = 6, kv_heads: int = 2, ffn: int = 96,
               shared_ffn: int = 224, experts: int = 16, top_k: int = 3, shared: int = 1,
               seq: int = 1024, head_dim: int = 64) -> mp.ModelSpec:
    """One executor MoE layer of the family the formula covers (RMSNorm, rotary, SwiGLU,
    no biases, softmax router with top-k renormalised)."""
    return mp.ModelSpec(
        name="moe-block", num_layers=1, hidden_size=hidden, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, ffn_hidden_size=ffn, vocab_size=128,
        max_seq_len=seq, activation="swiglu", norm="rmsnorm", position_embedding="rope",
        tied_embeddings=False, bias=False, num_experts=experts, experts_per_token=top_k,
        moe_ffn_hidden_size=ffn, num_shared_experts=shared,
        shared_expert_ffn_hidden_size=shared_ffn if shared else None)


def compiled_block(spec: mp.ModelSpec, full: bool = False):
    """The executor's block of ``spec``, its experts on the grouped GEMM, compiled."""
    torch._dynamo.reset()
    model = Transformer(spec)
    model.init_weights(1)
    block = next(iter(model.layers.values()))
    block.mlp.experts.backend = "grouped"
    block.recompute_block = full
    block.compile(dynamic=False)
    return block


def saved(block, spec: mp.ModelSpec, tokens: int) -> dict:
    """Storage -> (bytes, dtype, shape, "param" / "input" / "") of what one forward of
    ``tokens`` tokens (two sequences) saves under bf16 autocast; the second of two steps
    (the first compiles), each with its backward. Any executor block (dense ones too:
    ``compiled_dense_saved_bytes.py``; no rotary tables with learned positions)."""
    def step():
        rope = (rope_tables(tokens // 2, spec.head_dim)
                if spec.position_embedding == "rope" else None)
        torch.manual_seed(0)
        x = torch.randn(2, tokens // 2, spec.hidden_size, dtype=torch.bfloat16,
                        requires_grad=True)
        params = {p.untyped_storage().data_ptr() for p in block.parameters()}
        seen: dict = {}

        def pack(t):
            st = t.untyped_storage()
            ptr = st.data_ptr()
            tag = ("param" if ptr in params else
                   "input" if ptr == x.untyped_storage().data_ptr() else "")
            seen[ptr] = (st.nbytes(), str(t.dtype).replace("torch.", ""), tuple(t.shape), tag)
            return t
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = block(x, rope)
        y.float().sum().backward()
        return seen
    step()
    return step()


def kept(storages: dict) -> int:
    """The saved bytes, the input included, parameters apart."""
    return sum(v[0] for v in storages.values() if v[3] != "param")


def predicted(spec: mp.ModelSpec, tokens: int, eager: bool = False) -> float:
    """The cost model's bytes for the block at ``tokens`` (two sequences): the compiled
    block's with its 16-bit copies, or (``eager``) the eager count, which holds neither the
    input nor the copies (autocast caches those once a step, counted with the weights)."""
    job = mp.Job(global_batch=2, seq_len=tokens // 2, precision="bf16", runtime="torch")
    rows = spec.experts_per_token * tokens
    if eager:
        return eager_block_kept_bytes(spec, job, mp.Layout(micro_batch=2), tokens, rows)
    return compiled_block_kept_bytes(spec, job, tokens, rows) + compiled_block_copy_bytes(
        spec, job)


def measure(spec: mp.ModelSpec, tokens: tuple[int, int]) -> dict:
    """Measured and predicted bytes of the compiled block at ``tokens``."""
    block = compiled_block(spec)
    got = [kept(saved(block, spec, t)) for t in tokens]
    want = [predicted(spec, t) for t in tokens]
    eager = [predicted(spec, t, eager=True) for t in tokens]
    span = tokens[1] - tokens[0]
    return dict(bytes=got[1], formula=want[1], per_token=(got[1] - got[0]) / span,
                formula_per_token=(want[1] - want[0]) / span,
                eager_per_token=(eager[1] - eager[0]) / span)


def _shape_spec(shape: str) -> mp.ModelSpec:
    """A row's block shape, e.g. h2048-f768-q16-kv2-d128-...-moe64k8f768s1x768."""
    m = re.match(r"h(\d+)-f(\d+)-q(\d+)-kv(\d+)-d(\d+)-swiglu-rmsnorm-rope-nobias-drop0-"
                 r"moe(\d+)k(\d+)f(\d+)(?:s(\d+)x(\d+))?$", shape)
    if m is None:
        raise ValueError(shape)
    h, f, q, kv, d, e, k, fe, ns, fs = (int(v) if v else 0 for v in m.groups())
    return model_spec(hidden=h, heads=q, kv_heads=kv, ffn=fe, shared_ffn=fs, experts=e,
                      top_k=k, shared=ns, head_dim=d)


def timed_rows(pattern: str, keep, key=lambda r: (r["shape"], r["seq_len"])):
    """(profile, key, {micro-batch: activation bytes}) for every row ``key`` that the
    profiles matching ``pattern`` timed at two micro-batches or more among the layer rows
    ``keep`` admits (the first profile's, where several timed it)."""
    import tomllib
    seen = set()
    for path in sorted(glob.glob(pattern)):
        rows = collections.defaultdict(dict)
        for r in tomllib.loads(Path(path).read_text()).get("layers", []):
            if keep(r):
                rows[key(r)][r["micro_batch"]] = r["activation_bytes"]
        for k, by_mb in rows.items():
            if len(by_mb) >= 2 and k not in seen:
                seen.add(k)
                yield Path(path).stem, k, by_mb


def slope_per_token(fn, micro_batches, seq: int) -> float:
    """``fn``'s bytes a token between the smallest and largest of ``micro_batches``."""
    a, b = min(micro_batches), max(micro_batches)
    return (fn(b) - fn(a)) / ((b - a) * seq)


def against_row(got: float, want: float, eager: float) -> str:
    """A ``--rows`` table's last three cells: the row's bytes a token, then the formula's and
    the eager count's, each with its difference from the row."""
    return (f"{got:,.0f} | {want:,.0f} ({(want / got - 1) * 100:+.1f} %) | "
            f"{eager:,.0f} ({(eager / got - 1) * 100:+.1f} %) |")


def gpu_rows(pattern: str) -> list[tuple]:
    """(profile, shape, seq, micro-batches, measured, formula, eager) per token for every
    compiled bf16 MoE row shape without recomputation at ep 1 timed at two micro-batches."""
    out = []
    for prof, (shape, seq), by_mb in timed_rows(pattern, lambda r: (
            "moe" in r["shape"] and r.get("compile") and r.get("precision") == "bf16"
            and r["recompute"] == "none" and r.get("ep", 1) == 1
            and r.get("zero", 0) == 0 and r.get("tp", 1) == 1)):
        try:
            spec = _shape_spec(shape)
        except ValueError:
            continue
        job = mp.Job(global_batch=max(by_mb), seq_len=seq, precision="bf16", runtime="torch")
        got = slope_per_token(lambda mb: by_mb[mb], by_mb, seq)
        want = slope_per_token(lambda mb: compiled_block_kept_bytes(
            spec, job, mb * seq, spec.experts_per_token * mb * seq), by_mb, seq)
        eager = slope_per_token(lambda mb: eager_block_kept_bytes(
            spec, job, mp.Layout(micro_batch=mb), mb * seq,
            spec.experts_per_token * mb * seq), by_mb, seq)
        out.append((prof, shape, seq, (min(by_mb), max(by_mb)), got, want, eager))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1024,2048", help="two token counts a micro-batch")
    ap.add_argument("--full", action="store_true", help="list what the checkpointed block saves")
    ap.add_argument("--rows", action="store_true", help="the profiles' compiled GPU rows")
    ap.add_argument("--profiles", default=str(
        ROOT / "docs/benchmarks/data/profiles/profile_h*x1_moeh*.toml"))
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if a.rows:
        print("| profile | block | seq | mb | row B/token | formula | eager count |")
        print("|---|---|---|---|---|---|---|")
        for prof, shape, seq, mbs, got, want, eager in gpu_rows(a.profiles):
            print(f"| {prof} | {shape} | {seq} | {mbs[0]}, {mbs[1]} | "
                  + against_row(got, want, eager))
        return 0
    tokens = tuple(int(v) for v in a.tokens.split(","))
    if a.full:
        spec = model_spec(seq=max(tokens))
        block = compiled_block(spec, full=True)
        for t in tokens:
            print(f"{t} tokens, checkpointed compiled block saves:")
            for v in sorted(saved(block, spec, t).values(), key=lambda v: (v[3], -v[0])):
                print(f"    {v[0]:>10,} B {v[1]:>8} {v[2]} {v[3]}")
        return 0
    print(f"bytes a compiled block keeps (input included, weights' 16-bit copies too), CPU, "
          f"torch {torch.__version__}, tokens {tokens}")
    print("| block | kept at the larger | formula | B/token | formula | eager count |")
    print("|---|---|---|---|---|---|")
    cases = [("h 320, q 6x64, kv 2, 16 x 96, top-3, shared 224", {}),
             ("... without shared experts", dict(shared=0)),
             ("... multi-head (kv 6)", dict(kv_heads=6)),
             ("... top-1", dict(top_k=1)),
             ("... top-8", dict(top_k=8))]
    for name, kw in cases:
        r = measure(model_spec(seq=max(tokens), **kw), tokens)
        print(f"| {name} | {r['bytes']:,} | {r['formula']:,.0f} | {r['per_token']:,.0f} | "
              f"{r['formula_per_token']:,.0f} | {r['eager_per_token']:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
