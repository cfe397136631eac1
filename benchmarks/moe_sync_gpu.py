"""The executor's MoE layer with and without its device-to-host syncs, on one GPU (issue 38).

Until 2026-11-29 every MoE layer forward of the executor read device values on the host five
times at ep = 1 (two ``torch.bincount`` calls, which on CUDA read their input's min and max,
and the grouped GEMM's ``int(padded.sum())``) and eight at ep > 1; each read drains the
GPU's queue. The executor now counts with ``index_add_``, sizes the grouped GEMM's buffer
from host-known bounds and reads the all-to-all splits back once (``executor/moe.py``;
``costmodel/moe_host.py`` prices what is left). This times both on the GPU: the same plans
run by the executor of a baseline tree (``--baseline``, the code before the change) and of
this one, beside the cost model's predictions made before the run (``plans``: each plan
file carries the prediction of this tree's cost model on the calibrated profile;
``predictions.json`` adds the datasheet one and the baseline tree's).

    # CPU, before the run: plans and predictions (commit them)
    python benchmarks/moe_sync_gpu.py plans --out benchmarks/plans/moe_sync_h200x1 \\
        --profile docs/benchmarks/data/profiles/profile_h200x2_moe_20261128.toml \\
        --baseline out/baseline
    # one GPU (the baseline tree carried: carry out/baseline), ~4 minutes
    python benchmarks/moe_sync_gpu.py run --plans benchmarks/plans/moe_sync_h200x1 \\
        --baseline out/baseline --out $OUT
    # Layout.compile of the MoE blocks, this tree only (plans --set compile, run without
    # --baseline)
    # measured MoE layer rows (plans --set rows): benchmarks/moe_rows_device.sh calibrates
    # moe-1.9b on one GPU and writes the plans (call 1), then runs them (call 2)
    # CPU, after: the table; POST HOC, today's cost model on the same profile
    python benchmarks/moe_sync_gpu.py table --results moe_sync.json
    python benchmarks/moe_sync_gpu.py repredict --results moe_sync.json

``--baseline DIR``: a directory holding the baseline ``meshplan`` package (e.g. ``git
archive <commit> meshplan | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: results key of a layout's second run in a fresh process (``run --second-pass``)
SECOND_RUN = "current2"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from moe_gpu_check import MODEL  # noqa: E402

from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.spec import Job, Layout  # noqa: E402

#: moe-1.9b's per-GPU work of the 2-GPU check (32 x 2048 tokens over dp 2) on one GPU
JOB = Job(global_batch=16, seq_len=2048, precision="bf16", runtime="torch")
SETS = {
    # the executor with and without its MoE syncs (the baseline tree against this one)
    "sync": [("mb1", Layout(micro_batch=1)), ("mb2", Layout(micro_batch=2)),
             ("mb4", Layout(micro_batch=4)),
             ("mb2-selective", Layout(micro_batch=2, recompute="selective"))],
    # Layout.compile: without syncs the MoE layer at ep = 1 compiles as one graph (the
    # baseline broke it into 8); this tree only, eager beside compiled
    "compile": [("mb2", Layout(micro_batch=2)), ("mb2-compiled", Layout(micro_batch=2,
                                                                         compile=True)),
                ("mb4", Layout(micro_batch=4)), ("mb4-compiled", Layout(micro_batch=4,
                                                                         compile=True))],
    # measured MoE layer rows (costmodel/moe_rows.py): the layouts of both sets above and
    # recomputation, predicted from a calibration of this model made in the call before
    "rows": [("mb1", Layout(micro_batch=1)), ("mb2", Layout(micro_batch=2)),
             ("mb4", Layout(micro_batch=4)),
             ("mb2-selective", Layout(micro_batch=2, recompute="selective")),
             ("mb2-full", Layout(micro_batch=2, recompute="full")),
             ("mb2-compiled", Layout(micro_batch=2, compile=True)),
             ("mb4-compiled", Layout(micro_batch=4, compile=True))],
    # a drawn model never run before (plans --model, benchmarks/draw_moe.py), priced from a
    # calibration of it that timed every layout's micro-batch and recompute mode, compiled
    # and eager: the GPU-bound layouts first
    "drawn": [("mb4-compiled", Layout(micro_batch=4, compile=True)),
              ("mb2-compiled", Layout(micro_batch=2, compile=True)),
              ("mb2-selective-compiled", Layout(micro_batch=2, recompute="selective",
                                                compile=True)),
              ("mb2-full-compiled", Layout(micro_batch=2, recompute="full", compile=True)),
              ("mb4", Layout(micro_batch=4)),
              ("mb1-compiled", Layout(micro_batch=1, compile=True))],
}
# the drawn layouts at twice the micro-batch, for a drawn model whose sequence is half as
# long: the same tokens a micro-batch (moeh2: seq 2048 against moeh1's 4096)
SETS["drawn-2x"] = [(f"mb{2 * lay.micro_batch}{name.removeprefix(f'mb{lay.micro_batch}')}",
                     lay.replace(micro_batch=2 * lay.micro_batch)) for name, lay in SETS["drawn"]]


#: the two-GPU parallel shapes a drawn layout picks from (moeh4 on): every way the executor
#: composes expert parallelism with dp, tp + SP and pp on two ranks (ep folds over dp or tp
#: inside a stage, so pp 2 leaves ep 1)
TWO_GPU_SHAPES = (dict(dp=2), dict(dp=2, ep=2), dict(tp=2, sequence_parallel=True),
                  dict(tp=2, sequence_parallel=True, ep=2), dict(pp=2, schedule="1f1b"))
#: four ranks (moeh5 on): ep 2 and 4 over dp, over dp × tp + SP, inside a pipeline stage;
#: and the dense shapes around them
FOUR_GPU_SHAPES = (dict(dp=4), dict(dp=4, ep=2), dict(dp=4, ep=4),
                   dict(dp=2, tp=2, sequence_parallel=True, ep=2),
                   dict(dp=2, tp=2, sequence_parallel=True, ep=4),
                   dict(dp=2, pp=2, schedule="1f1b", ep=2),
                   dict(pp=2, tp=2, sequence_parallel=True, schedule="1f1b"))
#: eight ranks (issue 42's ep at 8 ranks): ep 4 and 8 over dp, over dp × tp + SP, inside a
#: pipeline stage; and the dense shapes around them
EIGHT_GPU_SHAPES = (dict(dp=8), dict(dp=8, ep=4), dict(dp=8, ep=8),
                    dict(dp=4, tp=2, sequence_parallel=True, ep=4),
                    dict(dp=4, tp=2, sequence_parallel=True, ep=8),
                    dict(dp=4, pp=2, schedule="1f1b", ep=4),
                    dict(dp=2, pp=2, tp=2, sequence_parallel=True, schedule="1f1b", ep=4),
                    dict(dp=2, pp=2, tp=2, sequence_parallel=True, schedule="1f1b"))
#: two ranks, the executor's MoE paths of 2026-12-01 (moeh21): etp 2 over tp 2 + SP, dropless
#: MoE at cp 2 (ep 1 and 2), beside the ep 2 shapes timed before
TWO_GPU_MOE_PATHS = (dict(tp=2, sequence_parallel=True, etp=2), dict(cp=2), dict(cp=2, ep=2),
                     dict(tp=2, sequence_parallel=True, ep=2), dict(dp=2, ep=2))
#: a drawn layout predicted to dispatch more CPU than this share of its GPU time is left out
#: (``plans --gpu-bound``; the transfer rounds' ``draw_holdout.py --max-host-load``)
MAX_HOST_LOAD = 0.75
#: per GPU count: (shapes, micro-batches drawn from); four ranks keep micro-batch 2, the one
#: size their calibration can time in one call with ep and FSDP2 rows
MULTI_GPU_DRAW = {2: (TWO_GPU_SHAPES, (1, 2, 4)), 4: (FOUR_GPU_SHAPES, (2,)),
                  8: (EIGHT_GPU_SHAPES, (2,))}


def _layout_name(lay: Layout) -> str:
    parts = [f"{k}{v}" for k, v in (("dp", lay.dp), ("tp", lay.tp), ("pp", lay.pp),
                                     ("cp", lay.cp), ("ep", lay.ep), ("etp", lay.etp)) if v > 1]
    if lay.dp > 1:
        parts.append(f"z{lay.zero}")
    parts.append(f"mb{lay.micro_batch}")
    if lay.recompute != "none":
        parts.append(lay.recompute)
    if lay.compile:
        parts.append("compiled")
    return "-".join(parts)


def draw_layouts(seed: int, count: int = 6, gpus: int = 1,
                 micro_batches: tuple[int, ...] | None = None, shapes=None,
                 subject=lambda shape: shape.get("ep", 1) > 1) -> list[tuple[str, Layout]]:
    """``count`` distinct layouts drawn uniformly from a seed: micro-batch 1-16 (1-4 on two
    GPUs, 2 on four), recompute none / selective / full, compiled or eager, and on two (four)
    GPUs one of ``TWO_GPU_SHAPES`` (``FOUR_GPU_SHAPES``) — each once, in a drawn order, then
    those with ep > 1 — with ZeRO 1-3 where dp > 1 (moeh3 on: unseen layouts as well as an
    unseen model, where moeh1 and moeh2 ran one hand-picked set). One GPU keeps moeh3's
    names (``mb8-compiled``); two name every degree above 1 (``dp2-ep2-z3-mb2-full``).
    ``micro_batches`` (several GPUs): the sizes drawn from instead of ``MULTI_GPU_DRAW``'s,
    e.g. the one size a one-call calibration with ep and FSDP2 rows can time. ``shapes``:
    the pool of shapes instead of the GPU count's, and ``subject`` the shapes drawn again
    once every shape has been (default: ep > 1)."""
    import random
    if gpus not in (1, *MULTI_GPU_DRAW):
        raise ValueError(f"draw_layouts(gpus={gpus}): one, two, four or eight GPUs")
    rng, drawn = random.Random(seed), []
    # several GPUs: every shape once (in a drawn order), then shapes with ep > 1, the subject
    pool, mbs = MULTI_GPU_DRAW.get(gpus, ((), ()))
    pool = tuple(shapes) if shapes else pool
    mbs = tuple(micro_batches) if micro_batches else mbs
    shapes = rng.sample(pool, len(pool))
    while len(drawn) < count:
        if gpus == 1:
            lay = Layout(micro_batch=rng.choice((1, 2, 4, 8, 16)),
                         recompute=rng.choice(("none", "selective", "full")),
                         compile=rng.random() < 0.5)
        else:
            shape = dict(shapes[len(drawn)] if len(drawn) < len(shapes) else
                         rng.choice([s for s in pool if subject(s)]))
            zero = rng.choice((1, 2, 3))
            if shape.get("dp", 1) > 1:
                shape["zero"] = zero
            lay = Layout(micro_batch=rng.choice(mbs),
                         recompute=rng.choice(("none", "selective", "full")),
                         compile=rng.random() < 0.5, **shape)
        if lay not in drawn:
            drawn.append(lay)
    if gpus == 1:
        return [(f"mb{lay.micro_batch}"
                 + ("" if lay.recompute == "none" else f"-{lay.recompute}")
                 + ("-compiled" if lay.compile else ""), lay) for lay in drawn]
    return [(_layout_name(lay), lay) for lay in drawn]


def compiled_draws(seed: int, selective: bool = False) -> list[tuple[str, Layout]]:
    """The compiled layouts among sixteen 1-GPU draws of ``seed``, in drawn order; without
    selective recompute (the 1-GPU MoE checks' sets since moeh23) unless ``selective`` (the
    dense fp8h sets)."""
    return [(n, lay) for n, lay in draw_layouts(seed, count=16, gpus=1)
            if lay.compile and (selective or lay.recompute != "selective")]


SETS["drawn-3803"] = draw_layouts(3803)
# moeh4 (2026-11-29): the first drawn set on two GPUs
SETS["drawn2-3804"] = draw_layouts(3804, count=8, gpus=2)
# moeh5 (2026-11-29, for the next 4-GPU lease): sixteen candidates; `plans --gpu-bound 8`
# keeps the first eight the call-1 profile predicts GPU-bound
SETS["drawn4-3805"] = draw_layouts(3805, count=16, gpus=4)
# moeh6 (2026-11-29 night): a second two-GPU model, hidden 2048, at micro-batch 4 only (the
# one size its one-call calibration with ep and FSDP2 rows times); `plans --gpu-bound 8`
SETS["drawn2-3806"] = draw_layouts(3806, count=16, gpus=2, micro_batches=(4,))
# moeh7 (2026-11-29 night, for a 2-GPU lease): moeh6's design, 8 k tokens a micro-batch of
# its 1 k sequences, priced at the calibration's recorded load imbalance (--load-imbalance rows)
SETS["drawn2-3807"] = draw_layouts(3807, count=16, gpus=2, micro_batches=(8,))
# moeh8 (2026-11-30, for a 2-GPU lease): moeh7's design, 8 k tokens a micro-batch of its
# 4 k sequences; ZeRO-2/3 at ep 2 from the ep rows (moeh7's post hoc change, before this draw)
SETS["drawn2-3808"] = draw_layouts(3808, count=16, gpus=2, micro_batches=(2,))
# moeh9 (2026-11-30, for a 2-GPU lease): moeh8's design on fine-grained experts (64 of width
# 640, top-8), 8 k tokens a micro-batch of its 1 k sequences
SETS["drawn2-3809"] = draw_layouts(3809, count=16, gpus=2, micro_batches=(8,))
# moeh10 (2026-11-30, for a 2-GPU lease): moeh9's design on 16 experts of width 2560, top-4,
# calibrated with the FSDP2 rows at ep 2 (added after moeh9) and the 4-block synchronized
# diagnostic of the ep rows
SETS["drawn2-3810"] = draw_layouts(3810, count=16, gpus=2, micro_batches=(8,))
# moeh11 (2026-11-30, for a 2-GPU lease): moeh10's design on 32 experts of width 1664, top-4,
# with a shared expert; all three compiled modes among its first ten candidates
SETS["drawn2-3811"] = draw_layouts(3811, count=16, gpus=2, micro_batches=(8,))
# moeh12 (2026-11-30, for a 2-GPU lease, drawn after moeh11 ran): moeh11's design at the
# drawn model's own sequence length 4096, so 8 k tokens a micro-batch at micro-batch 2 (as
# moeh8); its first ten compile at none and full, one a ZeRO-3 layout at ep 2 (priced from a
# derived compiled FSDP2 row: MoE FSDP2 rows are timed eager)
SETS["drawn2-3812"] = draw_layouts(3812, count=16, gpus=2, micro_batches=(2,))
# moeh13 (2026-11-30, for a 2-GPU lease, drawn after moeh12 ran): moeh12's design on
# fine-grained experts (64 of width 768, top-8: moeh9's regime), 8 k tokens a micro-batch of
# its 2 k sequences
SETS["drawn2-3813"] = draw_layouts(3813, count=16, gpus=2, micro_batches=(4,))
# moeh14 (2026-11-30, for a 2-GPU lease, drawn after moeh13 ran): moeh13's design on coarse
# top-1 experts (8 of width 5760, Switch-style) with GQA, 8 k tokens a micro-batch of its 2 k
# sequences; the first check calibrated with the ep rows re-timed in the rounds left
SETS["drawn2-3814"] = draw_layouts(3814, count=16, gpus=2, micro_batches=(4,))
# moeh15 (2026-11-30, for a 2-GPU lease, drawn after moeh14 ran): fine-grained experts
# (64 of width 640, top-8) with a shared expert, GQA and a 100 k vocabulary, 8 k tokens a
# micro-batch of its 2 k sequences; calibrated with the ep rows re-timed, as moeh14
SETS["drawn2-3815"] = draw_layouts(3815, count=16, gpus=2, micro_batches=(4,))
# moeh16 (2026-11-30, for a 2-GPU lease, drawn after moeh15 ran): coarse top-1 experts (8 of
# width 6272) with a shared expert as wide, GQA, 8 k tokens a micro-batch of its 4 k sequences;
# calibrated with the ep rows re-timed, each layout run twice, as moeh15
SETS["drawn2-3816"] = draw_layouts(3816, count=16, gpus=2, micro_batches=(2,))
# moeh17 (2026-11-30, for a 2-GPU lease, drawn after the compiled-gradient fix): fine-grained
# experts (32 of width 1280, top-4) with GQA at 4 k sequences, 8 k tokens a micro-batch; the
# first check whose compiled ep layouts train their experts (docs/benchmarks/compiled_grads.md)
SETS["drawn2-3817"] = draw_layouts(3817, count=16, gpus=2, micro_batches=(2,))
# moeh18 (2026-12-01, one GPU): a fine-grained never-run model (64 experts of width 768,
# top-8, no shared expert) in bf16 and in fp8 (attention's linears fp8, experts bf16): does
# the cost model say when fp8 does not pay? `plans --gpu-bound 4` on the bf16 arm, the fp8
# arm at the same layouts (`plans --only`)
SETS["drawn-3818"] = draw_layouts(3818, count=8, gpus=1)
# moeh19 (2026-12-01, one GPU): moeh18's design on a model with a shared expert (16 of width
# 2816, top-4), the first three GPU-bound layouts
SETS["drawn-3822"] = draw_layouts(3822, count=8, gpus=1)
# moeh20 (2026-12-01, one GPU): moeh18's design on a never-run model with DeepSeek's
# multi-head latent attention (draw_moe.py --mla; 8 experts of 5504, top-2, + a shared one):
# the first timed check of the executor's MLA; the first four GPU-bound layouts
SETS["drawn-3823"] = draw_layouts(3823, count=8, gpus=1)
# fp8h16 (2026-12-01, one GPU): a never-run dense GPT (draw_models.py seed 4116) in bf16 and
# fp8 tensorwise, eager and compiled as drawn, priced by composition (no fp8 rows): the
# eager casts' GPU / host split checked as run; the first five predicted to fit, host-bound
# or not (`plans --gpu-bound 5 --max-host-load inf`)
SETS["drawn-4116"] = draw_layouts(4116, count=8, gpus=1)
# fp8h17 (drawn 2026-12-01, for the next lease of any size): the compiled fp8 composition
# fixed post hoc that day (full recomputation, casts inside a block) checked as run on a
# never-run model (draw_models.py seed 4117): the compiled ones of sixteen one-GPU draws
SETS["drawn-4117c"] = compiled_draws(4117, selective=True)
# fp8h18 (drawn 2026-12-01): `meshplan calibrate --fp8-rows` as a user would run it, as run on
# a never-run model (draw_models.py seed 4118): compiled fp8 priced from its own fp8 rows
SETS["drawn-4118c"] = compiled_draws(4118, selective=True)
# fp8h19 (drawn 2026-12-01, for the next lease of any size): fp8h18's path (`--fp8-rows`) on
# another never-run model (draw_models.py seed 4119), four compiled draws
SETS["drawn-4119c"] = compiled_draws(4119, selective=True)
# fp8h20 (drawn 2026-12-01, for the next lease of any size): the same path on a third
# never-run model (draw_models.py seed 4120), six compiled draws
SETS["drawn-4120c"] = compiled_draws(4120, selective=True)
# fp8h21 (drawn 2026-12-01, for the next lease of any size): the same path on a fourth
# never-run model (draw_models.py seed 4121), four compiled draws, after calibrate's steady
# CPU reading (host.md, section 6)
SETS["drawn-4121c"] = compiled_draws(4121, selective=True)
# fp8h22 (drawn 2026-12-03, one GPU): a never-run 5.52 B GPT (draw_models.py seed 4124,
# 5-6.5 B) priced from fp8h21's calibration of a 1.46 B model, rows carried 3.8x in size:
# the compiled ones of sixteen one-GPU draws, as fp8h21's set
SETS["drawn-4124c"] = compiled_draws(4124, selective=True)
# fp8h23 (drawn 2026-12-03, one GPU): a never-run 5.06 B Llama (draw_models.py seed 4125,
# 5-6.5 B; 72 thin layers) priced from the nearest same-family dense profile by the
# nearest-shape rule's own distance (fp8h18's Llama 1.71 B): fp8h22's question in depth
SETS["drawn-4125c"] = compiled_draws(4125, selective=True)
# fp8h24 / fp8h25 (drawn 2026-12-03, one GPU): a never-run 2.36 B Llama and a 2.87 B GPT
# (draw_models.py seed 4126, two models), each priced from the nearest profile of its own
# family, of the other family and from the datasheet: compiled layers without their rows
SETS["drawn-4126c"] = compiled_draws(4126, selective=True)
SETS["drawn-4127c"] = compiled_draws(4127, selective=True)
# fp8h26 (drawn 2026-12-03, one GPU): fp8h24's question on a second never-run Llama, the first
# Llama-family model of draw_models.py seed 4128's two (a 2.61 B MQA at sequence 2048)
SETS["drawn-4128c"] = compiled_draws(4128, selective=True)
# fp8h27 / fp8h28 (drawn 2026-12-03, one GPU): the H200 datasheet's compiled fp8 cast rate
# held out, on draw_models.py seed 4129's two models (a Llama 3.84 B, a GPT 2.48 B)
SETS["drawn-4129c"] = compiled_draws(4129, selective=True)
SETS["drawn-4130c"] = compiled_draws(4130, selective=True)
# fp8h29 (drawn 2026-12-03, one GPU): compiled rows derived from another recompute mode's
# compiled/eager pair, held out: the first Llama-family model of the seeds after 4130
# (draw_models.py seed 4133's first) priced from fp8h18 (no compiled recompute-none rows)
SETS["drawn-4133c"] = compiled_draws(4133, selective=True)
# fp8h30 (drawn 2026-12-03, one GPU): fp8h27's question once more, on draw_models.py seed
# 4134's first model (a Llama 1.77 B)
SETS["drawn-4134c"] = compiled_draws(4134, selective=True)
# fp8h31 (drawn 2026-12-03, one GPU): the gradient accumulation across micro-batches on a
# dense never-run model, draw_models.py seed 4135's first (a GPT 1.61 B with MQA)
SETS["drawn-4135c"] = compiled_draws(4135, selective=True)
# fp8h32 (2026-12-03): the gradient accumulation on a second dense never-run model,
# draw_models.py seed 4136's second (the first, a GPT 1.25 B at seq 1024, host-bound)
SETS["drawn-4136c"] = compiled_draws(4136, selective=True)
# fp8h33 (2026-12-03): fp8's speed-up on a third dense never-run model from its family's
# profile, draw_models.py seed 4137 (benchmarks/sets/fp8h33)
SETS["drawn-4137c"] = compiled_draws(4137, selective=True)
# fp8h34 (2026-12-03): the same on a Llama, the first Llama of draw_models.py seed 4138
# (benchmarks/sets/fp8h34)
SETS["drawn-4138c"] = compiled_draws(4138, selective=True)
# fp8h35 (2026-12-03): a calibrated attention curve at another head dim, held out
# (benchmarks/sets/fp8h35; draw_models.py seed 4139)
SETS["drawn-4139c"] = compiled_draws(4139, selective=True)
# fp8h36 / fp8h37 (2026-12-04): transferred rows extended past the source's largest timed
# micro-batch, held out on two never-run models of draw_models.py seed 4140 (a GPT from
# fp8h1's profile, a Llama from fp8h3's: benchmarks/sets/fp8h36, fp8h37)
SETS["drawn-4140c"] = compiled_draws(4140, selective=True)
# fp8h38 (2026-12-04): the extension and the compiled loss's memory share held out on a GPT
# from fp8h1's eager-output-row profile (draw_models.py seed 4141; benchmarks/sets/fp8h38)
SETS["drawn-4141c"] = compiled_draws(4141, selective=True)
# fp8h39 (2026-12-04): compiled selective recomputation priced without the earlier executor's
# rows, held out on a GPT from fp8h2's profile (draw_models.py seed 4142; benchmarks/sets/fp8h39)
SETS["drawn-4142c"] = compiled_draws(4142, selective=True)
# fp8h40 (2026-12-04): fp8h39's question and the compiled selective block's kept bytes (the
# core's output not kept) held out on a GPT from fp8h1's profile (draw_models.py seed 4144,
# the first from 4143 whose compiled draws pair none and selective at a micro-batch >= 4)
SETS["drawn-4144c"] = compiled_draws(4144, selective=True)
# fp8h41 (2026-12-04): fp8h40's questions a third time, on a GPT from fp8h1's and fp8h2's
# profiles (draw_models.py seed 4145, the next seed; benchmarks/sets/fp8h41)
SETS["drawn-4145c"] = compiled_draws(4145, selective=True)
# fp8h42 (2026-12-04): a never-run Llama priced from same-family profiles of two calibration
# generations, no change under test (draw_models.py seed 4146; benchmarks/sets/fp8h42)
SETS["drawn-4146c"] = compiled_draws(4146, selective=True)
# fp8h43 / fp8h44 (2026-12-04): the compiled casts' block share per layer family held out on
# a never-run Llama and GPT (draw_models.py seeds 4147, 4148; benchmarks/sets/fp8h43, fp8h44)
SETS["drawn-4147c"] = compiled_draws(4147, selective=True)
SETS["drawn-4148c"] = compiled_draws(4148, selective=True)
# fp8h45 (2026-12-04): the stale-pair rule (kept stale compiled selective rows as a module's
# only pair) held out on a never-run Llama (draw_models.py seed 4149; benchmarks/sets/fp8h45)
SETS["drawn-4149c"] = compiled_draws(4149, selective=True)
# fp8h46 (2026-12-04): the compiled block's re-run share under full recomputation held out
# on a never-run model priced from the other family's profiles (draw_models.py seed 4150;
# benchmarks/sets/fp8h46)
SETS["drawn-4150c"] = compiled_draws(4150, selective=True)
# fp8h47 (2026-12-04): the same, the other direction: a never-run Llama priced from GPT
# profiles (draw_models.py seed 4151; benchmarks/sets/fp8h47)
SETS["drawn-4151c"] = compiled_draws(4151, selective=True)
# fp8h48 / fp8h49 (2026-12-04): a GPT and a Llama from one calibration, each priced from
# the other's rows (compiled blocks from GPU-alone curves)
SETS["drawn-4152c"] = compiled_draws(4152, selective=True)
# fp8h50 / fp8h51 (drawn 2026-12-04 before any run): the same protocol on seed 4153's first
# GPT and first Llama (benchmarks/sets/fp8h50)
SETS["drawn-4153c"] = compiled_draws(4153, selective=True)
# fp8h52 / fp8h53 (drawn 2026-12-04 before any run): the share test again, its rule on the
# arms the share prices (benchmarks/sets/fp8h52)
SETS["drawn-4154c"] = compiled_draws(4154, selective=True)
# fp8h54h100 (2026-12-05, before any run): the compiled dense memory rule's first clean
# hold-out, a never-run Llama on one H100 (draw_models.py seed 4155; benchmarks/sets/fp8h54h100)
SETS["drawn-4155c"] = compiled_draws(4155, selective=True)
# fp8h55h100 and fp8h56h100 (2026-12-05, before any run): never-run dense models on one H100
SETS["drawn-4156c"] = compiled_draws(4156, selective=True)
SETS["drawn-4157c"] = compiled_draws(4157, selective=True)
SETS["drawn-4158c"] = compiled_draws(4158, selective=True)
# fp8h58h100 (2026-12-06, before any run): --for-plan at calibrate's default three rounds
SETS["drawn-4159c"] = compiled_draws(4159, selective=True)
# fp8h59h100 (2026-12-06, before any run): the draw's smallest hidden size (the most
# host-loaded), --for-plan calibrated twice in fresh processes
SETS["drawn-4160c"] = compiled_draws(4160, selective=True)
# fp8h60h100 (2026-12-06, before any run): the draw's smallest hidden size again, the arms
# run a second time where the budget allows (draw_models.py seed 4161;
# benchmarks/sets/fp8h60h100)
SETS["drawn-4161c"] = compiled_draws(4161, selective=True)
# fp8h61h100 (2026-12-06, before any run): the draw's smallest hidden size × its own sequence
# length (the most host-loaded), --for-plan calibrated twice in fresh processes
# (draw_models.py seed 4162; benchmarks/sets/fp8h61h100)
SETS["drawn-4162c"] = compiled_draws(4162, selective=True)
# fp8h62h100 (2026-12-06, before any run): fp8h61h100's rule (the draw's smallest hidden
# size × its own sequence length) on the next seed, --for-plan calibrated twice in fresh
# processes (draw_models.py seed 4163; benchmarks/sets/fp8h62h100)
SETS["drawn-4163c"] = compiled_draws(4163, selective=True)
# fp8h63h100 (2026-12-06, before any run): fp8h61h100's rule (the draw's smallest hidden
# size × its own sequence length) on the next seed, --for-plan calibrated twice in fresh
# processes (draw_models.py seed 4164; benchmarks/sets/fp8h63h100)
SETS["drawn-4164c"] = compiled_draws(4164, selective=True)
# fp8h64h100 (2026-12-06, before any run): fp8h61h100's rule (the draw's smallest hidden
# size × its own sequence length) on the next seed, --for-plan calibrated twice in fresh
# processes (draw_models.py seed 4165; benchmarks/sets/fp8h64h100)
SETS["drawn-4165c"] = compiled_draws(4165, selective=True)
# host22 (drawn 2026-12-01, one GPU): calibrate's steady CPU reading as run, on host-bound
# layouts of a never-run small model (draw_models.py seed 4122): the draws at the calibrated
# micro-batches 1 and 2, eager or compiled
SETS["drawn-4122s"] = [(n, lay) for n, lay in draw_layouts(4122, count=16, gpus=1)
                       if lay.micro_batch <= 2]
# host23 (drawn 2026-12-01, for the next lease of any size): the windowed steady CPU reading
# as run, on a never-run 0.24 B model (draw_models.py seed 4123) host-bound at micro-batches
# 1 and 2, eager or compiled
SETS["drawn-4123s"] = [(n, lay) for n, lay in draw_layouts(4123, count=16, gpus=1)
                       if lay.micro_batch <= 2]
# moeh21 (drawn 2026-12-01, for a 2-GPU lease): the executor's new MoE paths (etp 2, dropless
# MoE at cp 2) timed for the first time, on a never-run model (draw_moe.py seed 3824)
SETS["drawn2-3824"] = draw_layouts(3824, count=8, gpus=2, micro_batches=(4,),
                                   shapes=TWO_GPU_MOE_PATHS,
                                   subject=lambda s: s.get("etp", 1) > 1 or s.get("cp", 1) > 1)
# moeh22 (drawn 2026-12-01, one GPU): moeh20's design on another never-run MLA MoE model
# (draw_moe.py --mla seed 3825; 32 experts of 1536, top-4, + a shared one): moeh20's post-hoc
# fp8 fixes as run; the first four GPU-bound layouts
SETS["drawn-3825"] = draw_layouts(3825, count=8, gpus=1)


# moeh23 (drawn 2026-12-01, for the next lease of any size): the user's fp8 path (calibrate
# --fp8-rows rowwise) on a never-run MoE model (draw_moe.py seed 3826; 8 experts of 6400,
# top-2, seq 4096): the compiled draws without selective recompute, the first three GPU-bound
SETS["drawn-3826c"] = compiled_draws(3826)
# moeh24 (drawn 2026-12-02, for the next lease of any size): the executor's fp8 routed
# experts (rowwise) as run, from `calibrate --fp8-rows rowwise` on a never-run MoE model
# (draw_moe.py seed 3827; 8 experts of 6144, top-1, + a shared one, seq 1024): the compiled
# draws without selective recompute, the first three GPU-bound
SETS["drawn-3827c"] = compiled_draws(3827)
# moeh25 (drawn 2026-12-02, for the next lease of any size): the executor's fp8 routed experts
# with their weights cast once a step (a step of several micro-batches, or full recompute),
# priced from `calibrate --fp8-rows rowwise` on a never-run MoE model (draw_moe.py seed 3828;
# 8 experts of 6528, top-1, seq 4096): the compiled draws without selective recompute, the
# first three GPU-bound
SETS["drawn-3828c"] = compiled_draws(3828)
# moeh26 (drawn 2026-12-02, for the next lease of any size): fp8 MoE rows timed with the
# experts' weights cast beforehand (`fp8_weights_cached`) and the calibrated weight-cast rate,
# on a never-run MoE model (draw_moe.py seed 3829; 16 experts of 3328, top-4, seq 2048): the
# compiled draws without selective recompute, the first three GPU-bound
SETS["drawn-3829c"] = compiled_draws(3829)
# moeh27 (drawn 2026-12-02, one call of a 1-GPU lease): calibrate with the optimizer row timed
# at a model-sized step, plans and arms in the same call, on a never-run fine-grained MoE model
# (draw_moe.py seed 3830; 64 experts of 640, top-8, + a shared one, seq 2048): the compiled
# draws without selective recompute, the first two GPU-bound
SETS["drawn-3830c"] = compiled_draws(3830)
# moeh28 (drawn 2026-12-02, for the next lease of any size): the optimizer row at a model-sized
# step and fp8 rows grown as the composed layer grows, on a never-run MoE model (draw_moe.py
# seed 3831; 32 experts of 1280, top-8, a 152 k vocabulary, seq 2048), calibrated at the full
# budget: the compiled draws without selective recompute, the first three GPU-bound
SETS["drawn-3831c"] = compiled_draws(3831)
# moeh29 (drawn 2026-12-02): the first MoE check predicted from a profile that never timed its
# model (moeh28's: MoE rows carried to another MoE shape, costmodel/nearest_rows.py), on a
# never-run model (draw_moe.py seed 3832; 32 experts of 1536, top-4, + a shared one, seq
# 2048): the compiled draws without selective recompute, the first three GPU-bound
SETS["drawn-3832c"] = compiled_draws(3832)
# moeh30 (drawn 2026-12-02): moeh29's question again after the two fixes it found (a carried
# compiled row's weight copies, the compiled output row), on a never-run model (draw_moe.py
# seed 3833; 32 experts of 1280, top-8, + a shared one, seq 2048) priced from moeh28's
# profile: the compiled draws without selective recompute, the first three GPU-bound
SETS["drawn-3833c"] = compiled_draws(3833)
# moeh31 (drawn 2026-12-02, for the next lease of any size): an MoE model priced from a profile
# that never timed it, the other way round from moeh29/30: a coarse model (draw_moe.py seed
# 3834; 8 experts of 7040, top-2) from moeh28's fine-grained profile (32 of 1280, top-8): the
# compiled draws without selective recompute, the first three GPU-bound
SETS["drawn-3834c"] = compiled_draws(3834)
# moeh32 (drawn 2026-12-02): the next seed as drawn (draw_moe.py seed 3835; 8 experts of 6016,
# top-2, hidden 2304) priced from a profile calibrated after moeh31's run on moeh31's model
# (the permutation timed queued); four of its five compiled draws recompute in full
SETS["drawn-3835c"] = compiled_draws(3835)
# moeh33 (drawn 2026-12-02): the next seed as drawn (draw_moe.py seed 3836; 8 experts of 5120,
# top-2, seq 4096) priced from moeh31's calibration (seq 1024), no calibration of its own
SETS["drawn-3836c"] = compiled_draws(3836)
# moeh34 (drawn 2026-12-02): the first seed after 3836 whose draw is fine-grained (>= 32
# experts: draw_moe.py seed 3840; 64 experts of 640, top-8, a shared one, seq 4096) priced from
# moeh31's coarse calibration (8 experts of 7040, top-2, seq 1024), no calibration of its own
SETS["drawn-3840c"] = compiled_draws(3840)
# moeh35 (drawn 2026-12-03): the first seed after 3840 (draw_moe.py seed 3841; 16 experts of
# 2944, top-4, a shared one, seq 1024), priced from moeh31's calibration (8 experts of 7040,
# top-2) under the grouped curves keyed by the call and timed in the MoE layer
SETS["drawn-3841c"] = compiled_draws(3841)
# moeh36 (drawn 2026-12-03): the next seed (draw_moe.py seed 3842; 64 experts of 768, top-8,
# a shared one, seq 2048), priced from moeh23's calibration (8 experts of 6400, top-2, seq
# 4096) under the grouped curves keyed by the call
SETS["drawn-3842c"] = compiled_draws(3842)
# moeh37 / moeh38 (drawn 2026-12-03): the next two seeds (3843: 64 experts of 768, top-8, a
# shared one; 3844: 64 of 640, top-8; both seq 1024), priced from the profiles calibrate made
# with the small in-layer rows (moeh23's and moeh28's, sources fixed before the draw)
SETS["drawn-3843c"] = compiled_draws(3843)
SETS["drawn-3844c"] = compiled_draws(3844)
# moeh39 (drawn 2026-12-03): the next seed (3845: 64 experts of 640, top-8, seq 2048), priced
# from moeh31's coarse small-row profile (and moeh28's) under the grouped curves keyed by the call
SETS["drawn-3845c"] = compiled_draws(3845)
# moeh40 (drawn 2026-12-03): the next seed (3846: 8 experts of 5760, top-2, a shared expert,
# GQA, seq 2048), priced from one calibration of two other models (moeh28's fine-grained and
# moeh31's coarse one): the profile's nearest-shape rule picks the source
SETS["drawn-3846c"] = compiled_draws(3846)
# moeh41 (drawn 2026-12-03, one GPU): a fine-grained never-run model (64 experts of 640,
# top-8) priced from a two-model calibration timed where the stretch caveat asked
SETS["drawn-3847c"] = compiled_draws(3847)
# moeh42 (drawn 2026-12-03, one GPU): a never-run model (32 experts of 1536, top-8, a shared
# expert, GQA, seq 4096) priced from the same two-model calibration
SETS["drawn-3848c"] = compiled_draws(3848)
# moeh43 (drawn 2026-12-03, one GPU): a coarse never-run model (8 experts of 6144, top-2,
# a 100 k vocabulary) priced from the same two-model calibration
SETS["drawn-3849c"] = compiled_draws(3849)
# moeh44 / moeh45 (2026-12-03): the H200 datasheet's grouped curves held out, two never-run
# models (benchmarks/sets/moeh44, moeh45)
SETS["drawn-3850c"] = compiled_draws(3850)
SETS["drawn-3851c"] = compiled_draws(3851)
# moeh46 / moeh47 (2026-12-03): the H200 datasheet's grouped curves with its permutation rate,
# held out (benchmarks/sets/moeh46); seed 3852 skipped (printed while drawing moeh44)
SETS["drawn-3853c"] = compiled_draws(3853)
SETS["drawn-3854c"] = compiled_draws(3854)
# moeh48 (2026-12-03): the datasheet's one permutation rate on a top-8 model, held out
# (benchmarks/sets/moeh48; seed 3856, the first top-8 draw from 3855)
SETS["drawn-3856c"] = compiled_draws(3856)
# moeh49 (2026-12-03): the permutation rate by top-k at top-4, where it is interpolated
# (benchmarks/sets/moeh49; seed 3857, the next draw)
SETS["drawn-3857c"] = compiled_draws(3857)
# moeh50 (2026-12-03): the gradient accumulation across micro-batches, held out
# (benchmarks/sets/moeh50; seed 3858, the next draw)
SETS["drawn-3858c"] = compiled_draws(3858)
# moeh51 (2026-12-03): the gradient accumulation held out once more
# (benchmarks/sets/moeh51; seed 3859, the next draw)
SETS["drawn-3859c"] = compiled_draws(3859)
# moeh52 (2026-12-03): the gradient accumulation held out a third time
# (benchmarks/sets/moeh52; seed 3860, the next draw)
SETS["drawn-3860c"] = compiled_draws(3860)
# moeh53 (2026-12-04): transferred MoE rows extended past their source's largest timed
# micro-batch, held out (draw_moe.py seed 3862, from moeh40's profile; seed 3861's draw
# had no GPU-bound layout read past moeh40's sizes: benchmarks/sets/moeh53)
SETS["drawn-3862c"] = compiled_draws(3862)
# moeh54 (2026-12-04): the next draw as run, a fine-grained model with a shared expert from
# moeh40's two-model profile (draw_moe.py seed 3863; benchmarks/sets/moeh54)
SETS["drawn-3863c"] = compiled_draws(3863)
# moeh55 (2026-12-05): the next draw as run, a coarse top-1 model with a shared expert from
# moeh40's two-model profile (draw_moe.py seed 3864; benchmarks/sets/moeh55)
SETS["drawn-3864c"] = compiled_draws(3864)
# moeh56 (2026-12-05): the draw after, in the same call (draw_moe.py seed 3865;
# benchmarks/sets/moeh56): seed 3864's set left one GPU-bound layout
SETS["drawn-3865c"] = compiled_draws(3865)
# moeh57 (2026-12-05): the next draw, a fine-grained model at seq 4096 (draw_moe.py seed 3866;
# benchmarks/sets/moeh57)
SETS["drawn-3866c"] = compiled_draws(3866)
# moeh58 (2026-12-05): the next draw, a coarse top-1 model with a shared expert, priced from
# moeh40's profile and from a new calibration of moeh56's and moeh57's models (draw_moe.py
# seed 3867; benchmarks/sets/moeh58)
SETS["drawn-3867c"] = compiled_draws(3867)
# moeh59 (2026-12-05): the next draw, a fine-grained top-8 model with a shared expert, priced
# from moeh40's and moeh58's profiles (draw_moe.py seed 3868; benchmarks/sets/moeh59)
SETS["drawn-3868c"] = compiled_draws(3868)
# moeh60-62 (2026-12-05): the three draws the pre-registered untimed-shape rule is read on
# (benchmarks/sets/moe_untimed_shape_rule), priced from moeh40's and moeh58's profiles and the
# datasheet (draw_moe.py seeds 3869-3871; benchmarks/sets/moeh60, moeh61, moeh62)
SETS["drawn-3869c"] = compiled_draws(3869)
SETS["drawn-3870c"] = compiled_draws(3870)
SETS["drawn-3871c"] = compiled_draws(3871)
# moeh63h100 (2026-12-05): the next draw, run on one H100 and priced from H100 profiles only:
# holds out the H100 datasheet's compiled casts taken from the H200's (post hoc on moeh61h100)
# (draw_moe.py seed 3872; benchmarks/sets/moeh63h100)
SETS["drawn-3872c"] = compiled_draws(3872)
# moeh64h100 (2026-12-05): the first draw after it whose experts match no source's, priced
# from one H100 calibration of moeh61's and moeh63h100's models (draw_moe.py seed 3874;
# benchmarks/sets/moeh64h100)
SETS["drawn-3874c"] = compiled_draws(3874)
# moeh65h100 (2026-12-05): the next draw whose experts match no source's, from the same H100
# profile (draw_moe.py seed 3875; benchmarks/sets/moeh65h100)
SETS["drawn-3875c"] = compiled_draws(3875)
# moeh66h100 (2026-12-05, drawn before any run): the next draw, priced with the compiled
# MoE memory rule committed (draw_moe.py seed 3876; benchmarks/sets/moeh66h100)
SETS["drawn-3876c"] = compiled_draws(3876)
# moeh67h100 (2026-12-05, drawn before any run): the next draw whose experts match no
# source's (draw_moe.py seed 3878; 3877 matched moeh63h100's; benchmarks/sets/moeh67h100)
SETS["drawn-3878c"] = compiled_draws(3878)
# moeh68h100 (2026-12-05, drawn before any run): the next draw, the first priced with the
# CPU-pooling mend (draw_moe.py seed 3879; benchmarks/sets/moeh68h100)
SETS["drawn-3879c"] = compiled_draws(3879)
# moeh69h100 (2026-12-05, drawn before any run): the next draw (draw_moe.py seed 3880;
# benchmarks/sets/moeh69h100)
SETS["drawn-3880c"] = compiled_draws(3880)
# moeh70h100 (2026-12-06, drawn before any run): the next draw, the GPU-alone ratio's
# second hold-out (draw_moe.py seed 3881; benchmarks/sets/moeh70h100)
SETS["drawn-3881c"] = compiled_draws(3881)
# moeh71h100 (2026-12-06, drawn before any run): the next draw, the MoE-only fp8 residual
# trial's H100 hold-out (draw_moe.py seed 3882; benchmarks/sets/moeh71h100)
SETS["drawn-3882c"] = compiled_draws(3882)
# moeh72h100 (2026-12-06, drawn before any run): the user's order on an MoE model, plan on
# the datasheet then calibrate --for-plan (draw_moe.py seed 3883; benchmarks/sets/moeh72h100)
SETS["drawn-3883c"] = compiled_draws(3883)
# moeh73h100 (2026-12-06, drawn before any run): the user's order on an MoE model a second
# time, plan on the datasheet then calibrate --for-plan (draw_moe.py seed 3884;
# benchmarks/sets/moeh73h100)
SETS["drawn-3884c"] = compiled_draws(3884)
# moeh74h100 (2026-12-06, drawn before any run): the user's order on an MoE model a third
# time, plan on the datasheet then calibrate --for-plan (draw_moe.py seed 3885;
# benchmarks/sets/moeh74h100)
SETS["drawn-3885c"] = compiled_draws(3885)
# moeh75h100 (2026-12-06, drawn before any run): the user's order on an MoE model a fourth
# time, calibrated twice in fresh processes (draw_moe.py seed 3886; benchmarks/sets/moeh75h100)
SETS["drawn-3886c"] = compiled_draws(3886)
# moeh76h100 (2026-12-06, drawn before any run): the user's order on an MoE model a fifth
# time, calibrated twice in fresh processes (draw_moe.py seed 3887; benchmarks/sets/moeh76h100)
SETS["drawn-3887c"] = compiled_draws(3887)
# moeh77h100 (2026-12-06, drawn before any run): the user's order on an MoE model a sixth
# time, calibrated twice in fresh processes (draw_moe.py seed 3888; benchmarks/sets/moeh77h100)
SETS["drawn-3888c"] = compiled_draws(3888)
# moeh78h100 (2026-12-06, drawn before any run): the user's order on a fine-grained MoE
# draw (64 experts, top-8), calibrated twice in fresh processes (draw_moe.py seed 3889;
# benchmarks/sets/moeh78h100)
SETS["drawn-3889c"] = compiled_draws(3889)
# issue 42's expert parallelism at 8 ranks (2026-11-30, for an 8-GPU lease): a fine-grained
# never-run model (64 experts of width 896, top-8) at seq 2048, micro-batch 4 (8 k tokens)
SETS["drawn8-4242"] = draw_layouts(4242, count=16, gpus=8, micro_batches=(4,))


def _cluster(profile: str | None, gpus: int = 1, keep_stale_rows: bool = False,
             override: bool = False, gpu: str | None = None):
    """A one-node ``dgx-h200`` of ``gpus`` (``plans --gpu``: the first built-in node of that
    GPU instead, e.g. ``dgx-h100``) with ``profile`` applied (``override``: a profile of
    another device too — a CPU dry run's, ``plans --profile-override``)."""
    from meshplan.hardware_profiles import Cluster
    from meshplan.hardware_profiles.calibrated import apply_profile
    from meshplan.hardware_profiles.loader import builtin_gpu
    c = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=gpus)
    if gpu and gpu != c.gpu.name:
        # the built-in node of that GPU (its name and price), else the H200 node with it
        same = [n for n in Cluster.preset_names() if Cluster.preset(n).gpu.name == gpu]
        c = (Cluster.preset(same[0], nodes=1, gpus_per_node=gpus) if same
             else c.replace(gpu=builtin_gpu(gpu)))
    return (apply_profile(c, profile, keep_stale_rows=keep_stale_rows, override=override)
            if profile else c)


