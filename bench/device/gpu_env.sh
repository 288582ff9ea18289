# Sourced (from the repository root) by the scripts run on the H200 through the device tool:
# installs the carried wheels the image lacks (.whl/, from bench/device/gpu_service_wheels.sh) into
# /tmp/site when they are there, and makes litetopk importable without installing it: a folder of
# links under the CONTRACT.md §6 import names. `require_wheels` fails when the wheels are missing.
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
fi
require_wheels() { [ -d /tmp/site ] || { echo "carry .whl (bash bench/device/gpu_service_wheels.sh first)" >&2; exit 1; }; }
mkdir -p /tmp/ltk/litetopk
for part in kernels service clients; do ln -sfn "$PWD/$part" "/tmp/ltk/litetopk/$part"; done
export PYTHONPATH="/tmp/ltk:/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
