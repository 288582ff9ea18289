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


async def test_full_queue_is_overloaded_with_retry_after():
    executor = make_executor(queue_size=1, delay=0.3)
    running = executor.submit(lambda: "first")   # taken by the worker (sleeps 0.3 s first)
    await asyncio.sleep(0.05)
    queued = executor.submit(lambda: "second")   # fills the queue
    with pytest.raises(ServiceError) as err:
        executor.submit(lambda: "third")
    assert err.value.code == "overloaded" and err.value.headers["Retry-After"] == "2"
    assert await running == "first" and await queued == "second"
    await executor.close(5)


async def test_timed_out_job_is_skipped():
    executor = make_executor(delay=0.2)
    ran = []
    blocker = executor.submit(lambda: None)
    with pytest.raises(ServiceError) as err:
        await executor.run(lambda: ran.append(1), timeout=0.05)
    assert err.value.code == "timeout"
    await blocker
    await executor.run(lambda: None, 5)
    assert ran == []
    await executor.close(5)


async def test_closed_executor_refuses_with_shutting_down():
    executor = make_executor(delay=0.1)
    pending = [executor.submit(lambda i=i: i) for i in range(3)]
    await executor.close(5)  # drains what was queued
    assert [await p for p in pending] == [0, 1, 2]
    with pytest.raises(ServiceError) as err:
        executor.submit(lambda: None)
    assert err.value.code == "shutting_down"
