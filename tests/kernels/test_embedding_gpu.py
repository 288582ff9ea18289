"""The operator as a serving engine embeds it (issue 14), on a CUDA device: no host synchronization
in an eager call, and a CUDA-graph capture whose replay on new input contents gives the same bits
as an eager call. Marked gpu: reported as not run where no CUDA device exists."""

from __future__ import annotations

import pytest
import torch

from litetopk.kernels import LiteTopKTuning, dense_topk_prefill, litetopk_prefill, random_problem

pytestmark = pytest.mark.gpu
FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status", "repaired", "candidates")


def _problem(seed):
    return random_problem(40, [3000, 5000], 512, device="cuda", seed=seed)


def _call(p, out=None, operator=litetopk_prefill, calibration="sample"):
    tuning = {"tuning": LiteTopKTuning(calibration=calibration)} if operator is litetopk_prefill else {}
    return operator(*p.args(), topk=p.topk, weight_scale=p.weight_scale, out=out, **tuning)


def _without_syncs(call):
    """call()'s result; a host synchronization inside it raises RuntimeError."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return call()
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize(
    "operator, calibration",
    [(litetopk_prefill, "sample"), (litetopk_prefill, "scan"), (dense_topk_prefill, "sample")],
    ids=["litetopk", "litetopk-self-calibrating", "dense"],
)
def test_an_eager_call_never_synchronizes_with_the_host(operator, calibration, seed):
    p = _problem(seed)
    _call(p, operator=operator, calibration=calibration)  # compile outside the check
    _without_syncs(lambda: _call(p, operator=operator, calibration=calibration)).raise_for_status()


def test_dense_ties_are_settled_on_the_device(seed):
    """Rows whose queries are all zero score 0 at every key: the dense path's value top-k ties across
    the K-th place and the device settles it (no sync): the window's first K positions, as LiteTopK
    (which repairs those rows) answers."""
    p = _problem(seed)
    p.q_fp4[:3] = 0
    _call(p, operator=dense_topk_prefill)
    dense = _without_syncs(lambda: _call(p, operator=dense_topk_prefill))
    lite = litetopk_prefill(*p.args(), topk=p.topk, weight_scale=p.weight_scale, check=True)
    for name in ("values", "raw_indices", "physical_indices", "counts", "status"):  # what both publish alike
        assert torch.equal(getattr(dense, name), getattr(lite, name)), f"{name} (seed {seed})"
    for row in range(3):
        start, end = int(p.starts[row]), int(p.ends[row])
        want = torch.arange(start, start + min(p.topk, end - start), dtype=torch.int32, device="cuda")
        assert torch.equal(dense.raw_indices[row, : len(want)], want), f"row {row} (seed {seed})"


@pytest.mark.parametrize("calibration", ["sample", "scan"])
def test_graph_replay_on_new_inputs_equals_an_eager_call(calibration, seed):
    p = _problem(seed)
    fresh = _problem(seed + 1)
    out = {name: torch.full_like(getattr(_call(p, calibration=calibration), name), -7) for name in FIELDS}  # poisoned
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _call(p, out, calibration=calibration)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _call(p, out, calibration=calibration)
    for name in ("q_fp4", "q_scale", "kv_cache", "weights"):
        getattr(p, name).copy_(getattr(fresh, name))
    for tensor in out.values():
        tensor.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    want = _call(p, calibration=calibration)  # eager, on the same tensors with the new contents
    for name in FIELDS:
        assert torch.equal(out[name], getattr(want, name)), (
            f"{calibration}, seed {seed}: field {name} differs after replay"
        )
