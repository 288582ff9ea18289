"""The request path's lock-free metrics (service/metrics.py ThreadCounter / ThreadHistogram): what
/metrics shows is what prometheus_client's own Counter and Histogram show for the same observations,
made on several threads, some of which have ended."""

from __future__ import annotations

import random
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from litetopk.service.metrics import LATENCY_BUCKETS, ThreadCounter, ThreadHistogram


def exposition(registry: CollectorRegistry) -> list[str]:
    """The lines of a registry's text exposition, without the `_created` samples (ours have none) and
    with every number rounded (a histogram's sum is added up in another order)."""
    lines = []
    for line in generate_latest(registry).decode().splitlines():
        if "_created" in line:
            continue
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            line = f"{name} {float(value):.9g}"
        lines.append(line)
    return lines


@pytest.mark.parametrize("threads", [1, 4])
def test_thread_metrics_expose_what_prometheus_client_exposes(threads, seed):
    rng = random.Random(seed)
    values = [rng.choice([0.0001, 0.0005, 0.0007, 0.001, 0.3, 60.0, 70.0]) for _ in range(2000)]
    codes = [rng.choice(["ok", "stale_region"]) for _ in values]
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    their_requests = Counter("litetopk_requests", "Requests", ["route", "code"], registry=theirs)
    their_latency = Histogram(
        "litetopk_request_seconds", "Latency", ["route"], buckets=LATENCY_BUCKETS, registry=theirs
    )
    their_rows = Counter("litetopk_rows", "Rows", registry=theirs)
    our_requests = ThreadCounter("litetopk_requests", "Requests", ["route", "code"])
    our_latency = ThreadHistogram("litetopk_request_seconds", "Latency", ["route"])
    our_rows = ThreadCounter("litetopk_rows", "Rows")
    for family in (our_requests, our_latency, our_rows):
        ours.register(family)

    def observe(part: range) -> None:
        for i in part:
            for requests, latency, rows in (
                (their_requests, their_latency, their_rows),
                (our_requests, our_latency, our_rows),
            ):
                requests.labels("ipc:topk", codes[i]).inc()
                latency.labels("ipc:topk").observe(values[i])
                rows.inc(64)

    workers = [threading.Thread(target=observe, args=(range(k, len(values) // 2, threads),)) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()  # ended: their numbers are folded when /metrics is read
    assert exposition(ours) == exposition(theirs), f"{threads} threads (seed {seed})"
    live = threading.Thread(target=observe, args=(range(len(values) // 2, len(values)),))
    live.start()
    live.join()
    observe(range(10))  # this thread's own numbers as well
    assert exposition(ours) == exposition(theirs), f"{threads} threads, then more (seed {seed})"


def test_a_family_with_labels_is_used_through_them():
    counter = ThreadCounter("litetopk_requests", "Requests", ["route"])
    with pytest.raises(ValueError, match="labels"):
        counter.inc()
    with pytest.raises(ValueError, match="labels"):
        counter.labels("a", "b")
    with pytest.raises(ValueError, match="labels"):
        ThreadHistogram("litetopk_request_seconds", "Latency", ["route"]).observe(0.1)
