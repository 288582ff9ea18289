"""A real `python -m litetopk.service` process for tests: free TCP port, private Unix socket.

`ServiceProcess(tmp_dir, **settings)` starts the service with `--port 0` (the port it bound is
read from its start line in the log), waits until /livez answers (and /readyz, unless told not
to), and `stop()` sends SIGTERM (graceful shutdown), then SIGKILL only if it hangs. Every fixture
that starts one stops it. `token` is the TCP bearer token the service wrote beside its socket;
`auth` the header that carries it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

LISTENING = re.compile(r"litetopk listening on (http://\S+)")


class ServiceProcess:
    def __init__(self, directory: str | os.PathLike, *, wait_ready: bool = True, **settings):
        self.directory = Path(directory)
        self.uds = str(self.directory / "sock" / "litetopk.sock")
        self.log_path = self.directory / "service.log"
        flags = {"host": "127.0.0.1", "port": 0, "uds": self.uds, "device": "cpu", "log_level": "info",
                 "region_check_interval_s": 0.2, **settings}
        argv = [sys.executable, "-m", "litetopk.service"]
        for key, value in flags.items():
            flag = "--" + key.replace("_", "-")
            argv += [flag] if value is True else [f"--no-{key.replace('_', '-')}"] if value is False else [flag, str(value)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            self.url = self._wait_for_url(timeout=90)
            self._wait(lambda c: c.get("/livez").status_code == 200, timeout=60)
            if wait_ready:
                self._wait(lambda c: c.get("/readyz").status_code == 200, timeout=60)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def token(self) -> str:
        return (Path(self.uds).parent / "token").read_text().strip()

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    def log(self) -> str:
        return self.log_path.read_text()

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = LISTENING.search(self.log())
            if match:
                return match.group(1)
            if self.process.poll() is not None:
                raise RuntimeError(f"the service exited with {self.process.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise TimeoutError(f"the service did not start within {timeout} s:\n{self.log()}")

    def _wait(self, probe, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while time.monotonic() < deadline:
                try:
                    if probe(client):
                        return
                except httpx.TransportError:
                    pass
                if self.process.poll() is not None:
                    raise RuntimeError(f"the service exited with {self.process.returncode}:\n{self.log()}")
                time.sleep(0.05)
        raise TimeoutError(f"the service did not become ready within {timeout} s:\n{self.log()}")

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30) -> int | None:
        self.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()
        return self.process.returncode


def start_service(**settings) -> tuple[ServiceProcess, tempfile.TemporaryDirectory]:
    # A short private directory: Unix socket paths are limited to ~107 bytes.
    directory = tempfile.TemporaryDirectory(prefix="ltk-", dir="/tmp")
    return ServiceProcess(directory.name, **settings), directory


@pytest.fixture(scope="session")
def service():
    """One default service (reference backend on the CPU) shared by a test session (per xdist worker)."""
    process, directory = start_service()
    yield process
    process.stop()
    directory.cleanup()


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05):
    """Poll `predicate` until it returns a truthy value (returned) or `timeout` passes (AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
