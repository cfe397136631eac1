"""Tensor-parallel layers under autocast keep 16-bit tensors (round 16: GPT's LayerNorm
returns fp32 under autocast, so its column-parallel backward all-reduced fp32, and its
row-parallel fp32 bias promoted the residual stream to fp32)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from _gloo import run_gloo_ranks, write_rank_result  # noqa: E402


def _worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from meshplan.executor import tensor_parallel as tpm
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    seen = []
    for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
        real = getattr(dist, name)

        def spy(*args, _real=real, _name=name, **kw):
            seen.append((_name, str(args[0].dtype)))
            return _real(*args, **kw)
        setattr(tpm.dist, name, spy)
    out = {}
    for sp in (False, True):
        torch.manual_seed(0)
        norm, fc, proj = nn.LayerNorm(16), nn.Linear(16, 32), nn.Linear(32, 16)
        x = torch.randn(2, 8, 16, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):        # full model, one rank
            ref = proj(torch.relu(fc(norm(x))))
        ref.float().sum().backward()
        ref_grad = x.grad
        col = tpm.ColumnParallelLinear(fc, None, sequence_parallel=sp)
        row = tpm.RowParallelLinear(proj, None, sequence_parallel=sp)
        # with SP each rank starts from its own sequence slice (no harness collective)
        part = slice(rank * 8 // world, (rank + 1) * 8 // world) if sp else slice(None)
        xs = x.detach()[:, part].clone().requires_grad_()
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = norm(xs)                                          # fp32 under autocast
            y = row(torch.relu(col(h)))                           # (b, s[/tp], h)
        y.float().sum().backward()            # the ranks' losses add up to the full one
        out[str(sp)] = {"norm_dtype": str(h.dtype), "collectives": list(seen),
                        "out_dtype": str(y.dtype), "ref_dtype": str(ref.dtype),
                        "out_err": (y.float() - ref[:, part].float()).abs().max().item(),
                        "grad_err": (xs.grad - ref_grad[:, part]).abs().max().item(),
                        "grad_scale": ref_grad.abs().max().item()}
    write_rank_result(out_dir, rank, out)


def test_column_parallel_collectives_move_bf16_under_autocast(tmp_path):
    for got in run_gloo_ranks(_worker, 2, tmp_path):
        for sp, r in got.items():
            assert r["norm_dtype"] == "torch.float32"             # LayerNorm under autocast
            names = [n for n, _ in r["collectives"]]
            # f's backward (all-reduce; with SP reduce-scatter), g's forward, SP's gathers
            assert len(names) >= 2
            assert {d for _, d in r["collectives"]} == {"torch.bfloat16"}, (sp, r)
            # the row-parallel output keeps the dtype nn.Linear gives under autocast (an
            # fp32 bias would have promoted the residual stream to fp32)
            assert r["out_dtype"] == r["ref_dtype"] == "torch.bfloat16"
            # the same numbers as the unsplit model, within bf16 rounding
            assert r["out_err"] < 0.05
            assert r["grad_err"] < 0.05 * max(1.0, r["grad_scale"])
