"""Security scenarios against real service processes (issue 16): shutdown paths, socket directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import ServiceProcess


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_every_socket_file_is_removed_on_shutdown(tmp_path, sig):
    process = ServiceProcess(tmp_path, warmup=False)
    directory = Path(process.uds).parent
    assert {p.name for p in directory.iterdir()} == {"litetopk.sock", "fds.sock", "token"}
    assert (directory / "token").stat().st_mode & 0o777 == 0o600
    process.process.send_signal(sig)
    process.stop()
    assert list(directory.iterdir()) == [], f"{sig.name} left {list(directory.iterdir())} behind"


def test_symlinked_socket_directory_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    (tmp_path / "sock").symlink_to(target)
    result = subprocess.run([sys.executable, "-m", "litetopk.service", "--device", "cpu", "--port", "0",
                             "--uds", str(tmp_path / "sock" / "litetopk.sock"), "--no-warmup"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "symbolic link" in result.stderr, result.stderr[-2000:]
    assert target.stat().st_mode & 0o777 == 0o755, "the link's target was not chmodded"
    assert os.listdir(target) == []
