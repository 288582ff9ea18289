"""The rows-dependent calibration sample of decode-shaped calls (calibration.sample_size_for): a call whose
candidate buffer holds every window (the Triton backend's paged mode) of few rows samples more densely; every
other call keeps LiteTopKTuning.sample_size. The function's values, the sizes the workspace sizing runs
(sample_size_changes), and decode calls with the denser sample against the float64 oracle and bit for bit
against the dense path (the Triton kernels under the interpreter, as in test_paged_scoring.py).
"""

from __future__ import annotations

import pytest
import torch

from litetopk.kernels import LiteTopKTuning, calibration, litetopk_prefill, registry
from litetopk.kernels.calibration import sample_size_changes, sample_size_for, sample_stride
from litetopk.kernels.reference import ReferenceBackend
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.triton.paged import paged_block_rows
from tests.kernels.test_triton_backend import check_against_oracle, run_both
from tests.problems import make_problem, scan_tuning

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

DEFAULT = LiteTopKTuning().sample_size


@pytest.mark.parametrize(
    "rows, want",
    [(1, 8192), (2, 8192), (3, 8192), (32, 8192), (33, 4096), (64, 4096), (65, 2048), (128, 2048), (4096, 2048)],
)
def test_decode_calls_of_few_rows_take_a_denser_sample(rows, want):
    assert DEFAULT == 2048, "the values below are the default sample's"
    assert sample_size_for(DEFAULT, rows, holds_windows=True) == want
    assert sample_size_for(DEFAULT, rows, holds_windows=False) == DEFAULT, "a prefill call keeps sample_size"


