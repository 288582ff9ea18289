"""The device worker in-process: order, errors handed back, timeouts, shutdown that drains."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from litetopk.service.errors import ServiceError
from litetopk.service.executor import DeviceExecutor
from litetopk.service.metrics import ServiceMetrics

pytestmark = pytest.mark.asyncio


def make_executor(queue_size=4, delay=0.0) -> DeviceExecutor:
    executor = DeviceExecutor(torch.device("cpu"), queue_size, ServiceMetrics(), retry_after_s=2, fault_delay_s=delay)
    executor.start()
    return executor


async def test_jobs_run_in_order_on_one_thread():
    executor = make_executor()
    seen = []
    results = await asyncio.gather(*[executor.run(lambda i=i: seen.append((i, threading.current_thread().name)) or i, 5)
                                     for i in range(4)])
    await executor.close(5)
    assert results == [0, 1, 2, 3] and [i for i, _ in seen] == [0, 1, 2, 3]
    assert len({name for _, name in seen}) == 1 and seen[0][1] != threading.current_thread().name


async def test_job_exception_reaches_the_caller():
    executor = make_executor()
    with pytest.raises(ZeroDivisionError):
        await executor.run(lambda: 1 / 0, 5)
    assert await executor.run(lambda: "still alive", 5) == "still alive"
    await executor.close(5)


def held(value, started: threading.Event, gate: threading.Event):
    """A job that says it runs, then waits for `gate` (the test orders events, not time)."""
    def job():
        started.set()
        if not gate.wait(30):
            raise TimeoutError("the test never opened the gate")
        return value
    return job


async def test_full_queue_is_overloaded_with_retry_after():
    executor = make_executor(queue_size=1)
    started, gate = threading.Event(), threading.Event()
    running = executor.submit(held("first", started, gate))
    assert await asyncio.to_thread(started.wait, 30), "the worker took the first job"
    queued = executor.submit(lambda: "second")   # fills the queue
    with pytest.raises(ServiceError) as err:
        executor.submit(lambda: "third")
    assert err.value.code == "overloaded" and err.value.headers["Retry-After"] == "2"
    gate.set()
    assert await running == "first" and await queued == "second"
    await executor.close(5)


async def test_timed_out_job_is_skipped():
    executor = make_executor()
    ran = []
    started, gate = threading.Event(), threading.Event()
    blocker = executor.submit(held(None, started, gate))
    with pytest.raises(ServiceError) as err:
        await executor.run(lambda: ran.append(1), timeout=0.05)  # queued behind the held job until it times out
    assert err.value.code == "timeout"
    gate.set()
    await blocker
    await executor.run(lambda: None, 5)
    assert ran == []
    await executor.close(5)


async def test_queued_jobs_fail_with_the_error_given():
    executor = make_executor()
    started, gate = threading.Event(), threading.Event()
    running = executor.submit(held("ran", started, gate))
    assert await asyncio.to_thread(started.wait, 30)
    queued = [executor.submit(lambda: "never") for _ in range(2)]
    executor.stop_admissions()
    assert executor.fail_queued(ServiceError("shutting_down", "grace period over")) == 2
    gate.set()
    assert await running == "ran"
    for future in queued:
        with pytest.raises(ServiceError) as err:
            await future
        assert err.value.code == "shutting_down"
    await executor.close(5)


async def test_closed_executor_refuses_with_shutting_down():
    executor = make_executor()
    pending = [executor.submit(lambda i=i: i) for i in range(3)]
    await executor.close(5)  # drains what was queued
    assert [await p for p in pending] == [0, 1, 2]
    with pytest.raises(ServiceError) as err:
        executor.submit(lambda: None)
    assert err.value.code == "shutting_down"
