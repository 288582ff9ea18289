"""The schedule kernels' two ways to a rank (kernels/triton/schedule.py) against build_schedule_torch, bit
for bit, under Triton's interpreter on small shapes: the ordered-input fast paths (a causal prefill's rows
in key order, its programs' spans growing) and the general rows^2 / programs^2 ranks, on sorted, nearly
sorted and unsorted metadata. Each case also checks which path the kernels' programs took: every
program's block tried by a fast path reports its verdict through the helper that reads the rows (or
programs) around the block, which the tests wrap; fast_paths=False compiles the general ranks only.
"""

from __future__ import annotations

import os

import pytest
import torch

from litetopk.kernels.scratch import Scratch
from litetopk.kernels.triton import schedule
from litetopk.kernels.triton.schedule import RANK_BLOCK, build_schedule_torch, build_schedule_triton, max_programs
from tests.kernels.test_triton_stages import random_metadata

pytestmark = [
    pytest.mark.interpret,
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1",
        reason="interpreter only: on a GPU the Triton stages run compiled in every operator test",
    ),
]


def prefill(sequences: list[tuple[int, int]], window: int = 0):
    """Effective metadata of causal prefill rows in row order: for each sequence (rows, first raw position),
    in order, its rows' windows over C4 keys end at (position + 1) // 4 and start at 0, or `window` keys
    before the end; rows whose window is empty (the first tokens) carry zeros (kernels/row_checks.py)."""
    rtb, starts, ends = [], [], []
    for b, (rows, first) in enumerate(sequences):
        end = (torch.arange(first, first + rows) + 1) // 4
        start = (end - window).clamp_min(0) if window else torch.zeros_like(end)
        rtb.append(torch.full_like(end, b))
        starts.append(start)
        ends.append(end)
    rtb, starts, ends = (torch.cat(t).to(torch.int32) for t in (rtb, starts, ends))
    live = ends > starts
    return tuple(torch.where(live, t, 0) for t in (rtb, starts, ends)) + (len(sequences),)


