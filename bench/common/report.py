"""What a benchmark's JSON says about its run: the command line, the card, versions, and which code ran.

`run_info(device)`: the card's name and properties (or the CPU's model), torch / triton / Python
versions, and the code: the LITETOPK_COMMIT environment variable where it is set (device calls run on a
copy of the working tree whose .git, where one travels, can name an older commit: pass the commit there),
else the git commit (with `dirty` when the tracked files differ from it), and always `source_sha256`, a
digest of every .py file under kernels/ and bench/ (the same digest, the same code, with or without git).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys

import torch

from bench.common import REPO_ROOT


def _git(*argv: str) -> str | None:
    try:
        done = subprocess.run(["git", *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_sha256() -> str:
    digest = hashlib.sha256()
    for folder in ("kernels", "bench"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def card(device: torch.device) -> dict:
    """{"name", ...}: the GPU's name, memory, SMs and L2, or the CPU's model and core count."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return dict(
            name=props.name,
            total_memory=props.total_memory,
            sms=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
            capability=f"{props.major}.{props.minor}",
        )
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return dict(name=name, cores=os.cpu_count())


def run_info(device: torch.device, argv: list[str], module: str) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    given = os.environ.get("LITETOPK_COMMIT")
    commit = None if given else _git("rev-parse", "HEAD")
    dirty = None if commit is None else bool(_git("status", "--porcelain", "--untracked-files=no"))
    return dict(
        command=f"python -m {module} " + " ".join(argv),
        card=card(device),
        device=str(device),
        torch=torch.__version__,
        triton=triton_version,
        python=sys.version.split()[0],
        commit=given or commit,
        dirty=dirty,
        commit_from="LITETOPK_COMMIT" if given else ("git" if commit else None),
        source_sha256=source_sha256(),
    )
