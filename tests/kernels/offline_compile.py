"""Offline sm_90 builds for the compile-only tests (no GPU needed): run one of the kernel package's
compile modules in a fresh process, without the interpreter, and read the summary it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def offline_summary(module: str, out: Path) -> dict:
    """`python -m <module> <out>` without TRITON_INTERPRET (the kernels compile for sm_90); its
    out/summary.json. Fails the calling test with the build's output when the build fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", module, str(out)], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, f"sm_90 compile ({module}) failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads((out / "summary.json").read_text())