def _baseline_step_s(baseline: Path, profile: str, layout: Layout) -> float | None:
    """The baseline tree's cost model on the same layout (a subprocess: its own package)."""
    # the baseline's package is imported first, so that the helpers below (which put this
    # tree on sys.path) find it already loaded
    # (python -c puts the working directory, this tree, first on sys.path: dropped)
    code = ("import json,sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')];"
            "import meshplan.costmodel, meshplan.hardware_profiles.calibrated;"
            f"assert meshplan.__file__.startswith({str(baseline.resolve())!r}), meshplan.__file__;"
            f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r});"
            "from moe_sync_gpu import _cluster, MODEL, JOB;"
            "from meshplan.spec import Layout; from meshplan.costmodel import estimate;"
            f"lay = Layout.from_dict(json.loads({json.dumps(json.dumps(layout.to_dict()))}));"
            f"print(estimate(MODEL, _cluster({profile!r}), JOB, lay).step_time_s)")
    env = dict(os.environ, PYTHONPATH=f"{baseline.resolve()}{os.pathsep}{ROOT}")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True)
    return float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None


def _model_job(args):
    """moe-1.9b and its job, or ``--model`` with ``--seq-len`` / ``--global-batch``."""
    if not args.model:
        if args.seq_len or args.global_batch:
            raise SystemExit("--seq-len / --global-batch go with --model (moe-1.9b's job is "
                             "fixed: the 2-GPU check's per-GPU work)")
        return MODEL, JOB
    if args.baseline:
        raise SystemExit("--baseline prices moe-1.9b only: leave it out with --model")
    from meshplan.spec import ModelSpec
    if not Path(args.model).is_file():
        raise SystemExit(f"--model {args.model!r}: no such file (a ModelSpec JSON, e.g. "
                         f"benchmarks/sets/moeh1/m01.json)")
    model = ModelSpec.from_dict(json.loads(Path(args.model).read_text()))
    fp8 = getattr(args, "fp8_recipe", None)
    return model, dataclasses.replace(JOB, seq_len=args.seq_len or model.max_seq_len,
                                      global_batch=args.global_batch or JOB.global_batch,
                                      precision="fp8" if fp8 else JOB.precision,
                                      fp8_recipe=fp8 or JOB.fp8_recipe)


