#!/usr/bin/env bash
# Download (here) the FlashInfer wheels of H200-NOTES.md into .whl/flashinfer/ (git-ignored with
# .whl/); carry `.whl` and run bench/device/gpu_flashinfer.sh on the H200, which installs them --no-deps.
set -euo pipefail
cd "$(dirname "$0")/../.."
"${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d .whl/flashinfer flashinfer-python==0.6.18 apache-tvm-ffi==0.1.15
ls -l .whl/flashinfer
