"""LiteTopKGraphs (kernels/graphs.py) on the CPU: the staging, signatures, eviction and publishing of
the per-signature graph runner, against litetopk_prefill on the same inputs, bit for bit.

On the CPU a "graph" is the captured call re-run on the staging arena (the module docstring), so
every test here checks what the CUDA path shares with it: the inputs copied into the arena, the
result fields copied out of it, the cache read in place by address. The CUDA graphs themselves are
tested on a GPU in test_graphs_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

from litetopk.kernels import (
    DeviceError,
    InputDtypeError,
    InputError,
    LiteTopKGraphs,
    LiteTopKTuning,
    RowFaultError,
    litetopk_prefill,
    random_problem,
)
from litetopk.kernels.graphs import STAGED_INPUTS
from litetopk.kernels.result import RESULT_FIELDS
from litetopk.kernels.status import CAPACITY_EVENTS

FIELDS = tuple(RESULT_FIELDS)
BOUNDS = dict(max_rows=48, max_seq_len=8192, topk=(512, 1024), device="cpu", backend="reference", max_batch=2)


def problem(seed: int, rows: int = 24, keys=(2600, 1900), topk: int = 512, **kw):
    return random_problem(rows, list(keys), topk, seed=seed, **kw)


def eager(p, **kw):
    return litetopk_prefill(*p.args(), **p.kwargs(), backend="reference", max_seq_len=kw.pop("max_seq_len", None), **kw)


def refill(p, fresh) -> None:
    """New contents in p's own tensors (same addresses: the same signature)."""
    for name in ("q_fp4", "q_scale", "kv_cache", "weights", "starts", "ends", "row_to_batch", "block_table"):
        getattr(p, name).copy_(getattr(fresh, name))


def assert_same(got, want, case: str) -> None:
    for name in FIELDS:
        assert torch.equal(getattr(got, name), getattr(want, name)), f"{case}: field {name} differs"


@pytest.fixture(scope="module")
def graphs():
    return LiteTopKGraphs(**BOUNDS)


def test_replays_on_new_contents_equal_eager_calls(graphs, seed):
    p = problem(seed)
    first = graphs(*p.args(), **p.kwargs())
    assert_same(first, eager(p), f"seed {seed}: the capturing call")
    kept = {name: getattr(first, name).clone() for name in FIELDS}
    before = graphs.stats["replays"]
    for step in range(1, 3):
        refill(p, problem(seed + step))
        got = graphs(*p.args(), **p.kwargs())
        assert_same(got, eager(p), f"seed {seed}: replay {step}")
    assert graphs.stats["replays"] == before + 2, graphs.stats
    for name in FIELDS:  # the first result owns its memory: later replays never write into it
        assert torch.equal(getattr(first, name), kept[name]), f"seed {seed}: replays changed the first result's {name}"


@pytest.mark.parametrize("case", ["rows", "topk", "bf16 weights", "weight_scale", "max_seq_len", "repair"])
def test_each_signature_part_gets_its_own_graph(graphs, case, seed):
    p = problem(seed)
    graphs(*p.args(), **p.kwargs())
    variant = {
        "rows": problem(seed, rows=18),
        "topk": problem(seed, topk=1024),
        "bf16 weights": problem(seed, weights_dtype=torch.bfloat16),
        "weight_scale": problem(seed, weight_scale=0.375),
    }.get(case, p)
    variant.kv_cache = p.kv_cache if variant.kv_cache.shape == p.kv_cache.shape else variant.kv_cache
    kw = {"max_seq_len": 3000} if case == "max_seq_len" else {"repair": False} if case == "repair" else {}
    captures = graphs.stats["captures"]
    got = graphs(*variant.args(), **variant.kwargs(), **kw)
    assert graphs.stats["captures"] == captures + 1, f"{case}: no new capture ({graphs.stats})"
    assert_same(got, eager(variant, **kw), f"seed {seed}: {case}")
    again = graphs(*p.args(), **p.kwargs())  # the first signature still replays its own graph
    assert_same(again, eager(p), f"seed {seed}: {case}, back to the first signature")


def test_the_cache_is_read_in_place_and_a_new_cache_address_is_a_new_signature(graphs, seed):
    p = problem(seed)
    graphs(*p.args(), **p.kwargs())
    p.kv_cache.copy_(problem(seed + 1).kv_cache)  # same address, new keys: the replay reads them
    captures = graphs.stats["captures"]
    assert_same(graphs(*p.args(), **p.kwargs()), eager(p), f"seed {seed}: cache rewritten in place")
    assert graphs.stats["captures"] == captures
    p.kv_cache = p.kv_cache.clone()  # another address
    assert_same(graphs(*p.args(), **p.kwargs()), eager(p), f"seed {seed}: cache at a new address")
    assert graphs.stats["captures"] == captures + 1


