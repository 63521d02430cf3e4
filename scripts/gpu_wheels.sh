#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh needs beyond a GPU machine's image (Python 3.12, x86-64 Linux), into .whl/, which
# git ignores and the device tool carries (carry: [".whl"]); nothing there can reach a registry. The image already
# has torch, numpy, msgpack, pyyaml, tensorboard, transformers, tokenizers, safetensors, opencv and pytest. The
# versions are the ones this project's tests run with.
#
#   scripts/gpu_wheels.sh [DEST]      (DEST: .whl)
set -euo pipefail
DEST=${1:-.whl}
mkdir -p "$DEST"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" \
    gymnasium==1.4.0 farama-notifications==0.0.6 ale-py==0.12.1 pyzmq==27.3.0
ls -l "$DEST"