def _with_load_imbalance(cluster, lay: Layout, how: str | None):
    """``cluster`` with the load imbalance ρ this ep > 1 layout is priced at, and that ρ
    (None: the profile's own). ``how``: a number, or "rows": the ρ the profile's ep rows of
    this ep recorded of their own routing (``MeasuredLayer.routed_imbalance``) — the
    executor's synthetic tokens through a fresh router, which is what a check of the
    executor runs, where a user's training routes as its data does (moeh6: 1.04-1.05 as run
    against the built-in 1.25)."""
    if how is None or lay.ep == 1:
        return cluster, None
    if how == "rows":
        tables = cluster.gpu.measured
        got = [r.routed_imbalance for r in (tables.layers if tables else ())
               if r.ep == lay.ep and r.routed_imbalance > 0]
        if not got:
            return cluster, None
        rho = sum(got) / len(got)
    else:
        rho = float(how)
    g = cluster.gpu
    return cluster.replace(gpu=dataclasses.replace(g, corrections=dataclasses.replace(
        g.corrections, moe_load_imbalance=rho))), rho


def plans(args) -> int:
    from meshplan.costmodel import estimate
    from meshplan.executor.planfiles import write_plan_for_layout
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, job = _model_job(args)
    gpus = max(lay.num_gpus for _, lay in SETS[args.set])
    try:
        datasheet = _cluster(None, gpus, gpu=args.gpu)
    except MeshplanError as exc:     # a GPU name no built-in knows: one line, not a traceback
        raise SystemExit(f"--gpu: {exc}")
    calibrated = _cluster(args.profile, gpus, override=args.profile_override, gpu=args.gpu)
    preds = {"model": model.name, "job": job.to_dict(), "profile": args.profile,
             "gpu": datasheet.gpu.name,
             "written_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "layouts": {}}
    preds["set"] = args.set
    if args.model:
        preds["model_spec"] = model.to_dict()
    kept = 0
    preds["excluded"] = {}
    preds["load_imbalance"] = {}
    profiled = calibrated
    chosen = SETS[args.set]
    if args.only:
        unknown = sorted(set(args.only) - {n for n, _ in chosen})
        if unknown:
            raise SystemExit(f"--only {unknown}: not in set {args.set!r}")
        chosen = [(n, lay) for n, lay in chosen if n in args.only]
    for name, lay in chosen:
        calibrated, rho = _with_load_imbalance(profiled, lay, args.load_imbalance)
        if rho is not None:
            preds["load_imbalance"][name] = rho
        elif args.load_imbalance and lay.ep > 1:
            print(f"{name}: no ep {lay.ep} row recorded its routing; the profile's "
                  f"moe_load_imbalance prices it")
        e = estimate(model, calibrated, job, lay)
        if args.gpu_bound is not None:
            # the rule of every drawn round (draw_holdout.py --max-host-load): a layout whose
            # predicted CPU dispatch exceeds 0.75 of its GPU time is left out, the next taken
            if kept >= args.gpu_bound:
                break
            if e.host_load > args.max_host_load:
                preds["excluded"][name] = (f"predicted CPU {e.host_load:.0%} of the GPU's "
                                           f"time (> {args.max_host_load:.0%})")
                print(name, "excluded:", preds["excluded"][name])
                continue
            if not e.fits:
                preds["excluded"][name] = (f"predicted not to fit "
                                           f"({e.memory_peak_bytes / 2**30:.1f} GiB)")
                print(name, "excluded:", preds["excluded"][name])
                continue
            kept += 1
        write_plan_for_layout(out / f"{name}.json", model, job, lay, calibrated)
        # the same profile without its measured rows: how this tree's MoE layers were
        # priced before the MoE rows (analytical layer, the profile's MoE keys)
        curves = calibrated.replace(gpu=dataclasses.replace(calibrated.gpu, measured=None))
        ce = estimate(model, curves, job, lay)
        preds["layouts"][name] = {
            "short": lay.short(), "calibrated_s": e.step_time_s,
            "curves_s": ce.step_time_s, "curves_memory_gib": ce.memory_peak_bytes / 2**30,
            "caveats": list(e.caveats),
            "datasheet_s": estimate(model, datasheet, job, lay).step_time_s,
            "baseline_calibrated_s": (_baseline_step_s(Path(args.baseline), args.profile, lay)
                                      if args.baseline else None),
            "memory_gib": e.memory_peak_bytes / 2**30, "host_load": e.host_load}
        print(name, json.dumps(preds["layouts"][name]))
    if args.gpu_bound is not None and kept < args.gpu_bound:
        print(f"only {kept} of the set's layouts passed (--gpu-bound {args.gpu_bound})")
    (out / "predictions.json").write_text(json.dumps(preds, indent=1) + "\n")
    return 0


def _run_one(plan: Path, tree: Path, res: Path, log: Path, timeout_s: float,
             profile_dir: Path | None, device: str = "cuda",
             allow_gpu_mismatch: bool = False) -> dict:
    """The executor on ``plan`` (its layout's GPUs, 3 warm-up + 6 timed steps) from source
    ``tree``: status, step, peak memory and rank 0's per-phase times, host step and probe.
    ``device`` "cpu": as many gloo ranks instead (a dry run of the script, no timing)."""
    from meshplan.calibrate.validate import collective_timeout_s
    from meshplan.calibrate.validate_records import read_measurement
    from meshplan.executor.gpu_busy import wait_for_idle_gpus
    from meshplan.planner.planfile import load_plan_file
    gpus = load_plan_file(plan).layout.num_gpus
    # a run beside another process measures it too
    busy = wait_for_idle_gpus() if device == "cuda" else []
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()), NCCL_NVLS_ENABLE="0")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={gpus}",
           "-m", "meshplan.executor.run", "--plan", str(plan), "--out", str(res),
           "--steps", "6", "--warmup", "3", "--force", "--device", device,
           "--timeout-s", f"{collective_timeout_s(timeout_s):g}"]
    if profile_dir is not None:
        cmd += ["--profile", str(profile_dir)]
    if allow_gpu_mismatch:      # plans made for one GPU type, run on another (moeh61h100)
        cmd.append("--allow-gpu-mismatch")
    t0 = time.time()
    with open(log, "w") as fh:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    doc = json.loads(res.read_text()) if res.exists() else {}
    try:
        meas = read_measurement(doc, gpus)
    except ValueError:      # no results, or no timed step
        meas = {}

    def rank0(key):
        return (meas.get(key) or [None])[0]
    return {"rc": rc, "wall_s": time.time() - t0, "status": doc.get("status", "failed"),
            "step_time_s": meas.get("step_time_s"),
            "memory_peak_bytes": meas.get("memory_peak_bytes"),
            "phases": rank0("phase_median_ms_per_rank"),
            "host_step_s": rank0("host_step_median_s_per_rank"),
            "host_probe_us": rank0("host_probe_us_per_rank"),
            # ρ as run (eager ep > 1): against the profile's assumed moe_load_imbalance
            "moe_routing": (doc.get("measured") or {}).get("moe_routing"),
            "gpu_busy_at_start": busy}


