# The litetopk service image. `docker compose up` (compose.yaml) builds it; README "## Deployment".
#
# One recipe, not a second one: the builder runs the README's `make env` (the Makefile's venv and
# pip install line, with the runtime-only EXTRAS instead of the default `dev`) and the image's CMD
# is what `make run` runs (tests/deploy checks both). Only the base image, the torch build and the
# extras differ by target, through build arguments:
#
#   target  BASE                                  TORCH_INDEX_URL                            EXTRAS          RUNTIME_PACKAGES
#   cpu     python:3.12-slim                      https://download.pytorch.org/whl/cpu       service         (none)
#   cuda    nvidia/cuda:13.0.1-base-ubuntu24.04   https://download.pytorch.org/whl/cu130     service,triton  gcc libc6-dev python3-dev
#   rocm    rocm/dev-ubuntu-24.04:7.0             https://download.pytorch.org/whl/rocm7.0   service,flydsl  gcc libc6-dev python3-dev
#
# EXTRAS are pyproject.toml extras: `service` is the service alone (no test tools, no GPU
# packages); a GPU target adds its backend's extra (Triton on NVIDIA, FlyDSL on AMD gfx950).
# Triton itself is a core dependency (the pipeline's stage files import it), so every image has it:
# the CPU image only imports it (the reference backend runs there, nothing is compiled), and the
# cuda target's `triton` extra names its backend with the same pin.
# TORCH_INDEX_URL is given to pip as an extra index, so the pinned `torch==X` of pyproject.toml
# resolves to that index's build (X+cpu, X+cu130, X+rocm7.0); pick the index of the CUDA / ROCm
# release the pinned torch is built for and a base (and host driver) no older than it. The cuda
# base is the small `-base-` flavour: the torch wheel brings its own CUDA libraries, the host's
# driver comes in through the NVIDIA container toolkit. RUNTIME_PACKAGES are Debian/Ubuntu
# packages added to the runtime stage: Triton (cuda) and FlyDSL's build (rocm) compile small
# launchers with the system C compiler against Python's headers on first use. A base without
# Python gets the distribution's python3 in both stages (the venv points at it).

ARG BASE=python:3.12-slim

# ---------------------------------------------------------------------------------------- builder
FROM ${BASE} AS builder
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG EXTRAS=service
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_EXTRA_INDEX_URL=${TORCH_INDEX_URL} \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN packages="make" \
 && { python3 -c "import ensurepip" 2>/dev/null || packages="$packages python3 python3-venv"; } \
 && apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends $packages \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/litetopk
COPY . .
RUN make env EXTRAS=${EXTRAS}

# ---------------------------------------------------------------------------------------- runtime
FROM ${BASE} AS runtime
ARG RUNTIME_PACKAGES=""
ARG UID=10001
ENV DEBIAN_FRONTEND=noninteractive
RUN packages="$RUNTIME_PACKAGES" \
 && { command -v python3 >/dev/null || packages="$packages python3"; } \
 && if [ -n "$packages" ]; then \
      apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && useradd --system --uid "$UID" --user-group --create-home --home-dir /home/litetopk \
      --shell /usr/sbin/nologin litetopk \
 && install -d -o litetopk -g litetopk -m 0700 /run/litetopk
# Source and venv stay root-owned (read-only to the service); `make env` installed the package
# in editable mode, so the tree keeps the path it was built at.
COPY --from=builder /opt/litetopk /opt/litetopk
WORKDIR /opt/litetopk
# The Unix socket lives in /run/litetopk (0700, owned by the service user): compose mounts a named
# volume there that worker containers mount too. TCP stays on the container's 127.0.0.1 unless
# LITETOPK_HOST says otherwise (compose says 0.0.0.0 and publishes the port on the host's 127.0.0.1).
ENV LITETOPK_UDS=/run/litetopk/litetopk.sock \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER litetopk
EXPOSE 8471
# The service's own probe: it reads the service's settings (LITETOPK_UDS, LITETOPK_HOST,
# LITETOPK_PORT, flags) and asks /livez over the Unix socket when there is one (the path workers
# use), else over TCP on loopback; exit 0 or 1, without loading torch (README "### Settings").
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
  CMD ["/opt/litetopk/.venv/bin/python", "-m", "litetopk.service", "--check", "livez"]
CMD ["/opt/litetopk/.venv/bin/python", "-m", "litetopk.service"]
