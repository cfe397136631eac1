"""What one compiled executor MoE block saves for its backward, bf16 (autocast) against fp8
(recipe rowwise: fp8 grouped GEMMs for the routed experts, ``torch._scaled_mm`` for the
dense linears), per token, beside the cost model's difference for the same block: the
mechanism behind the compiled fp8 MoE memory terms (meshplan.costmodel.fp8_experts,
"memory"; meshplan.costmodel.fp8_cost.torch_memory; docs/benchmarks/moe_checks.md
"Compiled fp8 MoE blocks keep less").

Counts the bytes of every distinct storage autograd saves during one block's forward
(``saved_tensors_hooks``), parameters and the block input apart, at two token counts; the
per-token figure is the slope between them (what grows with the micro-batch). Both arms run
``torch.compile`` (Inductor) on the block, as ``Layout.compile`` does at ep = 1.

    python benchmarks/fp8_moe_saved_bytes.py                  # CPU, h 384, 16 experts of 160
    python benchmarks/fp8_moe_saved_bytes.py --device cuda --hidden 2048 --ffn 1280

On CPU, ``aten::_scaled_grouped_mm`` has no kernel: one is registered here that dequantises
and runs ``torch._grouped_mm``, so the fp8 grouped GEMM stays one opaque node in the graph
as on the GPU (the executor's own emulation is kept out of the graph, which would split it).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fp8_saved_bytes import saved_storages  # noqa: E402

import meshplan as mp  # noqa: E402
from meshplan.costmodel.tables import layer_tables  # noqa: E402
from meshplan.executor.fp8 import Fp8Linear, Fp8Plan, convert_to_fp8  # noqa: E402
from meshplan.executor.fp8_grouped import group_of_rows  # noqa: E402
from meshplan.executor.model import Transformer, rope_tables  # noqa: E402


@contextlib.contextmanager
def cpu_scaled_grouped_mm():
    """Within it, a CPU kernel for ``aten::_scaled_grouped_mm`` (2-D × 3-D forward and
    2-D × 2-D weight gradient, rowwise scales) where the installed torch has none."""
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_scaled_grouped_mm", "CPU"):
        yield
        return

    def kernel(a, b, scale_a, scale_b, offs=None, bias=None, scale_result=None,
               out_dtype=None, use_fast_accum=False):
        if b.dim() == 3:
            a32 = a.float() * scale_a[:, None]
            b32 = b.float() * scale_b[:, None, :]
        else:
            g, groups = group_of_rows(offs, a.shape[1]), offs.numel()
            a32 = a.float() * scale_a.reshape(groups, -1)[g].t()
            b32 = b.float() * scale_b.reshape(groups, -1)[g]
        return torch._grouped_mm(a32, b32, offs=offs).to(out_dtype or torch.bfloat16)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_scaled_grouped_mm", kernel, "CPU")
    try:
        yield
    finally:
        lib._destroy()


def model_spec(a, top_k: int, shared: int) -> mp.ModelSpec:
    return mp.ModelSpec(
        name="moe-block", num_layers=1, hidden_size=a.hidden, num_heads=a.hidden // 64,
        num_kv_heads=2, head_dim=64, ffn_hidden_size=a.ffn, vocab_size=128,
        max_seq_len=max(a.tokens), activation="swiglu", norm="rmsnorm",
        position_embedding="rope", tied_embeddings=False, bias=False,
        num_experts=a.experts, experts_per_token=top_k, moe_ffn_hidden_size=a.ffn,
        num_shared_experts=shared, shared_expert_ffn_hidden_size=a.shared_ffn if shared else None)


def compiled_block(spec: mp.ModelSpec, precision: str, device: torch.device):
    model = Transformer(spec)
    model.init_weights(1)
    block = next(iter(model.layers.values())).to(device)
    block.mlp.experts.backend = "grouped"
    if precision == "fp8":
        convert_to_fp8(model, "rowwise", device=device)
        experts = block.mlp.experts
        experts.fp8 = Fp8Plan(recipe=experts.fp8.recipe, emulate=False)
        for mod in block.modules():
            if isinstance(mod, Fp8Linear):
                mod.plan = Fp8Plan(recipe=mod.plan.recipe, emulate=False)
    block.compile(dynamic=False)
    return block


def saved_bytes(spec: mp.ModelSpec, block, tokens: int, device: torch.device) -> int:
    """Bytes of the distinct storages one forward saves, parameters apart (the second of two
    steps: the first compiles)."""
    seqs = 2
    rope = rope_tables(tokens // seqs, spec.head_dim, device=device)
    torch.manual_seed(0)
    x = torch.randn(seqs, tokens // seqs, spec.hidden_size, dtype=torch.bfloat16,
                    device=device, requires_grad=True)
    saved_storages(block, x, rope)
    return sum(v[0] for v in saved_storages(block, x, rope).values() if not v[3])


def per_token(spec: mp.ModelSpec, precision: str, tokens: tuple[int, int],
              device: torch.device) -> float:
    """The compiled block's saved bytes a token (the slope between ``tokens``)."""
    torch._dynamo.reset()
    block = compiled_block(spec, precision, device)
    lo, hi = (saved_bytes(spec, block, t, device) for t in tokens)
    return (hi - lo) / (tokens[1] - tokens[0])