def run(args) -> int:
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    trees = {"baseline": Path(args.baseline), "current": ROOT} if args.baseline else \
        {"current": ROOT}
    preds = json.loads((Path(args.plans) / "predictions.json").read_text())
    names = list(preds["layouts"])
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            raise SystemExit(f"--only {unknown}: not among the plans' layouts {names}")
        names = [n for n in names if n in args.only]
    import torch
    results = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
               "torch": torch.__version__, "predictions": preds, "runs": {}}
    deadline = time.time() + args.budget
    passes = [(name, arm, tree, arm) for name in names for arm, tree in trees.items()]
    if args.second_pass:    # each layout once more in a fresh process, in the budget left
        passes += [(name, "current", ROOT, SECOND_RUN) for name in names]
    for name, arm, tree, tag in passes:
        key = f"{name}/{tag}"
        # a second run starts only if it ends within the budget, as long as its first took
        first = results["runs"].get(f"{name}/current", {}).get("wall_s", 0.0)
        if time.time() + (1.2 * first if tag == SECOND_RUN else 0.0) >= deadline:
            results["runs"][key] = {"status": "skipped: budget"}
        else:
            r = _run_one(Path(args.plans) / f"{name}.json", tree, work / f"{name}_{tag}.json",
                         work / f"{name}_{tag}.log", args.timeout, None, args.device,
                         args.allow_gpu_mismatch)
            results["runs"][key] = r
            print(key, json.dumps({k: r[k] for k in ("status", "step_time_s", "wall_s")}),
                  flush=True)
        (out / "moe_sync.json").write_text(json.dumps(results, indent=1) + "\n")
    if args.trace is not None and time.time() + 60 < deadline:
        for arm, tree in trees.items():
            _run_one(Path(args.plans) / f"{args.trace or names[0]}.json", tree,
                     work / f"trace_{arm}.json", work / f"trace_{arm}.log", args.timeout,
                     work / f"trace_{arm}", args.device, args.allow_gpu_mismatch)
            top = work / f"trace_{arm}" / "top_ops_rank0.txt"
            if top.exists():
                (out / f"top_ops_{arm}.txt").write_text(top.read_text())
    subprocess.run(["tar", "czf", str(out / "logs.tgz"), "-C", str(work.parent), work.name],
                   check=False)
    print(table(results))
    return 0


