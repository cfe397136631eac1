"""The dense feed-forward block and the seeded initialiser, shared by the dense model
(:mod:`meshplan.executor.model`) and the MoE layer (:mod:`meshplan.executor.moe`)."""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from meshplan.spec import ModelSpec


class MLP(nn.Module):
    """GELU MLP (GPT) or SwiGLU (Shazeer 2020, arXiv 2002.05202, eq. 6) with fused gate|up;
    ``ffn_hidden_size`` overrides the spec's width (an MoE layer's shared experts)."""

    def __init__(self, spec: ModelSpec, ffn_hidden_size: int | None = None):
        super().__init__()
        self.swiglu = spec.activation == "swiglu"
        f = ffn_hidden_size or spec.ffn_hidden_size
        self.fc = nn.Linear(spec.hidden_size, spec.ffn_matrices * f, bias=spec.bias)
        self.proj = nn.Linear(f, spec.hidden_size, bias=spec.bias)

    def forward(self, x):
        h = self.fc(x)                             # (b, s, f) or (b, s, 2f)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)          # (b, s, f) each
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return self.proj(h)


def seeded_normal(shape, std: float, seed: int, name: str, device, dtype) -> torch.Tensor:
    """N(0, std²) values that depend only on (seed, name, shape, device type).

    A CPU generator keeps the values identical across GPU types and cheap to draw for
    the tiny test models; large tensors are drawn on the device for speed.
    """
    numel = math.prod(shape)
    gen_device = torch.device(device) if numel >= 1 << 22 else torch.device("cpu")
    g = torch.Generator(device=gen_device)
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1))
    t = torch.empty(shape, device=gen_device, dtype=torch.float32).normal_(0.0, std, generator=g)
    return t.to(device=device, dtype=dtype)


__all__ = ["MLP", "seeded_normal"]
