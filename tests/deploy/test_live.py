"""What the containers run, run here against a real `python -m litetopk.service` process: the
demo worker (as compose's `demo` profile starts it: LITETOPK_URL names the socket) and the
image's HEALTHCHECK command (with this venv's python in place of the image's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.servers import start_service

from .files import ROOT, healthcheck_command, parse_dockerfile

HEALTHCHECK = healthcheck_command(parse_dockerfile((ROOT / "Dockerfile").read_text()).runtime.last("HEALTHCHECK"))


@pytest.fixture(scope="module")
def live():
    process, directory = start_service()
    yield process
    process.stop()
    directory.cleanup()


def run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env=environment)


def test_demo_worker_over_the_socket_named_by_litetopk_url(live):
    result = run([sys.executable, "bench/demo_worker.py", "--calls", "2"], LITETOPK_URL=f"unix:{live.uds}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(", ok") == 2, result.stdout


def test_demo_worker_over_tcp(live):
    # over TCP the worker's client reads the service's bearer token (the file beside its socket)
    result = run([sys.executable, "bench/demo_worker.py", "--calls", "1", "--url", live.url], LITETOPK_TOKEN=live.token)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "call 0: 16 rows, top-512" in result.stdout and ", ok" in result.stdout, result.stdout


def test_demo_worker_gives_up_when_no_service_answers(tmp_path):
    result = run([sys.executable, "bench/demo_worker.py", "--wait", "1", "--url", f"unix:{tmp_path}/none.sock"])
    assert result.returncode == 2, result.stdout + result.stderr
    assert "not ready" in result.stderr


@pytest.mark.parametrize("via", ["socket", "tcp"])
def test_image_healthcheck_passes_on_a_live_service(live, via):
    port = live.url.rsplit(":", 1)[1]
    env = (
        {"LITETOPK_UDS": live.uds, "LITETOPK_PORT": "1"}
        if via == "socket"
        else {"LITETOPK_UDS": "", "LITETOPK_PORT": port}
    )
    result = run([sys.executable, *HEALTHCHECK[1:]], **env)
    assert result.returncode == 0, result.stderr


def test_image_healthcheck_fails_without_a_service(tmp_path):
    result = run([sys.executable, *HEALTHCHECK[1:]], LITETOPK_UDS=str(tmp_path / "none.sock"))
    assert result.returncode != 0