def error_summary(results: dict) -> list[str]:
    """Each layout's step-time error against its first run, its second (``--second-pass``)
    and the mean of the two, as mean / max absolute error over the layouts that ran so. A
    layout run twice in fresh processes moved 3-10 % (moeh14): the mean of two is the
    steadier figure, the first run the one earlier checks report."""
    preds = results["predictions"]["layouts"]
    errs: dict[str, list[float]] = {"first run": [], "second run": [], "mean of both runs": []}
    for name, p in preds.items():
        steps = [results["runs"].get(f"{name}/{tag}", {}).get("step_time_s")
                 for tag in ("current", SECOND_RUN)]
        for label, step in (("first run", steps[0]), ("second run", steps[1]),
                            ("mean of both runs", sum(steps) / 2 if all(steps) else None)):
            if step:
                errs[label].append(abs(p["calibrated_s"] / step - 1))
    busy = sorted(k for k, r in results["runs"].items() if r.get("gpu_busy_at_start"))
    return [_error_line(label, v) for label, v in errs.items() if v] + (
        [f"started with another process still on the GPUs (counted above; their times "
         f"include it): {', '.join(busy)}"] if busy else [])


def _error_line(label: str, errors: list[float]) -> str:
    """``label: mean M %, max X % (N layouts)`` of absolute relative errors."""
    return (f"{label}: mean {100 * sum(errors) / len(errors):.1f} %, "
            f"max {100 * max(errors):.1f} % ({len(errors)} layouts)")