@pytest.mark.parametrize("rows", [0, 1, 2, 5, 8, 16, 64, 128, 4096])
@pytest.mark.parametrize("sample_size", [0, 64, 300, 2048, 8192, 16384])
def test_the_sample_size_rule(rows, sample_size):
    """max(sample_size, min(8192, 262144 / next power of two of rows)) where the buffer holds the windows;
    sample_size unchanged elsewhere, and where it is 0 (no sample)."""
    assert sample_size_for(sample_size, rows, holds_windows=False) == sample_size
    pow2 = 1
    while pow2 < rows:
        pow2 *= 2
    want = max(sample_size, min(8192, 262144 // pow2)) if sample_size > 0 else sample_size
    assert sample_size_for(sample_size, rows, holds_windows=True) == want


@pytest.mark.parametrize("holds_windows", [False, True])
@pytest.mark.parametrize("sample_size", [0, 64, 2048, 5000, 16384])
@pytest.mark.parametrize("max_rows", [0, 1, 7, 8, 9, 16, 17, 33, 100, 1000])
def test_sample_size_changes_list_the_most_rows_of_each_size(max_rows, sample_size, holds_windows):
    """For every rows <= max_rows a listed (rows', size) has the same size and rows' >= rows."""
    listed = sample_size_changes(max_rows, sample_size, holds_windows)
    assert listed == sorted(listed) and listed[-1][0] == max_rows and len({s for _, s in listed}) == len(listed)
    assert all(size == sample_size_for(sample_size, r, holds_windows) for r, size in listed)
    most = dict((size, r) for r, size in listed)
    for rows in range(max_rows + 1):
        size = sample_size_for(sample_size, rows, holds_windows)
        assert most.get(size, -1) >= rows, f"rows {rows} (sample {size}) not covered by {listed}"
    if not holds_windows:
        assert listed == [(max_rows, sample_size)], "a prefill path runs its bounds only"


@pytest.fixture
def sample_strides(monkeypatch):
    """The strides of the calibration samples the Triton backend scores in this test (score_dense with a
    stride > 1)."""
    strides = []
    score_dense = TritonBackend.score_dense

    def recording(self, problem, stride=1):
        if stride > 1:
            strides.append(stride)
        return score_dense(self, problem, stride)

    monkeypatch.setattr(TritonBackend, "score_dense", recording)
    return strides


@pytest.mark.interpret
def test_one_row_with_the_production_sample_is_exact(sample_strides, seed):
    """One decode row of 16,500 keys with the default tuning (on the scan): sampled with 8,192 keys (stride 2; the
    prefill mode's 2,048 would take stride 8), calibrated, and exact."""
    p = make_problem(seed, seq_lens=[16500], rows_per_seq=1, spread=1)
    assert paged_block_rows(1, 1), "the case must be decode-shaped"
    max_end = p.block_table.shape[1] * 64
    assert sample_stride(max_end, DEFAULT, p.topk) == 8
    lite, dense = run_both(p)
    where = f"seed {seed}"
    assert sample_strides == [sample_stride(max_end, 8192, p.topk)] == [2], f"{where}: strides {sample_strides}"
    assert not lite.status.any() and not dense.status.any(), f"{where}: status {lite.status.tolist()}"
    windows = (p.ends - p.starts).long()
    assert bool((lite.candidates.long() < windows).all()), f"{where}: not filtered: {lite.candidates.tolist()}"
    check_against_oracle(p, lite, dense, where)


@pytest.mark.interpret
@pytest.mark.parametrize("rows_per_seq, want", [(1, 1024), (3, 512)])
def test_the_middle_sizes_are_exact(rows_per_seq, want, sample_strides, monkeypatch, seed):
    """The rule at a smaller scale (DECODE_SAMPLE_KEYS 1,024, DECODE_SAMPLE_BUDGET 4,096, sample_size 300:
    two sequences of 3,000 keys): 2 rows sample 1,024 keys, 6 rows 512 (4,096 / 8), both denser than
    sample_size; exact against the oracle and the dense path."""
    monkeypatch.setattr(calibration, "DECODE_SAMPLE_KEYS", 1024)
    monkeypatch.setattr(calibration, "DECODE_SAMPLE_BUDGET", 4096)
    tuning = scan_tuning(sample_size=300)
    p = make_problem(seed, seq_lens=[3000, 2900], rows_per_seq=rows_per_seq, spread=1)
    rows, max_end = p.q_fp4.shape[0], p.block_table.shape[1] * 64
    assert paged_block_rows(rows, 2), "the case must be decode-shaped"
    assert sample_size_for(tuning.sample_size, rows, holds_windows=True) == want
    lite, dense = run_both(p, tuning=tuning)
    where = f"[{rows} rows] seed {seed}"
    stride = sample_stride(max_end, want, p.topk)
    assert stride != sample_stride(max_end, tuning.sample_size, p.topk), "the case must change the stride"
    assert sample_strides == [stride], f"{where}: strides {sample_strides}"
    assert not lite.status.any() and not dense.status.any(), f"{where}: status {lite.status.tolist()}"
    check_against_oracle(p, lite, dense, where)


@pytest.mark.interpret
@pytest.mark.parametrize("backend", ["reference", "triton prefill mode"])
def test_a_prefill_call_keeps_its_sample(backend, monkeypatch, seed):
    """A call whose buffer does not hold the windows (the reference backend; the Triton backend's prefill mode,
    TritonBackend(paged="never"), at one row) samples sample_size keys at any rows."""
    strides = []
    cls, instance = (
        (ReferenceBackend, ReferenceBackend())
        if backend == "reference"
        else (TritonBackend, TritonBackend(paged="never"))
    )
    score_dense = cls.score_dense

    def recording(self, problem, stride=1):
        strides.append(stride)
        return score_dense(self, problem, stride)

    monkeypatch.setattr(cls, "score_dense", recording)
    p = make_problem(seed, seq_lens=[5000], rows_per_seq=1, spread=1)
    name = "reference" if backend == "reference" else "triton"
    with registry.backend_instance(name, instance):
        litetopk_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk, backend=name)
    assert strides == [sample_stride(p.block_table.shape[1] * 64, DEFAULT, p.topk)] == [2], f"{strides}"
