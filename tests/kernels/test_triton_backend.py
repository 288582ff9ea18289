"""The Triton backend (kernels/triton/): decode exactness, the fused scan, and the operator.

Without a GPU these run the real kernels in Triton's CPU interpreter (tests/conftest.py sets
TRITON_INTERPRET=1) on small shapes; with a GPU they run compiled. Checks:
- decode: lo + 16 hi, times 2^(m - 128), equals the float64 decode of every supported vector,
  and the flags say which vectors are wide, unsupported or carry a NaN scale;
- the operator: LiteTopK == dense on the Triton backend, bit for bit; every published row
  against the float64 oracle, tie-aware within the bound the kernel documents; repair / strict
  capacity events; NONFINITE rows; wide vectors (the hi operands) exact; rows with unsupported
  spreads or head weights get the UNSUPPORTED bit (nothing raised, the other rows exact);
- the schedule (kernels/triton/schedule.py): its invariants on the device-built grid;
- the scan's threshold only rises and never passes the row's true K-th best key (the kernel's own
  scores, themselves checked against the float64 oracle, and the oracle's K-th best score).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litetopk.kernels import (
    BackendUnavailableError,
    LiteTopKTuning,
    RowFaultError,
    RowStatus,
    dense_topk_prefill,
    litetopk_prefill,
    unpack_kv_cache,
)
from litetopk.kernels.cache_layout import describe_kv_cache
from litetopk.kernels.calibration import calibrate
from litetopk.kernels.keys import NO_KEY, make_keys, split_keys
from litetopk.kernels.mxfp4 import dequantize_mxfp4
from litetopk.kernels.scratch import Scratch
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.triton.operands import (
    FLAG_NAN_SCALE,
    FLAG_UNSUPPORTED,
    FLAG_WIDE,
    decode_keys_fp4_triton,
    decode_queries_fp4_triton,
    prepare_queries_fp4_triton,
)
from litetopk.kernels.triton.schedule import build_schedule, max_programs
from litetopk.kernels.validation import validate_prefill
from tests.kernels.test_reference_operator import assert_nothing_published, assert_row_matches_oracle, assert_same
from tests.problems import make_problem, oracle_kth, oracle_scores, random_fp4, scan_tuning, scores_off_the_oracle

# The Triton backend's prefill mode (int8 keys, a program a row group): its kernels on small problems.
pytestmark = pytest.mark.usefixtures("prefill_mode")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")


def spread_of(scales: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """Binades spanned by the scale bytes of each vector's nonzero 32-element blocks (a NaN scale
    byte, 255, makes the vector NaN and does not count)."""
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], 4, 32)
    nonzero = ((codes & 7).amax(dim=-1) > 0) & (scales != 255)
    s = scales.long()
    hi = torch.where(nonzero, s, -1).amax(dim=-1)
    lo = torch.where(nonzero, s, 999).amin(dim=-1)
    return torch.where(nonzero.any(dim=-1), hi - lo, 0)


@pytest.mark.parametrize("spread", [0, 1, 2, 3])
def test_decode_queries_is_exact_and_flags_wide_vectors(spread, seed):
    rng = np.random.default_rng(seed)
    q, qs = random_fp4((3, 64, 128), rng, spread)
    qs[0, 0, 1] = 255  # a NaN scale byte
    summary = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    lo, hi, exp, flags = decode_queries_fp4_triton(q.to(DEVICE), qs.to(DEVICE), summary)
    lo, hi, exp, flags = lo.cpu(), hi.cpu(), exp.cpu(), flags.cpu().int()
    every_or = 0
    for f in flags.unique().tolist():
        every_or |= f
    assert int(summary) == every_or, f"summary {int(summary)} != OR of the flags {every_or}, spread {spread}"
    want = dequantize_mxfp4(q, qs, torch.float64)
    got = (lo.double() + 16 * hi.double()) * torch.exp2(exp.double() - 128)[..., None]
    widths = spread_of(qs, q)
    supported = ((flags & FLAG_UNSUPPORTED) == 0) & ((flags & FLAG_NAN_SCALE) == 0)
    where = f"spread {spread}, seed {seed}"
    assert torch.equal(got[supported], want[supported]), f"{where}: decode differs from float64"
    assert torch.equal((flags & FLAG_WIDE) != 0, widths >= 4), f"{where}: WIDE flag"
    assert torch.equal((flags & FLAG_UNSUPPORTED) != 0, widths >= 8), f"{where}: UNSUPPORTED flag"
    assert int(flags[0, 0]) & FLAG_NAN_SCALE and int((flags & FLAG_NAN_SCALE).sum()) == FLAG_NAN_SCALE, where
    assert int(lo.abs().max()) <= 96 and int(hi.abs().max()) <= 96, where


def ref_head_weight_scaling(w: np.ndarray, q_exp: np.ndarray):
    """float64 definition of the scoring epilogue's head weights (scoring.py docstring): per row the
    shift puts max |w * 2^(q_exp - 129) * 2^shift| in [2^126, 2^127); a row is out of range when a
    finite nonzero scaled weight is below 2^23 or max |w * 2^(q_exp - 129)| >= 2^100."""
    scaled_true = w.astype(np.float64) * np.exp2(q_exp.astype(np.float64) - 129)
    counted = np.isfinite(w) & (w != 0)
    top = np.where(counted, np.floor(np.log2(np.abs(np.where(counted, scaled_true, 1.0)))) + 1, -np.inf).max(axis=1)
    shift = np.where(np.isfinite(top), 127 - top, 149)
    small = counted & (np.abs(scaled_true) * np.exp2(shift)[:, None] < 2.0**23)
    out_of_range = small.any(axis=1) | (top > 100)
    return scaled_true, shift, out_of_range


def windows_of(live: np.ndarray, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, ends) int32 on DEVICE whose live rows are `live`: random windows drawn from `seed`, empty
    where not live."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, 1000, (live.shape[0],), dtype=torch.int32, generator=gen)
    lengths = torch.randint(1, 500, (live.shape[0],), dtype=torch.int32, generator=gen)
    ends = starts + torch.from_numpy(live).to(torch.int32) * lengths
    return starts.to(DEVICE), ends.to(DEVICE)


def test_prepare_queries_scales_head_weights_exactly(seed):
    rng = np.random.default_rng(seed)
    rows = 10
    q, qs = random_fp4((rows, 64, 128), rng, 1)
    w = rng.standard_normal((rows, 64)).astype(np.float32)
    w[1] = 0.0  # all-zero weights: zero scores, rowfac 1
    w[2, 5] = 1e-42  # a subnormal weight beside ordinary ones: out of range (2^-139 vs ~1)
    w[3, :] = np.float32(2.0**-120) * rng.standard_normal(64).astype(np.float32)  # tiny, in range
    w[4, 0] = 2.0**100  # w * 2^(q_exp - 129) far above 2^100: out of range
    w[5, 7] = np.inf  # not counted (validation flags the row); the others scale as usual
    w[6, :32] = 0.0
    w[7, 3] = 2.0**-110  # 2^-110 beside ~1: out of range ...
    live = np.ones(rows, dtype=bool)
    live[7] = False  # ... but not refused: the row has no window
    qs[8, 2, 0] = 255  # a NaN scale byte: that head's weight is NaN
    summary = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    _, _, exp, flags, wq, rowfac, refused, q_wide, q_unsupported = prepare_queries_fp4_triton(
        q.to(DEVICE), qs.to(DEVICE), torch.from_numpy(w).to(DEVICE), windows_of(live, seed), summary
    )
    # the row flags as torch ops define them from the per-vector flags
    vector_flags = flags.cpu().int()
    want_wide = ((vector_flags & FLAG_WIDE) != 0).any(dim=1) & torch.from_numpy(live)
    want_unsupported = ((vector_flags & FLAG_UNSUPPORTED) != 0).any(dim=1) | (refused.cpu() != 0)
    assert torch.equal(q_wide.cpu(), want_wide) and torch.equal(q_unsupported.cpu(), want_unsupported), f"seed {seed}"
    exp, flags, wq = exp.cpu().numpy(), flags.cpu().numpy(), wq.cpu().numpy()
    rowfac, refused = rowfac.cpu().numpy(), refused.cpu().numpy()
    scaled_true, shift, out_of_range = ref_head_weight_scaling(w, exp)
    assert refused.astype(bool).tolist() == (out_of_range & live).tolist(), f"seed {seed}"
    assert int(summary[1]) == int((out_of_range & live).any()), f"seed {seed}"
    nan_scale = (flags & FLAG_NAN_SCALE) != 0
    assert np.isnan(wq[nan_scale]).all() and nan_scale[8, 2], f"seed {seed}"
    for r in np.flatnonzero(~out_of_range):
        counted = np.isfinite(w[r]) & (w[r] != 0) & ~nan_scale[r]
        assert rowfac[r] == np.exp2(149 - shift[r]), f"row {r}: rowfac, seed {seed}"
        assert np.array_equal(wq[r, counted].astype(np.float64), scaled_true[r, counted] * np.exp2(shift[r])), (
            f"row {r}, seed {seed}"
        )
        assert (wq[r, (w[r] == 0) & ~nan_scale[r]] == 0).all(), f"row {r}: zero weights stay zero, seed {seed}"
        # The row's largest scaled weight lies in [2^126, 2^127), a NaN-scale head's counted: its weight sets the
        # shift too (its wq is NaN, the row NONFINITE), so its exact scaled value stands in for it.
        scaled = np.where(nan_scale[r], scaled_true[r] * np.exp2(shift[r]), wq[r].astype(np.float64))
        shifted_heads = np.isfinite(w[r]) & (w[r] != 0)
        if shifted_heads.any():
            assert 2.0**126 <= np.abs(scaled[shifted_heads]).max() < 2.0**127, f"row {r}, seed {seed}"
    assert rowfac[1] == 1.0 and (wq[1] == 0).all(), f"zero weights, seed {seed}"
    assert np.isinf(wq[5, 7]), f"an infinite weight stays infinite, seed {seed}"


def test_decode_keys_reads_through_the_block_table(seed):
    p = make_problem(seed, seq_lens=[300, 170], rows_per_seq=1, spread=2)
    need = torch.tensor([300, 170], dtype=torch.int32)
    summary = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    lo, hi, exp, flags, kfac, tile_wide, batch_wide = decode_keys_fp4_triton(
        describe_kv_cache(p.kv_cache.to(DEVICE)), p.block_table.to(DEVICE), need.to(DEVICE), 320, summary
    )
    lo, hi, exp, flags, kfac = lo.cpu(), hi.cpu(), exp.cpu(), flags.cpu().int(), kfac.cpu()
    # the key tiles' wide bits (64 keys a tile) and the sequences', as the torch definition has them
    want_tiles = ((flags & FLAG_WIDE) != 0).view(2, -1, 64).any(dim=2)
    assert torch.equal(tile_wide.cpu(), want_tiles.to(torch.int8)), f"tile_wide, seed {seed}"
    assert torch.equal(batch_wide.cpu(), want_tiles.any(dim=1).to(torch.int32)), f"batch_wide, seed {seed}"
    assert bool(want_tiles.any()), f"seed {seed}: spread 2 must give wide keys"
    nan_scale = (flags & FLAG_NAN_SCALE) != 0
    assert torch.equal(kfac.double()[~nan_scale], torch.exp2(exp.double() - 127)[~nan_scale]), f"kfac, seed {seed}"
    assert bool(kfac[nan_scale].isnan().all()), f"kfac of a NaN scale, seed {seed}"
    live_or = 0
    for b, n in enumerate(need.tolist()):
        for f in flags[b, :n].unique().tolist():
            live_or |= f
    assert int(summary) == live_or, f"summary {int(summary)} != OR of the live keys' flags {live_or}, seed {seed}"
    values, scales = unpack_kv_cache(p.kv_cache, p.block_table, 300)
    want = dequantize_mxfp4(values, scales, torch.float64)
    got = (lo.double() + 16 * hi.double()) * torch.exp2(exp.double() - 128)[..., None]
    for b, n in enumerate(need.tolist()):
        ok = (flags[b, :n] & FLAG_UNSUPPORTED) == 0
        assert torch.equal(got[b, :n][ok], want[b, :n][ok]), f"sequence {b}, seed {seed}"
        assert bool((lo[b, n:] == 0).all()) and bool((hi[b, n:] == 0).all()), "positions past need decode to zero"


def run_both(p, **kw):
    """(LiteTopK, dense) on the triton backend, on the CPU; LiteTopK on its scan unless `tuning` says otherwise."""
    kw.setdefault("tuning", scan_tuning())
    args = [t.to(DEVICE) for t in p.args()]
    common = dict(topk=p.topk, weight_scale=p.weight_scale, backend="triton")
    lite = litetopk_prefill(*args, **common, **kw)
    dense = dense_topk_prefill(*args, **common)
    return lite.__class__(**{f: getattr(lite, f).cpu() for f in lite.__dataclass_fields__}), dense.__class__(
        **{f: getattr(dense, f).cpu() for f in dense.__dataclass_fields__}
    )


def check_against_oracle(p, lite, dense, where, withheld=None):
    rows = p.q_fp4.shape[0]
    withheld = torch.zeros(rows, dtype=torch.bool) if withheld is None else withheld
    assert_same(lite, dense, ~withheld, f"{where}: litetopk vs dense (triton)")
    scores, bound = oracle_scores(p)
    for i in range(rows):
        for result, label in ((lite, "litetopk"), (dense, "dense")):
            if int(result.status[i]):
                assert_nothing_published(result, i, f"{where} row {i} ({label})")
            else:
                assert_row_matches_oracle(result, p, i, scores, bound, False, f"{where} row {i} ({label})")


CASES = {
    "two sequences, causal, K=512": (dict(seq_lens=[1300, 900], rows_per_seq=3, spread=1), {}),
    "K=1024, windows shorter than K": (dict(seq_lens=[900, 700], rows_per_seq=2, topk=1024, spread=1), {}),
    "non-causal windows, weight_scale -0.5": (
        dict(seq_lens=[1400], rows_per_seq=4, causal=False, weight_scale=-0.5, spread=1),
        {},
    ),
    "wide vectors (hi operands)": (dict(seq_lens=[1100], rows_per_seq=4, spread=2), {}),
    "calibrated + histogram": (
        dict(seq_lens=[2600], rows_per_seq=4, spread=1),
        dict(tuning=LiteTopKTuning(sample_size=520)),
    ),
    "tiny capacity: repaired": (
        dict(seq_lens=[1200], rows_per_seq=3, spread=1),
        dict(tuning=LiteTopKTuning(candidate_capacity=40)),
    ),
    "forced underfill: repaired": (
        dict(seq_lens=[2000], rows_per_seq=3, spread=1),
        dict(tuning=LiteTopKTuning(sample_size=700, calibration_offset=1e30)),
    ),
}


@pytest.mark.interpret
@pytest.mark.parametrize("name", list(CASES))
def test_triton_operator_against_float64_oracle(name, seed):
    build, kw = CASES[name]
    p = make_problem(seed, **build, note=name)
    lite, dense = run_both(p, **kw)
    where = f"[{name}] seed {seed}"
    assert not lite.status.any() and not dense.status.any(), f"{where}: status {lite.status.tolist()}"
    if "repaired" in name:
        assert int(lite.repaired.sum()) > 0, f"{where}: the case must exercise the repair path"
    check_against_oracle(p, lite, dense, where)


@pytest.mark.interpret
@pytest.mark.parametrize("bit", ["OVERFLOW", "UNDERFILLED"])
def test_strict_capacity_events_publish_nothing(bit, seed):
    p = make_problem(seed, seq_lens=[1500], rows_per_seq=2, spread=1)
    tuning = (
        LiteTopKTuning(candidate_capacity=64)
        if bit == "OVERFLOW"
        else LiteTopKTuning(sample_size=600, calibration_offset=1e30)
    )
    lite, dense = run_both(p, tuning=tuning, repair=False)
    where = f"[strict {bit}] seed {seed}"
    assert lite.status.tolist() == [int(RowStatus[bit])] * 2, f"{where}: {lite.status.tolist()}"
    for i in range(2):
        assert_nothing_published(lite, i, where)
    assert not dense.status.any(), where


@pytest.mark.interpret
def test_nonfinite_rows_publish_nothing(seed):
    p = make_problem(seed, seq_lens=[700, 600], rows_per_seq=2, spread=1)
    p.weights[1, 5] = float("nan")
    cache = p.kv_cache.view(-1, 4352)
    page = int(p.block_table[1, 0])
    cache[page, 4096 + 3 * 4 + 2] = 255  # key 3 of sequence 1: a NaN scale byte, inside both windows
    lite, dense = run_both(p)
    want = [0, int(RowStatus.NONFINITE), int(RowStatus.NONFINITE), int(RowStatus.NONFINITE)]
    where = f"[nonfinite] seed {seed}"
    assert lite.status.tolist() == want and dense.status.tolist() == want, f"{where}: {lite.status.tolist()}"
    for i in (1, 2, 3):
        assert_nothing_published(lite, i, where)
    assert_same(lite, dense, torch.ones(4, dtype=torch.bool), where)


def check_unsupported(p, want: list[int], where: str):
    """litetopk_prefill and dense_topk_prefill on the Triton backend: exactly the rows in `want`
    get UNSUPPORTED (no InputError) and publish nothing; the backend says so itself
    (unsupported_rows); every other row is published and equals the reference backend's answer;
    raise_for_status names the rows."""
    lite, dense = run_both(p)
    bits = [int(RowStatus.UNSUPPORTED) if r in want else 0 for r in range(p.q_fp4.shape[0])]
    assert lite.status.tolist() == bits and dense.status.tolist() == bits, f"{where}: {lite.status.tolist()}"
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk)
    assert TritonBackend(paged="never").unsupported_rows(problem).cpu().nonzero().flatten().tolist() == want, where
    for r in want:
        assert_nothing_published(lite, r, where)
        assert_nothing_published(dense, r, where)
    reference = litetopk_prefill(*p.args(), topk=p.topk, weight_scale=p.weight_scale, backend="reference")
    assert not reference.status.any(), f"{where}: the reference backend scores every row"
    ok = torch.tensor(bits) == 0
    assert_same(lite, dense, ok, f"{where}: lite vs dense, triton")
    if DEVICE == "cpu":  # the interpreted Triton kernel sums heads in the reference's order; the compiled
        # Gluon kernel may round the head sum differently (docs/contract.md: precision)
        assert_same(lite, reference, ok, f"{where}: triton vs reference")
    with pytest.raises(RowFaultError, match="UNSUPPORTED") as info:
        lite.raise_for_status()
    assert info.value.rows == want, where


@pytest.mark.interpret
def test_unsupported_scale_spread_is_a_status_bit(seed):
    p = make_problem(seed, seq_lens=[200, 150], rows_per_seq=2, spread=1)
    p.q_scale[2, 7] = torch.tensor([120, 121, 130, 122], dtype=torch.uint8)  # 10 binades in one head vector
    p.q_fp4[2, 7] |= 0x11  # every block nonzero
    check_unsupported(p, [2], f"[query spread] seed {seed}")


@pytest.mark.interpret
def test_unsupported_key_spread_is_a_status_bit_of_the_rows_reading_it(seed):
    p = make_problem(seed, seq_lens=[200, 150], rows_per_seq=2, spread=1)
    # a key of sequence 1 at position 70: only the rows of sequence 1 whose window holds it
    windows = [(int(p.starts[r]), int(p.ends[r]), int(p.row_to_batch[r])) for r in range(4)]
    want = [r for r, (s, e, b) in enumerate(windows) if b == 1 and s <= 70 < e]
    assert want and len(want) < 4, f"the case needs a row reading position 70: {windows}"
    cache = p.kv_cache.view(-1, 4352)
    page, slot = int(p.block_table[1, 70 // 64]), 70 % 64
    cache[page, 64 * 64 + slot * 4 : 64 * 64 + slot * 4 + 4] = torch.tensor([120, 130, 121, 122], dtype=torch.uint8)
    cache[page, slot * 64 : slot * 64 + 64] |= 0x11  # every block of the key nonzero
    check_unsupported(p, want, f"[key spread] seed {seed}")


@pytest.mark.interpret
def test_head_weights_beyond_the_epilogue_range_are_a_status_bit(seed):
    p = make_problem(seed, seq_lens=[200], rows_per_seq=2, spread=1)
    p.weights[1, 9] = 2.0**-120  # 2^-120 beside weights of ~1 in a live row
    check_unsupported(p, [1], f"[head weights] seed {seed}")


@pytest.mark.interpret
@pytest.mark.parametrize("refresh, num_bins", [(16, 32), (4, 64)])
def test_scan_threshold_only_rises_and_stays_safe(refresh, num_bins, seed):
    p = make_problem(seed, seq_lens=[2400], rows_per_seq=3, spread=1)
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=512)
    backend = TritonBackend(paged="never", refresh=refresh, num_bins=num_bins)
    thresholds, ceilings = calibrate(problem, backend, 600)
    assert ceilings is not None and bool((thresholds != NO_KEY).all()), "the case needs a calibrated threshold"
    scan = backend.scan_candidates(problem, thresholds, 4096, ceilings=ceilings)
    scores, _ = backend.score_dense(problem)
    positions = torch.arange(scores.shape[1], device=scores.device)
    true_kth = torch.topk(make_keys(scores, positions[None, :]), 512, dim=1).values[:, -1]
    assert bool((scan.thresholds >= thresholds).all()), f"seed {seed}: a threshold went down"
    assert bool((scan.thresholds <= true_kth).all()), f"seed {seed}: a threshold passed the true K-th key"
    assert bool((scan.thresholds > thresholds).any()), f"seed {seed}: the histogram never raised a threshold"
    # The true K-th keys above come from the kernel under test; the float64 oracle anchors them: its
    # scores lie within the bound of the float64 ones, and no threshold passes the float64 K-th best
    # score by more than that bound.
    off = scores_off_the_oracle(p, scores)
    assert not off, f"seed {seed}: the backend's dense scores vs float64: {off[:3]}"
    oracle, bound = oracle_scores(p)
    threshold_scores = split_keys(scan.thresholds.cpu())[0].double().numpy()
    passed = np.flatnonzero(threshold_scores > oracle_kth(oracle, 512) + bound).tolist()
    assert not passed, f"seed {seed}: rows {passed}: a threshold passed the float64 K-th best score"


def check_schedule(row_to_batch, starts, ends, batch: int, block_rows: int, where: str) -> None:
    """build_schedule's invariants (schedule.py docstring) against the row metadata it was given."""
    n = row_to_batch.shape[0]
    no_flags = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    # every third live row holds a wide query vector: the order and the spans must not depend on it
    q_wide = (torch.arange(n) % 3 == 1) & (ends > starts)
    schedule = build_schedule(
        row_to_batch.to(DEVICE),
        starts.to(DEVICE),
        ends.to(DEVICE),
        batch,
        block_rows,
        q_wide.to(DEVICE),
        no_flags,
        Scratch(DEVICE),
    )
    rows, prog_batch, span = schedule.rows.cpu(), schedule.batch.cpu(), schedule.span.cpu()
    prog_q_wide = schedule.q_wide.cpu()
    rtb, starts, ends = row_to_batch.tolist(), starts.tolist(), ends.tolist()
    assert rows.dtype == prog_batch.dtype == span.dtype == torch.int32, where
    programs = max_programs(n, batch, block_rows)
    assert rows.shape == (programs, block_rows) and prog_batch.shape == (programs,), where
    assert span.shape == (programs, 2), where
    listed = rows[rows >= 0].tolist()
    assert sorted(listed) == list(range(n)), f"{where}: every row exactly once (live and empty)"
    live = [r for r in range(n) if ends[r] > starts[r]]
    empty = [r for r in range(n) if ends[r] <= starts[r]]
    kinds = {"live": 0, "empty": 0, "unused": 0}
    for prog in range(programs):
        lanes = rows[prog].tolist()
        members = [r for r in lanes if r >= 0]
        assert lanes == members + [-1] * (block_rows - len(members)), (
            f"{where}: program {prog} fills from the first lane"
        )
        if not members:
            kinds["unused"] += 1
            assert span[prog].tolist() == [0, 0], f"{where}: unused program {prog} must do no work"
        elif all(r in empty for r in members):
            kinds["empty"] += 1
            assert span[prog].tolist() == [0, 1], f"{where}: empty-row program {prog}: span {span[prog].tolist()}"
        else:
            kinds["live"] += 1
            assert all(r in live for r in members), f"{where}: program {prog} mixes live and empty rows"
            assert {rtb[r] for r in members} == {int(prog_batch[prog])}, f"{where}: program {prog}: one sequence"
            assert span[prog].tolist() == [min(starts[r] for r in members), max(ends[r] for r in members)], (
                f"{where}: program {prog}: the span covers exactly its rows' windows"
            )
            assert [starts[r] for r in members] == sorted(starts[r] for r in members), f"{where}: ordered by start"
            assert bool(prog_q_wide[prog]) == any(bool(q_wide[r]) for r in members), (
                f"{where}: program {prog}: q_wide is whether a row of it holds a wide query vector"
            )
    per_seq = [sum(1 for r in live if rtb[r] == b) for b in range(batch)]
    assert kinds["live"] == sum(-(-c // block_rows) for c in per_seq), f"{where}: live programs {kinds}"
    assert kinds["empty"] == -(-len(empty) // block_rows), f"{where}: empty-row programs {kinds}"
    work = (span[:, 1] - span[:, 0]).tolist()
    assert work == sorted(work, reverse=True), f"{where}: programs sorted by span length, longest first: {work}"
    if kinds["unused"]:
        assert all(w == 0 for w in work[programs - kinds["unused"] :]), f"{where}: unused programs last"


@pytest.mark.parametrize("block_rows", [1, 2, 4, 8])
@pytest.mark.parametrize("seq_lens, shuffled", [([300, 900, 200], False), ([300, 900, 200], True), ([900], True)])
def test_schedule_covers_every_row_once_within_one_sequence(block_rows, seq_lens, shuffled, seed):
    p = make_problem(seed, seq_lens=seq_lens, rows_per_seq=5, causal=False, spread=1)
    if shuffled:  # rows in no particular order: the schedule sorts them
        perm = torch.randperm(p.row_to_batch.shape[0], generator=torch.Generator().manual_seed(seed))
        p.row_to_batch, p.starts, p.ends = p.row_to_batch[perm], p.starts[perm], p.ends[perm]
        p.q_fp4, p.q_scale, p.weights = p.q_fp4[perm], p.q_scale[perm], p.weights[perm]
    p.starts[2] = p.ends[2] = 0  # an empty window (a causal prefill's first token): a program of empty rows
    p.ends[1] = p.starts[1]  # an empty window where its random start lies (the random windows draw them rarely)
    p.row_to_batch[4] = len(seq_lens)  # a bad batch index: INVALID_ROW, its window emptied
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=512)
    assert int(problem.row_status[4]) == int(RowStatus.INVALID_ROW)
    where = f"block_rows {block_rows}, sequences {seq_lens}, shuffled {shuffled}, seed {seed}"
    check_schedule(
        problem.row_to_batch.cpu(), problem.starts.cpu(), problem.ends.cpu(), len(seq_lens), block_rows, where
    )
    # the backend launches exactly this schedule
    ops = TritonBackend(paged="never", block_rows=block_rows).operands(problem)
    want = build_schedule(
        problem.row_to_batch,
        problem.starts,
        problem.ends,
        len(seq_lens),
        block_rows,
        ops.q_wide,
        ops.keys.flags,
        Scratch(DEVICE),
    )
    assert all(torch.equal(getattr(ops.schedule, f), getattr(want, f)) for f in ("rows", "batch", "span", "q_wide")), (
        where
    )
    wide = bool(((ops.keys.flags[0] | ops.keys.flags[1]) & FLAG_WIDE) != 0)
    busy, idle = ops.schedule.variants[::-1] if wide else ops.schedule.variants
    assert torch.equal(busy[0], ops.schedule.rows) and torch.equal(busy[1], ops.schedule.span), where
    assert bool((idle[0] == -1).all()) and not bool(idle[1].any()), f"{where}: the variant that does not apply"


@pytest.mark.parametrize("block_rows", [1, 4])
def test_schedule_gives_an_empty_window_away_from_zero_span_0_1(block_rows, seed):
    """A valid row whose window is empty at start 77 (no status bit, so validation keeps its
    metadata): the schedule must still put it in an empty-row program with span (0, 1)."""
    p = make_problem(seed, seq_lens=[300, 900], rows_per_seq=3, causal=False, spread=1)
    p.starts[1] = p.ends[1] = 77
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=512)
    assert problem.row_status.tolist() == [0] * 6 and int(problem.starts[1]) == 77
    check_schedule(
        problem.row_to_batch.cpu(),
        problem.starts.cpu(),
        problem.ends.cpu(),
        2,
        block_rows,
        f"block_rows {block_rows}, seed {seed}",
    )


@pytest.mark.parametrize("block_rows", [1, 3, 4])
@pytest.mark.parametrize(
    "case", ["random", "causal prefill", "all empty", "one row", "no rows", "every row empty but one"]
)
def test_schedule_invariants_on_random_metadata(case, block_rows, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, n = 4, 23
    rtb = torch.randint(0, batch, (n,), generator=gen, dtype=torch.int32)
    starts = torch.randint(0, 500, (n,), generator=gen, dtype=torch.int32)
    ends = starts + torch.randint(0, 300, (n,), generator=gen, dtype=torch.int32)
    if case == "causal prefill":
        rtb = torch.zeros(n, dtype=torch.int32)
        starts = torch.zeros(n, dtype=torch.int32)
        ends = torch.arange(n, dtype=torch.int32) * 17  # row 0: empty
    elif case == "all empty":
        starts, ends = torch.zeros(n, dtype=torch.int32), torch.zeros(n, dtype=torch.int32)
    elif case == "one row":
        rtb, starts, ends = rtb[:1], starts[:1], starts[:1] + 5
    elif case == "no rows":
        rtb, starts, ends = rtb[:0], starts[:0], ends[:0]
    elif case == "every row empty but one":
        ends = starts.clone()
        ends[7] = starts[7] + 1
    live = ends > starts  # effective metadata: empty rows carry zeros (row_checks.py)
    rtb, starts, ends = (torch.where(live, t, 0) for t in (rtb, starts, ends))
    check_schedule(rtb, starts, ends, batch, block_rows, f"[{case}] block_rows {block_rows}, seed {seed}")


@pytest.mark.interpret
def test_litetopk_allocates_no_score_matrix(seed):
    """Every tensor torch allocates on the Triton LiteTopK path (device or interpreter) is watched:
    none holds a quarter of the floats of the [rows, S] score matrix, while the dense path (the
    control) allocates the matrix itself. (The int64 candidate buffer is [rows, capacity], bounded
    by the capacity, not by S; the H200 benchmark reports the whole workspace.)"""
    from litetopk.kernels.pipeline import run_dense, run_litetopk
    from tests.kernels.test_reference_operator import LargestFloatTensors

    rows, keys = 8, 4096
    p = make_problem(seed, seq_lens=[keys], rows_per_seq=rows, causal=False, spread=1)
    p.starts.fill_(0)
    p.ends.fill_(keys)
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=512)
    backend = TritonBackend(paged="never")
    tuning = LiteTopKTuning(sample_size=512)
    matrix = rows * keys
    with LargestFloatTensors() as spy:
        lite = run_litetopk(problem, backend, repair=True, tuning=tuning)
    assert spy.largest[0] < matrix // 4, f"seed {seed}: the LiteTopK path built a float tensor {spy.largest}"
    with LargestFloatTensors() as control:
        dense = run_dense(problem, backend, selector="torch")
    assert control.largest[0] >= matrix, f"the spy must see the dense score matrix, saw {control.largest}"
    assert_same(
        lite.__class__(**{f: getattr(lite, f).cpu() for f in FIELDS + ("repaired", "candidates")}),
        dense.__class__(**{f: getattr(dense, f).cpu() for f in FIELDS + ("repaired", "candidates")}),
        torch.ones(rows, dtype=torch.bool),
        f"seed {seed}: litetopk vs dense",
    )


GLUON_CASES = {
    "three sequences, causal": dict(seq_lens=[700, 1500, 300], rows_per_seq=5, spread=0),
    "non-causal sub-windows, odd rows": dict(seq_lens=[2000, 900], rows_per_seq=3, causal=False, spread=0),
    "K=1024, one long sequence": dict(seq_lens=[3000], rows_per_seq=7, topk=1024, spread=0),
    "wide vectors (hi operands)": dict(seq_lens=[1100, 2500], rows_per_seq=4, spread=2),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GLUON_CASES))