def test_caller_owned_out_is_written_in_place_and_the_rest_is_new_memory(graphs, seed):
    p = problem(seed)
    rows, k = p.q_fp4.shape[0], p.topk
    buf = torch.full((rows + 3, k + 5), -7, dtype=torch.int32)
    status = torch.full((rows, 2), -7, dtype=torch.int32)
    out = {"physical_indices": buf[1 : 1 + rows, :k], "status": status[:, 1]}
    got = graphs(*p.args(), **p.kwargs(), out=out)
    assert got.physical_indices is out["physical_indices"] and got.status is out["status"]
    assert_same(got, eager(p), f"seed {seed}: out=")
    assert (buf[0] == -7).all() and (buf[1 + rows :] == -7).all() and (buf[:, k:] == -7).all(), (
        "wrote outside the views"
    )
    assert (status[:, 0] == -7).all(), "wrote outside the status view"
    arena = (graphs._arena.data_ptr(), graphs._arena.data_ptr() + graphs.arena_bytes)
    for name in FIELDS:
        assert not arena[0] <= getattr(got, name).data_ptr() < arena[1], f"{name} lies in the staging arena"


def test_the_least_recently_used_graph_is_dropped(seed):
    small = LiteTopKGraphs(**{**BOUNDS, "topk": 512}, max_graphs=2)
    a, b, c = (problem(seed, rows=rows) for rows in (10, 12, 14))
    for p in (a, b, a, c):  # a is used again after b: b is the least recently used when c arrives
        small(*p.args(), **p.kwargs())
    assert small.stats["evictions"] == 1 and small.stats["captures"] == 3, small.stats
    small(*a.args(), **a.kwargs())  # kept: a replay
    assert small.stats["captures"] == 3 and small.stats["replays"] == 2, small.stats
    got = small(*b.args(), **b.kwargs())  # dropped: captured again
    assert small.stats["captures"] == 4, small.stats
    assert_same(got, eager(b), f"seed {seed}: after eviction")


def test_a_miss_that_fails_leaves_the_runner_as_it_was(seed, monkeypatch):
    small = LiteTopKGraphs(**{**BOUNDS, "max_rows": 8, "topk": 512}, max_graphs=4)
    p = problem(seed, rows=8)
    small(*p.args(), **p.kwargs())
    arena, graphs_before = small._arena, dict(small._graphs)
    wide = problem(seed + 1, rows=8)
    wide.block_table = torch.nn.functional.pad(wide.block_table, (0, 400), value=0)  # would grow the arena

    def failing(*args, **kwargs):
        raise DeviceError("injected: the device failed during the miss")

    monkeypatch.setattr("litetopk.kernels.graphs.litetopk_prefill", failing)
    with pytest.raises(DeviceError, match="injected"):
        small(*wide.args(), **wide.kwargs(), max_seq_len=4500)
    monkeypatch.undo()
    assert small._arena is arena and dict(small._graphs) == graphs_before, "a failed miss changed the runner"
    assert small.stats["arena_regrowths"] == 0, small.stats
    assert_same(small(*p.args(), **p.kwargs()), eager(p), f"seed {seed}: the old signature after the failed miss")


def test_check_finishes_capacity_events_like_the_eager_operator(seed):
    tuning = LiteTopKTuning(candidate_capacity=600, repair_rows=0)  # rows overflow; no device repair slot
    runner = LiteTopKGraphs(**{**BOUNDS, "max_rows": 8, "topk": 512}, tuning=tuning)
    p = problem(seed, rows=8)
    unchecked = runner(*p.args(), **p.kwargs())
    assert ((unchecked.status & int(CAPACITY_EVENTS)) != 0).any(), f"seed {seed}: no capacity event to finish"
    got = runner(*p.args(), **p.kwargs(), check=True)
    assert_same(got, eager(p, check=True, tuning=tuning), f"seed {seed}: check=True")
    assert (got.status == 0).all() and got.repaired.any()


def test_a_signature_beyond_the_arena_grows_it(seed):
    small = LiteTopKGraphs(**{**BOUNDS, "max_rows": 8, "topk": 512}, max_graphs=4)
    p = problem(seed, rows=8)
    small(*p.args(), **p.kwargs())
    wide = problem(seed, rows=8)
    wide.block_table = torch.nn.functional.pad(wide.block_table, (0, 400), value=0)  # 8192 keys beyond the bound
    got = small(*wide.args(), **wide.kwargs(), max_seq_len=4500)
    assert small.stats["arena_regrowths"] == 1 and len(small._graphs) == 1, small.stats
    assert_same(got, eager(wide, max_seq_len=4500), f"seed {seed}: grown arena")


