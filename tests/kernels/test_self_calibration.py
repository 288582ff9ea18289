"""The self-calibrating scan (LiteTopKTuning(calibration="scan"); kernels/triton/scan_calibration.py).

Each program of the scan scores n_sample contiguous key tiles first, those that end with its rows'
earliest window end (phase A: every in-window key appended), takes a safe threshold and a histogram
range from them, compacts its buffer to the keys at or above the threshold, then scans the tiles
after them and before them (phase B). Checks
(the kernel's rules restated as plain-Python ref_* beside the tests):
- the sample size: _sample_tiles, through a tiny test kernel, over span lengths and capacities;
- the scan (backend.scan_candidates(thresholds=None, sample_size=...)): a row is calibrated
  exactly where phase A saw >= K finite in-window keys, its threshold never passes its true K-th
  best key and is at least the sample's K-th best minus two bisection brackets, the buffer holds
  every key at or above the final threshold, distinct keys of the row's window (no phase A key
  below the bracket survives the compaction), an uncalibrated row every key of its window; the
  kernel's dense scores these checks rest on lie within the float64 oracle's bound, and no threshold
  passes the oracle's K-th best score by more than that bound;
- the operator: LiteTopK with calibration="scan" equals dense and calibration="sample", bit for bit,
  with no row repaired; two rows of one program share its sample: overlapping windows both calibrate,
  a row that meets the sample in fewer than K keys (no threshold, the whole window appended, an
  overflow) is repaired to dense's bits;
- errors: backends without the scan raise BackendUnavailableError; an unknown calibration ValueError.
Without a GPU the kernels run in Triton's CPU interpreter (tests/conftest.py).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from litetopk.kernels import BackendUnavailableError, LiteTopKTuning, dense_topk_prefill, litetopk_prefill
from litetopk.kernels.backend import MAX_SAMPLE_STRIDE
from litetopk.kernels.flydsl import FlyDSLBackend
from litetopk.kernels.keys import NO_KEY, make_keys, split_keys
from litetopk.kernels.reference import ReferenceBackend
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.triton.operands import FLAG_WIDE
from litetopk.kernels.triton.scan_calibration import BISECTION_STEPS, _sample_tiles
from litetopk.kernels.validation import validate_prefill
from tests.problems import make_problem, oracle_kth, oracle_scores, scores_off_the_oracle

# The Triton backend's prefill mode (int8 keys, a program a row group): its kernels on small problems.
pytestmark = pytest.mark.usefixtures("prefill_mode")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")
SAMPLE_SIZE = 2048  # LiteTopKTuning's default: 32 key tiles of 64
BLOCK_KEYS = 64  # TritonBackend's default key tile
BLOCK_ROWS = 2  # TritonBackend's default rows a program
BRACKET = 2.0**-BISECTION_STEPS.value  # a bisection bracket's width, in units of the sample's range


# -- the sample size ------------------------------------------------------------------------------


def ref_sample_tiles(
    n_steps: int, sample_tiles: int, sample_stride: int, capacity: int, topk: int, block_keys: int = BLOCK_KEYS
) -> int:
    """Phase A's tiles as _sample_tiles documents them: max(sample_tiles, ceil(n_steps /
    sample_stride), ceil(2 K / 64)), at most n_steps and at most the tiles the buffer holds whole."""
    wanted = max(sample_tiles, -(-n_steps // sample_stride), -(-2 * topk // block_keys))
    return min(wanted, n_steps, capacity // block_keys)


@triton.jit
def sample_tiles_kernel(
    out_ptr, n_steps, sample_tiles, sample_stride, capacity, TOPK: tl.constexpr, BLOCK_KEYS: tl.constexpr
):
    tl.store(out_ptr, _sample_tiles(n_steps, sample_tiles, sample_stride, capacity, TOPK, BLOCK_KEYS))


N_STEPS = [0, 1, 5, 32, 33, 64, 100, 1000, 5000]  # 5000 tiles: ceil(5000 / 64) = 79 > 32 sample tiles
CAPACITIES = [40, 1024, 4096, 8192]  # 0, 16, 64 and 128 whole tiles


@pytest.mark.interpret
@pytest.mark.parametrize("sample_tiles", [SAMPLE_SIZE // BLOCK_KEYS, 4])  # 4 tiles: fewer than 2 K keys
@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("n_steps", N_STEPS)
def test_sample_tiles_follow_the_rule(n_steps, capacity, sample_tiles):
    topk = 512
    out = torch.full((1,), -1, dtype=torch.int32, device=DEVICE)
    sample_tiles_kernel[(1,)](out, n_steps, sample_tiles, MAX_SAMPLE_STRIDE, capacity, TOPK=topk, BLOCK_KEYS=BLOCK_KEYS)
    n_sample = int(out[0])
    where = f"[{n_steps} tiles, capacity {capacity}, {sample_tiles} sample tiles asked]"
    assert n_sample == ref_sample_tiles(n_steps, sample_tiles, MAX_SAMPLE_STRIDE, capacity, topk), (
        f"{where}: got {n_sample}"
    )
    assert 0 <= n_sample <= min(capacity // BLOCK_KEYS, n_steps), f"{where}: {n_sample} sample tiles"
    floor = max(sample_tiles, 2 * topk // BLOCK_KEYS)  # 2 K keys at least
    assert n_sample >= min(floor, n_steps, capacity // BLOCK_KEYS), f"{where}: {n_sample} sample tiles"


# -- the scan ----------------------------------------------------------------------------------------


def ref_programs(
    row_to_batch: list[int], starts: list[int], ends: list[int], block_rows: int = BLOCK_ROWS
) -> list[tuple[list[int], int, int]]:
    """The scoring kernels' programs (schedule.py docstring) that hold live rows, as (rows, span
    start, span end): each sequence's live rows ordered by (start, row), block_rows to a program."""
    programs = []
    for b in sorted(set(row_to_batch)):
        live = sorted((starts[r], r) for r in range(len(starts)) if row_to_batch[r] == b and ends[r] > starts[r])
        for first in range(0, len(live), block_rows):
            rows = [r for _, r in live[first : first + block_rows]]
            programs.append((rows, min(starts[r] for r in rows), max(ends[r] for r in rows)))
    return programs


