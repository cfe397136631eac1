"""fp8 casts and the fp8 linear on CPU: scales, saturation, round-trip and GEMM error bounds.

The bounds are the formats' own (arXiv 2209.05433 Table 1): round-to-nearest into e4m3 errs
by at most 2^-4 of a normal value and half a subnormal step (2^-10 before unscaling) below
the normal range; e5m2 by 2^-3 and 2^-17.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from meshplan.costmodel.fp8 import RECIPES, roundtrip_error_bound  # noqa: E402
from meshplan.executor.fp8 import Fp8Plan, fp8_linear, recipe  # noqa: E402
from meshplan.executor.fp8_quant import FP8_DTYPES, block_amax, quantize  # noqa: E402

BLOCKS = [(0, 0), (1, 0), (0, 1), (1, 128), (128, 128), (128, 1), (1, 32)]
HALF_SUBNORMAL = {"e4m3": 2.0 ** -10, "e5m2": 2.0 ** -17}


def _data(rows=300, cols=260, seed=0):
    g = torch.Generator().manual_seed(seed)
    # magnitudes over ten binades, so that small blocks and subnormals both occur
    return torch.randn(rows, cols, generator=g) * torch.exp2(
        torch.randint(-6, 4, (rows, cols), generator=g).float())


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("block", BLOCKS)
def test_roundtrip_error_within_the_formats_bound(block, fmt):
    x = _data()
    q = quantize(x, block, fmt)
    assert q.data.dtype == FP8_DTYPES[fmt]
    back = q.dequantize()
    # per element: relative bound for normals, plus half a subnormal step (unscaled)
    step = _expand(q.scale_inv, x.shape, block) * HALF_SUBNORMAL[fmt]
    bound = roundtrip_error_bound(fmt) * x.abs() + step
    assert ((back - x).abs() <= bound * (1 + 1e-6)).all()


def test_scale_puts_each_blocks_amax_at_the_format_maximum():
    x = _data()
    for block in [(0, 0), (1, 0), (1, 128), (128, 128)]:
        for fmt in ("e4m3", "e5m2"):
            q = quantize(x, block, fmt)
            fmax = torch.finfo(FP8_DTYPES[fmt]).max
            assert torch.equal(block_amax(q.data.float(), block),
                               torch.full_like(q.scale_inv, fmax))


def test_zero_block_gets_a_finite_scale_and_zero_data():
    x = torch.zeros(4, 256)
    x[0, :128] = 3.0
    q = quantize(x, (1, 128), "e4m3")
    assert torch.isfinite(q.scale).all() and torch.isfinite(q.scale_inv).all()
    back = q.dequantize()
    assert torch.equal(back[x == 0], x[x == 0])
    torch.testing.assert_close(back, x, rtol=1e-6, atol=0)


def test_a_reused_smaller_scale_saturates_instead_of_overflowing():
    x = torch.tensor([[1.0, -2.0, 4.0, 0.5]])
    scale = quantize(x / 4, (0, 0), "e4m3").scale      # fits values up to 1.0
    q = quantize(x, (0, 0), "e4m3", scale=scale)
    assert torch.isfinite(q.data.float()).all()
    assert q.data.float().tolist() == [[448.0, -448.0, 448.0, 224.0]]


def test_mx_scales_are_powers_of_two_and_saturate_the_top_of_the_binade():
    x = _data(64, 256)
    q = quantize(x, (1, 32), "e4m3", power_of_two=True)
    exps = torch.log2(q.scale)
    assert torch.equal(exps, exps.round())
    amax = block_amax(x, (1, 32))
    assert ((amax * q.scale >= 256) & (amax * q.scale < 512)).all()    # OCP MX §6.3
    # above 448 the elements saturate: at most 1 - 448/512 = 1/8 relative error
    back = q.dequantize()
    big = x.abs() * _expand(q.scale, x.shape, (1, 32)) >= 2.0 ** -6
    assert ((back - x).abs()[big] <= x.abs()[big] / 8 * (1 + 1e-6)).all()


def test_transpose_keeps_the_values():
    x = _data(256, 384)
    for block in [(1, 128), (128, 128), (0, 1)]:
        q = quantize(x, block, "e4m3")
        assert torch.equal(q.t().dequantize(), q.dequantize().t())
        assert torch.equal(q.contiguous_t().dequantize(), q.dequantize().t())


@pytest.mark.parametrize("name", ["tensorwise", "rowwise", "blockwise", "mxfp8"])
def test_fp8_linear_error_within_the_product_bound(name):
    """Every output element of the emulated forward GEMM is within the bound that
    quantizing both operands allows: Σ |â b̂ − a b| ≤ Σ (u_a + u_b + u_a u_b)|a||b| +
    half-subnormal terms (ε_a(1 + u_b)|b| + ε_b|a|), plus fp32 accumulation."""
    r = recipe(name)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 384, generator=g)
    w = torch.randn(512, 384, generator=g) * 0.05
    y = fp8_linear(x, w, None, Fp8Plan(recipe=r, emulate=True))
    ua, ub = (roundtrip_error_bound(r.x_fwd.fmt), roundtrip_error_bound(r.w_fwd.fmt))
    if r.power_of_two_scales:
        ua = ub = 1 / 8                     # MX saturation (test above)
    qx = quantize(x, r.x_fwd.block, r.x_fwd.fmt, power_of_two=r.power_of_two_scales)
    qw = quantize(w, r.w_fwd.block, r.w_fwd.fmt, power_of_two=r.power_of_two_scales)
    ea = _expand(qx.scale_inv, x.shape, r.x_fwd.block) * HALF_SUBNORMAL[r.x_fwd.fmt]
    eb = _expand(qw.scale_inv, w.shape, r.w_fwd.block) * HALF_SUBNORMAL[r.w_fwd.fmt]
    bound = ((ua + ub + ua * ub) * (x.abs() @ w.abs().t()) + (ea @ w.abs().t()) * (1 + ub)
             + x.abs() @ eb.t())
    exact = x.double() @ w.double().t()
    err = (y.double() - exact).abs()
    assert (err <= bound.double() * (1 + 1e-5) + 1e-6).all()
    # and far from vacuous: the typical error is a few percent of the output
    rel = float((y - exact.float()).norm() / exact.norm())
    assert 0.005 < rel < 0.08


@pytest.mark.parametrize("name", ["tensorwise", "rowwise"])
def test_kernel_path_equals_the_emulation_on_cpu(name):
    """torch._scaled_mm (where this torch has it on CPU) multiplies the same fp8 values as the
    emulation: the operand layouts and scale shapes of all three GEMMs are the kernel's."""
    if not hasattr(torch, "_scaled_mm"):
        pytest.skip("no torch._scaled_mm")
    g = torch.Generator().manual_seed(2)
    x0 = torch.randn(2, 64, 128, generator=g)
    w0 = torch.randn(256, 128, generator=g) * 0.05
    dy = torch.randn(2, 64, 256, generator=g)
    out = []
    for emulate in (True, False):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        try:
            y = fp8_linear(x, w, None, Fp8Plan(recipe=recipe(name), emulate=emulate))
        except RuntimeError as exc:
            pytest.skip(f"torch {torch.__version__} has no CPU fp8 kernel: {exc}")
        y.backward(dy)
        out.append((y.detach(), x.grad, w.grad))
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_every_recipe_runs_all_three_gemms_in_fp8():
    """The backward GEMMs see fp8 operands: a gradient computed in fp8 differs from the
    fp32 one, and equals the emulated fp8 product of the recipe's backward operands."""
    for name in ("tensorwise", "rowwise", "blockwise"):
        r = RECIPES[name]
        g = torch.Generator().manual_seed(3)
        x = torch.randn(128, 256, generator=g).requires_grad_()
        w = (torch.randn(128, 256, generator=g) * 0.05).requires_grad_()
        dy = torch.randn(128, 128, generator=g)
        fp8_linear(x, w, None, Fp8Plan(recipe=r, emulate=True)).backward(dy)
        qdy = quantize(dy, r.dy_dgrad.block, r.dy_dgrad.fmt)
        qw = quantize(w.detach(), r.w_dgrad.block, r.w_dgrad.fmt)
        assert torch.allclose(x.grad, qdy.dequantize() @ qw.dequantize(), rtol=1e-5, atol=1e-6)
        qdyw = quantize(dy, r.dy_wgrad.block, r.dy_wgrad.fmt)
        qx = quantize(x.detach(), r.x_wgrad.block, r.x_wgrad.fmt)
        assert torch.allclose(w.grad, qdyw.dequantize().t() @ qx.dequantize(), rtol=1e-5,
                              atol=1e-6)
        assert not torch.allclose(w.grad, dy.t() @ x.detach(), rtol=1e-3)


def _expand(per_block: torch.Tensor, shape, block) -> torch.Tensor:
    rows, cols = shape
    br = rows if block[0] == 0 else block[0]
    bc = cols if block[1] == 0 else block[1]
    return per_block.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]


@pytest.mark.parametrize("block", [(0, 0), (1, 0), (128, 128)])
def test_bf16_input_is_scaled_in_fp32(block):
    """A bf16 tensor casts exactly as its fp32 copy: the scaling multiply is not done in
    bf16 (which would round twice), whatever the scale's shape."""
    x = _data(256, 256).bfloat16()
    a, b = quantize(x, block, "e4m3"), quantize(x.float(), block, "e4m3")
    assert torch.equal(a.data.float(), b.data.float())
