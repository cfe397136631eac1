"""Does meshplan's copy of torch's interleaved lowering (costmodel/torch_p2p.py) match the
installed torch's own? Run it wherever a torch version runs layouts (the device: 2.11; CI:
2.13); exits 1 on the first difference. No GPU needed:

    python benchmarks/check_torch_lowering.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplan.costmodel.torch_p2p import lowered_interleaved  # noqa: E402

_ACTION = re.compile(r"^(\d+)(F|B|SEND_F|SEND_B|RECV_F|RECV_B)(\d+)$")
SHAPES = [(2, 2, 4), (3, 2, 6), (4, 2, 4), (4, 2, 8), (4, 2, 16), (4, 3, 8), (4, 4, 12),
          (8, 2, 16)]


def torch_lowered(pp: int, vpp: int, m: int) -> list[list[tuple[str, int, int]]]:
    """The installed torch's ScheduleInterleaved1F1B, lowered (``pipeline_order_with_comms``),
    as (kind, stage, micro-batch) per rank; UNSHARD / RESHARD / REDUCE_GRAD left out."""
    from torch.distributed.pipelining import schedules

    class _Stage:     # what the schedule's constructor reads from a stage
        def __init__(self, idx: int):
            self.stage_index, self.group_size, self.group_rank = idx, pp, idx % pp
            self.num_stages, self.submod, self.group = pp * vpp, None, None
            self.has_backward = True

    order = schedules.ScheduleInterleaved1F1B([_Stage(c * pp) for c in range(vpp)],
                                              m).pipeline_order_with_comms
    out = []
    for r in range(pp):
        acts = [_ACTION.match(str(a)) for a in order[r]]
        out.append([(a[2], int(a[1]), int(a[3])) for a in acts if a])
    return out


def main() -> int:
    import torch
    for pp, vpp, m in SHAPES:
        ours = [list(x) for x in lowered_interleaved(pp, vpp, m)]
        theirs = torch_lowered(pp, vpp, m)
        if ours != theirs:
            r = next(i for i in range(pp) if ours[i] != theirs[i])
            print(f"torch {torch.__version__}: pp {pp} vpp {vpp} m {m} differs on rank {r}")
            return 1
    print(f"torch {torch.__version__}: lowering identical for {len(SHAPES)} shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