def test_gluon_kernel_returns_the_triton_kernels_bits(name, seed):
    """The Gluon scoring kernel (sm_90) and its CI-tested Triton twin at the same tile: dense and
    strided score matrices bit for bit, and the same LiteTopK and dense results."""
    from litetopk.kernels.pipeline import run_dense, run_litetopk

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon scoring kernel runs on sm_90 only")
    p = make_problem(seed, **GLUON_CASES[name], note=name)
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk)
    gluon = TritonBackend(paged="never", scoring_kernel="gluon")
    twin = TritonBackend(paged="never", scoring_kernel="triton")
    where = f"[{name}] seed {seed}"
    assert gluon.operands(problem).gluon and not twin.operands(problem).gluon, f"{where}: the kernels asked for"
    wide = bool(twin.operands(problem).schedule.variants[1][1].any())  # the wide variant has the work (a device flag)
    assert wide == ("wide" in name), f"{where}: the case's wide vectors"
    for stride in (1, 5):
        g_scores, g_flags = gluon.score_dense(problem, stride=stride)
        t_scores, t_flags = twin.score_dense(problem, stride=stride)
        differ = (g_scores != t_scores) & ~(g_scores.isnan() & t_scores.isnan())
        assert not bool(differ.any()), f"{where}: stride {stride}: {int(differ.sum())} scores differ"
        assert torch.equal(g_flags, t_flags), where
    tuning = LiteTopKTuning(sample_size=600)
    g_lite, t_lite = (run_litetopk(problem, b, repair=True, tuning=tuning) for b in (gluon, twin))
    g_dense = run_dense(problem, gluon, selector="torch")
    for field in FIELDS:
        assert torch.equal(getattr(g_lite, field), getattr(t_lite, field)), f"{where}: lite {field}, gluon vs triton"
        assert torch.equal(getattr(g_lite, field), getattr(g_dense, field)), f"{where}: gluon lite vs dense {field}"