def predicted_per_token(spec: mp.ModelSpec, precision: str, tokens: tuple[int, int]) -> float:
    """The cost model's kept bytes a token of one layer (the slope between ``tokens``)."""
    cluster = mp.Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1)
    kept = []
    for t in tokens:
        job = mp.Job(global_batch=2, seq_len=t // 2, precision=precision, runtime="torch",
                     **({"fp8_recipe": "rowwise"} if precision == "fp8" else {}))
        lay = mp.Layout(micro_batch=2, compile=True)
        kept.append(layer_tables(spec, cluster, job, lay).layer_activation_bytes)
    return (kept[1] - kept[0]) / (tokens[1] - tokens[0])


def _counts(option: str, text: str) -> tuple[int, ...]:
    """A comma-separated list of positive whole numbers."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) <= 0:
        raise SystemExit(f"{option} {text!r}: positive whole numbers separated by commas")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--ffn", type=int, default=160, help="each routed expert's width")
    ap.add_argument("--shared-ffn", type=int, default=224)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", default="1,2,4,8")
    ap.add_argument("--tokens", default="1024,2048", help="two token counts a micro-batch")
    a = ap.parse_args(argv)
    a.tokens, top_k = _counts("--tokens", a.tokens), _counts("--top-k", a.top_k)
    if len(a.tokens) != 2 or a.tokens[0] >= a.tokens[1]:
        raise SystemExit(f"--tokens {a.tokens}: two increasing counts, e.g. 1024,2048")
    if any(k > a.experts for k in top_k):
        raise SystemExit(f"--top-k {a.top_k}: each at most --experts ({a.experts})")
    device = torch.device(a.device)
    warnings.simplefilter("ignore")
    print(f"h {a.hidden}, {a.experts} experts of {a.ffn}, shared {a.shared_ffn}; "
          f"bytes a token, {device.type}, torch {torch.__version__}")
    print("| top-k | shared | bf16 | fp8 | fp8 − bf16 | cost model's fp8 − bf16 |")
    print("|---|---|---|---|---|---|")
    for k in top_k:
        for shared in (0, 1):
            spec = model_spec(a, k, shared)
            with cpu_scaled_grouped_mm() if device.type == "cpu" else contextlib.nullcontext():
                got = {p: per_token(spec, p, a.tokens, device) for p in ("bf16", "fp8")}
            want = (predicted_per_token(spec, "fp8", a.tokens)
                    - predicted_per_token(spec, "bf16", a.tokens))
            print(f"| {k} | {shared} | {got['bf16']:.0f} | {got['fp8']:.0f} | "
                  f"{got['fp8'] - got['bf16']:.0f} | {want:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
