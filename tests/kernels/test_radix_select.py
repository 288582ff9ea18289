"""The bucket-select candidate top-K (kernels/selection.py) against torch's top-K of each
row's passing keys (keys.select_topk_keys), bit for bit, at both supported K.

Runs the real kernel in Triton's CPU interpreter where no GPU exists (tests/conftest.py). Each case
draws a buffer of ordering keys (keys.make_keys of random float32 scores at distinct random
positions, stale keys past `kept`) and thresholds as the scan makes them (score floors at or below
the K-th best kept key), shaped to reach one path of the kernel, and checks with ref_path (the
kernel's bucket arithmetic in torch) that it does: n <= K passing keys (one sort of the scratch row);
the compacted scratch row (at most 2 K pass) or the whole row; the boundary bucket ranked by a sort or
by radix narrowing (zero / one / several passes, the bit-0 pass); the output row ordered by the two
window sorts or by one sort of K.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litetopk.kernels.keys import NO_KEY, make_keys, score_floor_keys, select_topk_keys
from litetopk.kernels.scratch import Scratch
from litetopk.kernels.selection import (
    BOUNDARY,
    CONFIG,
    DECODE_CONFIG,
    DECODE_ROWS,
    WINDOW,
    launch_config,
    select_topk_candidates_radix,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def ref_select(keys: torch.Tensor, kept: torch.Tensor, thresholds: torch.Tensor, k: int) -> torch.Tensor:
    """select_topk_keys over each row's first kept[r] keys at or above thresholds[r]."""
    live = torch.arange(keys.shape[1])[None, :] < kept[:, None]
    return select_topk_keys(torch.where(live & (keys >= thresholds[:, None]), keys, NO_KEY), k)


def ref_bucket(keys: torch.Tensor, low_score: int, mantissa: int) -> torch.Tensor:
    """The kernel's bucket: exponent and top `mantissa` bits of float32(score part - low_score), 1 + those
    of 1.0, clamped to [0, 32 << mantissa) (int64 -> float32 rounds to nearest, as the kernel's u32 does)."""
    bits = ((keys >> 32) - low_score).to(torch.float32).view(torch.int32)
    return ((bits >> (23 - mantissa)) - ((127 << mantissa) - 1)).clamp(0, (32 << mantissa) - 1)


def ref_path(keys, kept, thresholds, k, mantissa=None, boundary=BOUNDARY, window=WINDOW, **launch) -> list[str]:
    """Per row, the kernel's path: "n<=K", or "small/..." / "row/..." (scratch row or whole buffer row)
    then "narrowed" (boundary bucket over `boundary` keys), "windows" or "sorted" (one sort of K); the
    `launch` options (tiles, warps, register cap) change no path."""
    mantissa = mantissa or CONFIG.get(k, CONFIG[1024])[2]
    paths = []
    for r in range(keys.shape[0]):
        row = keys[r, : int(kept[r])]
        passing = row[row >= max(int(thresholds[r]), NO_KEY + 1)]
        if passing.numel() <= k:
            paths.append("n<=K")
            continue
        low = int((passing >> 32).min())
        bucket = ref_bucket(passing, low, mantissa)
        chosen = ref_bucket(torch.sort(passing, descending=True).values[k - 1 : k], low, mantissa)[0]
        above = bucket[bucket > chosen]
        widest = int(torch.bincount(above).max()) if above.numel() else 0
        where = "row" if passing.numel() > 2 * k else "small"
        if int((bucket == chosen).sum()) > boundary:
            paths.append(f"{where}/narrowed")
        else:
            paths.append(f"{where}/windows" if widest <= window else f"{where}/sorted")
    return paths