def test_bad_arguments_are_the_operators_input_errors(graphs, seed):
    p = problem(seed)
    with pytest.raises(InputDtypeError, match="weights must be float32 or bfloat16"):
        graphs(*p.args()[:4], p.weights.double(), *p.args()[5:], **p.kwargs())
    with pytest.raises(InputError, match="overlaps"):
        graphs(*p.args(), **p.kwargs(), out={"counts": p.starts})
    too_many = problem(seed, rows=60)
    with pytest.raises(InputError, match="60 query rows: this runner was built for at most 48"):
        graphs(*too_many.args(), **too_many.kwargs())
    longer = problem(seed, rows=8, keys=(4200, 1900))  # 69 pages a sequence: up to 4416 keys
    with pytest.raises(InputError, match=r"4288 window bound .* at most 4096"):
        LiteTopKGraphs(**{**BOUNDS, "max_rows": 8, "max_seq_len": 4096, "topk": 512})(
            *longer.args(), **longer.kwargs(), max_seq_len=4288
        )
    with pytest.raises(InputError, match=r"topk=1024: this runner was built for K in \(512,\)"):
        LiteTopKGraphs(**{**BOUNDS, "max_rows": 8, "topk": 512})(*problem(seed, rows=8, topk=1024).args(), topk=1024)
    three = problem(seed, keys=(900, 900, 900))
    with pytest.raises(InputError, match="3 sequences"):
        graphs(*three.args(), **three.kwargs())
    assert_same(graphs(*p.args(), **p.kwargs()), eager(p), f"seed {seed}: after the errors")


def test_check_raises_for_faulty_rows_like_the_operator(graphs, seed):
    p = problem(seed)
    p.weights[3, 5] = float("inf")
    with pytest.raises(RowFaultError, match="row 3: NONFINITE"):
        graphs(*p.args(), **p.kwargs(), check=True)
    with pytest.raises(RowFaultError, match="row 3: NONFINITE"):
        eager(p, check=True)


def test_the_runner_rejects_bad_bounds():
    with pytest.raises(InputError, match="max_graphs"):
        LiteTopKGraphs(**BOUNDS, max_graphs=0)
    with pytest.raises(InputError, match="max_rows"):
        LiteTopKGraphs(**{**BOUNDS, "max_rows": -1})


def test_the_cache_format_and_page_stride_are_part_of_the_signature(graphs, seed):
    from litetopk.kernels.aiter_layout import aiter_pages_from_litetopk

    p = problem(seed)
    values, scales = aiter_pages_from_litetopk(p.kv_cache)  # AITER's pair holding the same keys
    captures = graphs.stats["captures"]
    ours = graphs(*p.args(), **p.kwargs())
    theirs = graphs(p.q_fp4, p.q_scale, values, *p.args()[3:], **p.kwargs(), kv_scale=scales)
    assert graphs.stats["captures"] == captures + 2, graphs.stats
    assert_same(theirs, ours, f"seed {seed}: AITER's format vs ours")
    # One buffer, two views of the same address and shape: pages 4,608 bytes apart, then packed.
    pages = p.kv_cache.shape[0]
    slab = torch.zeros(pages, 4608, dtype=torch.uint8)
    slab[:, :4352] = p.kv_cache
    padded = slab[:, :4352]
    packed = slab.view(-1)[: pages * 4352].view(pages, 4352)
    assert padded.data_ptr() == packed.data_ptr() and padded.shape == packed.shape
    for view in (padded, packed):
        p.kv_cache = view
        assert_same(graphs(*p.args(), **p.kwargs()), eager(p), f"seed {seed}: page stride {view.stride(0)}")
    assert graphs.stats["captures"] == captures + 4, graphs.stats


def in_place_args(views: dict, p) -> tuple:
    """p's arguments with every staged input replaced by the runner's own buffer holding p's values."""
    for name, view in views.items():
        view.copy_(getattr(p, name))
    return tuple(
        views.get(name, getattr(p, name))
        for name in ("q_fp4", "q_scale", "kv_cache", "block_table", "weights", "row_to_batch", "starts", "ends")
    )


