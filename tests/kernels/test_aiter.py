"""The AITER drop-in (kernels/aiter.py) on the CPU reference: AITER's arguments in, our answer out.

Checks: the same keys give the same answer as `litetopk_prefill` in our layout; the status table
(each of our bits to AITER's); bad rows, windows past max_seq_len and NaN weights fail only their
row; AITER's guard columns are never read; `out` is written in place; enforce_status raises.
"""

from __future__ import annotations

import pytest
import torch

from litetopk.kernels import InputError, RowFaultError, RowStatus, litetopk_prefill
from litetopk.kernels.aiter import (
    STATUS_BAD_CERTIFICATE,
    STATUS_CANDIDATE_OVERFLOW,
    STATUS_INVALID_INDEX,
    STATUS_NONFINITE,
    STATUS_SELECTOR_FAILURE,
    STATUS_UNDERFILLED,
    FP4LiteTopKResult,
    aiter_status,
    allocate_fp4_litetopk_workspace,
    flydsl_pa_mqa_litetopk_fp4_prefill,
)
from litetopk.kernels.aiter_layout import aiter_pages_from_litetopk, shuffle_q_scale_aiter
from tests.problems import make_problem

# The table of docs/cache-layouts.md, restated: our bit -> AITER's bits.
REF_STATUS_TABLE = {
    1: STATUS_CANDIDATE_OVERFLOW | STATUS_BAD_CERTIFICATE,
    2: STATUS_UNDERFILLED | STATUS_BAD_CERTIFICATE,
    4: STATUS_NONFINITE,
    8: STATUS_INVALID_INDEX,
    16: STATUS_INVALID_INDEX,
    32: STATUS_SELECTOR_FAILURE,
}


def ref_aiter_status(ours: int) -> int:
    out = 0
    for bit, theirs in REF_STATUS_TABLE.items():
        if ours & bit:
            out |= theirs
    return out


def test_status_table_maps_every_combination():
    ours = torch.arange(64, dtype=torch.int32)
    got = aiter_status(ours).tolist()
    assert got == [ref_aiter_status(s) for s in range(64)]
    assert {int(b) for b in RowStatus if b and b < 64} == set(REF_STATUS_TABLE), "a RowStatus bit has no AITER mapping"


def test_every_status_bit_fails_closed_in_aiter_bits():
    """Every row that publishes nothing (any nonzero RowStatus) must carry a nonzero AITER status."""
    every = 0
    for bit in RowStatus:
        every |= int(bit)
    ours = torch.arange(1, every + 1, dtype=torch.int32)
    theirs = aiter_status(ours)
    open_rows = [RowStatus(int(s)).name for s in ours[theirs == 0].tolist()]
    assert not open_rows, f"these status words map to AITER status 0: {open_rows[:8]}"


def aiter_args(p, max_seq_len: int | None = None, guard_columns: int = 0, guard_value: int = 0):
    """AITER's positional arguments for problem `p` (cache in AITER's layout, bf16 weights)."""
    values, scales = aiter_pages_from_litetopk(p.kv_cache)
    table = p.block_table
    if guard_columns:
        guard = torch.full((table.shape[0], guard_columns), guard_value, dtype=torch.int32)
        table = torch.cat([table, guard], dim=1)
    seq = max_seq_len if max_seq_len is not None else p.block_table.shape[1] * 64
    return (
        p.q_fp4,
        shuffle_q_scale_aiter(p.q_scale),
        values,
        scales,
        table,
        p.weights.to(torch.bfloat16),
        p.row_to_batch,
        p.starts,
        p.ends,
        seq,
    )


def ours(p, **kw):
    return litetopk_prefill(
        *p.args()[:4], p.weights.to(torch.bfloat16), *p.args()[5:], topk=p.topk, backend="reference", **kw
    )


def assert_same_answer(got: FP4LiteTopKResult, want, where: str) -> None:
    for name, field in (
        ("values", "values"),
        ("raw_indices", "raw_indices"),
        ("physical_indices", "physical_indices"),
        ("counts", "counts"),
        ("candidate_counts", "candidates"),
    ):
        assert torch.equal(getattr(got, name), getattr(want, field)), f"{where}: {name} differs"


@pytest.mark.parametrize("topk", [512, 1024])
def test_dropin_answers_as_our_operator(topk, seed):
    p = make_problem(seed, seq_lens=[900, 500], rows_per_seq=2, topk=topk, spread=2)
    got = flydsl_pa_mqa_litetopk_fp4_prefill(*aiter_args(p), topk=topk, backend="reference")
    want = ours(p)
    assert_same_answer(got, want, f"topk {topk}, seed {seed}")
    assert got.status.tolist() == [0] * p.q_fp4.shape[0], f"seed {seed}"


def test_guard_columns_past_max_seq_len_are_never_read(seed):
    p = make_problem(seed, seq_lens=[700], rows_per_seq=3, spread=1)
    max_seq_len = p.block_table.shape[1] * 64
    got = flydsl_pa_mqa_litetopk_fp4_prefill(
        *aiter_args(p, max_seq_len, guard_columns=4, guard_value=2**30), backend="reference"
    )
    assert_same_answer(got, ours(p), f"seed {seed}")