def table(results: dict) -> str:
    preds = results["predictions"]["layouts"]
    second = any(k.endswith(f"/{SECOND_RUN}") for k in results["runs"])
    rows = ["| layout | baseline s (pred.) | current s (pred.) | speed-up | current error | "
            "curves s (error) | datasheet s | peak GiB (pred.) | ρ as run |"
            + (" second run s (error) |" if second else ""),
            "|---|---|---|---|---|---|---|---|---|" + ("---|" if second else "")]
    for name, p in preds.items():
        b = results["runs"].get(f"{name}/baseline", {})
        c = results["runs"].get(f"{name}/current", {})
        bs, cs = b.get("step_time_s"), c.get("step_time_s")

        def f(x):
            return "—" if x is None else f"{x:.3f}"
        err = f"{(p['calibrated_s'] / cs - 1) * 100:+.1f} %" if cs else "—"
        cv = p.get("curves_s")
        curves = ("—" if cv is None else f"{cv:.3f}" + (
            f" ({(cv / cs - 1) * 100:+.1f} %)" if cs else ""))
        mem = (f"{c['memory_peak_bytes'] / 2**30:.1f} ({p['memory_gib']:.1f})"
               if c.get("memory_peak_bytes") else f"— ({p['memory_gib']:.1f})")
        rows.append(f"| {name} `{p['short']}` | {f(bs)} ({f(p.get('baseline_calibrated_s'))}) | "
                    f"{f(cs)} ({f(p['calibrated_s'])}) | "
                    f"{(bs / cs if bs and cs else float('nan')):.3f} | {err} | "
                    f"{curves} | {f(p['datasheet_s'])} | {mem} | "
                    f"{f((c.get('moe_routing') or {}).get('busiest_over_mean'))} |"
                    + (f" {_second_cell(results, name, p['calibrated_s'])} |" if second else ""))
    return "\n".join(rows + [""] + error_summary(results))


