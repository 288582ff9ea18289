#!/usr/bin/env bash
# Download (here, where pip reaches the package index) the wheels the service needs that the H200
# image lacks, into .whl/ at the repository root. Carry `.whl` to the device machine; there,
# bench/device/gpu_service_check.sh installs them with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
# Pins match pyproject.toml; the H200 image already has torch, triton, httpx, anyio, h11, click,
# prometheus-client, rich, numpy, matplotlib (see /work/.library/device/KINDS.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || grep -qx '/.whl/' .gitignore || echo /.whl/ >> .git/info/exclude
PY="${PYTHON:-python3}"
WHEELS=(
  fastapi==0.163.2 starlette==1.10.0 annotated-doc==0.0.7
  pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0 pydantic-settings==2.16.3 python-dotenv==1.2.4
  uvicorn==0.54.0 httptools==0.8.0 uvloop==0.22.1 opentelemetry-api==1.45.2 msgspec==0.19.0
)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
ls -l .whl
du -sh .whl
