"""`python -m litetopk.service --check livez|readyz`: the probe the image's HEALTHCHECK runs. It
reads the same settings as the service (socket first, else TCP) and exits 0 or 1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from litetopk.service.__main__ import check_target
from litetopk.service.settings import ServiceSettings
from tests.servers import start_service, wait_until


def probe(route: str, *flags: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LITETOPK_")} | env
    return subprocess.run(
        [sys.executable, "-m", "litetopk.service", "--check", route, *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )


@pytest.mark.parametrize(
    "settings,target",
    [
        ({"uds": "/run/litetopk/x.sock", "port": 9}, ("/run/litetopk/x.sock", "http://litetopk")),
        ({"uds": "", "host": "127.0.0.1", "port": 9}, (None, "http://127.0.0.1:9")),
        ({"uds": "", "host": "0.0.0.0", "port": 9}, (None, "http://127.0.0.1:9")),
        ({"uds": "", "host": "::", "port": 9}, (None, "http://[::1]:9")),
        ({"uds": "", "host": "10.1.2.3", "port": 9}, (None, "http://10.1.2.3:9")),
    ],
)
def test_probe_asks_the_socket_else_tcp(settings, target):
    assert check_target(ServiceSettings(**settings)) == target, settings


@pytest.mark.parametrize("settings", [{"uds": "", "host": ""}, {"uds": "", "port": 0}])
def test_probe_needs_a_fixed_address(settings):
    with pytest.raises(ValueError, match="nothing to probe"):
        check_target(ServiceSettings(**settings))


def test_probe_without_a_service_fails(tmp_path):
    result = probe("livez", "--uds", str(tmp_path / "none.sock"))
    assert result.returncode == 1 and "no answer from unix:" in result.stderr, result.stderr


def test_probe_livez_then_readyz_through_the_warm_up(tmp_path):
    gate = tmp_path / "gate"  # the warm-up waits until the test creates it
    process, directory = start_service(fault_gate_file=str(gate), wait_ready=False)
    port = process.url.rsplit(":", 1)[1]
    try:
        warming = probe("readyz", "--uds", process.uds)
        assert warming.returncode == 1 and "503" in warming.stderr and "not_ready" in warming.stderr, warming.stderr
        live = probe("livez", LITETOPK_UDS=process.uds)  # settings from the environment
        assert live.returncode == 0, live.stderr
        gate.touch()
        wait_until(lambda: probe("readyz", "--uds", process.uds).returncode == 0, timeout=60, interval=0.2)
        over_tcp = probe("readyz", "--uds", "", "--port", port)
        assert over_tcp.returncode == 0, over_tcp.stderr
        wrong_port = probe("readyz", LITETOPK_UDS="", LITETOPK_PORT="1")
        assert wrong_port.returncode == 1, wrong_port.stderr
    finally:
        process.stop()
        directory.cleanup()
