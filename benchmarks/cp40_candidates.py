"""Why the cp40 held-out rows ran slower than predicted: each candidate mechanism priced on
the rows themselves, post hoc (docs/benchmarks/cp_checks.md, "cp40: why the held-out rows ran
11 % slow").

    python benchmarks/cp40_candidates.py /work/devdata/cp40_call4/cp/cp_gpu_logs.tar.gz \
        [--set benchmarks/sets/cp40/set.json] [--gpu H200]

Per row (rank 0, seconds): the step and each micro-batch's forward / backward measured
(the executor's CUDA-event phases) against today's datasheet prediction with one attention
curve for every head dim ("one curve", as the run was predicted) and with the published
head-dim ratio ("now"); the step's gap against its attention and non-attention time; and
the other candidates' size:

* heads per rank (34 heads: 17 under tp 2 or all-to-all cp 2): the attention kernel's
  wave quantization, CTAs = heads · ceil(q tokens / 128) per sequence over the GPU's 132
  SMs; the fraction of the last wave left idle is the most it can cost.
* GEMM shapes (hidden 2176 = 17·128, ffn 6912, vocab 32000): the FLOPs a 128 × 128 output
  tile grid pads, weighted over the layer's GEMMs and the logits.
* the ring's K/V (MHA: 34 kv heads): bytes per ring step and their NVLink time beside the
  block kernel they hide behind; the exposed part is priced (cp_comm_s).

POST HOC: the measurements were known when this was written.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import context_parallel_gpu as cg  # noqa: E402
import cp_phase_gap as pg  # noqa: E402
from cp_gpu_posthoc import without_head_dim_ratio  # noqa: E402

from meshplan.costmodel import context, estimate  # noqa: E402
from meshplan.costmodel.compute import linear_shapes  # noqa: E402
from meshplan.costmodel.memory import activation_bytes_per_element  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.spec import Job, Layout  # noqa: E402

SMS = 132          # H100 / H200 SXM streaming multiprocessors
TILE = 128         # the attention kernel's query tile and the GEMM output tile side


def wave_idle(model, job: Job, layout: Layout) -> float:
    """Fraction of SM-slots idle in the attention kernel's last wave, per call."""
    a2a = layout.cp_style == "all-to-all"
    heads = model.num_heads // (layout.tp * (layout.cp if a2a else 1))
    q_tokens = job.seq_len // (1 if a2a else 2 * layout.cp)     # ring: a half-chunk block
    ctas = layout.micro_batch * heads * math.ceil(q_tokens / TILE)
    return 1.0 - ctas / (SMS * math.ceil(ctas / SMS))


def gemm_padding(model, job: Job, layout: Layout) -> float:
    """Padded FLOPs of a 128 × 128 output tile grid over the FLOPs, minus 1."""
    tokens = job.seq_len // layout.cp
    shapes = [s for s, _ in linear_shapes(model, replace(job, seq_len=tokens),
                                          layout.micro_batch, layout.tp)]
    shapes.append((tokens, model.hidden_size, model.vocab_size / layout.tp))   # logits
    real = sum(m * k * n for m, k, n in shapes)
    padded = sum(m * k * TILE * math.ceil(n / TILE) for m, k, n in shapes)
    return padded / real - 1.0


def ring_kv(model, cluster: Cluster, job: Job, layout: Layout) -> tuple[float, float]:
    """(K/V bytes per ring step, their time on the cp link) of one layer; 0 without a ring."""
    if layout.cp == 1 or layout.cp_style != "ring":
        return 0.0, 0.0
    kv = context.ring_kv_bytes(model, job.seq_len, layout.micro_batch, layout.tp, layout.cp,
                               activation_bytes_per_element(job))
    link = cluster.group_link(layout.cp, layout.tp)
    return kv, kv / link.bandwidth_bytes_per_s(kv)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tarballs", nargs="+", help="cp_gpu_logs.tar.gz of the run")
    p.add_argument("--set", default="benchmarks/sets/cp40/set.json")
    p.add_argument("--gpu", default="H200", choices=("H100", "H200"))
    args = p.parse_args(argv)
    model = cg.load_set(args.set)[0]
    now = Cluster.preset(f"dgx-{args.gpu.lower()}", nodes=1, gpus_per_node=4)
    one = without_head_dim_ratio(now)
    print(f"{'row':7s} {'step meas/one/now':>20s} {'fwd meas/one/now':>20s} "
          f"{'bwd meas/one/now':>20s} {'attn one':>8s} {'gap':>6s} {'gap/attn':>8s} "
          f"{'gap/rest':>8s} {'wave idle':>9s} {'gemm pad':>8s} {'kv MB':>6s} {'kv ms':>6s} "
          f"{'cp exp':>6s}")
    for name, doc in sorted(pg.results(args.tarballs).items()):
        job, layout = Job(**doc["job"]), Layout(**doc["layout"])
        e1, e2 = estimate(model, one, job, layout), estimate(model, now, job, layout)
        m = pg.phases(doc)
        meas = doc["measured"]["step_time_s"]
        gap = meas - e1.step_time_s
        kv, kv_s = ring_kv(model, now, job, layout)

        def cell(a: float, b: float, c: float) -> str:
            return f"{a:6.3f}/{b:6.3f}/{c:6.3f}"
        print(f"{name:7s} {cell(meas, e1.step_time_s, e2.step_time_s)} "
              f"{cell(m['forward'], e1.stage_forward_s[0], e2.stage_forward_s[0])} "
              f"{cell(m['backward'], e1.stage_backward_s[0], e2.stage_backward_s[0])} "
              f"{e1.time.attention_s:8.3f} {gap:6.3f} {gap / e1.time.attention_s:8.2f} "
              f"{gap / (e1.step_time_s - e1.time.attention_s):8.2f} "
              f"{100 * wave_idle(model, job, layout):8.1f}% "
              f"{100 * gemm_padding(model, job, layout):7.1f}% {kv / 1e6:6.1f} "
              f"{1e3 * kv_s:6.2f} {e2.time.cp_comm_s:6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
