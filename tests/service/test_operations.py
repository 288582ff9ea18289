"""Operations against live services: health, metrics, OpenAPI, overload, timeouts, regions that
go away while requests are queued, readiness after warm-up, graceful shutdown."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from litetopk.clients import AsyncTopKClient, RegionProblem, TimeoutProblem, TopKClient, UnavailableProblem
from litetopk.kernels import litetopk_prefill
from tests.problems import make_problem, results_equal
from tests.servers import start_service, wait_until


class Gate:
    """The gated service's worker runs a job only while the gate file exists (fault injection): a test
    closes it, queues work, watches the queue, opens it: outcomes ordered by events, not by time."""

    def __init__(self, path):
        self.path = path
        self.open()

    def open(self) -> None:
        self.path.touch()

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    gate = Gate(tmp_path_factory.mktemp("gate") / "open")
    process, directory = start_service(queue_size=2, fault_gate_file=str(gate.path), request_timeout_s=30)
    process.gate = gate
    yield process
    gate.open()
    process.stop()
    directory.cleanup()


@pytest.fixture
def slow_service(gated):
    """The gated service, its gate closed for the test (opened again after it)."""
    gated.gate.close()
    yield gated
    gated.gate.open()


@pytest.fixture(scope="module")
def problem():
    return make_problem(21, seq_lens=[700, 690], rows_per_seq=4)


def reference(p):
    return litetopk_prefill(*p.args(), topk=p.topk, backend="reference")


# --------------------------------------------------------------------------------- health


def test_livez_readyz_info(service):
    with httpx.Client(base_url=service.url, headers=service.auth) as http:
        assert http.get("/livez").json() == {"status": "ok"}
        assert http.get("/readyz").json() == {"status": "ready", "device": "cpu", "backend": "reference"}
        info = http.get("/v1/info").json()
    assert info["backend"] == "reference" and info["supported_topk"] == [512, 1024] and info["device_uuid"] is None
    assert info["max_rows"] == 256 and info["max_keys"] == 65536 and info["max_batch"] == 256, info  # CPU defaults
    assert info["ipc_socket"] == service.ipc and info["http_url"] == service.url and info["graphs"] is True


def test_openapi_lists_the_routes(service):
    with httpx.Client(base_url=service.url, headers=service.auth) as http:
        spec = http.get("/openapi.json").json()
    assert {"/v1/topk", "/v1/regions", "/v1/regions/{region_id}", "/livez", "/readyz", "/metrics"} <= set(spec["paths"])


def test_metrics_count_requests_rows_and_candidates(service, problem):
    with (
        TopKClient(service.url, token=service.token) as client,
        httpx.Client(base_url=service.url, headers=service.auth) as http,
    ):
        client.topk(*problem.args(), topk=512)
        http.get("/v1/regions/rnone")
        text = http.get("/metrics").text
    for needle in (
        'litetopk_requests_total{code="ok",method="POST",route="/v1/topk"}',
        'litetopk_requests_total{code="unknown_region",method="GET",route="/v1/regions/{region_id}"}',
        "litetopk_request_seconds_bucket",
        "litetopk_queue_depth",
        "litetopk_device_seconds_count",
        "litetopk_rows_total",
        "litetopk_candidates_total",
        "litetopk_repairs_total",
        'litetopk_regions{kind="memfd"}',
    ):
        assert needle in text, needle
    rows = next(line for line in text.splitlines() if line.startswith("litetopk_rows_total"))
    assert float(rows.split()[-1]) >= 8


# ------------------------------------------------------------------------------- overload


@pytest.mark.asyncio
async def test_overload_answers_429_and_finishes_queued_work(slow_service, problem):
    want = reference(problem)
    async with AsyncTopKClient(uds=slow_service.uds) as client:
        cache = await client.register(problem.kv_cache)
        calls = [
            asyncio.ensure_future(client.topk(problem.q_fp4, problem.q_scale, cache, *problem.args()[3:], topk=512))
            for _ in range(12)
        ]
        await asyncio.to_thread(wait_until, lambda: sum(c.done() for c in calls) >= 9, 30)  # refused at once
        slow_service.gate.open()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        answered = [o for o in outcomes if not isinstance(o, BaseException)]
        refused = [o for o in outcomes if isinstance(o, BaseException)]
        assert all(
            isinstance(o, UnavailableProblem) and o.code == "overloaded" and o.status == 429 and o.retry_after == 1
            for o in refused
        ), refused
        # the gate holds the job the worker took, 2 more fit the queue (2 in all when the worker took its
        # job after the queue had filled), the others are refused at once
        assert len(answered) in (2, 3) and len(refused) == 12 - len(answered), (len(answered), len(refused))
        assert all(results_equal(o, want) == [] for o in answered)
        assert await client.ready()  # nothing crashed
        again = await client.topk(problem.q_fp4, problem.q_scale, cache, *problem.args()[3:], topk=512)
        assert results_equal(again, want) == []


def test_request_timeout(problem, tmp_path):
    # the gate stays closed: the request can only time out
    gate = tmp_path / "gate"
    process, directory = start_service(fault_gate_file=str(gate), request_timeout_s=0.2, warmup=False)
    try:
        # HTTP (awaited on the event loop), then IPC (answered by the connection's thread at the deadline)
        for endpoint in ({"base_url": process.url, "token": process.token}, {"uds": process.uds}):
            with TopKClient(**endpoint) as client:
                assert client.transport == ("http" if "base_url" in endpoint else "ipc")
                with pytest.raises(TimeoutProblem) as err:
                    client.topk(*problem.args(), topk=512)
                assert err.value.code == "timeout" and err.value.status == 504, (client.transport, err.value)
                assert client.ready()
    finally:
        gate.touch()  # the held jobs run, the service stops without waiting out its grace period
        process.stop()
        directory.cleanup()


# ------------------------------------------------------------------- regions while queued


def _metric(service, name: str) -> float:
    text = httpx.get(f"{service.url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def queue_depth(service, depth: int, timeout: float = 30.0) -> None:
    """Until the service's device queue holds `depth` requests (an event, with a deadline)."""
    await asyncio.to_thread(wait_until, lambda: _metric(service, "litetopk_queue_depth") == depth, timeout)