def buffer_of(scores: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    """Ordering keys of float32 scores [rows, capacity] at distinct random positions per row."""
    rows, capacity = scores.shape
    positions = np.stack([rng.choice(1 << 22, capacity, replace=False) for _ in range(rows)])
    return make_keys(torch.from_numpy(scores.astype(np.float32)), torch.from_numpy(positions))


def floor_at_rank(keys: torch.Tensor, kept: torch.Tensor, rank: int | None) -> torch.Tensor:
    """Per row: the score floor of its rank-th best kept key (as the scan's thresholds are), or
    NO_KEY for rank None or rows with fewer kept keys."""
    out = []
    for r in range(keys.shape[0]):
        row = torch.sort(keys[r, : int(kept[r])], descending=True).values
        if rank is None or row.numel() < rank:
            out.append(NO_KEY)
        else:  # the key's high 32 bits are its ordered score bits: floor = those bits, lowest position part
            out.append(int(row[rank - 1]) & ~0xFFFFFFFF)
    return torch.tensor(out, dtype=torch.int64)


def gaussian(rng, rows, capacity, k):
    return rng.standard_normal((rows, capacity))


def tail_of_window(rng, rows, capacity, k):
    """Scores like the scan's candidates: the top of a window of normal scores (one binade)."""
    return 2.5 + np.abs(rng.standard_normal((rows, capacity))) * 0.6


def tied_scores(rng, rows, capacity, k):
    """Heavy ties: 7 distinct scores; the K-th key is decided by positions (the low 32 bits)."""
    return rng.integers(-3, 4, (rows, capacity)).astype(np.float64)


def signed_zeros(rng, rows, capacity, k):
    """Half -0.0, half +0.0 (make_keys folds them into one score) and some negative scores."""
    scores = np.where(rng.random((rows, capacity)) < 0.5, -0.0, 0.0)
    scores[:, ::5] = -np.abs(rng.standard_normal((rows, len(range(0, capacity, 5)))))
    return scores


def one_bucket(rng, rows, capacity, k):
    """All keys but one in the lowest first-pass bucket: one huge score stretches the span."""
    scores = 1.0 + rng.random((rows, capacity)) * 1e-6
    scores[:, 3] = 3e38
    return scores


def negative(rng, rows, capacity, k):
    return -np.exp(rng.standard_normal((rows, capacity)) * 4)


def log_spread(rng, rows, capacity, k):
    """Score distances spread evenly over 20 doublings: about one key a bucket, the window sorts' case."""
    return 1.0 + 2.0 ** (-20 + 20 * rng.random((rows, capacity)))


def log_spread_and_a_tie(rng, rows, capacity, k):
    """log_spread with 40 keys of one top score: one bucket above the K-th holds more than WINDOW keys."""
    scores = log_spread(rng, rows, capacity, k)
    scores[:, 7:47] = 1.75
    return scores


# name -> (scores, kept per row as a fraction of capacity or an int, threshold rank in units of k or None,
#          the path every row takes: ref_path, or its prefix)
CASES = {
    "scan thresholds, compacted (<= 2K pass)": (tail_of_window, [1.0, 0.6], 1.2, "small/"),
    "threshold at the K-th key": (gaussian, [0.8, 0.5], 1.0, "n<=K"),
    "no threshold, whole row (> 2K pass)": (gaussian, [1.0, 0.75], None, "row/"),
    "threshold below 2K keys: whole row": (gaussian, [1.0, 1.0], 2.5, "row/"),
    "heavy ties in score, positions decide": (tied_scores, [1.0, 0.6], 1.3, "small/narrowed"),
    "-0.0 and +0.0 fold, negative scores": (signed_zeros, [1.0, 0.7], 1.1, ""),
    "all keys in one first-pass bucket": (one_bucket, [0.6, 1.0], 1.3, "small/narrowed"),
    "negative scores only": (negative, [0.9, 0.4], 1.5, "small/"),
    "a key a bucket: window sorts": (log_spread, [1.0, 0.8], 1.5, "small/windows"),
    "a wide bucket above the K-th: one sort of K": (log_spread_and_a_tie, [1.0, 0.8], 1.5, "small/sorted"),
    "fewer than K kept, and an empty row": (gaussian, [300, 0], None, "n<=K"),
    "exactly K kept": (gaussian, ["k", "k"], 1.0, "n<=K"),
}


# K = 1024 on the cases whose shape depends on K (the interpreter's tl.sort of 1024 keys is slow).
AT_1024 = [
    "scan thresholds, compacted (<= 2K pass)",
    "no threshold, whole row (> 2K pass)",
    "heavy ties in score, positions decide",
    "all keys in one first-pass bucket",
    "a key a bucket: window sorts",
    "exactly K kept",
]


def case_inputs(name, k, seed):
    """(keys [2, 3 k], kept [2], thresholds [2]) of CASES[name]."""
    make_scores, kept_spec, rank, _ = CASES[name]
    rng = np.random.default_rng(seed)
    capacity = 3 * k
    keys = buffer_of(make_scores(rng, 2, capacity, k), rng)
    kept = torch.tensor([k if f == "k" else (f if isinstance(f, int) else int(f * capacity)) for f in kept_spec])
    return keys, kept, floor_at_rank(keys, kept, None if rank is None else int(rank * k))


@pytest.mark.interpret
@pytest.mark.parametrize("name, k", [(name, 512) for name in CASES] + [(name, 1024) for name in AT_1024])
def test_radix_select_equals_torch_topk(name, k, seed):
    keys, kept, thresholds = case_inputs(name, k, seed)
    paths = ref_path(keys, kept, thresholds, k)
    assert all(p.startswith(CASES[name][3]) for p in paths), f"{name}, K={k}: the case reaches {paths}"
    got = select_topk_candidates_radix(keys.to(DEVICE), kept.to(DEVICE), thresholds.to(DEVICE), k)
    want = ref_select(keys, kept, thresholds, k)
    assert got.dtype == torch.int64 and got.shape == (2, k), name
    for r in range(2):
        assert torch.equal(got[r].cpu(), want[r]), f"{name}, K={k}: row {r} (kept {int(kept[r])}, {paths[r]})"


# The probe's sweep: other bucket resolutions, boundary sizes, window lengths (0: always one sort of K),
# tiles and warps, a register cap (compiled code only: the interpreter takes the option and ignores
# it); each on the cases whose path it changes.
VARIANTS = [
    dict(mantissa=3),
    dict(mantissa=6, window=8),
    dict(boundary=16),
    dict(window=0),
    dict(tile_rows=4, num_warps=2),
    dict(tile_rows=4, max_registers=80),
    dict(tile_rows=CONFIG[512][0], num_warps=CONFIG[512][1]),  # a prefill's launch (few rows: DECODE_CONFIG)
]


@pytest.mark.interpret
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{a}={b}" for a, b in v.items()))
@pytest.mark.parametrize("name", ["scan thresholds, compacted (<= 2K pass)", "a key a bucket: window sorts"])
def test_radix_select_variants_give_the_same_keys(name, variant, seed):
    keys, kept, thresholds = case_inputs(name, 512, seed)
    got = select_topk_candidates_radix(keys.to(DEVICE), kept.to(DEVICE), thresholds.to(DEVICE), 512, **variant)
    want = ref_select(keys, kept, thresholds, 512)
    assert torch.equal(got.cpu(), want), f"{name}, {variant}: {ref_path(keys, kept, thresholds, 512, **variant)}"


@pytest.mark.interpret
@pytest.mark.parametrize("name", ["scan thresholds, compacted (<= 2K pass)", "no threshold, whole row (> 2K pass)"])
def test_a_prefills_launch_at_k_1024_gives_the_same_keys(name, seed):
    """CONFIG[1024] (a prefill's many rows; these tests' few rows take DECODE_CONFIG by default)."""
    keys, kept, thresholds = case_inputs(name, 1024, seed)
    launch = dict(zip(("tile_rows", "num_warps", "mantissa"), CONFIG[1024]))
    got = select_topk_candidates_radix(keys.to(DEVICE), kept.to(DEVICE), thresholds.to(DEVICE), 1024, **launch)
    assert torch.equal(got.cpu(), ref_select(keys, kept, thresholds, 1024)), f"{name}, {launch}"


@pytest.mark.interpret
def test_radix_select_writes_out_from_a_workspace(seed):
    """`out` with a row stride is written in place,
    its other columns untouched; the buffers carved from a caller workspace (Scratch); int32 kept;
    thresholds at score floors from score_floor_keys."""
    rng = np.random.default_rng(seed)
    k, capacity = 512, 1536
    scores = rng.standard_normal((2, capacity)).astype(np.float32)
    keys = buffer_of(scores, rng)
    kept = torch.tensor([capacity, 700], dtype=torch.int32)
    kth = torch.tensor([np.sort(scores[r, : int(kept[r])])[::-1][k + 40] for r in range(2)])
    thresholds = score_floor_keys(kth)
    wide = torch.full((2, 2 * k), 7, dtype=torch.int64, device=DEVICE)
    out = wide[:, 1 : 1 + k]
    workspace = torch.zeros(1 << 16, dtype=torch.uint8, device=DEVICE)
    scratch = Scratch(DEVICE, workspace)
    got = select_topk_candidates_radix(
        keys.to(DEVICE), kept.to(DEVICE), thresholds.to(DEVICE), k, out=out, scratch=scratch
    )
    assert got.data_ptr() == out.data_ptr()
    assert 0 < scratch.used <= workspace.numel() and bool(workspace.any()), "the buffers are not the workspace's"
    assert torch.equal(out.cpu(), ref_select(keys, kept.long(), thresholds, k))
    assert bool((wide[:, 0] == 7).all()) and bool((wide[:, 1 + k :] == 7).all()), "columns outside out written"


@pytest.mark.interpret
def test_radix_select_refuses_a_bad_k_or_out():
    keys = torch.zeros(2, 8, dtype=torch.int64, device=DEVICE)
    kept = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="power of two"):
        select_topk_candidates_radix(keys, kept, kept, 500)
    with pytest.raises(ValueError, match="int64 \\[2, 512\\]"):
        select_topk_candidates_radix(keys, kept, kept, 512, out=torch.empty(2, 256, dtype=torch.int64, device=DEVICE))


def test_few_rows_take_the_decode_launch():
    """A decode step's few rows take DECODE_CONFIG (wider programs), a prefill's CONFIG; both resolve
    buckets alike, so the paths (ref_path) do not depend on the rows."""
    for k in (512, 1024):
        assert launch_config(k, 1) == launch_config(k, DECODE_ROWS - 1) == DECODE_CONFIG[k]
        assert launch_config(k, DECODE_ROWS) == launch_config(k, 8192) == CONFIG[k]
        assert DECODE_CONFIG[k][2] == CONFIG[k][2]
    assert launch_config(2048, 4) == DECODE_CONFIG[1024] and launch_config(64, 4096) == CONFIG[1024]
