"""The one validation layer (docs/contract.md §1-§3): call-level errors say what to change; row-level
faults become status bits of exactly those rows; slots are 64-bit and never wrap (a row reading a
page whose slots are beyond int32 gets SLOT_OVERFLOW; nothing is raised for it).

Row faults are checked here on `validate_prefill` directly; test_reference_operator.py checks
that such rows publish nothing while the other rows stay exact.
"""

from __future__ import annotations

import pytest
import torch

from litetopk.kernels import (
    SUPPORTED_TOPK,
    InputDtypeError,
    InputError,
    InputShapeError,
    RowFaultError,
    RowStatus,
    UnsupportedTopKError,
    dense_topk_prefill,
    litetopk_prefill,
)
from litetopk.kernels.assembly import assemble_result
from litetopk.kernels.keys import NO_KEY, make_keys
from litetopk.kernels.problem import ZEROED_WORDS
from litetopk.kernels.row_checks import FIRST_UNMAPPABLE_PAGE, row_checks_torch
from litetopk.kernels.scratch import Scratch
from litetopk.kernels.validation import validate_prefill
from tests.problems import make_problem

INT32_MAX = 2**31 - 1
LAST_PAGE_THAT_FITS = 2**25 - 1  # (2^25 - 1) * 64 + 63 == 2^31 - 1

ARG_NAMES = ("q_fp4", "q_scale", "kv_cache", "block_table", "weights", "row_to_batch", "starts", "ends")


def small_args(seed: int) -> dict:
    """Two sequences of 200 keys (4 pages each, a 5th table column of -1), four rows with windows
    row 0: b0 [0, 200), row 1: b0 [70, 130), row 2: b1 [0, 130), row 3: b1 [64, 128)."""
    p = make_problem(seed, seq_lens=[200, 200], rows_per_seq=2)
    args = dict(zip(ARG_NAMES, p.args()))
    args["starts"] = torch.tensor([0, 70, 0, 64], dtype=torch.int32)
    args["ends"] = torch.tensor([200, 130, 130, 128], dtype=torch.int32)
    assert args["block_table"].shape == (2, 5) and (args["block_table"][:, 4] == -1).all()
    return args


def noncontiguous(t: torch.Tensor) -> torch.Tensor:
    out = (
        torch.empty(t.shape[::-1], dtype=t.dtype).t()
        if t.ndim == 2
        else torch.empty(t.shape + (2,), dtype=t.dtype)[..., 0]
    )
    out.copy_(t)
    assert not out.is_contiguous() and torch.equal(out, t)
    return out


