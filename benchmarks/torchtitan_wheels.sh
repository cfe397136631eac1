#!/usr/bin/env bash
# Fetch (on a machine with PyPI) the wheels benchmarks/torchtitan_device.sh installs on the
# device, which has no package index: torchtitan 0.2.2 and what it imports that the device
# image lacks (tyro with docstring-parser, typeguard and typing-extensions; torchdata). Pinned
# to the versions checked on CPU; 0.8 MiB in all. The folder is ignored by git and travels with
# the device call's `carry`.
#   bash benchmarks/torchtitan_wheels.sh [DIR]     # default .titan_carry/wheels
set -eu
DIR=${1:-.titan_carry/wheels}
mkdir -p "$DIR"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$DIR" torchtitan==0.2.2 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 \
  typing-extensions==4.16.0 torchdata==0.11.0
ls -l "$DIR"
du -sh "$DIR"
