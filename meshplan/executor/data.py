"""Training tokens: synthetic (seeded, the default) or a flat token file read with memmap.

Each step draws the *global* batch (global_batch × (seq_len + 1) tokens) from the step
number alone, and a dp rank keeps its contiguous share, so every layout — and the
single-process reference in the tests — sees the same sequences in the same order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from meshplan.errors import ExecutorError


class SyntheticTokens:
    """Uniformly random token ids; batch ``step`` depends only on (seed, step)."""

    def __init__(self, vocab_size: int, seq_len: int, *, seed: int = 0):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def global_batch(self, step: int, global_batch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 7919 + step)
        return torch.randint(0, self.vocab_size, (global_batch, self.seq_len + 1), generator=g)


class TokenFile:
    """A flat binary file of uint16 or uint32 token ids (as nanoGPT's ``train.bin``).

    Sequences start at offsets drawn from (seed, step); the file is opened with
    ``numpy.memmap`` so nothing beyond the sampled windows is read.
    """

    def __init__(self, path: str | Path, vocab_size: int, seq_len: int, *,
                 dtype: str = "uint16", seed: int = 0):
        path = Path(path)
        if dtype not in ("uint16", "uint32"):
            raise ExecutorError(f"--data-dtype {dtype!r} is not supported; use uint16 or uint32")
        if not path.is_file():
            raise ExecutorError(f"token file {str(path)!r} does not exist")
        self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        if len(self.tokens) < seq_len + 2:
            raise ExecutorError(f"token file {str(path)!r} holds {len(self.tokens)} tokens; at "
                                f"least seq_len + 2 = {seq_len + 2} are needed")
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def global_batch(self, step: int, global_batch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 7919 + step)
        hi = len(self.tokens) - self.seq_len - 1
        starts = torch.randint(0, hi, (global_batch,), generator=g).tolist()
        rows = np.stack([np.asarray(self.tokens[s:s + self.seq_len + 1], dtype=np.int64)
                         for s in starts])
        if rows.max() >= self.vocab_size:
            raise ExecutorError(f"token file holds id {int(rows.max())} >= the model's "
                                f"vocab_size {self.vocab_size}")
        return torch.from_numpy(rows)


def local_share(batch: torch.Tensor, dp: int, dp_rank: int) -> torch.Tensor:
    """This dp rank's contiguous block of sequences."""
    n = batch.shape[0] // dp
    return batch[dp_rank * n:(dp_rank + 1) * n]


def load_balanced_positions(seq_len: int, cp: int, cp_rank: int, *,
                            device: torch.device | str | None = None) -> torch.Tensor:
    """Positions of the tokens context-parallel rank ``cp_rank`` holds, in order.

    The sequence is cut into 2·cp chunks and rank r keeps chunks r and 2·cp−1−r, so that
    under a causal mask every rank has the same share of the attention matrix (Megatron-Core
    context parallelism and TransformerEngine's load balancing; torch's head-tail balancer).
    """
    c = seq_len // (2 * cp)
    first, second = cp_rank * c, (2 * cp - 1 - cp_rank) * c
    return torch.cat((torch.arange(first, first + c, device=device),
                      torch.arange(second, second + c, device=device)))


def shard_sequence(tokens: torch.Tensor, cp: int, cp_rank: int) -> torch.Tensor:
    """This cp rank's tokens of every sequence: (b, s) -> (b, s/cp), load-balanced chunks.

    Inputs and targets are cut the same way, so each rank's next-token loss is over its own
    s/cp positions and the mean over cp ranks is the mean over the sequence. The index is
    made on the tokens' device: a copy from pageable host memory would make the host wait
    for the GPU (see :func:`to_device`)."""
    if cp == 1:
        return tokens
    index = load_balanced_positions(tokens.shape[1], cp, cp_rank, device=tokens.device)
    return tokens.index_select(1, index)


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``batch`` on ``device`` without making the host wait for the GPU.

    A copy from pageable host memory makes the CPU wait until every kernel already queued
    on the stream has finished (CUDA runtime API, "API synchronization behavior": for
    pageable host-to-device transfers "a stream sync is performed before the copy is
    initiated"), whatever ``non_blocking`` says. Done at every step's start, that drained
    the GPU's queue and made each step begin with the CPU dispatching into an idle GPU:
    phases whose CPU dispatch is slower than their GPU work (FSDP2's forward hooks at
    small micro-batches) then ran at the CPU's pace (round 20, docs/benchmarks/accuracy.md).
    From pinned memory the copy is queued like a kernel and the CPU runs on; torch's
    caching host allocator keeps the pinned source alive until the copy has run."""
    if device.type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)


__all__ = ["SyntheticTokens", "TokenFile", "load_balanced_positions", "local_share",
           "shard_sequence", "to_device"]
