"""The FlyDSL backend executed on a real gfx950 device (MI350X / MI355X) against the reference.

Not run by this project's CI (no gfx950 device there): every test is marked `gpu` and reported as
skipped with the reason. On an MI355X:
    .venv/bin/python -m pytest tests/kernels/test_flydsl_gfx950.py -q -rs
Exactness: the kernel's head sum runs in the reference's float32 order and each per-head dot is
exact while a dot's four block exponents span at most 9 binades (score_fp4.py), which the
`spread=1` problems keep; those cases compare bit for bit. The `spread=3` case compares with the
float64 oracle within its rounding bound, tie-aware. The same keys in every cache layout (ours at
any page stride, AITER's) give the same answer bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litetopk.kernels import dense_topk_prefill, litetopk_prefill
from litetopk.kernels.keys import NO_KEY, kth_key, make_keys
from litetopk.kernels.operator import get_backend, is_gfx950
from litetopk.kernels.validation import validate_prefill
from tests.kernels.test_aiter_layout import in_device
from tests.kernels.test_flydsl_addressing import LAYOUTS, cache_in_layout
from tests.problems import make_problem, oracle_scores, results_equal


def _gfx950() -> torch.device | None:
    if not torch.cuda.is_available() or torch.version.hip is None:
        return None
    device = torch.device("cuda", torch.cuda.current_device())
    return device if is_gfx950(device) else None


DEVICE = _gfx950()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE is None, reason="needs a ROCm gfx950 device (MI350X / MI355X); not run here"),
]

CASES = [
    pytest.param(dict(seq_lens=[3000, 700], rows_per_seq=5, topk=512), id="k512-two-seqs"),
    pytest.param(dict(seq_lens=[9000], rows_per_seq=6, topk=1024), id="k1024-calibrated"),
    pytest.param(dict(seq_lens=[2500, 40], rows_per_seq=4, topk=512, causal=False), id="k512-subwindows"),
    pytest.param(
        dict(seq_lens=[5000], rows_per_seq=3, topk=512, weights_dtype=torch.bfloat16, weight_scale=0.37),
        id="bf16-weights-scaled",
    ),
]


def _problem(seed, case, spread=1):
    return make_problem(seed, spread=spread, **case).to(DEVICE)


def _validated(p):
    return validate_prefill(*p.args(), topk=p.topk, weight_scale=p.weight_scale)


@pytest.mark.parametrize("case", CASES)
def test_dense_scores_equal_reference_bit_for_bit(seed, case):
    p = _problem(seed, case)
    problem = _validated(p)
    ours, ours_nf = get_backend("flydsl", DEVICE).score_dense(problem)
    ref, ref_nf = get_backend("reference", DEVICE).score_dense(problem)
    diff = (ours != ref) & ~(torch.isneginf(ours) & torch.isneginf(ref))
    assert not bool(diff.any()), f"{case}: {int(diff.sum())} scores differ, first at {torch.nonzero(diff)[:5].tolist()}"
    assert torch.equal(ours_nf, ref_nf), f"{case}: nonfinite flags differ"


@pytest.mark.parametrize("case", CASES)
def test_litetopk_equals_dense_exactly(seed, case):
    p = _problem(seed, case)
    lite = litetopk_prefill(*p.args(), topk=p.topk, weight_scale=p.weight_scale, backend="flydsl")
    dense = dense_topk_prefill(*p.args(), topk=p.topk, weight_scale=p.weight_scale, backend="flydsl")
    for name in ("values", "raw_indices", "physical_indices", "counts", "status"):
        assert torch.equal(getattr(lite, name), getattr(dense, name)), f"{case}: {name} differs"


@pytest.mark.parametrize("case", CASES)
def test_litetopk_equals_reference(seed, case):
    p = _problem(seed, case)
    ours = litetopk_prefill(*p.args(), topk=p.topk, weight_scale=p.weight_scale, backend="flydsl")
    ref = litetopk_prefill(*p.args(), topk=p.topk, weight_scale=p.weight_scale, backend="reference")
    for name in ("values", "raw_indices", "physical_indices", "counts", "status"):
        assert torch.equal(getattr(ours, name), getattr(ref, name)), f"{case}: {name} differs from the reference"


@pytest.mark.parametrize("case", CASES[:2])
def test_topk_sets_match_oracle_tie_aware_wide_spread(seed, case):
    """spread=3: dots may round differently from the reference; compare with the float64 oracle."""
    p = make_problem(seed, spread=3, **case)
    scores, bound = oracle_scores(p)
    res = litetopk_prefill(*p.to(DEVICE).args(), topk=p.topk, weight_scale=p.weight_scale, backend="flydsl")
    got = res.raw_indices.cpu().numpy()
    for i, row in enumerate(scores):
        live = np.sort(row[row > -np.inf])[::-1]
        k = min(p.topk, live.size)
        picked = got[i][got[i] >= 0]
        assert picked.size == k, f"{case} row {i}: {picked.size} indices, expected {k}"
        if k == 0:
            continue
        kth = live[k - 1]
        surely_in = np.nonzero(row > kth + 2 * bound[i])[0]
        surely_out = set(np.nonzero(row < kth - 2 * bound[i])[0].tolist())
        assert set(surely_in.tolist()) <= set(picked.tolist()), f"{case} row {i}: a clear top-K key is missing"
        assert not (surely_out & set(picked.tolist())), f"{case} row {i}: a clearly worse key was picked"


@pytest.mark.parametrize("case", CASES[:2])
def test_scan_threshold_only_tightens_to_a_lower_bound(seed, case):
    p = _problem(seed, case)
    problem = _validated(p)
    backend = get_backend("flydsl", DEVICE)
    dense, _ = backend.score_dense(problem)
    positions = torch.arange(dense.shape[1], device=DEVICE)
    keys = torch.where(torch.isneginf(dense), NO_KEY, make_keys(dense, positions[None, :]))
    true_kth = kth_key(keys, problem.topk)
    start = torch.full((problem.num_rows,), NO_KEY, dtype=torch.int64, device=DEVICE)
    scan = backend.scan_candidates(problem, start, capacity=8 * problem.topk)
    assert bool((scan.thresholds >= start).all()), f"{case}: a threshold went down"
    live = true_kth != NO_KEY
    assert bool((scan.thresholds[live] <= true_kth[live]).all()), f"{case}: a threshold passed the true K-th key"


def test_reruns_are_bit_identical(seed):
    p = _problem(seed, dict(seq_lens=[4000], rows_per_seq=4, topk=512))
    first = litetopk_prefill(*p.args(), topk=p.topk, backend="flydsl")
    second = litetopk_prefill(*p.args(), topk=p.topk, backend="flydsl")
    for name in ("values", "raw_indices", "physical_indices", "counts", "status"):
        assert torch.equal(getattr(first, name), getattr(second, name)), f"rerun: {name} differs"


def _in_layout(p, layout: str, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(kv_cache, kv_scale) on DEVICE holding p's keys in `layout`, strides and offsets kept."""
    placed = cache_in_layout(layout, p.kv_cache.cpu(), np.random.default_rng(seed))
    return tuple(None if t is None else in_device(t, DEVICE) for t in placed)


