"""LiteTopKGraphs on a CUDA device (issue 14): real CUDA graphs, replayed on new input contents, give
the bits of an eager litetopk_prefill call; a replayed call never synchronizes with the host; calls
from another stream and calls under the caller's own capture stay exact. Marked gpu: reported as not
run where no CUDA device exists (the staging logic is tested on the CPU in test_graphs.py)."""

from __future__ import annotations

import pytest
import torch

from litetopk.kernels import LiteTopKGraphs, litetopk_prefill, random_problem
from litetopk.kernels.result import RESULT_FIELDS

pytestmark = pytest.mark.gpu
FIELDS = tuple(RESULT_FIELDS)


def _problem(seed, topk=512):
    return random_problem(40, [3000, 5000], topk, device="cuda", seed=seed)


def _refill(p, fresh):
    for name in ("q_fp4", "q_scale", "kv_cache", "weights", "starts", "ends"):
        getattr(p, name).copy_(getattr(fresh, name))


def _same(got, want, case):
    for name in FIELDS:
        assert torch.equal(getattr(got, name), getattr(want, name)), f"{case}: field {name} differs"


@pytest.fixture(scope="module")
def graphs():
    return LiteTopKGraphs(64, 8192, (512, 1024), device="cuda", max_batch=2)


def test_replays_equal_eager_calls_and_never_synchronize(graphs, seed):
    p = _problem(seed)
    _same(graphs(*p.args(), **p.kwargs()), litetopk_prefill(*p.args(), **p.kwargs()), f"seed {seed}: capture")
    for step in (1, 2):
        _refill(p, _problem(seed + step))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = graphs(*p.args(), **p.kwargs())
        finally:
            torch.cuda.set_sync_debug_mode(0)
        _same(got, litetopk_prefill(*p.args(), **p.kwargs()), f"seed {seed}: replay {step}")
    assert graphs.stats["replays"] >= 2


def test_a_call_from_another_stream_waits_for_the_last_one(graphs, seed):
    p, q = _problem(seed), _problem(seed + 1)
    graphs(*p.args(), **p.kwargs())
    graphs(*q.args(), **q.kwargs())
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of the default stream before `first`: the side stream would overtake it
    first = graphs(*p.args(), **p.kwargs())
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # no explicit wait: the runner orders the arena's reuse itself
        second = graphs(*q.args(), **q.kwargs())
    torch.cuda.synchronize()
    _same(first, litetopk_prefill(*p.args(), **p.kwargs()), f"seed {seed}: first stream")
    _same(second, litetopk_prefill(*q.args(), **q.kwargs()), f"seed {seed}: second stream")


def test_under_the_callers_capture_the_call_is_captured_too(graphs, seed):
    p = _problem(seed, topk=1024)
    out = {name: torch.full_like(getattr(graphs(*p.args(), **p.kwargs()), name), -7) for name in FIELDS}
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphs(*p.args(), **p.kwargs(), out=out)
    _refill(p, _problem(seed + 5, topk=1024))
    graph.replay()
    torch.cuda.synchronize()
    want = litetopk_prefill(*p.args(), **p.kwargs())
    for name in FIELDS:
        assert torch.equal(out[name], getattr(want, name)), f"seed {seed}: {name} after the caller's replay"