def _between(gen, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def from_the_first_token(gen):
    return prefill([(_between(gen, 100, 300), 0)])


def a_sequence_tail(gen):
    return prefill([(_between(gen, 100, 300), _between(gen, 500, 5000))])


def sliding_windows(gen):
    return prefill([(_between(gen, 100, 300), _between(gen, 0, 200))], window=_between(gen, 5, 40))


def one_window(gen):
    n = 150
    return (
        torch.zeros(n, dtype=torch.int32),
        torch.full((n,), _between(gen, 0, 50), dtype=torch.int32),
        torch.full((n,), _between(gen, 60, 90), dtype=torch.int32),
        1,
    )


def sequences_from_their_first_tokens(gen):
    return prefill([(_between(gen, 20, 90), 0) for _ in range(_between(gen, 2, 4))])


def sequences_with_sliding_windows(gen):
    return prefill([(_between(gen, 20, 90), _between(gen, 0, 300)) for _ in range(3)], window=20)


def an_empty_row_in_the_middle(gen):
    rtb, starts, ends, batch = prefill([(200, _between(gen, 40, 400))])
    row = _between(gen, 40, 160)
    for t in (rtb, starts, ends):
        t[row] = 0
    return rtb, starts, ends, batch


def one_swapped_pair(gen):
    rtb, starts, ends, batch = prefill([(200, _between(gen, 200, 400))], window=8)
    a = _between(gen, 60, 100)
    for t in (rtb, starts, ends):
        t[[a, a + 40]] = t[[a + 40, a]]
    return rtb, starts, ends, batch


def sequences_out_of_order(gen):
    """Three sequences' prefill rows, the sequences in the order 2, 0, 1."""
    rtb, starts, ends, batch = prefill([(_between(gen, 30, 80), _between(gen, 0, 400)) for _ in range(3)])
    order = torch.cat([torch.nonzero(rtb == b).flatten() for b in (2, 0, 1)])
    return rtb[order].contiguous(), starts[order].contiguous(), ends[order].contiguous(), batch


def random_rows(gen):
    return random_metadata(gen, _between(gen, 60, 200), 3) + (3,)


# name -> (metadata from a generator, the rank kernel's expected paths, the order kernel's): "fast" every
# program, "mixed" some of each, "general" some general (a block may pass by chance), None unchecked.
CASES = {
    "causal prefill from the first token (leading empty rows)": (from_the_first_token, "fast", "fast"),
    "causal prefill of a sequence's tail (no empty rows, tied ends)": (a_sequence_tail, "fast", "fast"),
    "sliding windows (starts and ends increasing)": (sliding_windows, "fast", None),  # spans of W or W + 1
    "one window for every row (ties)": (one_window, "fast", "fast"),
    "several sequences in sorted order, each from its first token": (sequences_from_their_first_tokens, "fast", None),
    "several sequences in sorted order, sliding windows": (sequences_with_sliding_windows, "fast", None),
    "an empty row in the middle": (an_empty_row_in_the_middle, "fast", "fast"),
    "one swapped pair": (one_swapped_pair, "mixed", None),
    "sequences out of order": (sequences_out_of_order, "general", None),
    "random metadata": (random_rows, "general", None),
}


@pytest.fixture
def paths(monkeypatch):
    """{"rank": [...], "order": [...]}: the verdict (took the fast path) of every program of the rank and the
    order kernel whose own block was in order, recorded from the helpers that read around the block."""
    seen = {"rank": [], "order": []}
    for kernel, helper in (("rank", "_rows_around_in_order"), ("order", "_lengths_around_in_order")):
        wrapped = getattr(schedule, helper)

        def record(*args, _wrapped=wrapped, _kernel=kernel):
            out = _wrapped(*args)
            seen[_kernel].append(bool(out[0].handle.data))  # the interpreter's scalar
            return out

        monkeypatch.setattr(schedule, helper, record)
    return seen


def _check_paths(where: str, verdicts: list[bool], programs: int, expect: str | None):
    fast = sum(verdicts)
    if expect == "fast":
        assert fast == programs, f"{where}: {fast} of {programs} programs on the fast path"
    elif expect == "mixed":
        assert 0 < fast < programs, f"{where}: {fast} of {programs} programs on the fast path (want some of each)"
    elif expect == "general":
        assert fast < programs, f"{where}: every program on the fast path"


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("block_rows", [1, 2, 3])
@pytest.mark.parametrize("fast_paths", [True, False])
@pytest.mark.parametrize("chunk", ["production", "small"])
def test_both_rank_paths_give_the_torch_schedule(name, block_rows, fast_paths, chunk, paths, seed, monkeypatch):
    if chunk == "small":  # several chunks (and a partial last one) through every chunked loop
        monkeypatch.setattr(schedule, "SCAN", 32)
        monkeypatch.setattr(schedule, "FLAGS", 32)
    gen = torch.Generator().manual_seed(seed)
    build, rank_paths, order_paths = CASES[name]
    rtb, starts, ends, batch = build(gen)
    n = rtb.shape[0]
    q_wide = torch.rand(n, generator=gen) < 0.3
    flags = torch.tensor([int(torch.rand(1, generator=gen) < 0.5), 0], dtype=torch.int32)
    want = build_schedule_torch(rtb, starts, ends, batch, block_rows, q_wide, flags)
    got = build_schedule_triton(
        rtb, starts, ends, batch, block_rows, q_wide, flags, Scratch("cpu"), fast_paths=fast_paths
    )
    where = (
        f"[{name}] rows {n}, batch {batch}, block_rows {block_rows}, fast_paths {fast_paths}, chunk {chunk}, "
        f"seed {seed}"
    )
    for field in ("rows", "batch", "span", "q_wide"):
        assert torch.equal(getattr(got, field), getattr(want, field)), f"{where}: {field}"
    for variant, (g, w) in enumerate(zip(got.variants, want.variants)):
        assert torch.equal(g[0], w[0]), f"{where}: variant {variant} rows"
        assert torch.equal(g[1], w[1]), f"{where}: variant {variant} span"
    if not fast_paths:
        assert paths == {"rank": [], "order": []}, f"{where}: a fast path ran"
        return
    _check_paths(f"{where}, rank kernel", paths["rank"], -(-n // RANK_BLOCK), rank_paths)
    _check_paths(
        f"{where}, order kernel", paths["order"], -(-max_programs(n, batch, block_rows) // RANK_BLOCK), order_paths
    )