def test_gluon_kernel_is_refused_where_it_cannot_run(seed):
    with pytest.raises(ValueError, match="one tile"):
        TritonBackend(paged="never", block_rows=4, scoring_kernel="gluon")
    with pytest.raises(ValueError, match="scoring_kernel='fast'"):
        TritonBackend(paged="never", scoring_kernel="fast")
    p = make_problem(seed, seq_lens=[300], rows_per_seq=2, spread=1)
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=512)
    if DEVICE == "cpu":
        with pytest.raises(BackendUnavailableError, match="sm_90"):
            TritonBackend(paged="never", scoring_kernel="gluon").operands(problem)
    assert not TritonBackend(paged="never", scoring_kernel="triton").operands(problem).gluon


def ref_histogram_ranges(threshold_scores, ceilings, num_bins):
    """The scan's histogram origin and bin width in torch (prepare_scan_triton's contract)."""
    from litetopk.kernels.keys import split_keys

    lo = threshold_scores
    if ceilings is None:
        return lo.nan_to_num(neginf=0.0), torch.zeros_like(lo)
    hi, _ = split_keys(ceilings)
    width = (hi - lo) / num_bins
    usable = torch.isfinite(width) & (width > 2.0**-16 * torch.maximum(lo.abs(), hi.abs()))
    return torch.where(usable, lo, 0.0), torch.where(usable, width, 0.0)