@pytest.mark.parametrize("layout", LAYOUTS[1:])
def test_dense_scores_in_every_layout_equal_reference_bit_for_bit(seed, layout):
    p = _problem(seed, dict(seq_lens=[3000, 700], rows_per_seq=4, topk=512))
    kv_cache, kv_scale = _in_layout(p, layout, seed)
    problem = validate_prefill(p.q_fp4, p.q_scale, kv_cache, *p.args()[3:], topk=p.topk, kv_scale=kv_scale)
    ours, ours_nf = get_backend("flydsl", DEVICE).score_dense(problem)
    ref, ref_nf = get_backend("reference", DEVICE).score_dense(_validated(p))
    diff = (ours != ref) & ~(torch.isneginf(ours) & torch.isneginf(ref))
    assert not bool(diff.any()), (
        f"{layout}: {int(diff.sum())} scores differ, first at {torch.nonzero(diff)[:5].tolist()}"
    )
    assert torch.equal(ours_nf, ref_nf), f"{layout}: nonfinite flags differ"


@pytest.mark.parametrize("layout", LAYOUTS[1:])
def test_litetopk_in_every_layout_equals_our_contiguous_layout(seed, layout):
    p = _problem(seed, dict(seq_lens=[9000, 300], rows_per_seq=3, topk=1024))
    kv_cache, kv_scale = _in_layout(p, layout, seed)
    first = litetopk_prefill(*p.args(), topk=p.topk, backend="flydsl")
    args = list(p.args())
    args[2] = kv_cache
    other = litetopk_prefill(*args, topk=p.topk, backend="flydsl", kv_scale=kv_scale)
    assert int(first.counts.sum()) > 0, f"seed {seed}: the case must publish keys"
    assert not results_equal(first, other), f"{layout}: {results_equal(first, other)} differ from [pages, 4352]"
