"""Size and time of one executor checkpoint (``meshplan.executor.checkpoint``).

Size (the executor's state; exact for the tensors it saves)::

    bytes = P · (4 + 4 + 4)                     fp32 master weights + AdamW exp_avg, exp_avg_sq

P = ``ModelSpec.num_params()`` (a tied embedding once: DCP writes each full-size tensor
once, whatever the layout). The executor keeps fp32 master parameters in every
precision (``executor.data_parallel``), and AdamW (Loshchilov & Hutter 2017, arXiv
1711.05101) keeps two fp32 moments per parameter — Rajbhandari et al. 2019 (ZeRO, arXiv
1910.02054) §3.1 count the same 12 bytes per parameter as "optimizer states" (K = 12)
beside the 2-byte fp16 weights, which the executor does not store. Not counted: AdamW's
step counters (4 bytes per parameter tensor), each rank's generator states (≈5 KiB) and
DCP's file framing (``torch.save`` per chunk plus ``.metadata``). Measured error (CPU,
2026-11-28, docs/executor.md): a 41.6M-parameter GPT, 499.6 MB predicted, 500.4 MB of
files from one process (+0.15 %) and 500.9 MB from dp 2 · ZeRO-3 (+0.26 %, more chunks);
the framing is about 2 KB per chunk, which is most of a toy model's files.

Time, as the executor saves. Every rank first copies *every piece it holds* to host memory
(replicas included: DCP deduplicates only when it plans the write), then writes its share;
DCP's planner gives each replicated piece to the rank with the least to write, so the
written bytes spread evenly::

    held  = P/(tp·pp) · (4 / z_w + 8 / z_o)     the rank's fp32 weights and AdamW moments
            z_w = dp·cp under ZeRO-2/3 (the executor's FSDP2 shards the master weights), else 1
            z_o = dp·cp under ZeRO-1/2/3 (the optimizer states), else 1
    stage_s = held / stage_gbps                 the step loop's pause: copy to host memory
    write_s = (bytes / world) / write_gbps      in the background, per rank in parallel
    (write_s = bytes / aggregate_gbps when the file system's total is the limit)

Without a layout, ``held`` is bytes / world (every piece sharded). Measured on 2 × H200
(2026-11-28, docs/benchmarks/executor_gpu.md), gpt3-1.3b dp 2 ZeRO-0: each rank staged
15.81 GB (predicted with the layout 15.81 GB, without it 7.91); the first save paused
15.6 s (fresh pinned buffers), the second 0.34 s (46 GB/s); the write 14.5-22.2 s
(0.7-1.1 GB/s for both ranks together on the machine's local disk: its aggregate).

``write_gbps`` is the sustained write bandwidth of one rank to the checkpoint file system
and ``stage_gbps`` the device-to-host copy bandwidth. Neither is in the GPU profiles yet,
so both are arguments; the defaults are stated assumptions, not measurements: 1 GB/s per
rank (a networked parallel file system shared by every GPU of a node) and 10 GB/s for a
copy into pinned memory over PCIe 4/5 (a third of PCIe 4's 32 GB/s, a sixth of PCIe 5's
64 GB/s: many small tensors). The executor measures both (results ``measured.checkpoints``): put
the measured values here for a real prediction. On the 2-core CI container the same
checkpoint took 1.4-3.7 s to write (0.13-0.36 GB/s with fsync, 1-2 ranks) against 0.25-0.5 s
predicted with the defaults, and 0.11-0.25 s to stage after the first save (1.7 s for the
first, whose fresh host buffers page-fault).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from meshplan.spec import Layout, ModelSpec

BYTES_PER_PARAM = 4 + 4 + 4
DEFAULT_WRITE_GBPS_PER_RANK = 1.0
DEFAULT_STAGE_GBPS = 10.0


@dataclass(frozen=True, kw_only=True)
class CheckpointEstimate:
    bytes: float
    bytes_per_rank: float
    stage_s: float
    write_s: float
    write_gbps_per_rank: float
    stage_gbps: float

    def to_dict(self) -> dict:
        return asdict(self)


def checkpoint_bytes(model: ModelSpec) -> float:
    """Model and optimizer bytes of one checkpoint (see the module docstring)."""
    return float(model.num_params() * BYTES_PER_PARAM)


def held_bytes_per_rank(model: ModelSpec, layout: Layout) -> float:
    """The checkpointed state one rank holds (and stages), replicas included. ZeRO and
    FSDP2 shard over the gradient replicas, dp · cp (the executor's ``dp_cp`` group)."""
    split = layout.tp * layout.pp
    replicas = layout.dp * layout.cp
    z_w = replicas if layout.zero >= 2 else 1
    z_o = replicas if layout.zero >= 1 else 1
    return model.num_params() / split * (4 / z_w + 8 / z_o)


def predict_checkpoint(model: ModelSpec, *, world: int, layout: Layout | None = None,
                       write_gbps_per_rank: float = DEFAULT_WRITE_GBPS_PER_RANK,
                       stage_gbps: float = DEFAULT_STAGE_GBPS,
                       aggregate_gbps: float | None = None) -> CheckpointEstimate:
    """Bytes and seconds of one checkpoint written by ``world`` ranks (``layout``: what each
    rank holds and stages; without it every piece is taken as sharded)."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    total = checkpoint_bytes(model)
    per_rank = total / world
    held = held_bytes_per_rank(model, layout) if layout is not None else per_rank
    write_s = per_rank / (write_gbps_per_rank * 1e9)
    if aggregate_gbps:
        write_s = max(write_s, total / (aggregate_gbps * 1e9))
    return CheckpointEstimate(bytes=total, bytes_per_rank=per_rank,
                              stage_s=held / (stage_gbps * 1e9), write_s=write_s,
                              write_gbps_per_rank=write_gbps_per_rank, stage_gbps=stage_gbps)


__all__ = ["CheckpointEstimate", "checkpoint_bytes", "held_bytes_per_rank", "predict_checkpoint",
           "BYTES_PER_PARAM"]