@pytest.mark.interpret
@pytest.mark.parametrize("with_ceilings", [True, False])
def test_prepare_scan_derives_thresholds_and_histogram_ranges(with_ceilings, seed):
    from litetopk.kernels.keys import score_floor_keys, split_keys
    from litetopk.kernels.triton.scoring import prepare_scan_triton

    rng = np.random.default_rng(seed)
    rows = 300  # three programs of the launch, the last one partly masked
    lo = torch.from_numpy(rng.standard_normal(rows).astype(np.float32))
    hi = lo + torch.from_numpy(rng.exponential(size=rows).astype(np.float32))
    hi[::7] = lo[::7] * (1 + 2.0**-20)  # bins too narrow: no histogram
    lo[::11] = -0.0
    thresholds = score_floor_keys(lo)
    thresholds[::13] = NO_KEY  # no threshold: -inf, every score passes
    ceilings = score_floor_keys(hi)
    ceilings[::5] = NO_KEY
    got = prepare_scan_triton(thresholds.to(DEVICE), ceilings.to(DEVICE) if with_ceilings else None, 32)
    want_thr = split_keys(thresholds)[0]
    want_lo, want_width = ref_histogram_ranges(want_thr, ceilings if with_ceilings else None, 32)
    where = f"ceilings {with_ceilings}, seed {seed}"
    for name, want in (("thr", want_thr), ("raised", want_thr), ("hist_lo", want_lo), ("hist_width", want_width)):
        assert torch.equal(got[name].cpu(), want), f"{where}: {name}"
    assert bool((want_width > 0).any()) == with_ceilings and bool((want_width == 0).any()), f"{where}: cases"
    for name in ("appended", "hist", "nonfinite"):
        assert not bool(got[name].cpu().any()), f"{where}: {name} not zeroed"


