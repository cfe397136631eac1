"""Environment for the processes meshplan starts on GPU hosts (no torch import).

NVLink SHARP / multicast (NCCL NVLS, symmetric-memory multicast, NVSHMEM NVLS) is switched
off: on shared hosts a program using it can take the host's GPUs out of service, and
meshplan's collectives do not need it.

torch's CUDA caching allocator runs with expandable segments unless the user configured it
(``PYTORCH_CUDA_ALLOC_CONF`` or torch's newer name ``PYTORCH_ALLOC_CONF``). The cost model
predicts the bytes tensors hold; with fixed-size segments the allocator can also hold memory
reserved but unusable for a larger request, which the plan does not count. fp8h20's bf16
``mb16-compiled`` (1 × H200, 2026-12-01) ran out of memory asking for 3.1 GiB with 117.2 GiB
allocated and 19.5 GiB reserved but free, on a plan predicted at 123.1 GiB of 139.8.
Expandable segments map more memory into one growing segment instead, so freed blocks
coalesce (PyTorch, "CUDA semantics: optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF").
The same plan's time with and without it matched within 0.1 % (moeh1, docs/benchmarks/
moe_checks.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from types import MappingProxyType

NO_MULTICAST_ENV = MappingProxyType({"NCCL_NVLS_ENABLE": "0",
                                     "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                     "NVSHMEM_DISABLE_NVLS": "1"})
ALLOCATOR_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
DEFAULT_ALLOCATOR_CONF = "expandable_segments:True"


def allocator_vars(environ: Mapping[str, str]) -> dict[str, str]:
    """The allocator variables ``environ`` sets (what a run records)."""
    return {v: environ[v] for v in ALLOCATOR_VARS if environ.get(v)}


def allocator_setting(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Give ``environ`` expandable segments unless it sets the allocator; returns the
    allocator variables in force (:func:`allocator_vars`)."""
    if not allocator_vars(environ):
        environ[ALLOCATOR_VARS[0]] = DEFAULT_ALLOCATOR_CONF
    return allocator_vars(environ)


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with multicast off and the allocator's default, plus
    ``extra``."""
    env = {**os.environ, **NO_MULTICAST_ENV}
    allocator_setting(env)
    return {**env, **extra}
