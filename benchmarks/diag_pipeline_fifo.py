"""Diagnostic (issue 5, round 5): does torch's own interleaved / zero-bubble action order,
run with NCCL's per-peer FIFO streams, have a larger bubble than the cost model's?

Takes the schedule torch builds (``ScheduleInterleaved1F1B`` / ``ScheduleInterleavedZeroBubble``
lowered by ``_PipelineScheduleRuntime`` into compute plus SEND/RECV actions — a private
torch API, so this is a diagnostic, not part of meshplan) and times it two ways:

* ``fifo=True``: every rank's p2p operations with one peer run in issue order on one
  stream (ProcessGroupNCCL keys p2p communicators by the rank pair), a send completes with
  the receiver's matching recv once both reach the heads of their streams;
* ``fifo=False``: each transfer starts as soon as its data is ready (dependencies only).

Compute runs in each rank's order and waits for its received input.

Superseded (round 11): torch's ``batch_isend_irecv`` groups run on the pipeline group's own
communicator, one NCCL stream per rank, not one per peer pair, and each kernel also waits
for the compute enqueued before it; :mod:`meshplan.costmodel.torch_p2p` replays that, and
finds the pp ≥ 3 waits this per-peer replay missed. No GPU needed:

    python benchmarks/diag_pipeline_fifo.py --pp 2 --vpp 2 --microbatches 8 \\
        --forward-ms 17.16 --backward-ms 34.26 --p2p-ms 0.3      # h12: Llama pp2 v2 mb4
"""

from __future__ import annotations

import argparse
import re
import sys

_ACTION = re.compile(r"^(\d+)(F|B|I|W|SEND_F|SEND_B|RECV_F|RECV_B)(\d+)$")


def lowered(pp: int, vpp: int, microbatches: int, schedule: str) -> dict:
    """torch's per-rank action lists with communication (``pipeline_order_with_comms``)."""
    import torch.distributed.pipelining.schedules as sch
    cls = {"interleaved-1f1b": sch.ScheduleInterleaved1F1B,
           "zero-bubble": sch.ScheduleInterleavedZeroBubble}[schedule]

    class _Stage:   # what the schedule's constructor reads from a stage
        def __init__(self, idx: int):
            self.stage_index, self.group_size, self.group_rank = idx, pp, idx % pp
            self.num_stages, self.submod, self.group, self.has_backward = pp * vpp, None, None, True

    return cls([_Stage(i * pp) for i in range(vpp)], microbatches).pipeline_order_with_comms


def simulate(pp: int, vpp: int, microbatches: int, schedule: str, duration, p2p_s: float,
             *, fifo: bool = True) -> float:
    """Makespan (s) of torch's schedule; ``duration(stage, kind)`` gives the compute seconds
    of an action kind ("F", "B", "I" input gradient, "W" weight gradient)."""
    orders = lowered(pp, vpp, microbatches, schedule)
    stages = pp * vpp
    bwd = "I" if schedule == "zero-bubble" else "B"
    compute: dict[int, list] = {r: [] for r in range(pp)}
    queues: dict[tuple, list] = {}
    for r in range(pp):
        for action in orders[r]:
            m = _ACTION.match(str(action))
            if not m:
                continue       # UNSHARD / RESHARD / REDUCE_GRAD: no time here
            s, kind, mb = int(m[1]), m[2], int(m[3])
            if kind in ("F", "B", "I", "W"):
                compute[r].append((kind, s, mb))
                continue
            d = kind[-1]                                   # "F" or "B" traffic
            if kind.startswith("SEND"):
                dst = s + 1 if d == "F" else s - 1
                key, peer = (d, dst, mb), dst % pp
                op = ("S", key, ("F", s, mb) if d == "F" else (bwd, s, mb))
            else:
                key, peer = (d, s, mb), (s - 1 if d == "F" else s + 1) % pp
                op = ("R", key, None)
            queues.setdefault((r, peer) if fifo else (r, peer, key), []).append(op)
    cpos, ctime = {r: 0 for r in range(pp)}, {r: 0.0 for r in range(pp)}
    qpos, qtime = {q: 0 for q in queues}, {q: 0.0 for q in queues}
    done: dict[tuple, float] = {}
    arrived: dict[tuple, float] = {}
    progress = True
    while progress:
        progress = False
        for q, ops in queues.items():
            if qpos[q] >= len(ops) or ops[qpos[q]][0] != "S":
                continue
            _, key, producer = ops[qpos[q]]
            if producer not in done:
                continue
            if fifo:
                other = (q[1], q[0])
                if qpos[other] >= len(queues[other]) or queues[other][qpos[other]][1] != key:
                    continue
                end = max(qtime[q], done[producer], qtime[other]) + p2p_s
                qtime[q] = qtime[other] = end
                qpos[q] += 1
                qpos[other] += 1
            else:
                end = done[producer] + p2p_s
                qpos[q] += 1
            arrived[key] = end
            progress = True
        for r in range(pp):
            while cpos[r] < len(compute[r]):
                kind, s, mb = compute[r][cpos[r]]
                deps = []
                if kind == "F" and s > 0:
                    deps.append(arrived.get(("F", s, mb)) if (s - 1) % pp != r
                                else done.get(("F", s - 1, mb)))
                if kind in ("B", "I") and s < stages - 1:
                    deps.append(arrived.get(("B", s, mb)) if (s + 1) % pp != r
                                else done.get((bwd, s + 1, mb)))
                if kind in ("B", "I"):
                    deps.append(done.get(("F", s, mb)))
                if kind == "W":
                    deps.append(done.get((bwd, s, mb)))
                if any(d is None for d in deps):
                    break
                end = max([ctime[r], *deps]) + duration(s, kind)
                done[(kind, s, mb)] = ctime[r] = end
                cpos[r] += 1
                progress = True
    stuck = {r: compute[r][cpos[r]] for r in range(pp) if cpos[r] < len(compute[r])}
    if stuck:
        raise RuntimeError(f"deadlock: ranks wait at {stuck}")
    return max(ctime.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--vpp", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--schedule", default="interleaved-1f1b",
                   choices=["interleaved-1f1b", "zero-bubble"])
    p.add_argument("--forward-ms", type=float, required=True, help="one chunk's forward")
    p.add_argument("--backward-ms", type=float, required=True,
                   help="one chunk's backward (zero-bubble: its input-gradient part)")
    p.add_argument("--weight-ms", type=float, default=0.0, help="zero-bubble's W per chunk")
    p.add_argument("--p2p-ms", type=float, default=0.3)
    a = p.parse_args(argv)
    times = {"F": a.forward_ms, "B": a.backward_ms, "I": a.backward_ms, "W": a.weight_ms}
    busy = a.microbatches * a.vpp * (a.forward_ms + a.backward_ms + a.weight_ms) / 1e3
    for fifo in (False, True):
        t = simulate(a.pp, a.vpp, a.microbatches, a.schedule, lambda s, k: times[k] / 1e3,
                     a.p2p_ms / 1e3, fifo=fifo)
        print(f"{'per-peer FIFO' if fifo else 'dependencies only'}: step {t * 1e3:.1f} ms, "
              f"bubble {(t - busy) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
