"""What one executor block saves for its backward, bf16 (autocast) against fp8 (tensorwise,
``torch._scaled_mm``), eager and ``torch.compile``'d: the mechanism behind the cost model's
fp8 memory terms under runtime "torch" (meshplan.costmodel.fp8_cost, docs/fp8.md "Memory").

Counts the bytes of every distinct storage autograd saves during one block's forward
(``saved_tensors_hooks``), parameters apart (they cost nothing extra), the block input
left out (both arms keep it).

    python benchmarks/fp8_saved_bytes.py                      # CPU, h 256, ffn 1024, 256 tokens
    python benchmarks/fp8_saved_bytes.py --device cuda --hidden 2048 --ffn 8192 --tokens 2048
    # also compiled as DDP compiles it under ZeRO-1 (DDPOptimizer, a piece per parameter;
    # meshplan.costmodel.fp8_ddp_split), for a Llama or a GPT block
    python benchmarks/fp8_saved_bytes.py --split [--block gpt]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from meshplan.executor.fp8 import Fp8Linear, Fp8Plan, recipe  # noqa: E402
from meshplan.executor.model import Block, rope_tables  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402


def split_backend(pieces: list[int]):
    """A ``torch.compile`` backend that compiles as DDP does when every parameter's storage
    exceeds its bucket cap (ZeroRedundancyOptimizer's bucket views): Dynamo's DDPOptimizer
    cutting after every operator that takes a parameter, Inductor compiling each piece.
    Appends the number of pieces of each graph to ``pieces``."""
    from torch._dynamo.backends.distributed import DDPOptimizer
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs, **kw):
        opt = DDPOptimizer(bucket_bytes_cap=1, backend_compile_fn=compile_fx,
                           first_bucket_cap=1)
        out = opt.compile_fn(gm, example_inputs, **kw)
        pieces.append(len(opt.buckets))
        return out
    return backend


def saved_storages(block: torch.nn.Module, x: torch.Tensor, rope) -> dict:
    """Every distinct storage autograd saves in one forward of ``block`` on ``x`` under bf16
    autocast, the input's apart: data pointer -> (bytes, dtype, shape, whether a parameter's).
    Runs the backward too (a step's, so a compiled block has its whole graph)."""
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen: dict = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() != x.untyped_storage().data_ptr():
            seen[st.data_ptr()] = (st.nbytes(), str(t.dtype), tuple(t.shape),
                                   st.data_ptr() in params)
        return t
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = block(x, rope)
    y.float().sum().backward()
    return seen


def saved_bytes(spec: ModelSpec, tokens: int, precision: str, compile: bool,
                device: torch.device, split: bool = False) -> dict:
    torch.manual_seed(0)
    torch._dynamo.reset()
    block = Block(spec).to(device)
    if precision == "fp8":
        plan = Fp8Plan(recipe=recipe("tensorwise"), emulate=False)
        for parent, attr in ((block.attn, "qkv"), (block.attn, "proj"), (block.mlp, "fc"),
                             (block.mlp, "proj")):
            setattr(parent, attr, Fp8Linear(getattr(parent, attr), plan))
    pieces: list[int] = []
    if compile:
        block.compile(**({"backend": split_backend(pieces)} if split else {}))
    rope = tuple(t.to(device) for t in rope_tables(tokens, spec.head_dim))
    x = torch.randn(1, tokens, spec.hidden_size, dtype=torch.bfloat16, device=device,
                    requires_grad=True)
    seen = saved_storages(block, x, rope)
    kept = sum(v[0] for v in seen.values() if not v[3])
    return {"precision": precision, "compiled": compile, "pieces": max(pieces, default=1),
            "saved_bytes": kept,
            "per_token_h": kept / (tokens * spec.hidden_size),
            "tensors": sorted(seen.values(), reverse=True)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--block", default="llama", choices=("llama", "gpt"),
                   help="gpt: LayerNorm, GELU, biases, learned positions")
    p.add_argument("--split", action="store_true",
                   help="also compiled per parameter, as DDP compiles it under ZeRO-1")
    a = p.parse_args()
    style = (dict(activation="swiglu", norm="rmsnorm", position_embedding="rope",
                  tied_embeddings=False, bias=False) if a.block == "llama" else {})
    spec = ModelSpec(name="block", num_layers=1, hidden_size=a.hidden, num_heads=4,
                     num_kv_heads=2, ffn_hidden_size=a.ffn, vocab_size=128,
                     max_seq_len=a.tokens, **style)
    linear = sum(q.numel() for n, q in Block(spec).named_parameters() if "norm" not in n)
    print(f"h {a.hidden}, ffn {a.ffn}, {a.tokens} tokens: 16-bit copies of the linears' "
          f"weights {2 * linear} B = {2 * linear / (a.tokens * a.hidden):.2f} B per token·h; "
          f"norm outputs + MLP-down input {2 * (2 * a.hidden + a.ffn) * a.tokens} B")
    modes = [(False, False), (True, False)] + ([(True, True)] if a.split else [])
    for compile, split in modes:
        for precision in ("bf16", "fp8"):
            r = saved_bytes(spec, a.tokens, precision, compile, torch.device(a.device), split)
            how = "split   " if split else "compiled" if compile else "eager   "
            print(f"{how} {precision}: saved {r['saved_bytes']} B = {r['per_token_h']:.2f} B "
                  f"per token·h" + (f" ({r['pieces']} pieces)" if split else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