def _second_cell(results: dict, name: str, predicted_s: float) -> str:
    step = results["runs"].get(f"{name}/{SECOND_RUN}", {}).get("step_time_s")
    return "—" if not step else f"{step:.3f} ({(predicted_s / step - 1) * 100:+.1f} %)"


def _peak_cell(measured_bytes: float | None, predicted_gib: float) -> str:
    if not measured_bytes:
        return f"— ({predicted_gib:.1f})"
    meas = measured_bytes / 2 ** 30
    return f"{meas:.1f} ({predicted_gib:.1f}, {(predicted_gib / meas - 1) * 100:+.1f} %)"


def repredict(args) -> int:
    """POST HOC: each run layout of a results file priced by today's cost model on the
    profile its plans were made from, beside the prediction fixed before the run and the
    measurement (nothing fitted: the cost model and the committed profile as they are)."""
    from meshplan.costmodel import estimate
    from meshplan.spec import ModelSpec
    results = json.loads(Path(args.results).read_text())
    if args.arm:      # a check's data file holding each arm's results under its name
        if args.arm not in results:
            raise SystemExit(f"--arm {args.arm!r}: not in {args.results} (it holds "
                             f"{sorted(k for k, v in results.items() if isinstance(v, dict))})")
        results = results[args.arm]
    preds = dict(results["predictions"])
    if args.profile:       # a later calibration of the same machine kind (e.g. with ep rows)
        if not Path(args.profile).is_file():
            raise SystemExit(f"--profile {args.profile!r}: no such file")
        preds["profile"] = args.profile
    if not preds.get("profile"):
        raise SystemExit(f"{args.results}: its predictions name no profile to re-predict on")
    if args.ep_reading:
        if not args.readings or not Path(args.readings).is_file():
            raise SystemExit(f"--ep-reading {args.ep_reading} needs --readings, a file of the "
                             f"calibration's readings (its profile, or a "
                             f"moe_ep_rows_reread_*.json); got {args.readings!r}")
        scratch = tempfile.TemporaryDirectory()     # removed when repredict returns
        preds["profile"] = str(profile_at_reading(
            Path(preds["profile"]), calibration_readings(Path(args.readings)),
            args.ep_reading, Path(scratch.name) / "profile.toml"))
    model = (ModelSpec.from_dict(preds["model_spec"]) if preds.get("model_spec") else MODEL)
    job = Job.from_dict(preds["job"])
    layouts = dict(SETS[preds["set"]])
    cluster = _cluster(preds["profile"], max(lay.num_gpus for lay in layouts.values()),
                       keep_stale_rows=args.rows_as_timed, gpu=preds.get("gpu"))
    if args.sustained_from:
        from fp8_repredict import with_sustained_from
        try:
            cluster = with_sustained_from(cluster, args.sustained_from)
        except MeshplanError as exc:
            raise SystemExit(f"--sustained-from {args.sustained_from!r}: {exc}") from None
    rows = ["| layout | step s | as run s (error) | today s (error) | today host s / measured "
            "| peak GiB (today's prediction) |", "|---|---|---|---|---|---|"]
    errs: dict[str, list[float]] = {"as run": [], "today": []}
    for name, p in preds["layouts"].items():
        run = results["runs"].get(f"{name}/current", {})
        meas = run.get("step_time_s")
        if not meas:
            continue
        priced, _ = _with_load_imbalance(cluster, layouts[name], args.load_imbalance)
        e = estimate(model, priced, job, layouts[name])
        errs["as run"].append(abs(p["calibrated_s"] / meas - 1))
        errs["today"].append(abs(e.step_time_s / meas - 1))
        host = run.get("host_step_s")
        rows.append(f"| `{name}` | {meas:.3f} | {p['calibrated_s']:.3f} "
                    f"({(p['calibrated_s'] / meas - 1) * 100:+.1f} %) | {e.step_time_s:.3f} "
                    f"({(e.step_time_s / meas - 1) * 100:+.1f} %) | {e.host_dispatch_s:.3f} / "
                    + ("—" if host is None else f"{host:.3f}") + " | "
                    + _peak_cell(run.get("memory_peak_bytes"), e.memory_peak_gib) + " |")
    for k, v in errs.items():
        if v:
            rows.append("\n" + _error_line(k, v))
    print("\n".join(rows))
    return 0


