"""Bounded and graceful, against real service processes: a region holds no fd, per-principal caps on
regions and bytes, parked fds leaving headroom for connections, fd exhaustion answered `fd_exhausted`
and logged once per interval (the fd socket's reserve fd taken again when lost), requests still queued
when the grace period ends answered 503 `shutting_down`, and the service helper stops its process when
the start fails."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import pytest
import torch

from bench.common.service_process import ServiceProcess
from litetopk.clients import AsyncTopKClient, RegionProblem, TopKClient, TransportError, UnavailableProblem
from litetopk.clients.memfd import HandoverError, SealedMemory, hand_over_fd
from litetopk.service.fdpass import FD_HEADROOM_MIN, FdSocket, FdTickets
from tests.problems import make_problem
from tests.servers import start_service, wait_until

NOFILE = (
    "-c",
    "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({n}, {n})); "
    "sys.argv[0] = 'litetopk.service'; runpy.run_module('litetopk.service', run_name='__main__')",
)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_region_holds_no_fd(service):
    with TopKClient(uds=service.uds) as client:
        client.register(torch.zeros(16))  # the client's scratch and first-use fds settle
        before = open_fds(service.pid)
        regions = [client.register(torch.full((64,), float(i))) for i in range(40)]
        assert open_fds(service.pid) - before < 5, "a live region keeps no fd in the service"
        for region in regions:
            client.unregister(region)


def test_region_quota_per_principal():
    process, directory = start_service(
        warmup=False, max_regions_per_principal=3, max_region_bytes_per_principal=3 * 4096
    )
    try:
        info = httpx.get(f"{process.url}/v1/info").json()
        assert (info["max_regions_per_principal"], info["max_region_bytes_per_principal"]) == (3, 3 * 4096)
        with TopKClient(uds=process.uds) as client:
            kept = [client.register(torch.zeros(1024)) for _ in range(2)]
            with pytest.raises(RegionProblem) as err:
                client.register(torch.zeros(2048))  # 8 KiB more would pass 12 KiB
            assert err.value.code == "region_quota_exceeded" and err.value.status == 409, err.value
            kept.append(client.register(torch.zeros(1024)))
            with pytest.raises(RegionProblem) as err:
                client.register(torch.zeros(1))  # a 4th region
            assert err.value.code == "region_quota_exceeded" and "unregister" in err.value.detail
            client.unregister(kept.pop())
            client.register(torch.zeros(1))  # room again
    finally:
        process.stop()
        directory.cleanup()
        directory.cleanup()


def answers_ready(uds: str, transport: str) -> bool:
    try:
        with TopKClient(uds=uds, transport=transport) as client:
            return client.ready()
    except TransportError:  # a connection the service had no fd to accept with (uvloop resets it)
        return False


def test_the_service_raises_its_fd_limit_to_the_hard_limit():
    """Started with RLIMIT_NOFILE 64 soft, 256 hard, the service runs at 256 (its connections, parked fds and
    pidfds all take fds: it takes the most it is allowed)."""
    entry = (NOFILE[0], NOFILE[1].replace("({n}, {n})", "(64, 256)"))
    process, directory = start_service(warmup=False, entry=entry)
    try:
        limits = open(f"/proc/{process.pid}/limits").read()
        assert re.search(r"Max open files\s+256\s+256", limits), limits
        assert answers_ready(process.uds, "http")
    finally:
        process.stop()
        directory.cleanup()


def test_parked_fds_leave_headroom_and_exhaustion_is_answered():
    """Under RLIMIT_NOFILE 64: fds parked on the fd socket until refused. Every later handover gets
    `fd_exhausted` (not a misleading "got 0 fds"), logged once; the parked fds leave the last
    FD_HEADROOM_MIN free, so HTTP and IPC answer at once. Then, twice, idle connections take every fd
    left: a handover is still answered `fd_exhausted` (the reserve fd is given up to answer it, and
    taken again after), and once they close, HTTP answers again."""
    limit = 64
    process, directory = start_service(
        warmup=False, entry=tuple(s.format(n=limit) for s in NOFILE), resource_log_interval_s=600
    )
    memory, idle = SealedMemory(4096), []

    def held_fds() -> int:  # the service's open fds once they stop changing (connections are accepted late)
        while True:
            before = open_fds(process.pid)
            time.sleep(0.05)
            if open_fds(process.pid) == before:
                return before

    def fill() -> None:  # idle connections until the service holds every fd it may
        for _ in range(limit):
            idle.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            idle[-1].settimeout(2)
            idle[-1].connect(process.uds)
            if held_fds() >= limit:
                return
        raise AssertionError(f"{limit} idle connections left the service with fds free ({held_fds()} open)")

    try:
        fd_socket = process.info["fd_socket"]
        answers, tickets = [], []
        for _ in range(limit):
            try:
                tickets.append(hand_over_fd(fd_socket, memory.fd, timeout=10))
            except OSError as exc:
                answers.append(getattr(exc, "problem", None))
        assert tickets, "some fds were parked before the headroom"
        assert answers and all(a is not None and a["code"] == "fd_exhausted" for a in answers), answers[:3]
        assert process.log().count("fd headroom reached") == 1, "logged once per interval, not per refusal"
        assert held_fds() <= limit - FD_HEADROOM_MIN, "parked fds leave the headroom free"
        assert answers_ready(process.uds, "http") and answers_ready(process.uds, "ipc")
        for _ in range(2):
            fill()
            with pytest.raises(HandoverError) as refused:
                hand_over_fd(fd_socket, memory.fd, timeout=10)
            assert refused.value.problem is not None and refused.value.problem["code"] == "fd_exhausted", refused.value
            while idle:
                idle.pop().close()
            wait_until(lambda: answers_ready(process.uds, "http"), timeout=20)
        assert process.log().count("no file descriptors left") == 1, "logged once per interval"
    finally:
        for connection in idle:
            connection.close()
        memory.close_fd()
        process.stop()
        directory.cleanup()


def test_the_fd_socket_takes_its_reserve_fd_again(tmp_path):
    """The reserve fd, given up for a moment to answer at exhaustion, can find its slot taken by another
    thread (uvloop accepting an HTTP connection into it): the accept loop opens it again, so that the next
    exhaustion is still answered."""
    fd_socket = FdSocket(str(tmp_path / "fds.sock"), FdTickets())
    fd_socket.start()
    try:
        assert fd_socket._reserve is not None
        os.close(fd_socket._reserve)
        fd_socket._reserve = None  # as when another thread took the slot
        wait_until(lambda: fd_socket._reserve is not None, timeout=5)
    finally:
        fd_socket.stop()


def test_queued_requests_get_503_when_the_grace_period_ends(tmp_path):
    """Four requests behind a closed gate (the worker holds the first, three wait in the queue);
    SIGTERM with a grace period of 1 s: when it ends the three queued ones are answered 503
    `shutting_down` problem+json; the gate then opens and the held one is answered."""
    p = make_problem(51, seq_lens=[300], rows_per_seq=2)
    gate = tmp_path / "gate"
    gate.touch()
    process, directory = start_service(fault_gate_file=str(gate), shutdown_timeout_s=1, queue_size=8)

    async def scenario():
        async with AsyncTopKClient(uds=process.uds, transport="http") as client:
            gate.unlink()
            calls = [asyncio.ensure_future(client.topk(*p.args(), topk=512)) for _ in range(4)]
            with httpx.Client(base_url=process.url) as http:  # the order of events: all four in the service
                await asyncio.to_thread(wait_until, lambda: "litetopk_queue_depth 4.0" in http.get("/metrics").text, 30)
            process.terminate()
            await asyncio.to_thread(wait_until, lambda: sum(c.done() for c in calls) == 3, 30)
            gate.touch()  # the held request runs now, inside the second uvicorn gives after the grace period
            return await asyncio.gather(*calls, return_exceptions=True)

    try:
        outcomes = asyncio.run(scenario())
    finally:
        process.stop()
        directory.cleanup()
        directory.cleanup()
    refused = [o for o in outcomes if isinstance(o, UnavailableProblem)]
    assert len(refused) == 3 and all(o.code == "shutting_down" and o.status == 503 for o in refused), outcomes
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 1, "the running request finished"


def test_the_helper_stops_a_service_that_fails_to_start(tmp_path, monkeypatch):
    import bench.common.service_process as helper

    started = []
    popen = helper.subprocess.Popen
    monkeypatch.setattr(helper.subprocess, "Popen", lambda *a, **k: started.append(popen(*a, **k)) or started[-1])
    with pytest.raises(RuntimeError, match="exited"):
        ServiceProcess(tmp_path, device="cpu", backend="flydsl", timeout=60)
    assert len(started) == 1 and started[0].poll() is not None, "the helper reaped its child"
    with pytest.raises(TimeoutError):  # a deadline passes: the helper stops what it started
        ServiceProcess(tmp_path, timeout=0.01, log_name="slow.log")
    assert len(started) == 2 and started[1].poll() is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid (CI runs as root)")
def test_one_principal_at_its_cap_leaves_another_able_to_register():
    """RLIMIT_NOFILE 256 and a cap of 300 regions: one principal registers until refused (by its cap,
    not by the fds a region would hold), then another uid registers and gets its answer."""
    directory = tempfile.TemporaryDirectory(prefix="ltk-", dir="/tmp")
    os.chmod(directory.name, 0o711)
    process = ServiceProcess(
        directory.name,
        warmup=False,
        uds_mode="0666",
        max_regions_per_principal=300,
        entry=tuple(s.format(n=256) for s in NOFILE),
    )
    try:
        with TopKClient(uds=process.uds, transport="ipc") as client:
            with pytest.raises(RegionProblem) as err:
                for _ in range(301):
                    client.register(torch.zeros(4))
            assert err.value.code == "region_quota_exceeded", err.value
            code = (
                "import sys, torch; from litetopk.clients import TopKClient\n"
                "with TopKClient(uds=sys.argv[1]) as c:\n"
                "    r = c.register(torch.ones(8)); print(c.regions()[0]['id'] == r.id)"
            )
            other = subprocess.run(
                [
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    sys.executable,
                    "-c",
                    code,
                    process.uds,
                ],
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "HOME": "/tmp"},
            )
            assert other.returncode == 0 and other.stdout.strip() == "True", other.stderr[-2000:]
    finally:
        process.stop()
        directory.cleanup()
