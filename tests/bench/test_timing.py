"""bench.common.timing.wall_seconds_in_blocks: the benchmarks' order of calls (service, service_overhead)."""

from __future__ import annotations

import pytest

from bench.common.timing import wall_seconds_in_blocks


@pytest.mark.parametrize("iters, warm, block", [(7, 2, 3), (5, 0, 1), (4, 6, 20)])
def test_calls_come_in_blocks_of_one_function_and_warm_ones_are_not_timed(iters, warm, block):
    """Each function is called warm + iters times, in runs of `block` (the last run of a round shorter), the
    functions taking turns run by run; its first `warm` calls are not timed; `before` precedes every call."""
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in "ab"}
    seconds = wall_seconds_in_blocks(calls, iters, warm, block, before=lambda: order.append("-"))
    assert order[::2] == ["-"] * (2 * (iters + warm)), "before each call"
    made = order[1::2]
    want = []
    for first in range(0, iters + warm, block):
        for name in "ab":
            want += [name] * (min(first + block, iters + warm) - first)
    assert made == want, (iters, warm, block, made)
    assert {name: len(s) for name, s in seconds.items()} == {"a": iters, "b": iters}
    assert all(t >= 0 for s in seconds.values() for t in s)


def test_bounds_are_refused():
    with pytest.raises(ValueError, match="block=0"):
        wall_seconds_in_blocks({"a": lambda: None}, 3, 1, 0)
