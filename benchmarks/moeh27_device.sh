#!/bin/bash
# moeh27 in one call of a 1-GPU lease (benchmarks/sets/moeh27/README.md): calibrate
# (--time-budget 270), then the plans (every prediction written, and tarred into $OUT, before
# any arm runs), then the arms in drawn order, bf16 then fp8, each layout's pair tarred into
# $OUT as soon as it ran: benchmarks/moe1gpu_device.sh with PART=all.
#   PYTHONPATH=. bash benchmarks/moeh27_device.sh          # on the device, ~8 minutes
CHECK=moeh27 SEED=3830 MBS=2,4 GPU_BOUND=2 PART=all BUDGET=270 \
    exec bash "$(dirname "$0")/moe1gpu_device.sh"
