"""Security scenarios against real service processes (issue 16): shutdown paths, socket directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
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


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _as_nobody(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run Python `code` as uid/gid 65534 (CI runs as root), with httpx importable."""
    return subprocess.run([*NOBODY, sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": "/tmp"})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid (CI runs as root)")
def test_another_uid_on_tcp_gets_no_region_and_no_token(tmp_path):
    """The confused-deputy and listing scenarios of issue 16, as `nobody` against a real service: TCP
    without the token answers 401 to every region operation and to /v1/topk, the token file cannot be
    read, the Unix socket cannot be reached, and the owner's regions are untouched."""
    tmp_path.chmod(0o755)
    process = ServiceProcess(tmp_path, warmup=False)
    try:
        with httpx.Client(base_url=process.url, headers=process.auth) as owner:
            before = owner.get("/v1/regions").json()
        probe = r'''
import json, sys, httpx
url, token_file, uds = sys.argv[1:4]
out = {}
with httpx.Client(base_url=url) as c:
    out["list"] = c.get("/v1/regions").status_code
    out["register"] = c.post("/v1/regions", json={"kind": "memfd", "ticket": "x" * 32, "size": 64}).status_code
    out["delete"] = c.delete("/v1/regions/1").status_code
    out["topk"] = c.post("/v1/topk", json={}).status_code
    out["forged"] = c.get("/v1/regions", headers={"authorization": "Bearer " + "0" * 64}).status_code
try:
    open(token_file).read(); out["token"] = "read"
except PermissionError:
    out["token"] = "refused"
try:
    with httpx.Client(transport=httpx.HTTPTransport(uds=uds), base_url="http://litetopk") as c:
        out["uds"] = c.get("/v1/regions").status_code
except (httpx.TransportError, PermissionError):
    out["uds"] = "refused"
print(json.dumps(out))
'''
        result = _as_nobody(probe, process.url, str(Path(process.uds).parent / "token"), process.uds)
        assert result.returncode == 0, result.stderr[-2000:]
        seen = __import__("json").loads(result.stdout.strip().splitlines()[-1])
        assert seen == {"list": 401, "register": 401, "delete": 401, "topk": 401, "forged": 401,
                        "token": "refused", "uds": "refused"}, seen
        with httpx.Client(base_url=process.url, headers=process.auth) as owner:
            assert owner.get("/v1/regions").json() == before, "the owner's regions changed"
        assert process.process.poll() is None, "the service died"
        assert "Traceback" not in process.log(), process.log()[-3000:]
    finally:
        process.stop()