def test_bad_rows_fail_alone_with_aiter_bits(seed):
    p = make_problem(seed, seq_lens=[700, 400], rows_per_seq=2, causal=False, spread=1)
    p.ends[0] = 700
    p.row_to_batch[1] = 5  # no such sequence
    p.weights[2, 3] = float("nan")
    p.starts[2], p.ends[2] = 128, 256  # row 2 (sequence 1) does not read page 0
    p.starts[3], p.ends[3] = 0, 100  # row 3 (sequence 1) does
    p.block_table[1, 0] = -7
    max_seq_len = 650  # row 0's window ends past it
    args = aiter_args(p, max_seq_len)
    with pytest.raises(RowFaultError):
        flydsl_pa_mqa_litetopk_fp4_prefill(*args, backend="reference")
    got = flydsl_pa_mqa_litetopk_fp4_prefill(*args, backend="reference", enforce_status=False)
    want_bits = [STATUS_INVALID_INDEX, STATUS_INVALID_INDEX, STATUS_NONFINITE, STATUS_INVALID_INDEX]
    assert got.status.tolist() == want_bits, f"seed {seed}: {got.status.tolist()}"
    assert bool((got.raw_indices == -1).all()) and bool((got.counts == 0).all()), f"seed {seed}: published"


def test_out_tensors_are_written_in_place(seed):
    p = make_problem(seed, seq_lens=[600], rows_per_seq=2, spread=1)
    rows, k = p.q_fp4.shape[0], p.topk
    out = FP4LiteTopKResult(
        values=torch.empty(rows, k),
        raw_indices=torch.empty(rows, k, dtype=torch.int32),
        physical_indices=torch.empty(rows, k, dtype=torch.int32),
        counts=torch.empty(rows, dtype=torch.int32),
        candidate_counts=torch.empty(rows, dtype=torch.int32),
        status=torch.full((rows,), 99, dtype=torch.int32),
    )
    pointers = [t.data_ptr() for t in out]
    workspace = allocate_fp4_litetopk_workspace(rows, "cpu", topk=k)
    got = flydsl_pa_mqa_litetopk_fp4_prefill(*aiter_args(p), workspace=workspace, out=out, backend="reference")
    assert [t.data_ptr() for t in got] == pointers, "the result must be the caller's tensors"
    assert_same_answer(got, ours(p), f"seed {seed}")
    bad = out._replace(physical_indices=torch.empty(rows, k, dtype=torch.int64))
    with pytest.raises(InputError, match="out.physical_indices must be int32"):
        flydsl_pa_mqa_litetopk_fp4_prefill(*aiter_args(p), out=bad, backend="reference")


def test_a_workspace_sized_for_max_seq_len_serves_the_call(seed):
    """allocate_fp4_litetopk_workspace(..., max_seq_len=) holds the operator's buffers: the call runs on
    it (an allocator-free call gives the same answer) and a workspace for fewer rows is refused."""
    p = make_problem(seed, seq_lens=[700, 300], rows_per_seq=2, spread=1)
    args = aiter_args(p)
    rows, k, max_seq_len = p.q_fp4.shape[0], p.topk, args[9]
    workspace = allocate_fp4_litetopk_workspace(
        rows, "cpu", topk=k, max_seq_len=max_seq_len, max_batch=p.block_table.shape[0], backend="reference"
    )
    assert workspace.buffer is not None and workspace.buffer.numel() > 0, f"seed {seed}: no buffer"
    workspace.buffer.fill_(0xA5)  # poisoned: the call must not read what it did not write
    got = flydsl_pa_mqa_litetopk_fp4_prefill(*args, workspace=workspace, backend="reference")
    assert not bool((workspace.buffer == 0xA5).all()), f"seed {seed}: the call did not run on the workspace"
    assert_same_answer(got, ours(p), f"seed {seed}")
    small = allocate_fp4_litetopk_workspace(rows - 1, "cpu", topk=k)
    with pytest.raises(InputError, match="workspace is incompatible"):
        flydsl_pa_mqa_litetopk_fp4_prefill(*args, workspace=small, backend="reference")


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(sample_len=4096), "sample_len=4096 is not supported"),
        (dict(merge_cap=1024), "merge_cap=1024 is not supported"),
        (dict(topk=2048), r"topk in \(512, 1024\)"),
        (dict(max_seq_len=0), "max_seq_len must be"),
        (dict(max_seq_len=10**6), "max_seq_len must be"),
        (dict(max_seq_len=64 * 40), "exceeds block_tables capacity"),
    ],
)
def test_aiter_argument_checks(change, message, seed):
    p = make_problem(seed, seq_lens=[300], rows_per_seq=1, spread=1)
    args = list(aiter_args(p))
    if "max_seq_len" in change:
        args[9] = change.pop("max_seq_len")
    with pytest.raises(InputError, match=message):
        flydsl_pa_mqa_litetopk_fp4_prefill(*args, backend="reference", **change)
