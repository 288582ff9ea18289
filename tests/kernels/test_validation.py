"""The one validation layer (CONTRACT.md §1-§3): call-level errors say what to change; row-level
faults become status bits of exactly those rows; slots are 64-bit and never wrap.

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
    RowStatus,
    SlotOverflowError,
    UnsupportedTopKError,
    dense_topk_prefill,
    litetopk_prefill,
)
from litetopk.kernels.selection import map_pages
from litetopk.kernels.validation import check_slots_fit_int32, validate_prefill
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
    out = torch.empty(t.shape[::-1], dtype=t.dtype).t() if t.ndim == 2 else torch.empty(t.shape + (2,), dtype=t.dtype)[..., 0]
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
    "kv_cache page layout transposed": ("kv_cache", lambda t: t.view(-1, 64, 68).transpose(1, 2), "the bytes of one page of kv_cache must be contiguous"),
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
    assert torch.equal(varied.cache.values, plain.cache.values) and varied.cache.values.shape == plain.cache.values.shape
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
    "live page far past the cache": ([_set("block_table", (1, 0), 2**31 - 1)], [0, 0, 8, 0]),
    "bad page right after a window": ([_set("block_table", (1, 2), -5)], [0, 0, 8, 0]),
    "bad page outside every window": ([_set("block_table", (0, 4), 10**6), _set("block_table", (1, 4), -7)], [0, 0, 0, 0]),
    "bad page before a window": ([_set("block_table", (0, 0), -1), _set("starts", 0, 64)], [0, 0, 0, 0]),
    "nan weight": ([_set("weights", (2, 5), float("nan"))], [0, 0, 4, 0]),
    "inf weight": ([_set("weights", (3, 63), float("inf"))], [0, 0, 0, 4]),
    "-inf weight": ([_set("weights", (0, 0), -float("inf"))], [4, 0, 0, 0]),
    "bad page and nan weight": ([_set("block_table", (0, 1), -1), _set("weights", (1, 0), float("nan"))], [8, 12, 0, 0]),
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
    for name in ARG_NAMES:  # validation never writes to its inputs (compared bit for bit: NaN too)
        got, was = args[name].flatten(), original[name].flatten()
        assert torch.equal(got.view(torch.uint8), was.view(torch.uint8)), f"{case}: {name} was modified"


@pytest.mark.interpret
@pytest.mark.parametrize("case", list(ROW_FAULTS))
def test_row_checks_kernel_finds_the_same_faults(case, seed):
    """kernels/triton/row_checks.py (what validation runs on a CUDA device) on the same cases: the
    same status bits and the same effective windows as the torch checks."""
    from litetopk.kernels.triton.row_checks import row_checks_triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    changes, want = ROW_FAULTS[case]
    args = small_args(seed)
    for change in changes:
        change(args)
    status, effective = row_checks_triton(
        args["block_table"].to(device), _num_pages(args), args["weights"].float().to(device),
        *(args[name].to(device) for name in ("row_to_batch", "starts", "ends")))
    assert status.cpu().tolist() == want, f"{case}: {status.cpu().tolist()} vs {want}"
    ok = torch.tensor(want) == 0
    for i, name in enumerate(("row_to_batch", "starts", "ends")):
        assert torch.equal(effective[i].cpu(), torch.where(ok, args[name], 0)), f"{case}: effective {name}"


# ---- 64-bit slot arithmetic ---------------------------------------------------------------------


@pytest.mark.parametrize("page", [0, 1000, LAST_PAGE_THAT_FITS])
def test_slots_that_fit_int32_pass(page):
    check_slots_fit_int32(page)


@pytest.mark.parametrize("page", [LAST_PAGE_THAT_FITS + 1, 2**26, 2**31 - 1, 2**40])
def test_slots_beyond_int32_are_an_error(page):
    with pytest.raises(SlotOverflowError) as info:
        check_slots_fit_int32(page)
    assert isinstance(info.value, InputError)
    assert str(page * 64 + 63) in str(info.value) and str(INT32_MAX) in str(info.value), str(info.value)


def ref_slots(positions, row_to_batch, block_table):
    """slot = block_table[b, j // 64] * 64 + j % 64 in Python integers; -1 stays -1."""
    return [
        [-1 if j < 0 else block_table[b][j // 64] * 64 + j % 64 for j in row]
        for row, b in zip(positions, row_to_batch)
    ]


def test_map_pages_near_the_int32_limit_is_exact(seed):
    gen = torch.Generator().manual_seed(seed)
    table = torch.tensor(
        [[LAST_PAGE_THAT_FITS, 2**24 + 3, 5, -1], [LAST_PAGE_THAT_FITS - 1, LAST_PAGE_THAT_FITS - 2, 2**25 - 7, -1]],
        dtype=torch.int32,
    )
    positions = torch.randint(0, 3 * 64, (2, 512), generator=gen, dtype=torch.int32)
    positions[:, -7:] = -1
    positions[0, 0], positions[1, 0] = 63, 191  # the largest slot that fits, and a far one
    rtb = torch.tensor([0, 1], dtype=torch.int32)
    slots = map_pages(positions, rtb, table)
    assert slots.dtype == torch.int32
    want = ref_slots(positions.tolist(), rtb.tolist(), table.tolist())
    assert slots.tolist() == want, f"seed {seed}"
    assert slots[0, 0].item() == INT32_MAX


@pytest.mark.parametrize("page", [LAST_PAGE_THAT_FITS + 1, 2**26 + 1, 2**31 - 1])
def test_map_pages_never_wraps_a_slot(page):
    table = torch.tensor([[3, page]], dtype=torch.int32)
    positions = torch.tensor([[5, 64, -1]], dtype=torch.int32)  # position 64 lives in `page`
    with pytest.raises(SlotOverflowError, match=str(page * 64)):
        map_pages(positions, torch.tensor([0], dtype=torch.int32), table)
    # the same page outside every published position is not read
    assert map_pages(positions[:, :1], torch.tensor([0], dtype=torch.int32), table).tolist() == [[3 * 64 + 5]]


@pytest.mark.parametrize("live_page, want_error", [(9, False), (10, True), (12, True)])
def test_validate_checks_the_slots_of_live_pages_only(live_page, want_error, seed, monkeypatch):
    """A cache of 2^25 pages (146 GB) cannot be built here, so the slot limit is scaled down to
    10 pages (slots 0..639): validate_prefill must then fail a call whose windows read page 10 or
    beyond, and ignore such a page outside every window."""
    import litetopk.kernels.validation as validation

    monkeypatch.setattr(validation, "INT32_MAX", 10 * 64 - 1)
    args = small_args(seed)
    assert args["kv_cache"].shape[0] == 13
    table = args["block_table"]
    # move the live pages onto 0..8 and page (0, 1) onto `live_page`, keeping every page distinct
    free_low = iter(p for p in range(9) if p != live_page)
    for b in range(2):
        for c in range(4):
            table[b, c] = next(free_low) if (b, c) != (0, 1) else live_page
    table[1, 4] = 12 if live_page != 12 else 11  # outside every window: never checked
    if want_error:
        with pytest.raises(SlotOverflowError, match=str(live_page * 64 + 63)):
            validate_prefill(*args.values(), topk=512)
    else:
        assert validate_prefill(*args.values(), topk=512).row_status.tolist() == [0, 0, 0, 0]