def test_inputs_in_the_runners_own_buffers_are_not_copied(seed, monkeypatch):
    runner = LiteTopKGraphs(**BOUNDS)
    p = problem(seed)
    views = runner.input_buffers(p.q_fp4.shape[0], p.block_table.shape, topk=p.topk, weights_dtype=p.weights.dtype)
    assert set(views) == set(STAGED_INPUTS)
    arena = (runner._arena.data_ptr(), runner._arena.data_ptr() + runner.arena_bytes)
    assert all(arena[0] <= v.data_ptr() < arena[1] for v in views.values()), "the buffers are not the arena's"
    copies = []
    copy = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda dst, src: (copies.append(len(dst)), copy(dst, src)))
    assert_same(runner(*in_place_args(views, p), **p.kwargs()), eager(p), f"seed {seed}: capturing call in place")
    for step in (1, 2):  # new contents written into the runner's buffers: replays read them, nothing copied
        fresh = problem(seed + step)
        fresh.kv_cache = p.kv_cache
        copies.clear()
        got = runner(*in_place_args(views, fresh), **fresh.kwargs())
        assert copies == [], f"seed {seed}: staged inputs were copied ({copies})"
        assert_same(got, eager(fresh), f"seed {seed}: replay {step} in place")
    assert runner.stats["captures"] == 1 and runner.stats["replays"] == 2, runner.stats
    fresh = problem(seed + 3)
    fresh.kv_cache = p.kv_cache
    args = list(in_place_args(views, fresh))
    args[0] = fresh.q_fp4.clone()  # the caller's own queries: only they are copied
    copies.clear()
    assert_same(runner(*args, **fresh.kwargs()), eager(fresh), f"seed {seed}: queries copied, the rest in place")
    assert copies == [1], copies


def test_an_input_in_the_arena_that_is_not_its_buffer_is_an_input_error(seed):
    runner = LiteTopKGraphs(**BOUNDS)
    p = problem(seed)
    views = runner.input_buffers(p.q_fp4.shape[0], p.block_table.shape, topk=p.topk, weights_dtype=p.weights.dtype)
    args = list(in_place_args(views, p))
    args[7] = views["starts"]  # ends given the starts buffer: in the arena, not ends' own
    with pytest.raises(InputError, match="ends lies in the runner's staging arena but is not its ends buffer"):
        runner(*args, **p.kwargs())
    rows = p.q_fp4.shape[0]
    with pytest.raises(InputError, match="query rows"):
        runner.input_buffers(BOUNDS["max_rows"] + 1, p.block_table.shape, topk=512)
    with pytest.raises(InputError, match="topk=256"):
        runner.input_buffers(rows, p.block_table.shape, topk=256)
    before = runner.arena_bytes
    grown = runner.input_buffers(BOUNDS["max_rows"], (2, 40000), topk=1024)  # a table wider than the bounds
    assert runner.stats["arena_regrowths"] == 1 and runner.arena_bytes > before, runner.stats
    assert grown["block_table"].shape == (2, 40000)


def test_buffers_of_one_shape_serve_every_k_in_place(seed, monkeypatch):
    """input_buffers sizes the arena for every K of the runner: a call of the same shape with the other K
    finds its inputs in place (nothing copied, the arena not grown under them). The block table is wider
    than the bounds (columns past the window bound are never read), so that the arena must grow for it."""
    runner = LiteTopKGraphs(**BOUNDS)
    wide = (2, 100_000)

    def widened(p):
        table = torch.full(wide, -1, dtype=torch.int32)
        table[:, : p.block_table.shape[1]] = p.block_table
        p.block_table = table
        return p

    p = widened(problem(seed, rows=BOUNDS["max_rows"]))
    views = runner.input_buffers(p.q_fp4.shape[0], wide, topk=512, weights_dtype=p.weights.dtype)
    grown = runner.stats["arena_regrowths"]
    copies = []
    copy = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda dst, src: (copies.append(len(dst)), copy(dst, src)))
    for k in (512, 1024):
        fresh = widened(problem(seed + k, rows=BOUNDS["max_rows"], topk=k))
        fresh.kv_cache = p.kv_cache
        copies.clear()
        got = runner(*in_place_args(views, fresh), **fresh.kwargs(), max_seq_len=BOUNDS["max_seq_len"])
        assert copies == [], f"K={k}, seed {seed}: staged inputs were copied ({copies})"
        assert_same(got, eager(fresh, max_seq_len=BOUNDS["max_seq_len"]), f"K={k}, seed {seed}: in place")
    assert grown == 1 and runner.stats["arena_regrowths"] == 1 and runner.stats["captures"] == 2, runner.stats


def test_an_out_tensor_in_the_arena_is_an_input_error(seed):
    """Results go to the caller's memory: an `out` tensor lying in the runner's arena (here over another
    shape's staged queries, which the result copies could overwrite mid-publish) is refused."""
    runner = LiteTopKGraphs(**BOUNDS)
    p = problem(seed)
    rows = p.q_fp4.shape[0]
    other = runner.input_buffers(BOUNDS["max_rows"], p.block_table.shape, topk=512, weights_dtype=p.weights.dtype)
    inside = other["q_fp4"].view(torch.int32).flatten()[:rows]
    with pytest.raises(InputError, match="out\\['counts'\\] lies in the runner's staging arena"):
        runner(*p.args(), **p.kwargs(), out={"counts": inside})
    own = torch.empty(rows, dtype=torch.int32)
    assert_same(runner(*p.args(), **p.kwargs(), out={"counts": own}), eager(p), f"seed {seed}: out outside the arena")