@pytest.mark.interpret
def test_scan_outputs_without_thresholds_are_those_of_no_key_everywhere(seed):
    """A self-calibrating scan passes no thresholds and has no thr buffer (scan_buffers): the scan's
    finish (Triton and torch) then acts as for NO_KEY, threshold score -inf, on every row."""
    from litetopk.kernels.triton.scan_outputs import finish_scan_torch, finish_scan_triton
    from litetopk.kernels.triton.scoring import prepare_scan_triton, scan_buffers

    rows = 300
    scratch = Scratch(torch.device(DEVICE))
    no_key = torch.full((rows,), NO_KEY, dtype=torch.int64, device=DEVICE)
    own = scan_buffers(rows, 32, scratch, self_calibrating=True)
    assert set(own) == {"raised", "appended", "hist", "nonfinite"}, f"a self-calibrating scan's buffers: {set(own)}"
    prepared = prepare_scan_triton(no_key, None, 32, scratch)
    assert bool((prepared["thr"] == float("-inf")).all()), "NO_KEY thresholds are -inf scores"
    rng = np.random.default_rng(seed)
    # a scan's raw outputs: thresholds raised on some rows, counts, nonfinite flags
    raised = torch.from_numpy(rng.standard_normal(rows).astype(np.float32)).to(DEVICE)
    raised[::3] = float("-inf")
    outputs = dict(
        raised=raised,
        appended=torch.from_numpy(rng.integers(0, 5000, rows, dtype=np.int32)).to(DEVICE),
        nonfinite=torch.from_numpy((rng.random(rows) < 0.1).astype(np.int8)).to(DEVICE),
    )
    reference = finish_scan_torch(no_key, dict(prepared, **outputs))
    scan = dict(own, **outputs)
    for how, finished in (
        ("triton", finish_scan_triton(None, scan, scratch)),
        ("torch", finish_scan_torch(None, scan)),
    ):
        for name, a, b in zip(("final", "appended", "nonfinite"), finished, reference):
            assert torch.equal(a, b), f"finish ({how}) without thresholds: {name}, seed {seed}"
    assert bool((reference[0] != NO_KEY).any()) and bool((reference[0] == NO_KEY).any()), f"seed {seed}: cases"
