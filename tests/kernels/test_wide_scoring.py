"""Wide MXFP4 vectors placed where the scoring kernels change course (kernels/triton/scoring.py,
scoring_gluon.py): a wide key tile alone, at the first and the last tile of a window, in runs of
wide tiles (the Gluon kernel copies a wide tile's k_hi into the ring's other slot and the next lo
tile after the wide tile's MMA, so each neighbour pattern takes another copy order), and wide
query heads in a few rows; causal windows and random sub-windows (programs whose first tile is not
tile 0). Keys and heads are made wide by raising one block's scale byte by 5 binades in data of a
single binade, so exactly the planted vectors are wide (checked).

- interpreter and GPU: LiteTopK == dense on the Triton backend, every row against the float64 oracle;
- interpreter and GPU: the wide variant of the scoring kernel on data without wide vectors returns the
  narrow variant's dense scores and scan candidates bit for bit (its narrow steps are the common case's),
  and both lie within the float64 oracle's bound (an independent check, not only one variant against
  the other);
- GPU (sm_90): the Gluon kernel returns its Triton twin's bits on every layout, dense (stride 1 and 5)
  and LiteTopK.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.probes.gluon_wide_probe import forced_operands, operands_of
from litetopk.kernels import LiteTopKTuning
from litetopk.kernels.keys import NO_KEY, split_keys
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.triton.operands import FLAG_WIDE, decode_queries_fp4_triton
from litetopk.kernels.validation import validate_prefill
from tests.kernels.test_triton_backend import DEVICE, FIELDS, check_against_oracle, run_both
from tests.problems import make_problem, scores_off_the_oracle

# The Triton backend's prefill mode (int8 keys, a program a row group): its kernels on small problems.
pytestmark = pytest.mark.usefixtures("prefill_mode")

SEQ_LENS = [1300, 700]  # 21 and 11 key tiles of 64
PAGE, PAGE_BYTES, SCALES_AT = 64, 4352, 64 * 64
#: key tiles of sequence 0 that get one wide key each (sequence 1 gets those inside it)
LAYOUTS = {
    "isolated, first and last tile": [0, 6, 12, 20],
    "runs of wide tiles": [3, 4, 5, 9, 10],
    "every other tile": [1, 3, 5, 7, 9],
}
WIDE_HEADS = [(0, 7), (4, 0), (4, 63)]  # (row, head) whose query vector is made wide


def planted_problem(seed: int, tiles: list[int], causal: bool):
    """make_problem's data of one binade (no wide vector), then one wide key at a random position
    of each of `tiles` in each sequence that holds the tile, and the WIDE_HEADS query vectors wide."""
    p = make_problem(seed, seq_lens=SEQ_LENS, rows_per_seq=3, spread=0, causal=causal)
    rng = np.random.default_rng(seed)
    cache = p.kv_cache.view(-1, PAGE_BYTES)
    planted = []
    for b, length in enumerate(SEQ_LENS):
        for t in (t for t in tiles if t * PAGE < length):
            j = t * PAGE + int(rng.integers(0, min(PAGE, length - t * PAGE)))
            page, token = int(p.block_table[b, j // PAGE]), j % PAGE
            cache[page, SCALES_AT + 4 * token] += 5  # block 0: 5 binades above its neighbours
            planted.append((b, j))
    for row, head in WIDE_HEADS:
        p.q_scale[row, head, 0] += 5
    return p, planted


def check_planted(p, problem, planted, where):
    """Exactly the planted key and query vectors are wide (the decoded flags; keys are decoded up to
    the largest window end of their sequence)."""
    ops = TritonBackend(paged="never", scoring_kernel="triton").operands(problem)
    wide_keys = sorted(map(tuple, ((ops.keys.flags_of_keys & FLAG_WIDE) != 0).nonzero().tolist()))
    need = [int(p.ends[p.row_to_batch == b].max()) for b in range(len(SEQ_LENS))]
    seen = sorted((b, j) for b, j in planted if j < need[b])
    assert wide_keys == seen and len(seen) >= 3, f"{where}: wide keys {wide_keys}, planted {seen}"
    q_flags = decode_queries_fp4_triton(problem.q_fp4, problem.q_scale)[3]
    wide_heads = sorted(map(tuple, ((q_flags & FLAG_WIDE) != 0).nonzero().tolist()))
    assert wide_heads == sorted(WIDE_HEADS), f"{where}: wide heads {wide_heads}"


@pytest.mark.interpret
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "sub-windows"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_planted_wide_vectors_against_float64_oracle(layout, causal, seed):
    p, planted = planted_problem(seed, LAYOUTS[layout], causal)
    where = f"[{layout}, {'causal' if causal else 'sub-windows'}] seed {seed}"
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk)
    check_planted(p, problem, planted, where)
    lite, dense = run_both(p, tuning=LiteTopKTuning(sample_size=300))
    assert not lite.status.any() and not dense.status.any(), f"{where}: status {lite.status.tolist()}"
    check_against_oracle(p, lite, dense, where)


def dense_of_keys(keys: torch.Tensor, width: int) -> torch.Tensor:
    """float32 [rows, width]: each row's keys (NO_KEY padded) as scores at their positions, -inf elsewhere
    (the shape of score_dense, so the scan's candidates meet the oracle as dense scores do)."""
    scores, positions = split_keys(keys.cpu())
    dense = torch.full((keys.shape[0], width), float("-inf"))
    rows = torch.arange(keys.shape[0])[:, None].expand_as(positions)
    kept = positions >= 0
    dense[rows[kept], positions[kept].long()] = scores[kept]
    return dense


def scan_outputs(backend, problem):
    """The scan's outputs with no threshold and room for every key (so they do not depend on the
    order of the appends): each row's candidates (sorted), appended counts, final thresholds."""
    thresholds = torch.full((problem.num_rows,), NO_KEY, dtype=torch.int64, device=problem.device)
    scan = backend.scan_candidates(problem, thresholds, problem.max_end)
    slots = torch.arange(scan.keys.shape[1], device=scan.keys.device)[None, :]
    appended = torch.where(slots < scan.appended[:, None], scan.keys, NO_KEY)  # the slots past them: unwritten
    return appended.sort(dim=1).values, scan.appended, scan.thresholds


@pytest.mark.interpret
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "sub-windows"])
def test_wide_variant_on_narrow_data_is_the_narrow_variant(causal, seed):
    """Every program forced into the wide variant on data without wide vectors (the probe's case
    wide_none on spread 0): the dense scores and the scan's outputs of the narrow variant, bit for bit."""
    p = make_problem(seed, seq_lens=SEQ_LENS, rows_per_seq=3, spread=0, causal=causal)
    where = f"[{'causal' if causal else 'sub-windows'}] seed {seed}"
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk)
    backend = TritonBackend(paged="never")
    ops = backend.operands(problem)
    assert not bool(ops.schedule.variants[1][1].any()), f"{where}: the data must hold no wide vector"
    want_dense = backend.score_dense(problem)[0].clone()
    want_scan = scan_outputs(backend, problem)
    with operands_of(backend, problem, forced_operands(ops, "wide", True, True)):
        got_dense = backend.score_dense(problem)[0]
        got_scan = scan_outputs(backend, problem)
    assert torch.equal(got_dense, want_dense), f"{where}: dense scores of the wide variant"
    for name, got, want in zip(("keys", "appended", "thresholds"), got_scan, want_scan):
        assert torch.equal(got, want), f"{where}: scan {name} of the wide variant"
    # the float64 oracle: the wide variant's scores, and its scan's candidates (every key of each window,
    # with no threshold and room for all), are the window's scores within the kernel's documented bound
    off = scores_off_the_oracle(p, got_dense)
    assert not off, f"{where}: dense scores of the wide variant vs float64: {off[:3]}"
    off = scores_off_the_oracle(p, dense_of_keys(got_scan[0], got_dense.shape[1]))
    assert not off, f"{where}: scan candidates of the wide variant vs float64: {off[:3]}"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "sub-windows"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gluon_wide_variant_returns_the_triton_kernels_bits(layout, causal, seed):
    from litetopk.kernels.pipeline import run_litetopk

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon scoring kernel runs on sm_90 only")
    p, planted = planted_problem(seed, LAYOUTS[layout], causal)
    where = f"[{layout}, {'causal' if causal else 'sub-windows'}] seed {seed}"
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk)
    check_planted(p, problem, planted, where)
    gluon = TritonBackend(paged="never", scoring_kernel="gluon")
    twin = TritonBackend(paged="never", scoring_kernel="triton")
    for stride in (1, 5):
        g_scores, g_flags = gluon.score_dense(problem, stride=stride)
        t_scores, t_flags = twin.score_dense(problem, stride=stride)
        assert torch.equal(g_scores, t_scores), f"{where}: stride {stride}: {int((g_scores != t_scores).sum())} differ"
        assert torch.equal(g_flags, t_flags), where
    for name, g, t in zip(
        ("keys", "appended", "thresholds"), scan_outputs(gluon, problem), scan_outputs(twin, problem)
    ):
        assert torch.equal(g, t), f"{where}: scan {name}, gluon vs triton"
    tuning = LiteTopKTuning(sample_size=300)
    g_lite, t_lite = (run_litetopk(problem, b, repair=True, tuning=tuning) for b in (gluon, twin))
    for field in FIELDS:
        assert torch.equal(getattr(g_lite, field), getattr(t_lite, field)), f"{where}: lite {field}, gluon vs triton"