_READING_KEY = re.compile(r"^(?:zero(\d) dp(\d+) )?tp(\d+)( sp)? ep(\d+) rc=(\w+) "
                          r"mb(\d+)( compiled)?$")


def calibration_readings(path: Path) -> dict[str, list[tuple[float, float]]]:
    """Every reading the calibration took of each row it read more than once, as (forward_s,
    backward_s) per layer in order, keyed as its progress names the row: from a profile's
    ``[provenance.synced_readings]`` (calibrations since moeh15) or, for earlier checks, a
    ``moe_ep_rows_reread_*.json`` of readings taken from the calibration's log."""
    import tomllib
    if path.suffix == ".toml":
        got = tomllib.loads(path.read_text()).get("provenance", {}).get("synced_readings")
        if not got:
            raise SystemExit(f"{path}: its provenance holds no synced_readings (a "
                             f"calibration that read no row more than once)")
        return {k: [(f, b) for f, b in v] for k, v in got.items()}
    try:
        doc = json.loads(path.read_text())
        return {k: [(r["forward_ms"] / 1e3, r["backward_ms"] / 1e3) for r in v]
                for k, v in doc["readings"]["calibration"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SystemExit(f"{path}: not a profile (.toml) nor a readings file with "
                         f"readings.calibration.<row>: [{{forward_ms, backward_ms}}, ...] "
                         f"({type(exc).__name__}: {exc})") from None


def profile_at_reading(profile: Path, readings: dict, which: str, out: Path) -> Path:
    """POST HOC: ``profile`` with each ep > 1 row's forward and backward set to one of the
    calibration's readings of it (:func:`calibration_readings`; keyed as the calibration's
    progress names a row, e.g. ``layer M s2048 zero2 dp2 tp1 ep2 rc=none mb4 compiled``, the
    ``layer M sS`` part optional): ``first`` (what a calibration of one round keeps),
    ``last`` or ``median`` (each phase's, as the profile keeps it), written to ``out``. A row
    without readings, and a reading of a row that is not an ep row, are left as they are."""
    import statistics
    import tomllib

    from meshplan.calibrate.tomlfile import dumps, write_text_atomic
    from meshplan.hardware_profiles.calibrated import load_profile
    pick = {"first": lambda v: v[0], "last": lambda v: v[-1], "median": statistics.median}[which]
    by_key = {}
    for key, reads in readings.items():
        m = _READING_KEY.match(re.sub(r"^layer \S+ s\d+ ", "", key))
        if m is None:       # not an ep row (a capacity-factor row at ep 1, an fp8 row)
            continue
        z, dp, tp, sp, ep, rc, mb, comp = m.groups()
        by_key[(int(z or 0), int(dp or 1), int(tp), bool(sp), int(ep), rc, int(mb),
                bool(comp))] = (pick([f for f, _ in reads]), pick([b for _, b in reads]))
    doc = tomllib.loads(profile.read_text())
    for row in doc.get("layers", []):
        key = (row.get("zero", 0), row.get("dp", 1), row["tp"], row["sequence_parallel"],
               row.get("ep", 1), row["recompute"], row["micro_batch"], row.get("compile", False))
        if key in by_key:
            row["forward_s"], row["backward_s"] = by_key[key]
    write_text_atomic(out, dumps(doc))
    load_profile(out)
    return out


def _load_imbalance(text: str) -> str:
    """--load-imbalance's value: "rows", or a number >= 1."""
    try:
        ok = text == "rows" or float(text) >= 1.0
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a number >= 1 (the busiest expert rank's routed rows over the mean) "
            f"or 'rows'")
    return text


def _add_load_imbalance(parser) -> None:
    parser.add_argument("--load-imbalance", default=None, type=_load_imbalance,
                        metavar="RHO|rows",
                        help="price ep > 1 layouts at this load imbalance (e.g. the ρ runs "
                             "recorded), or at the one the profile's ep rows recorded of "
                             "their own routing ('rows': the executor's synthetic routing); "
                             "default the profile's")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("plans")
    a.add_argument("--out", required=True)
    a.add_argument("--profile", required=True)
    a.add_argument("--profile-override", action="store_true",
                   help="price from a profile of another device (a CPU dry run's)")
    a.add_argument("--baseline", default=None)
    a.add_argument("--set", default="sync", choices=sorted(SETS))
    a.add_argument("--gpu", default=None, metavar="NAME",
                   help="a built-in GPU instead of the H200 (e.g. H100-SXM5-80GB: moeh64h100)")
    a.add_argument("--model", default=None, help="a ModelSpec JSON instead of moe-1.9b")
    a.add_argument("--seq-len", type=int, default=None, help="with --model: default its own")
    a.add_argument("--global-batch", type=int, default=None,
                   help=f"with --model: default {JOB.global_batch}")
    a.add_argument("--fp8-recipe", default=None, choices=("tensorwise", "rowwise"),
                   help="with --model: the plans train in fp8 with this recipe (attention's "
                        "and shared experts' linears; the routed experts stay bf16)")
    _add_load_imbalance(a)
    a.add_argument("--only", nargs="+", default=None, metavar="LAYOUT",
                   help="write these layouts of the set only (e.g. another arm's picks)")
    a.add_argument("--gpu-bound", type=int, default=None, metavar="N",
                   help="keep the first N layouts of the set the profile predicts GPU-bound "
                        "and fitting (the others recorded as excluded, with the reason)")
    a.add_argument("--max-host-load", type=float, default=MAX_HOST_LOAD, metavar="X",
                   help=f"with --gpu-bound: the predicted CPU / GPU share above which a "
                        f"layout is passed over (default {MAX_HOST_LOAD}; inf: the first N "
                        f"predicted to fit, host-bound or not)")
    b = sub.add_parser("run")
    b.add_argument("--plans", required=True)
    b.add_argument("--baseline", default=None, help="a baseline tree to run beside this one")
    b.add_argument("--out", required=True)
    b.add_argument("--work", default="/tmp/moe_sync/runs")
    b.add_argument("--budget", type=float, default=420.0)
    b.add_argument("--allow-gpu-mismatch", action="store_true",
                   help="run plans made for another GPU type (the results record this one's)")
    b.add_argument("--timeout", type=float, default=120.0)
    b.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: the plans on as many gloo ranks (a dry run of the script)")
    b.add_argument("--only", nargs="+", default=None, metavar="LAYOUT",
                   help="run only these layouts of the plans (default all)")
    b.add_argument("--second-pass", action="store_true",
                   help="after every layout ran, run each once more in a fresh process while "
                        "the budget lasts (results key LAYOUT/current2; the table adds the "
                        "error against each run and against their mean)")
    b.add_argument("--trace", nargs="?", const="", default=None, metavar="LAYOUT",
                   help="also trace one run of LAYOUT (default the first) per tree")
    c = sub.add_parser("table")
    c.add_argument("--results", required=True)
    d = sub.add_parser("repredict", help="POST HOC: today's cost model on the run's profile")
    d.add_argument("--results", required=True)
    d.add_argument("--profile", default=None,
                   help="re-predict on this profile instead of the one the plans were made on")
    d.add_argument("--readings", default=None, metavar="FILE",
                   help="the calibration's readings of the ep rows: its profile (their "
                        "provenance, calibrations since moeh15) or a "
                        "moe_ep_rows_reread_*.json")
    d.add_argument("--ep-reading", default=None, choices=("first", "median", "last"),
                   help="with --readings: each ep row at this reading of it (first: what a "
                        "one-round calibration keeps)")
    d.add_argument("--arm", default=None, metavar="NAME",
                   help="the results of this arm of a check's data file (e.g. bf16 in "
                        "docs/benchmarks/data/fp8_h200x1_fp8h19_20261201.json)")
    d.add_argument("--rows-as-timed", action="store_true",
                   help="read every row the profile holds, those of an executor since changed "
                        "too (a check run by that executor, re-predicted as it ran: "
                        "meshplan/hardware_profiles/stale_rows.py)")
    d.add_argument("--sustained-from", default=None, metavar="PROFILE",
                   help="rows carrying no sustained-clock ratio (1) take this profile's "
                        "ratio for the same module, where it has one")
    _add_load_imbalance(d)
    args = p.parse_args(argv)
    if args.cmd == "plans" and args.gpu_bound is not None and args.gpu_bound < 1:
        p.error(f"--gpu-bound {args.gpu_bound}: the number of layouts to keep, at least 1")
    if args.cmd == "plans":
        return plans(args)
    if args.cmd == "run":
        return run(args)
    if args.cmd == "repredict":
        return repredict(args)
    print(table(json.loads(Path(args.results).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