@pytest.mark.asyncio
async def test_region_unregistered_while_queued(slow_service, problem):
    async with AsyncTopKClient(uds=slow_service.uds) as client:
        cache = await client.register(problem.kv_cache)
        other = await client.register(problem.kv_cache.clone())
        first = asyncio.create_task(client.topk(*problem.args()[:2], other, *problem.args()[3:], topk=512))
        queued = asyncio.create_task(client.topk(*problem.args()[:2], cache, *problem.args()[3:], topk=512))
        await queue_depth(slow_service, 2)  # both wait behind the closed gate, no lease taken
        await client.unregister(cache)  # returns at once: no request holds a lease on it yet
        assert not queued.done()
        slow_service.gate.open()
        with pytest.raises(RegionProblem) as err:
            await queued
        assert err.value.code == "stale_region" and "unregistered" in err.value.detail
        assert results_equal(await first, reference(problem)) == []


@pytest.mark.asyncio
async def test_region_unlinked_while_queued_still_answers(slow_service, problem):
    async with AsyncTopKClient(slow_service.url, token=slow_service.token) as client:
        cache = await client.register(problem.kv_cache)
        queued = asyncio.create_task(client.topk(*problem.args()[:2], cache, *problem.args()[3:], topk=512))
        await queue_depth(slow_service, 1)  # queued behind the closed gate
        cache.keepalive.close_fd()
        slow_service.gate.open()  # the owner lets go of its fd; the service's own mapping stays valid
        assert results_equal(await queued, reference(problem)) == []
        await client.unregister(cache)


# ------------------------------------------------------------------ readiness and shutdown


def test_not_ready_until_warm_up_then_graceful_shutdown(problem, tmp_path):
    gate = tmp_path / "gate"  # closed: the warm-up waits in the queue until the test opens it
    process, directory = start_service(fault_gate_file=str(gate), wait_ready=False)
    try:
        with (
            httpx.Client(base_url=process.url, headers=process.auth, timeout=30) as http,
            TopKClient(process.url, token=process.token) as client,
        ):
            doc = http.get("/readyz")
            assert doc.status_code == 503 and doc.json()["code"] == "not_ready", doc.text
            assert doc.headers["retry-after"] == "1"
            assert client.ready() is False

            async def queued_then_terminated():
                async with AsyncTopKClient(process.url, token=process.token) as aclient:
                    task = asyncio.create_task(aclient.topk(*problem.args(), topk=512))
                    await queue_depth(process, 2)  # the request waits behind the warm-up
                    process.terminate()  # SIGTERM with work queued
                    gate.touch()  # within the grace period: the warm-up and the request run
                    return await task

            result = asyncio.run(queued_then_terminated())
        assert results_equal(result, reference(problem)) == []  # queued work finished before exit
        assert process.stop() is not None
        assert "Traceback" not in process.log(), process.log()
    finally:
        process.stop()
        directory.cleanup()
