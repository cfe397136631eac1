#!/usr/bin/env bash
# cp44's one two-GPU call as run (docs/benchmarks/cp_checks.md "cp44"): benchmarks/cp_set_device.sh
# on benchmarks/sets/cp44.
CPSET=cp44 exec bash "$(dirname "$0")/cp_set_device.sh"