# (argument, change, words the message must contain)
BAD_CALLS = {
    "q_fp4 dtype": ("q_fp4", lambda t: t.view(torch.int8), "q_fp4 must be uint8"),
    "q_fp4 head dim": ("q_fp4", lambda t: t[:, :, :32].contiguous(), "q_fp4 must have shape"),
    "q_fp4 heads": ("q_fp4", lambda t: t[:, :32].contiguous(), "q_fp4 must have shape"),
    "q_fp4 not contiguous": ("q_fp4", noncontiguous, "q_fp4 must be contiguous"),
    "q_scale dtype": ("q_scale", lambda t: t.float(), "q_scale must be uint8"),
    "q_scale rows": ("q_scale", lambda t: t[:-1].contiguous(), "q_scale must have shape"),
    "kv_cache dtype": ("kv_cache", lambda t: t.view(torch.int8), "kv_cache must be a uint8"),
    "kv_cache page bytes": ("kv_cache", lambda t: t[:, :4351].contiguous(), "kv_cache must be [num_pages, 4352]"),
    "kv_cache page layout transposed": (
        "kv_cache",
        lambda t: t.view(-1, 64, 68).transpose(1, 2),
        "the bytes of one page of kv_cache must be contiguous",
    ),
    "block_table dtype": ("block_table", lambda t: t.long(), "block_table must be int32"),
    "block_table rank": ("block_table", lambda t: t.flatten(), "block_table must have shape"),
    "block_table not contiguous": ("block_table", noncontiguous, "block_table must be contiguous"),
    "weights float16": ("weights", lambda t: t.half(), "weights must be float32 or bfloat16"),
    "weights float64": ("weights", lambda t: t.double(), "weights must be float32 or bfloat16"),
    "weights heads": ("weights", lambda t: t[:, :32].contiguous(), "weights must have shape"),
    "weights not contiguous": ("weights", noncontiguous, "weights must be contiguous"),
    "weights on another device": ("weights", lambda t: t.to("meta"), "one device"),
    "weights not a tensor": ("weights", lambda t: t.tolist(), "weights must be a torch.Tensor"),
    "row_to_batch dtype": ("row_to_batch", lambda t: t.long(), "row_to_batch must be int32"),
    "starts rows": ("starts", lambda t: torch.cat([t, t[:1]]), "starts must have shape"),
    "ends dtype": ("ends", lambda t: t.short(), "ends must be int32"),
    "ends not contiguous": ("ends", noncontiguous, "ends must be contiguous"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_malformed_argument_is_an_input_error(case, seed):
    name, change, words = BAD_CALLS[case]
    args = small_args(seed)
    args[name] = change(args[name])
    with pytest.raises(InputError) as info:
        validate_prefill(*args.values(), topk=512)
    assert isinstance(info.value, ValueError), case
    assert words in str(info.value), f"{case}: message {str(info.value)!r} should say {words!r}"


def expected_error(case: str) -> type:
    """The InputError subclass a BAD_CALLS case raises: dtype and shape faults are told apart."""
    if "dtype" in case or "float" in case:
        return InputDtypeError
    if any(word in case for word in ("dim", "heads", "rows", "page bytes", "rank")):
        return InputShapeError
    return InputError  # layout, device, type: neither a dtype nor a shape


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_dtype_and_shape_faults_have_their_own_class(case, seed):
    name, change, _ = BAD_CALLS[case]
    args = small_args(seed)
    args[name] = change(args[name])
    with pytest.raises(InputError) as info:
        validate_prefill(*args.values(), topk=512)
    assert type(info.value) is expected_error(case), f"{case}: raised {type(info.value).__name__}"


@pytest.mark.parametrize("weight_scale", [float("nan"), float("inf"), -float("inf"), True, "1.0", None])
def test_weight_scale_must_be_a_finite_number(weight_scale, seed):
    with pytest.raises(InputError, match="weight_scale"):
        validate_prefill(*small_args(seed).values(), topk=512, weight_scale=weight_scale)


@pytest.mark.parametrize("topk", [2048, 256, 0, -512, 513, 1023, True, 512.0, "512", None])
def test_unsupported_topk_names_the_supported_set(topk, seed):
    with pytest.raises(UnsupportedTopKError) as info:
        validate_prefill(*small_args(seed).values(), topk=topk)
    assert isinstance(info.value, ValueError) and isinstance(info.value, InputError)
    assert "(512, 1024)" in str(info.value) and f"topk={topk!r}" in str(info.value), str(info.value)


@pytest.mark.parametrize("operator", [litetopk_prefill, dense_topk_prefill], ids=["litetopk", "dense"])
def test_operators_reject_topk_2048(operator, seed):
    with pytest.raises(UnsupportedTopKError, match=r"topk=2048 is not supported; supported: \(512, 1024\)"):
        operator(*small_args(seed).values(), topk=2048, backend="reference")


@pytest.mark.parametrize("topk", SUPPORTED_TOPK)
def test_supported_topk_and_accepted_variants(topk, seed):
    args = small_args(seed)
    assert SUPPORTED_TOPK == (512, 1024)
    plain = validate_prefill(*args.values(), topk=topk)
    assert plain.topk == topk and plain.row_status.tolist() == [0, 0, 0, 0]
    # the [num_pages, 64, 1, 68] view of some stacks, and bfloat16 weights widened exactly
    args["kv_cache"] = args["kv_cache"].view(-1, 64, 1, 68)
    args["weights"] = args["weights"].bfloat16()
    varied = validate_prefill(*args.values(), topk=topk)
    assert (
        torch.equal(varied.cache.values, plain.cache.values) and varied.cache.values.shape == plain.cache.values.shape
    )
    assert varied.weights.dtype == torch.float32
    assert torch.equal(varied.weights, args["weights"].float())


def _set(name, index, value):
    def change(args):
        args[name][index] = value

    return change


def _num_pages(args):
    return args["kv_cache"].shape[0]


# (changes to small_args, expected status of rows 0..3)
ROW_FAULTS = {
    "batch index == batch": ([_set("row_to_batch", 1, 2)], [0, 16, 0, 0]),
    "negative batch index": ([_set("row_to_batch", 1, -1)], [0, 16, 0, 0]),
    "negative start": ([_set("starts", 1, -1)], [0, 16, 0, 0]),
    "start after end": ([_set("starts", 1, 131)], [0, 16, 0, 0]),
    "end past the block table": ([_set("ends", 1, 5 * 64 + 1)], [0, 16, 0, 0]),
    "end at the table's end, last page -1": ([_set("ends", 1, 5 * 64)], [0, 8, 0, 0]),
    "live page -1": ([_set("block_table", (0, 1), -1)], [8, 8, 0, 0]),
    "live page past the cache": ([lambda a: _set("block_table", (1, 1), _num_pages(a))(a)], [0, 0, 8, 8]),
    "live page far past the cache": ([_set("block_table", (1, 0), 2**31 - 1)], [0, 0, 8 | 64, 0]),
    "live page 2^25 (slots beyond int32)": ([_set("block_table", (0, 2), 2**25)], [8 | 64, 8 | 64, 0, 0]),
    "live page 2^25 - 1 (past the cache, slots fit)": ([_set("block_table", (0, 3), 2**25 - 1)], [8, 0, 0, 0]),
    "page 2^25 outside every window": ([_set("block_table", (1, 3), 2**25)], [0, 0, 0, 0]),
    "bad window and page 2^25": ([_set("block_table", (0, 1), 2**25), _set("starts", 1, -3)], [8 | 64, 16, 0, 0]),
    "bad page right after a window": ([_set("block_table", (1, 2), -5)], [0, 0, 8, 0]),
    "bad page outside every window": (
        [_set("block_table", (0, 4), 10**6), _set("block_table", (1, 4), -7)],
        [0, 0, 0, 0],
    ),
    "bad page before a window": ([_set("block_table", (0, 0), -1), _set("starts", 0, 64)], [0, 0, 0, 0]),
    "nan weight": ([_set("weights", (2, 5), float("nan"))], [0, 0, 4, 0]),
    "inf weight": ([_set("weights", (3, 63), float("inf"))], [0, 0, 0, 4]),
    "-inf weight": ([_set("weights", (0, 0), -float("inf"))], [4, 0, 0, 0]),
    "bad page and nan weight": (
        [_set("block_table", (0, 1), -1), _set("weights", (1, 0), float("nan"))],
        [8, 12, 0, 0],
    ),
    "bad window and nan weight": ([_set("ends", 3, 10**6), _set("weights", (3, 0), float("nan"))], [0, 0, 0, 20]),
    "empty window": ([_set("starts", 1, 77), _set("ends", 1, 77)], [0, 0, 0, 0]),
    "empty window at the table's end": ([_set("starts", 1, 320), _set("ends", 1, 320)], [0, 0, 0, 0]),
}


@pytest.mark.parametrize("case", list(ROW_FAULTS))
def test_row_faults_become_status_bits(case, seed):
    changes, want = ROW_FAULTS[case]
    args = small_args(seed)
    for change in changes:
        change(args)
    original = {k: v.clone() for k, v in args.items()}
    problem = validate_prefill(*args.values(), topk=512)
    assert problem.row_status.tolist() == want, (
        f"{case}: status {[RowStatus(s).name for s in problem.row_status.tolist()]}, "
        f"want {[RowStatus(s).name for s in want]}"
    )
    faulty = torch.tensor(want) != 0
    # a faulty row's window is emptied, so backends never read through it ...
    assert (problem.starts[faulty] == problem.ends[faulty]).all(), case
    # ... and every other row keeps its window exactly
    ok = ~faulty
    assert torch.equal(problem.starts[ok], args["starts"][ok]) and torch.equal(problem.ends[ok], args["ends"][ok]), case
    assert torch.equal(problem.row_to_batch[ok], args["row_to_batch"][ok]), case
    assert problem.sequence_ends.tolist() == ref_sequence_ends(args, want), f"{case}: {problem.sequence_ends.tolist()}"
    assert problem.zeroed.tolist() == [0] * (ZEROED_WORDS + 2), case
    for name in ARG_NAMES:  # validation never writes to its inputs (compared bit for bit: NaN too)
        got, was = args[name].flatten(), original[name].flatten()
        assert torch.equal(got.view(torch.uint8), was.view(torch.uint8)), f"{case}: {name} was modified"


def ref_sequence_ends(args: dict, status: list[int]) -> list[int]:
    """Per sequence: the largest end of its rows' windows that are not INVALID_ROW (plain Python)."""
    batch = args["block_table"].shape[0]
    ends = [0] * batch
    for b, end, bits in zip(args["row_to_batch"].tolist(), args["ends"].tolist(), status):
        if not bits & RowStatus.INVALID_ROW:
            ends[b] = max(ends[b], end)
    return ends


def poisoned_scratch(device, seed: int) -> Scratch:
    """A Scratch over a workspace of random bytes: whatever a kernel does not write stays garbage."""
    gen = torch.Generator().manual_seed(seed)
    return Scratch(torch.device(device), torch.randint(0, 256, (1 << 16,), generator=gen, dtype=torch.uint8).to(device))


@pytest.mark.interpret
@pytest.mark.parametrize("case", list(ROW_FAULTS))
def test_row_checks_kernel_finds_the_same_faults(case, seed):
    """row_checks_triton (kernels/row_checks.py: what validation runs on a CUDA device) on the same cases: the
    same status bits and the same effective windows as the torch checks, the sequences' ends, and
    its zeroed words written over a poisoned workspace."""
    from litetopk.kernels.row_checks import row_checks_triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    changes, want = ROW_FAULTS[case]
    args = small_args(seed)
    for change in changes:
        change(args)
    checked = row_checks_triton(
        args["block_table"].to(device),
        _num_pages(args),
        args["weights"].float().to(device),
        *(args[name].to(device) for name in ("row_to_batch", "starts", "ends")),
        5 * 64,
        scratch=poisoned_scratch(device, seed),
    )
    assert checked.status.cpu().tolist() == want, f"{case}: {checked.status.cpu().tolist()} vs {want}"
    ok = torch.tensor(want) == 0
    for i, name in enumerate(("row_to_batch", "starts", "ends")):
        assert torch.equal(checked.effective[i].cpu(), torch.where(ok, args[name], 0)), f"{case}: effective {name}"
    assert checked.sequence_ends.cpu().tolist() == ref_sequence_ends(args, want), case
    assert checked.zeroed.cpu().tolist() == [0] * (ZEROED_WORDS + 2), case


@pytest.mark.interpret
@pytest.mark.parametrize("rows, batch", [(0, 3), (5, 0), (0, 0), (1100, 2)])
def test_row_checks_kernel_without_rows_or_sequences(rows, batch, seed):
    """No rows: every sequence ends at 0; no sequence: every row is INVALID_ROW; many rows (two of the
    sequences' blocks of BLOCK_ROWS): the ends as the torch checks give them. The zeroed words in every case."""
    from litetopk.kernels.row_checks import BLOCK_ROWS, row_checks_torch, row_checks_triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(seed)
    block_table = torch.randint(0, 50, (batch, 8), generator=gen, dtype=torch.int32)
    ends = torch.randint(0, 8 * 64 + 40, (rows,), generator=gen, dtype=torch.int32)  # some past the bound
    starts = (ends - torch.randint(0, 300, (rows,), generator=gen, dtype=torch.int32)).clamp_min(-2)
    row_to_batch = torch.randint(-1, max(batch, 1) + 1, (rows,), generator=gen, dtype=torch.int32)
    if rows > BLOCK_ROWS:  # only the last row, in the second block, ends sequence 0 at the bound
        first = row_to_batch[:-1] == 0
        ends[:-1][first] = ends[:-1][first].clamp_max(8 * 64 - 1)
        starts = torch.minimum(starts, ends)
        starts[-1], ends[-1], row_to_batch[-1] = 0, 8 * 64, 0
    weights = torch.randn(rows, 64, generator=gen)
    args = (block_table, 50, weights, row_to_batch, starts, ends, 8 * 64)
    want = row_checks_torch(*args)
    got = row_checks_triton(
        *(a.to(device) if isinstance(a, torch.Tensor) else a for a in args), scratch=poisoned_scratch(device, seed)
    )
    for name, a, b in zip(want._fields, got, want):
        assert torch.equal(a.cpu(), b), f"rows {rows}, batch {batch}: {name}"
    assert want.zeroed.tolist() == [0] * (ZEROED_WORDS + batch)
    if rows and batch:
        assert 0 < int(want.sequence_ends.max()) <= 8 * 64, "the case has rows in range"
    if rows > BLOCK_ROWS:
        assert int(want.sequence_ends[0]) == 8 * 64, "the second block's row sets sequence 0's end"


# ---- 64-bit slot arithmetic ---------------------------------------------------------------------


def test_max_seq_len_bounds_every_window_end(seed):
    """max_end = min(max_seq_len, max_pages * 64): rows ending past it are INVALID_ROW, rows ending at
    it are fine; a max_seq_len above the table's end changes nothing; a bad max_seq_len is an InputError."""
    args = small_args(seed)  # ends 200, 130, 130, 128; the table ends at 320
    problem = validate_prefill(*args.values(), topk=512, max_seq_len=130)
    assert problem.max_end == 130 and problem.row_status.tolist() == [16, 0, 0, 0]
    assert int(problem.ends[0]) == 0 and problem.ends[1:].tolist() == [130, 130, 128]
    assert validate_prefill(*args.values(), topk=512, max_seq_len=129).row_status.tolist() == [16, 16, 16, 0]
    wide = validate_prefill(*args.values(), topk=512, max_seq_len=10**6)
    assert wide.max_end == 5 * 64 and wide.row_status.tolist() == [0, 0, 0, 0]
    assert validate_prefill(*args.values(), topk=512).max_end == 5 * 64
    for bad in (-1, 1.5, True, "130"):
        with pytest.raises(InputError, match="max_seq_len"):
            validate_prefill(*args.values(), topk=512, max_seq_len=bad)


# ---- 64-bit slot arithmetic ---------------------------------------------------------------------


def test_first_unmappable_page_is_the_int32_limit():
    assert FIRST_UNMAPPABLE_PAGE == LAST_PAGE_THAT_FITS + 1 == 2**25
    assert LAST_PAGE_THAT_FITS * 64 + 63 == INT32_MAX


# Row checks with a cache large enough that no page below is "past the cache" (the checks read only
# num_pages, never the cache): rows of sequence 0 (pages of column 0..3), windows per row.
SLOT_CASES = {
    "pages that fit": ([0, 1000, LAST_PAGE_THAT_FITS, 5], [0, 0, 0]),
    "2^25 in every window": ([LAST_PAGE_THAT_FITS + 1, 1, 2, 3], [64, 0, 0]),
    "2^26 read by rows 0 and 2": ([0, 2**26, 2, 3], [64, 64, 0]),
    "int32 max read by every row": ([0, 1, 2**31 - 1, 3], [8 | 64, 8 | 64, 8 | 64]),  # also >= num_pages
    "int32 max - 1 read by every row": ([0, 1, 2**31 - 2, 3], [64, 64, 64]),
    "beyond int32, outside every window": ([0, 1, 2, 2**25 + 9], [0, 0, 0]),
    "negative and unmappable": ([-1, 1, 2**25, 3], [8 | 64, 64, 64]),
}
SLOT_WINDOWS = ([0, 130], [64, 150], [128, 192])  # pages 0-2, 1-2, 2


def slot_case(case: str):
    pages, want = SLOT_CASES[case]
    block_table = torch.tensor([pages, [4, 5, 6, 7]], dtype=torch.int32)
    weights = torch.zeros(4, 64)
    weights[3, 9] = float("nan")  # row 3: sequence 1, NONFINITE only
    starts = torch.tensor([w[0] for w in SLOT_WINDOWS] + [0], dtype=torch.int32)
    ends = torch.tensor([w[1] for w in SLOT_WINDOWS] + [256], dtype=torch.int32)
    return (block_table, 2**31 - 1, weights, torch.tensor([0, 0, 0, 1], dtype=torch.int32), starts, ends, 256), want + [
        4
    ]


@pytest.mark.parametrize("case", list(SLOT_CASES))
def test_row_checks_flag_slot_overflow(case):
    args, want = slot_case(case)
    status, effective, sequence_ends, _ = row_checks_torch(*args)
    assert status.tolist() == want, f"{case}: {[RowStatus(s).name for s in status.tolist()]}"
    ok = torch.tensor(want) == 0
    for i, t in enumerate(args[3:6]):
        assert torch.equal(effective[i], torch.where(ok, t, 0)), case
    # rows with bad or unmappable pages and the NONFINITE row count: their windows are in range
    assert sequence_ends.tolist() == [192, 256], case


@pytest.mark.interpret
@pytest.mark.parametrize("case", list(SLOT_CASES))
def test_row_checks_twins_agree_on_slot_overflow(case):
    """The Triton twin (row_checks_triton, kernels/row_checks.py) against the torch checks: same bits, same
    effective metadata."""
    from litetopk.kernels.row_checks import row_checks_triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    args, want = slot_case(case)
    reference = row_checks_torch(*args)
    checked = row_checks_triton(*(a.to(device) if isinstance(a, torch.Tensor) else a for a in args))
    assert checked.status.cpu().tolist() == reference.status.tolist() == want, f"{case}: {checked.status.tolist()}"
    for name, a, b in zip(reference._fields, checked, reference):
        assert torch.equal(a.cpu(), b), f"{case}: {name}"


def ref_slots(positions, row_to_batch, block_table):
    """slot = block_table[b, j // 64] * 64 + j % 64 in Python integers; -1 stays -1."""
    return [
        [-1 if j < 0 else block_table[b][j // 64] * 64 + j % 64 for j in row] for row, b in zip(positions, row_to_batch)
    ]


def keys_at(positions: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Ordering keys with random scores at `positions` (NO_KEY where -1), sorted descending."""
    scores = torch.randn(positions.shape, generator=gen)
    keys = torch.where(positions >= 0, make_keys(scores, positions.clamp_min(0)), NO_KEY)
    return keys.sort(dim=1, descending=True).values


def assemble(keys: torch.Tensor, table: torch.Tensor):
    rows = keys.shape[0]
    zeros = torch.zeros(rows, dtype=torch.int32)
    return assemble_result(keys, torch.arange(rows, dtype=torch.int32) % table.shape[0], table, zeros, zeros, zeros)


def test_assembly_near_the_int32_limit_is_exact(seed):
    gen = torch.Generator().manual_seed(seed)
    table = torch.tensor(
        [[LAST_PAGE_THAT_FITS, 2**24 + 3, 5, -1], [LAST_PAGE_THAT_FITS - 1, LAST_PAGE_THAT_FITS - 2, 2**25 - 7, -1]],
        dtype=torch.int32,
    )
    positions = torch.stack([torch.randperm(3 * 64, generator=gen)[:150] for _ in range(2)]).int()
    positions[:, -7:] = -1
    positions[0, 0], positions[1, 0] = 63, 191  # the largest slot that fits, and a far one
    result = assemble(keys_at(positions, gen), table)
    assert result.physical_indices.dtype == torch.int32 and result.status.tolist() == [0, 0]
    assert result.counts.tolist() == [143, 143]
    for r in range(2):
        n = int(result.counts[r])
        raw = result.raw_indices[r, :n]
        assert sorted(raw.tolist()) == sorted(j for j in positions[r].tolist() if j >= 0)
        want = ref_slots([raw.tolist()], [r], table.tolist())[0]
        assert result.physical_indices[r, :n].tolist() == want, f"seed {seed}, row {r}"
        assert (result.physical_indices[r, n:] == -1).all() and (result.raw_indices[r, n:] == -1).all()
    assert int(result.physical_indices[0].max()) == INT32_MAX


@pytest.mark.parametrize("page", [LAST_PAGE_THAT_FITS + 1, 2**26 + 1, 2**31 - 1])
def test_assembly_never_wraps_a_slot(page, seed):
    """A published position on a page beyond int32's slots: SLOT_OVERFLOW, and the row publishes
    nothing (no wrapped slot, no exception); the same page outside every published position is not read."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.tensor([[3, page]], dtype=torch.int32)
    result = assemble(keys_at(torch.tensor([[5, 64, -1]], dtype=torch.int32), gen), table)  # 64 lives in `page`
    assert result.status.tolist() == [int(RowStatus.SLOT_OVERFLOW)] and result.counts.tolist() == [0]
    assert (result.physical_indices == -1).all() and (result.raw_indices == -1).all()
    assert (result.values == float("-inf")).all()
    with pytest.raises(RowFaultError, match="SLOT_OVERFLOW"):
        result.raise_for_status()
    fine = assemble(keys_at(torch.tensor([[5, -1, -1]], dtype=torch.int32), gen), table)
    assert fine.status.tolist() == [0] and fine.physical_indices[0, :1].tolist() == [3 * 64 + 5]


@pytest.mark.parametrize("live_page, want_status", [(9, [0, 0, 0, 0]), (10, [64, 64, 0, 0]), (12, [64, 64, 0, 0])])
def test_validate_flags_the_slots_of_live_pages_only(live_page, want_status, seed, monkeypatch):
    """A cache of 2^25 pages (146 GB) cannot be built here, so the slot limit is scaled down to
    10 pages (slots 0..639): validate_prefill must then flag SLOT_OVERFLOW on the rows whose windows
    read page 10 or beyond (rows 0 and 1 read table (0, 1)), raise nothing, and ignore such a page
    outside every window; the operator then publishes nothing for those rows and the others stay exact."""
    import litetopk.kernels.row_checks as row_checks

    monkeypatch.setattr(row_checks, "FIRST_UNMAPPABLE_PAGE", 10)
    args = small_args(seed)
    assert args["kv_cache"].shape[0] == 13
    table = args["block_table"]
    # move the live pages onto 0..8 and page (0, 1) onto `live_page`, keeping every page distinct
    free_low = iter(p for p in range(9) if p != live_page)
    for b in range(2):
        for c in range(4):
            table[b, c] = next(free_low) if (b, c) != (0, 1) else live_page
    table[1, 4] = 12 if live_page != 12 else 11  # outside every window: never checked
    problem = validate_prefill(*args.values(), topk=512)
    assert problem.row_status.tolist() == want_status
    result = litetopk_prefill(*args.values(), topk=512, backend="reference")
    assert result.status.tolist() == want_status
    monkeypatch.undo()
    clean = litetopk_prefill(*args.values(), topk=512, backend="reference")
    assert clean.status.tolist() == [0, 0, 0, 0]
    for r, bits in enumerate(want_status):
        if bits:
            assert int(result.counts[r]) == 0 and (result.physical_indices[r] == -1).all()
        else:
            for name in ("values", "raw_indices", "physical_indices", "counts"):
                assert torch.equal(getattr(result, name)[r], getattr(clean, name)[r]), f"row {r}: {name}"
