"""The process group of a benchmark script launched by torchrun: NCCL on this rank's GPU
(``LOCAL_RANK``), or gloo on the CPU."""

from __future__ import annotations

import os


def init_torchrun_group(cuda: bool):
    """Join the torchrun world (NCCL bound to ``cuda:LOCAL_RANK`` when ``cuda``, else gloo)
    and return this rank's ``torch.device``."""
    import torch
    import torch.distributed as dist
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device


__all__ = ["init_torchrun_group"]
