"""Gradient accumulation across micro-batches: torch's rule, and the term that prices it."""

from __future__ import annotations

from dataclasses import replace

import pytest

import meshplan as mp
from meshplan.costmodel import estimate
from meshplan.costmodel.compute import hbm_s
from meshplan.costmodel.grad_accumulation import (ACCUMULATE_BYTES_PER_PARAM,
                                                  accumulation_terms)
from meshplan.costmodel.memory import stage_params
from meshplan.costmodel.moe import moe_params_per_rank

H200 = mp.Cluster.preset("dgx-h200", nodes=1).replace(gpus_per_node=1)
LLAMA = mp.ModelSpec(name="llama-small", num_layers=4, hidden_size=1024, num_heads=8,
                     vocab_size=32000, max_seq_len=1024, activation="swiglu", norm="rmsnorm",
                     position_embedding="rope", tied_embeddings=False, bias=False)
MOE = replace(LLAMA, name="moe-small", num_experts=8, experts_per_token=2,
                    moe_ffn_hidden_size=1024)
JOB = mp.Job(global_batch=16, seq_len=1024, runtime="torch")


def _one_accumulation_s(params: float) -> float:
    return hbm_s(H200.gpu, params * ACCUMULATE_BYTES_PER_PARAM, "residual-add")


def test_torch_steals_the_first_gradient_and_adds_the_rest_in_place():
    """The rule the term rests on, read from torch itself: after zero_grad(set_to_none=True)
    the first backward's gradient becomes .grad without an add, each later one is added in
    place (one aten add_ per parameter and micro-batch after the first)."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    lin = torch.nn.Linear(8, 8)
    grads = {id(p) for p in lin.parameters()}

    class Adds(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.add_.Tensor:
                self.n += 1
            return out

    lin.zero_grad(set_to_none=True)
    counted = []
    for _ in range(4):
        x = torch.randn(3, 8)
        with Adds() as mode:
            lin(x).sum().backward()
        counted.append(mode.n)
    assert grads and counted == [0, 2, 2, 2]      # weight and bias, from the second on


@pytest.mark.parametrize("compile_, measured, priced", [
    (True, (), 0),             # the compiled analytical layer counts no accumulation
    (False, (), 4),            # the eager analytical layer counts one in every micro-batch
    (True, ("layer",), 4),     # so does a measured row (its grads are never cleared)
])
def test_each_backward_moves_by_its_share_of_the_difference(compile_, measured, priced):
    lay = mp.Layout(micro_batch=4, compile=compile_)
    m = lay.num_microbatches(JOB.global_batch)
    acc = accumulation_terms(LLAMA, H200, JOB, lay, m, measured)
    per_layer = stage_params(LLAMA, 1, 1, first=False, last=False, pp=1)
    assert m == 4
    assert acc.layer_s == pytest.approx((m - 1 - priced) / m * _one_accumulation_s(per_layer))


def test_routed_experts_are_counted_apart_from_the_dense_part():
    lay = mp.Layout(micro_batch=2, compile=False)
    m = lay.num_microbatches(JOB.global_batch)
    acc = accumulation_terms(MOE, H200, JOB, lay, m, ())
    dense = stage_params(MOE, 1, 1, first=False, last=False, pp=1)
    experts = moe_params_per_rank(MOE, lay).experts
    # eager: the dense part priced in every micro-batch (one too many), experts in none
    want = (-1 / m * _one_accumulation_s(dense) + (m - 1) / m * _one_accumulation_s(experts))
    assert acc.layer_s == pytest.approx(want)
    assert acc.layer_s > 0


@pytest.mark.parametrize("job, layout", [
    (replace(JOB, runtime="megatron"), mp.Layout(micro_batch=2)),   # fused into the GEMM
    (JOB, mp.Layout(micro_batch=2, zero=2)),                      # FSDP2: not priced here
])
def test_nothing_where_gradients_are_not_kept_whole_by_the_executor(job, layout):
    acc = accumulation_terms(LLAMA, H200, job, layout, 8, ())
    assert acc == (0.0, 0.0, 0.0)


def test_a_step_on_the_datasheet_adds_m_minus_1_accumulations_of_every_parameter(request):
    lay = mp.Layout(micro_batch=4, compile=True)
    with_term = estimate(MOE, H200, JOB, lay).step_time_s
    request.getfixturevalue("no_grad_accumulation")     # the same layout without the term
    without = estimate(MOE, H200, JOB, lay).step_time_s
    params = (MOE.num_layers * (stage_params(MOE, 1, 1, first=False, last=False, pp=1)
                                + moe_params_per_rank(MOE, lay).experts)
              + stage_params(MOE, 0, 1, first=True, last=True, pp=1))
    assert with_term - without == pytest.approx(3 * _one_accumulation_s(params), rel=1e-6)


def test_one_microbatch_compiled_on_the_datasheet_has_nothing_to_accumulate():
    assert accumulation_terms(MOE, H200, JOB, mp.Layout(micro_batch=16, compile=True), 1,
                              ()) == (0.0, 0.0, 0.0)
