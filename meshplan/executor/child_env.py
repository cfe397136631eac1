"""Environment for the processes meshplan starts on GPU hosts (no torch import).

NVLink SHARP / multicast (NCCL NVLS, symmetric-memory multicast, NVSHMEM NVLS) is switched
off: on shared hosts a program using it can take the host's GPUs out of service, and
meshplan's collectives do not need it.
"""

from __future__ import annotations

import os
from types import MappingProxyType

NO_MULTICAST_ENV = MappingProxyType({"NCCL_NVLS_ENABLE": "0",
                                     "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                     "NVSHMEM_DISABLE_NVLS": "1"})


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with multicast off, plus ``extra``."""
    return {**os.environ, **NO_MULTICAST_ENV, **extra}
