"""Which sizes the microbenchmarks time (pure Python).

With a model, the GEMMs are exactly the ones a transformer layer issues under each
tensor-parallel degree (Shoeybi et al. 2019, arXiv 1909.08053 §3: QKV and MLP-up split by
columns, attention-output and MLP-down by rows, logits by vocabulary), for the tokens of a
micro-batch; without one, a representative grid of hidden sizes and token counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.spec import ModelSpec


@dataclass(frozen=True, kw_only=True, order=True)
class GemmShape:
    """Forward ``x[m, k] · W[n, k]ᵀ``; backward adds ``dY·W`` and ``dYᵀ·x``."""

    m: int
    k: int
    n: int
    label: str = ""


@dataclass(frozen=True, kw_only=True, order=True)
class AttentionShape:
    batch: int
    seq: int
    heads: int
    head_dim: int


def layer_gemms(model: ModelSpec, tokens: int, tp: int) -> list[GemmShape]:
    h, f = model.hidden_size, model.ffn_hidden_size
    return [
        GemmShape(m=tokens, k=h, n=(model.q_dim + 2 * model.kv_dim) // tp, label=f"qkv tp{tp}"),
        GemmShape(m=tokens, k=model.q_dim // tp, n=h, label=f"attn-out tp{tp}"),
        GemmShape(m=tokens, k=h, n=model.ffn_matrices * f // tp, label=f"mlp-up tp{tp}"),
        GemmShape(m=tokens, k=f // tp, n=h, label=f"mlp-down tp{tp}"),
        GemmShape(m=tokens, k=h, n=-(-model.vocab_size // tp), label=f"logits tp{tp}"),
    ]


def valid_tps(model: ModelSpec, max_tp: int) -> list[int]:
    return [t for t in (1, 2, 4, 8) if t <= max_tp and model.num_heads % t == 0
            and model.num_kv_heads % t == 0 and model.ffn_hidden_size % t == 0]


def model_gemm_shapes(model: ModelSpec, seq_len: int, *, micro_batches=(1, 2, 4),
                      max_tp: int = 8) -> list[GemmShape]:
    out = {g for t in valid_tps(model, max_tp) for mb in micro_batches
           for g in layer_gemms(model, mb * seq_len, t)}
    return sorted(out)


def default_gemm_shapes(quick: bool, device: str) -> list[GemmShape]:
    """A grid that spans the GEMM sizes of 0.1B-10B models at tp 1-4."""
    if device == "cpu":
        hiddens, tokens = ((64, 128, 256), (64, 256)) if quick else ((128, 256, 512), (128, 512))
    else:
        hiddens, tokens = ((1024, 4096), (2048, 8192)) if quick else \
            ((1024, 2048, 4096), (1024, 4096, 8192))
    out = set()
    for h in hiddens:
        for m in tokens:
            for t in (1, 2, 4):
                if h // t >= 32:
                    out.add(GemmShape(m=m, k=h, n=3 * h // t, label=f"h{h} qkv tp{t}"))
                    out.add(GemmShape(m=m, k=4 * h // t, n=h, label=f"h{h} mlp-down tp{t}"))
    return sorted(out)


def model_attention_shapes(model: ModelSpec, seq_len: int, *, max_tp: int = 8) -> list[AttentionShape]:
    out = set()
    for t in valid_tps(model, max_tp):
        for s in sorted({max(64, seq_len // 4), max(64, seq_len // 2), seq_len}):
            for b in (1, 2):
                out.add(AttentionShape(batch=b, seq=s, heads=model.num_heads // t,
                                       head_dim=model.head_dim))
    return sorted(out)


#: sequence lengths of the long-context attention points timed on GPUs
LONG_CONTEXT_SEQS = (16384, 65536)


def long_context_attention_shapes(model: ModelSpec | None, seq_len: int, device: str,
                                  quick: bool) -> list[AttentionShape]:
    """Attention at 16k and 64k tokens (batch 1, all the model's heads, or 16 heads of 128
    without a model), longer than ``seq_len`` only, on GPUs and without ``--quick``.

    Why: the efficiency curve is clamped beyond its largest point, and context-parallel plans
    run kernels 10-100x larger than a 2k-token calibration times. The 4 x H200 check
    (docs/benchmarks/cp_checks.md) priced 16k-64k attention 1.8x too slow from a profile whose
    largest point was 3.4e10 FLOPs at 0.18 of peak, where cuDNN ran at about 0.45. Two
    points cost well under a second of GPU time (flash/cuDNN memory is linear in tokens)."""
    if device != "cuda" or quick:
        return []
    heads, dim = (model.num_heads, model.head_dim) if model else (16, 128)
    return [AttentionShape(batch=1, seq=s, heads=heads, head_dim=dim)
            for s in LONG_CONTEXT_SEQS if s > seq_len]


def default_attention_shapes(quick: bool, device: str) -> list[AttentionShape]:
    if device == "cpu":
        seqs, heads, dims = ((64, 128), (2, 4), (32,)) if quick else ((128, 256), (2, 4), (32, 64))
    else:
        seqs, heads, dims = ((1024, 4096), (8, 16), (128,)) if quick else \
            ((512, 1024, 2048, 4096), (4, 8, 16), (64, 128))
    return sorted(AttentionShape(batch=1, seq=s, heads=h, head_dim=d)
                  for s in seqs for h in heads for d in dims)


def membound_elements(quick: bool, device: str) -> int:
    """Elements of the activation tensor the memory-bound ops run on."""
    if device == "cpu":
        return (1 << 18) if quick else (1 << 21)
    return (1 << 24) if quick else (1 << 25)


#: the fused AdamW step's state an element: fp32 parameter, gradient and the two moments
ADAMW_STATE_BYTES_PER_ELEMENT = 16
#: the largest optimizer row on a GPU, 2^29 elements (8 GiB of state): 4.45 ms on an H200
OPTIMIZER_MAX_ELEMENTS_LOG2 = 29


def optimizer_elements(quick: bool, device: str, free_bytes: int | None = None) -> int:
    """Elements of the fused AdamW step that ``optimizer_gbps`` is timed on.

    On a GPU the step is timed where its rate no longer moves with size, as a model's
    optimizer runs it: the largest power of two up to 2^29 elements whose state takes no
    more than a quarter of ``free_bytes``, and at least the membound ops' 2^25. Small sizes
    under-read the rate: one H200 timed 2,600 GB/s at 2^25, 3,300-3,670 at 2^27, 3,805 at
    2^28 and 3,860 at 2^29 (docs/benchmarks/optimizer_rate.md); the executor's optimizer
    phase ran at 3,820-3,995 GB/s on every 1-GPU check (0.24-2.99 B parameters).
    ``quick`` stops at 2^26. On the CPU the membound size.
    """
    floor = membound_elements(quick, device)
    if device == "cpu":
        return floor
    log2 = 26 if quick else OPTIMIZER_MAX_ELEMENTS_LOG2
    if free_bytes is not None:
        while log2 > 0 and (1 << log2) * ADAMW_STATE_BYTES_PER_ELEMENT * 4 > free_bytes:
            log2 -= 1
    return max(floor, 1 << log2)


def collective_sizes(quick: bool, device: str) -> list[int]:
    """Message sizes in bytes, 64 KiB .. 256 MiB on GPU."""
    if device == "cpu":
        exps = range(14, 21, 2) if quick else range(14, 23, 2)
    else:
        exps = range(16, 29, 2) if quick else range(16, 29)
    return [1 << e for e in exps]
