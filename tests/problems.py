"""Random prefill problems and an independent float64 oracle, written from docs/contract.md alone.

Nothing here calls the code under test except to build inputs: `litetopk.kernels.random_problem`
(which uses `quantize_mxfp4` / `pack_kv_cache`; the codec and the packing have their own
byte-level tests against ml_dtypes and the layout, and random_problem its own in test_problems.py).
"""

from __future__ import annotations

import numpy as np
import torch

from litetopk.kernels import LiteTopKTuning, random_problem
from litetopk.kernels.problems import RandomProblem, random_mxfp4
from litetopk.kernels.result import ANSWER_FIELDS, RESULT_FIELDS

H, D, PAGE = 64, 128, 64
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def decode_fp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float64 values [..., 128] from packed [..., 64] and scales [..., 4] (contract §1)."""
    low = packed & 0xF
    high = packed >> 4
    codes = np.stack([low, high], axis=-1).reshape(*packed.shape[:-1], D)
    values = E2M1[codes]
    factor = np.exp2(scales.astype(np.float64) - 127.0)
    return (values.reshape(*scales.shape, 32) * factor[..., None]).reshape(*packed.shape[:-1], D)


def oracle_scores(p: RandomProblem) -> tuple[np.ndarray, np.ndarray]:
    """(scores float64 [rows, S], bound float64 [rows]) with -inf outside windows.

    bound[i] covers float32 rounding of a 64-term head sum of non-negative-ReLU products:
    70 * 2^-24 * max_j sum_h |w_ih| relu(dot) * |weight_scale| (plus the final scale rounding).
    """
    cache = p.kv_cache.cpu().numpy().reshape(-1, PAGE * 68)
    values = cache[:, : PAGE * 64].reshape(-1, PAGE, 64)
    scales = cache[:, PAGE * 64 :].reshape(-1, PAGE, 4)
    bt = p.block_table.cpu().numpy().astype(np.int64)
    q = decode_fp4(p.q_fp4.cpu().numpy(), p.q_scale.cpu().numpy())  # [rows, H, D]
    w = p.weights.float().cpu().numpy().astype(np.float64)
    rtb = p.row_to_batch.cpu().numpy()
    st = p.starts.cpu().numpy()
    en = p.ends.cpu().numpy()
    s_max = int(en.max()) if len(en) else 0
    scores = np.full((len(rtb), s_max), -np.inf)
    bound = np.zeros(len(rtb))
    for i in range(len(rtb)):
        if en[i] <= st[i]:
            continue
        pos = np.arange(st[i], en[i])
        pages = bt[rtb[i], pos // PAGE]
        k = decode_fp4(values[pages, pos % PAGE], scales[pages, pos % PAGE])  # [n, D]
        dots = q[i] @ k.T  # [H, n]
        relu = np.maximum(dots, 0.0)
        scores[i, pos] = p.weight_scale * (w[i] @ relu)
        bound[i] = 70 * 2.0**-24 * abs(p.weight_scale) * float((np.abs(w[i]) @ relu).max())
    return scores, bound


def oracle_topk(scores: np.ndarray, k: int) -> list[list[int]]:
    """Positions of the k best of each row by (score desc, position asc), -inf excluded."""
    out = []
    for row in scores:
        live = np.nonzero(row > -np.inf)[0]
        order = np.lexsort((live, -row[live]))
        out.append(live[order][:k].tolist())
    return out


def oracle_kth(scores: np.ndarray, k: int) -> np.ndarray:
    """The k-th best float64 score of each row of oracle_scores' matrix (-inf where the window holds
    fewer than k keys)."""
    padded = np.concatenate([scores, np.full((scores.shape[0], k), -np.inf)], axis=1)
    return -np.sort(-padded, axis=1)[:, k - 1]


def scores_off_the_oracle(p: RandomProblem, scores: torch.Tensor, rows: list[int] | None = None) -> list[str]:
    """Where a backend's dense scores float32 [rows, >= S] (-inf outside each window, as score_dense
    returns them) leave the float64 oracle: finite anywhere but exactly on the row's window, or
    farther than the row's bound from the float64 score. [] when nowhere. `rows`: those to check
    (default every row; a backend's scores of a row it flags UNSUPPORTED mean nothing)."""
    want, bound = oracle_scores(p)
    width = want.shape[1]
    got = scores.detach().cpu().double().numpy()
    found = []
    for i in range(got.shape[0]) if rows is None else rows:
        row = got[i]
        inside = np.isfinite(want[i])
        if np.isfinite(row[width:]).any() or not np.array_equal(np.isfinite(row[:width]), inside):
            where = (
                np.flatnonzero(np.isfinite(row[:width]) != inside).tolist()
                + (width + np.flatnonzero(np.isfinite(row[width:]))).tolist()
            )
            found.append(f"row {i}: finite or -inf where the window says otherwise, at {where[:5]}")
            continue
        off = float(np.abs(row[:width][inside] - want[i][inside]).max(initial=0.0))
        if off > bound[i]:
            found.append(f"row {i}: a score {off:.3g} off the float64 score (bound {bound[i]:.3g})")
    return found


def random_fp4(shape, rng: np.random.Generator, spread: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 vectors of normal values whose 32-element blocks span `spread` binades of magnitude."""
    return random_mxfp4(shape, rng, spread)


def make_problem(seed: int, *, seq_lens: list[int], rows_per_seq: int, spread: int = 3, **options) -> RandomProblem:
    """`litetopk.kernels.random_problem` with `rows_per_seq` rows for each of `seq_lens`, blocks
    spread over 3 binades by default (wide vectors included); `options` are random_problem's."""
    return random_problem(len(seq_lens) * rows_per_seq, seq_lens, seed=seed, spread=spread, **options)


def scan_tuning(**options) -> LiteTopKTuning:
    """LiteTopKTuning(**options) that keeps every call on LiteTopK's scan (dense_route_bytes = 0): the tests of the
    scan (calibration, appends, certificate, repair) name it, so that they test the scan whatever the dense route's
    default (tests/kernels/test_paged_scoring.py tests the route)."""
    return LiteTopKTuning(dense_route_bytes=0, **options)


def results_equal(a, b) -> list[str]:
    """Names of the TopKResult fields where `a` and `b` differ (torch.equal on each); [] when equal. On a GPU
    the answer's fields only (result.ANSWER_FIELDS): the paged mode's `candidates` varies run to run there
    (programs sharing a row's threshold); elsewhere every field, `candidates` too."""
    names = ANSWER_FIELDS if a.values.is_cuda else tuple(RESULT_FIELDS)
    return [n for n in names if not torch.equal(getattr(a, n).cpu(), getattr(b, n).cpu())]
