"""wrap_data_parallel with bf16 (the GPU path): FSDP2's mixed-precision policy and DDP in one
process group of one rank on CPU. The CPU distributed cases run fp32, which never reached the
bf16 policy: on 2 x H200 every FSDP2 layout failed at setup with "cannot access local
variable 'torch'" (a function-level ``import torch._dynamo`` made ``torch`` local)."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402


class _Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({"0": nn.Linear(8, 8), "1": nn.Linear(8, 8)})

    def forward(self, x):
        for block in self.layers.values():
            x = block(x)
        return x


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        yield types.SimpleNamespace(dp=1, dp_group=dist.group.WORLD,
                                    dp_mesh=init_device_mesh("cpu", (1,)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("zero", [2, 3])
def test_fsdp2_with_bf16_sets_the_mixed_precision_policy(one_rank, zero):
    from torch.distributed.fsdp import FSDPModule
    from meshplan.executor.data_parallel import wrap_data_parallel
    m = wrap_data_parallel(_Blocks(), zero=zero, groups=one_rank, device=torch.device("cpu"),
                           bf16=True, pipelined=False)
    assert isinstance(m, FSDPModule)
    policy = m._get_fsdp_state()._mp_policy
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32


def test_ddp_turns_off_dynamos_bucket_split(one_rank):
    import torch._dynamo as dynamo
    from meshplan.executor.data_parallel import wrap_data_parallel
    one_rank.dp = 2     # the DDP branch: only dp > 1 wraps (a one-rank group is enough here)
    before = dynamo.config.optimize_ddp
    try:
        m = wrap_data_parallel(_Blocks(), zero=0, groups=one_rank, device=torch.device("cpu"),
                               bf16=True, pipelined=False)
        assert isinstance(m, nn.parallel.DistributedDataParallel)
        assert dynamo.config.optimize_ddp is False
    finally:
        dynamo.config.optimize_ddp = before