def ref_phase_a_positions(
    span_start: int,
    span_end: int,
    earliest_end: int,
    capacity: int,
    topk: int,
    sample_size: int = SAMPLE_SIZE,
    block_keys: int = BLOCK_KEYS,
) -> torch.Tensor:
    """The key positions a program scores in phase A: ref_sample_tiles contiguous tiles of its span
    (whose tiles start at the span's start rounded down to a tile) ending with the tile that holds the
    program's earliest window end - 1, or starting at the span's start when that is too early
    (scan_calibration._first_sample_tile)."""
    lo = span_start // block_keys * block_keys
    n_steps = -(-(span_end - lo) // block_keys)
    n_sample = ref_sample_tiles(n_steps, -(-sample_size // block_keys), MAX_SAMPLE_STRIDE, capacity, topk, block_keys)
    first = min(max(-(-(earliest_end - lo) // block_keys), n_sample), n_steps) - n_sample
    return torch.arange(lo + first * block_keys, lo + (first + n_sample) * block_keys)


def ref_phase_a_samples(problem, scores: torch.Tensor, capacity: int) -> list[torch.Tensor]:
    """float64 scores of the in-window keys each row's phase A appends (empty for an empty window)."""
    rtb, starts, ends = problem.row_to_batch.tolist(), problem.starts.tolist(), problem.ends.tolist()
    samples = [torch.empty(0, dtype=torch.float64) for _ in starts]
    for rows, span_start, span_end in ref_programs(rtb, starts, ends):
        positions = ref_phase_a_positions(span_start, span_end, min(ends[r] for r in rows), capacity, problem.topk)
        for r in rows:
            seen = positions[(positions >= starts[r]) & (positions < ends[r])]
            samples[r] = scores[r, seen].double()
    return samples


def check_self_calibrated_scan(problem, scan, scores: torch.Tensor, capacity: int, where: str) -> None:
    """The scan's contract (module docstring) against the dense scores float32 [rows, max_end] of the
    same kernel (-inf outside the windows), row by row."""
    k = problem.topk
    positions = torch.arange(scores.shape[1])
    keys = make_keys(scores, positions[None, :])
    true_kth = torch.topk(keys, k, dim=1).values[:, -1]
    samples = ref_phase_a_samples(problem, scores, capacity)
    appended = scan.appended.cpu()
    thresholds = scan.thresholds.cpu()
    threshold_scores = split_keys(thresholds)[0].double()
    buffer = scan.keys.cpu()
    for r, (start, end) in enumerate(zip(problem.starts.tolist(), problem.ends.tolist())):
        at = f"{where} row {r} (window [{start}, {end}), {samples[r].numel()} keys in phase A)"
        n = int(appended[r])
        assert n <= capacity, f"{at}: {n} keys appended, capacity {capacity}"
        kept = buffer[r, :n]
        window = keys[r, start:end]
        assert kept.unique().numel() == n, f"{at}: a key appended twice"
        assert bool(torch.isin(kept, window).all()), f"{at}: a kept key is not one of the window's keys"
        above = window[window >= thresholds[r]]
        assert bool(torch.isin(above, kept).all()), (
            f"{at}: {int((~torch.isin(above, kept)).sum())} keys >= the final threshold are not in the buffer"
        )
        calibrated = samples[r].numel() >= k and bool(samples[r].isfinite().all())
        assert bool(thresholds[r] > NO_KEY) == calibrated, (
            f"{at}: calibrated {bool(thresholds[r] > NO_KEY)}, want {calibrated}"
        )
        assert bool(thresholds[r] <= true_kth[r]), f"{at}: the threshold passed the row's true K-th best key"
        if not calibrated:
            assert n == end - start, f"{at}: an uncalibrated row appends its whole window, got {n}"
            continue
        # the bisection's lower end lies within one bracket below the sample's K-th best score
        sample_kth = torch.topk(samples[r], k).values[-1]
        bracket = (samples[r].max() - samples[r].min()) * BRACKET
        floor = sample_kth - 2 * bracket
        assert threshold_scores[r] >= floor, (
            f"{at}: threshold score {float(threshold_scores[r])} below the sample's K-th best minus two brackets"
        )
        assert bool((split_keys(kept)[0].double() >= floor).all()), (
            f"{at}: a key below the calibrated threshold survived the compaction"
        )


SCAN_CASES = {  # name: (problem, every row calibrates)
    # Causal rows see [0, end) with end within 64 keys of the sequence's length, so phase A's last 32
    # tiles of the span (all 24 tiles of 1,500 keys) hold >= 31 x 64 >= K keys of every row. Non-causal
    # windows are random: some rows calibrate, others do not (the check holds the rule either way).
    "one causal sequence, 4096 keys": (dict(seq_lens=[4096], rows_per_seq=2, spread=1), True),
    "two sequences 3000 and 1500, spread 3 (wide)": (dict(seq_lens=[3000, 1500], rows_per_seq=2, spread=3), True),
    "K=1024, 9000 keys": (dict(seq_lens=[9000], rows_per_seq=2, topk=1024, spread=1), True),
    "non-causal windows": (dict(seq_lens=[4096], rows_per_seq=4, causal=False, spread=1), False),
}


@pytest.mark.interpret
@pytest.mark.parametrize("name", list(SCAN_CASES))
def test_scan_calibrates_itself_safely(name, seed):
    build, all_calibrate = SCAN_CASES[name]
    p = make_problem(seed, **build, note=name)
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk)
    backend = TritonBackend(paged="never")
    capacity = LiteTopKTuning().capacity(p.topk)
    where = f"[{name}] seed {seed}"
    if "wide" in name:
        assert int(backend.operands(problem).keys.flags[0]) & FLAG_WIDE, f"{where}: the case needs wide keys"
    scan = backend.scan_candidates(problem, None, capacity, sample_size=SAMPLE_SIZE)
    scores, _ = backend.score_dense(problem)
    if all_calibrate:
        assert bool((scan.thresholds > NO_KEY).all()), f"{where}: every row of the case calibrates"
    check_self_calibrated_scan(problem, scan, scores.cpu(), capacity, where)
    # The check above takes the true K-th keys from the same kernel's dense scores; the float64 oracle
    # anchors them: the scores lie within its bound, and no threshold passes its K-th best score by more.
    # (On the rows the backend can score exactly: an UNSUPPORTED row's scores mean nothing, and the
    # operator publishes nothing for it.)
    supported = (~backend.unsupported_rows(problem).cpu()).nonzero().flatten().tolist()
    off = scores_off_the_oracle(p, scores, supported)
    assert not off, f"{where}: the backend's dense scores vs float64: {off[:3]}"
    oracle, bound = oracle_scores(p)
    threshold_scores = split_keys(scan.thresholds.cpu())[0].double().numpy()
    passed = [r for r in supported if threshold_scores[r] > oracle_kth(oracle, p.topk)[r] + bound[r]]
    assert not passed, f"{where}: rows {passed}: a threshold passed the float64 K-th best score"


# -- the operator ------------------------------------------------------------------------------------

OPERATOR_CASES = {
    "one sequence, 4096 keys": dict(seq_lens=[4096], rows_per_seq=3, spread=1),
    "two sequences, spread 3": dict(seq_lens=[3000, 1500], rows_per_seq=2, spread=3),
    "non-causal, K=1024": dict(seq_lens=[6000], rows_per_seq=2, topk=1024, causal=False, spread=1),
}


@pytest.mark.interpret
@pytest.mark.parametrize("name", list(OPERATOR_CASES))
def test_operator_with_scan_calibration_equals_dense(name, seed):
    p = make_problem(seed, **OPERATOR_CASES[name], note=name)
    args = [t.to(DEVICE) for t in p.args()]
    common = dict(topk=p.topk, weight_scale=p.weight_scale, backend="triton")
    scan = litetopk_prefill(*args, **common, tuning=LiteTopKTuning(calibration="scan"))
    sample = litetopk_prefill(*args, **common)
    dense = dense_topk_prefill(*args, **common)
    where = f"[{name}] seed {seed}"
    for field in FIELDS:
        assert torch.equal(getattr(scan, field), getattr(dense, field)), f"{where}: {field} differs from dense"
        assert torch.equal(getattr(scan, field), getattr(sample, field)), f"{where}: {field} differs from 'sample'"
    assert not scan.repaired.any(), f"{where}: rows repaired {scan.repaired.tolist()} (a threshold too high?)"


@pytest.mark.interpret
@pytest.mark.parametrize(
    "windows, repaired",
    [
        # The sample is the 32 tiles ending with the earlier end, [2368, 4416): inside row 0's window, 16
        # keys of row 1's; row 1 keeps no threshold, appends its 4,600 keys, overflows the 4,096-key buffer
        # and is repaired.
        (((0, 4400), (4400, 9000)), [0, 1]),
        # Overlapping windows: the sample [3008, 5056) lies inside both (the span's last tiles would not
        # be inside row 0's, which would then overflow): no repair.
        (((0, 5000), (1000, 9000)), [0, 0]),
    ],
    ids=["disjoint", "overlapping"],
)
def test_windows_of_one_program_share_its_sample(windows, repaired, seed):
    """Two rows of one program (one sequence, BLOCK_ROWS 2) with the windows given: the rows without
    K sampled keys are capacity events, repaired exactly; the answer is dense's, bit for bit."""
    p = make_problem(seed, seq_lens=[9000], rows_per_seq=2, causal=False, spread=1)
    p.starts[:] = torch.tensor([w[0] for w in windows], dtype=torch.int32)
    p.ends[:] = torch.tensor([w[1] for w in windows], dtype=torch.int32)
    args = [t.to(DEVICE) for t in p.args()]
    common = dict(topk=p.topk, weight_scale=p.weight_scale, backend="triton")
    scan = litetopk_prefill(*args, **common, tuning=LiteTopKTuning(calibration="scan"))
    dense = dense_topk_prefill(*args, **common)
    where = f"[windows {windows}] seed {seed}"
    assert scan.repaired.tolist() == repaired, f"{where}: repaired {scan.repaired.tolist()}, want {repaired}"
    for field in FIELDS:
        assert torch.equal(getattr(scan, field), getattr(dense, field)), f"{where}: {field} differs from dense"


# -- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", [ReferenceBackend, FlyDSLBackend], ids=["reference", "flydsl"])
def test_backends_without_the_scan_raise(backend, seed):
    p = make_problem(seed, seq_lens=[300], rows_per_seq=2, spread=1)
    problem = validate_prefill(*p.args(), topk=p.topk)
    with pytest.raises(BackendUnavailableError, match="calibration") as info:
        backend().scan_candidates(problem, None, 4096, sample_size=SAMPLE_SIZE)
    assert backend.name in str(info.value), f"[{backend.name}] the error names the backend: {info.value}"


def test_operator_on_the_reference_backend_raises(seed):
    p = make_problem(seed, seq_lens=[300], rows_per_seq=2, spread=1)
    with pytest.raises(BackendUnavailableError, match="calibration='scan'"):
        litetopk_prefill(*p.args(), topk=p.topk, backend="reference", tuning=LiteTopKTuning(calibration="scan"))


def test_unknown_calibration_is_a_value_error():
    with pytest.raises(ValueError, match="calibration='bogus' is not one of"):
        LiteTopKTuning(calibration="bogus")


@pytest.mark.interpret
@pytest.mark.parametrize("given", ["thresholds", "ceilings"])
def test_a_self_calibrating_scan_takes_no_thresholds_or_ceilings(given, seed):
    """Phase A appends every key and counts none in the histogram: thresholds or ceilings passed with
    a sample would filter it or count it twice, so they are refused."""
    p = make_problem(seed, seq_lens=[300], rows_per_seq=2, spread=1)
    problem = validate_prefill(*p.args(), topk=p.topk)
    keys = torch.full((problem.num_rows,), NO_KEY, dtype=torch.int64)
    arguments = (
        {"thresholds": keys, "ceilings": None} if given == "thresholds" else {"thresholds": None, "ceilings": keys}
    )
    with pytest.raises(ValueError, match="takes no thresholds and no ceilings"):
        TritonBackend(paged="never").scan_candidates(
            problem, arguments["thresholds"], 4096, ceilings=arguments["ceilings"], sample_size=SAMPLE_SIZE
        )


@pytest.mark.parametrize(
    "knobs, message",
    [
        (dict(sample_size=0), "needs sample_size >= 1"),
        (dict(calibration_offset=1.0), "calibration_offset applies to calibration='sample' only"),
    ],
)
def test_scan_calibration_refuses_knobs_it_cannot_honour(knobs, message):
    with pytest.raises(ValueError, match=message):
        LiteTopKTuning(calibration="scan", **knobs)
    LiteTopKTuning(calibration="sample", **knobs)  # the calibration stage takes them
