"""The Triton backend's paged mode (decode-shaped calls): the split schedule, the paged scoring kernel and
the operator on decode shapes, against the float64 oracle and bit for bit between LiteTopK and dense.

Under the interpreter (CI) the kernel runs its tl twin of the E2M1 decode over a grid of
paged.INTERPRETED_PROGRAMS programs, so several programs share every row group's tiles; on a GPU the
same tests run the compiled kernel with its PTX decode, and the `gpu` tests compare the two decodes and
the two modes of the backend.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litetopk.kernels import BackendUnavailableError, LiteTopKTuning, calibration, litetopk_prefill, registry
from litetopk.kernels.aiter_layout import aiter_pages_from_litetopk
from litetopk.kernels.calibration import calibrate
from litetopk.kernels.keys import make_keys, split_keys
from litetopk.kernels.result import ANSWER_FIELDS
from litetopk.kernels.scratch import Scratch
from litetopk.kernels.triton import TritonBackend, paged
from litetopk.kernels.triton.paged import cache_in_words, launch_paged_scoring, paged_block_rows
from litetopk.kernels.triton.paged_scoring import FAULT_DENSE
from litetopk.kernels.triton.paged_scoring_gluon import GLUON_PAGED_OPTIONS, gluon_paged_options
from litetopk.kernels.triton.split_schedule import build_split_schedule_torch, build_split_schedule_triton
from litetopk.kernels.validation import validate_prefill
from tests.kernels.test_aiter_layout import in_device, in_padded_slab
from tests.kernels.test_triton_backend import check_against_oracle, run_both
from tests.problems import make_problem, oracle_scores, scan_tuning

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def paged_mode():
    """Every backend="triton" call in paged mode whatever its shapes (TritonBackend(paged="always"))."""
    with registry.backend_instance("triton", TritonBackend(paged="always")):
        yield


#: GLUON_PAGED_OPTIONS of each Gluon kernel variant (the launched one first)
GLUON_VARIANTS = {"launched": {}}
#: the strided launch's options as launched (a variant that leaves them alone repeats the launched case there)
LAUNCHED_STRIDED = gluon_paged_options(strided=True)


@pytest.fixture(params=list(GLUON_VARIANTS))
def gluon_variant(request, monkeypatch):
    """The Gluon paged kernel's variant (paged_scoring_gluon.GLUON_PAGED_OPTIONS) for this test's launches."""
    for name, value in GLUON_VARIANTS[request.param].items():
        monkeypatch.setitem(GLUON_PAGED_OPTIONS, name, value)
    return request.param


def ref_split_schedule(row_to_batch: list[int], starts: list[int], ends: list[int], block_rows: int):
    """(groups as lists of rows, spans, tiles) in plain Python: runs of one sequence cut every block_rows rows."""
    groups = []
    for row, b in enumerate(row_to_batch):
        if groups and row_to_batch[groups[-1][-1]] == b and len(groups[-1]) < block_rows and groups[-1][-1] == row - 1:
            groups[-1].append(row)
        else:
            groups.append([row])
    spans, tiles = [], []
    for group in groups:
        windows = [(starts[r], ends[r]) for r in group if ends[r] > starts[r]]
        lo = min((s for s, _ in windows), default=0)
        hi = max((e for _, e in windows), default=0)
        spans.append((lo, hi))
        tiles.append(-(-hi // 64) - lo // 64 if windows else 0)
    return groups, spans, tiles


@pytest.mark.parametrize("block_rows", [1, 2])
@pytest.mark.parametrize("case", ["sequence-major", "interleaved", "one row", "all empty", "over one block of rows"])
def test_split_schedule_groups_rows_and_splits_their_tiles(case, block_rows, seed):
    gen = torch.Generator().manual_seed(seed)
    rows = {"one row": 1, "over one block of rows": 2500}.get(case, 37)
    batch = 9
    rtb = torch.randint(0, batch, (rows,), generator=gen)
    if case != "interleaved":
        rtb = torch.sort(rtb).values
    ends = torch.randint(0, 3000, (rows,), generator=gen)
    starts = (ends - torch.randint(0, 2000, (rows,), generator=gen)).clamp_min(0)
    empty = torch.rand(rows, generator=gen) < (1.0 if case == "all empty" else 0.2)
    rtb, starts, ends = (torch.where(empty, 0, t).to(torch.int32) for t in (rtb, starts, ends))
    where = f"[{case}, block_rows {block_rows}] seed {seed}"
    want_groups, want_spans, want_tiles = ref_split_schedule(rtb.tolist(), starts.tolist(), ends.tolist(), block_rows)
    for build in (
        lambda: build_split_schedule_torch(rtb, starts, ends, block_rows, 16),
        lambda: build_split_schedule_triton(
            rtb.to(DEVICE), starts.to(DEVICE), ends.to(DEVICE), block_rows, 16, Scratch(DEVICE)
        ),
    ):
        got = build()
        g = int(got.groups[0])
        assert g == len(want_groups), f"{where}: {g} groups, want {len(want_groups)}"
        first, count = got.group_row.tolist(), got.group_count.tolist()
        rows_of = [list(range(first[i], first[i] + count[i])) for i in range(g)]
        assert rows_of == want_groups, f"{where}: groups"
        assert got.group_span[:g].tolist() == [list(s) for s in want_spans], f"{where}: spans"
        assert got.tile_offset.tolist() == [0, *np.cumsum(want_tiles).tolist(), *[sum(want_tiles)] * (rows - g)], (
            f"{where}: tile offsets"
        )
        assert not bool(got.group_count[g:].any()) and not bool(got.group_span[g:].any()), f"{where}: unused groups"
        assert not bool(got.faults.any()), f"{where}: fault words zeroed"
        assert not bool(got.appended.any()) and not bool(got.hist.any()), f"{where}: the scan's counts zeroed"
        assert got.hist.shape == (rows, 16) and bool(torch.isneginf(got.raised).all()), f"{where}: raised -inf"


def paged_dense_scores(
    p, *, block_rows: int, programs: int, cache_format: str = "litetopk", gluon: bool = False, stride: int = 1
):
    """The paged kernel's dense scores [rows, ceil(max_end / stride)] of problem p (interpreter or GPU; the
    Gluon twin with `gluon`), poisoned first, and its fault words."""
    args = list(p.args())
    kw = dict(topk=p.topk, weight_scale=p.weight_scale)
    if cache_format == "aiter":
        args[2], kw["kv_scale"] = aiter_pages_from_litetopk(p.kv_cache)
    problem = validate_prefill(
        *[t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in args],
        **{k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kw.items()},
    )
    backend = TritonBackend(paged="always")
    ops = backend.operands(problem)
    schedule = build_split_schedule_torch(problem.row_to_batch, problem.starts, problem.ends, block_rows, 32)
    out = torch.full((problem.num_rows, -(-problem.max_end // stride)), 12345.0, device=DEVICE)
    launch_paged_scoring(
        problem.cache,
        problem.block_table,
        problem.row_to_batch,
        ops.queries,
        schedule,
        problem.starts,
        problem.ends,
        topk=p.topk,
        programs=programs,
        fault_set=FAULT_DENSE,
        use_asm=ops.use_asm,
        gluon=gluon,
        out=out,
        stride=stride,
    )
    return out.cpu(), schedule.faults[FAULT_DENSE].cpu()


@pytest.mark.interpret
@pytest.mark.parametrize("block_rows", [1, 2])
@pytest.mark.parametrize("cache_format", ["litetopk", "aiter"])
def test_paged_kernel_scores_within_the_float64_bound(block_rows, cache_format, seed):
    p = make_problem(seed, seq_lens=[700, 300, 1100], rows_per_seq=2, spread=2, causal=False)
    got, faults = paged_dense_scores(p, block_rows=block_rows, programs=5, cache_format=cache_format)
    want, bound = oracle_scores(p)
    where = f"[block_rows {block_rows}, {cache_format}] seed {seed}"
    width = want.shape[1]
    assert not bool((got == 12345.0).any()), f"{where}: every score written"
    assert bool(torch.isneginf(got[:, width:]).all()), f"{where}: -inf past the windows"
    inside = np.isfinite(want)
    assert bool(torch.isneginf(got[:, :width][torch.from_numpy(~inside)]).all()), f"{where}: -inf outside windows"
    error = np.abs(got[:, :width].double().numpy()[inside] - want[inside])
    limit = np.broadcast_to(bound[:, None], want.shape)[inside] + 1e-30
    assert bool((error <= limit).all()), f"{where}: max error / bound {float((error / limit).max())}"
    assert not bool(faults.any()), f"{where}: no fault in these windows"


@pytest.mark.interpret
def test_paged_kernel_gives_the_prefill_modes_bits_at_two_rows(seed):
    p = make_problem(seed, seq_lens=[900, 500], rows_per_seq=2, spread=2)
    paged, _ = paged_dense_scores(p, block_rows=2, programs=4)
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk, weight_scale=p.weight_scale)
    prefill, _ = TritonBackend(paged="never").score_dense(problem)
    assert torch.equal(paged, prefill.cpu()), f"seed {seed}: paged and prefill scores differ"


PAGED_CASES = {
    # name: (make_problem arguments, operator keywords); every case is decode-shaped (auto picks paged)
    "many sequences, one row each, uneven lengths": (
        dict(seq_lens=[1500, 300, 2200, 900, 64, 1300], rows_per_seq=1, spread=1),
        {},
    ),
    "next_n 2, K=1024, windows shorter than K": (dict(seq_lens=[900, 1200], rows_per_seq=2, topk=1024, spread=1), {}),
    "next_n 4, sliding windows (non-causal)": (dict(seq_lens=[2000, 1400], rows_per_seq=4, causal=False, spread=1), {}),
    "next_n 3, wide vectors (hi operands)": (dict(seq_lens=[1300, 700], rows_per_seq=3, spread=2), {}),
    "calibrated, several programs raise one row's threshold": (
        dict(seq_lens=[3200, 3000], rows_per_seq=1, spread=1),
        dict(tuning=scan_tuning(sample_size=1000)),
    ),
    "equal lengths, next_n 2, calibrated": (
        dict(seq_lens=[2400, 2400, 2400], rows_per_seq=2, spread=1),
        dict(tuning=scan_tuning(sample_size=500)),
    ),
    "tiny capacity: repaired": (
        dict(seq_lens=[1500, 900], rows_per_seq=1, spread=1),
        dict(tuning=scan_tuning(candidate_capacity=40)),
    ),
    "forced underfill: repaired": (
        dict(seq_lens=[2000, 1800], rows_per_seq=2, spread=1),
        dict(tuning=scan_tuning(sample_size=600, calibration_offset=1e30)),
    ),
}


@pytest.mark.interpret
@pytest.mark.parametrize("name", list(PAGED_CASES))
def test_paged_operator_against_float64_oracle(name, seed, monkeypatch):
    build, kw = PAGED_CASES[name]
    if "tuning" in kw:  # the tuning's sample_size as given: decode calls of few rows would sample 8,192 keys
        # (calibration.sample_size_for; tests/kernels/test_decode_sample.py), too many for these windows
        monkeypatch.setattr(calibration, "DECODE_SAMPLE_KEYS", 0)
    p = make_problem(seed, **build, note=name)
    assert paged_block_rows(p.q_fp4.shape[0], p.block_table.shape[0]), f"[{name}]: the case must be decode-shaped"
    lite, dense = run_both(p, **kw)
    where = f"[{name}] seed {seed}"
    assert not lite.status.any() and not dense.status.any(), f"{where}: status {lite.status.tolist()}"
    if "repaired" in name:
        assert int(lite.repaired.sum()) > 0, f"{where}: the case must exercise the repair path"
    if "calibrated" in name:  # the scan filtered (every window holds >= K sampled keys): fewer candidates than keys
        windows = (p.ends - p.starts).long()
        assert bool((lite.candidates.long() < windows).all()), f"{where}: candidates {lite.candidates.tolist()}"
    check_against_oracle(p, lite, dense, where)


@pytest.mark.interpret
@pytest.mark.parametrize("next_n, topk", [(1, 512), (2, 1024)])
def test_the_dense_route_answers_as_the_scan(next_n, topk, seed, monkeypatch):
    """LiteTopKTuning.dense_route_bytes: a decode call takes the dense route (the paged kernel's dense scores, then
    the exact selector: the radix selector's Triton kernels, here under the interpreter): exact against float64,
    the scan route's published fields bit for bit (a row with a NaN weight among them: the same status bit, nothing
    published), and `candidates` counts each published row's window. A bound below the call's score matrix keeps
    the scan."""
    from contextlib import nullcontext

    from bench.probes.host_time import triton_stages_on_cpu
    from litetopk.kernels import pipeline

    routes = []
    run_dense = pipeline.run_dense
    monkeypatch.setattr(pipeline, "run_dense", lambda *a, **kw: routes.append(kw["selector"]) or run_dense(*a, **kw))
    p = make_problem(seed, seq_lens=[1500, 300, 2200], rows_per_seq=next_n, topk=topk, spread=1)
    p.weights[0, 3] = float("nan")  # row 0 scores NaN: a status bit, nothing published, on both routes
    assert paged_block_rows(p.q_fp4.shape[0], p.block_table.shape[0]), "the case must be decode-shaped"
    matrix = p.q_fp4.shape[0] * validate_prefill(*p.args(), topk=p.topk).max_end * 4  # the call's score matrix
    with triton_stages_on_cpu() if DEVICE == "cpu" else nullcontext():
        routed, dense = run_both(p, tuning=LiteTopKTuning(dense_route_bytes=matrix))
    assert routes == ["exact"], f"the call did not take the dense route: {routes}"
    scanned, _ = run_both(p, tuning=LiteTopKTuning(dense_route_bytes=matrix - 4))
    assert routes == ["exact"], f"a bound below the score matrix must keep the scan: {routes}"
    where = f"[next_n {next_n}, K {topk}] seed {seed}"
    assert routed.status[0] != 0 and not routed.status[1:].any(), f"{where}: status {routed.status.tolist()}"
    check_against_oracle(p, routed, dense, where)
    for field in ANSWER_FIELDS:
        assert torch.equal(getattr(routed, field), getattr(scanned, field)), f"{where}: {field} differs from the scan's"
    windows = (p.ends - p.starts).long()
    assert torch.equal(routed.candidates[1:].long(), windows[1:]), f"{where}: {routed.candidates.tolist()}"


@pytest.mark.interpret
def test_paged_mode_forced_on_a_prefill_shaped_call_is_exact(paged_mode, seed):
    p = make_problem(seed, seq_lens=[1400], rows_per_seq=6, spread=1)
    lite, dense = run_both(p, tuning=scan_tuning(sample_size=300))
    where = f"seed {seed}"
    assert not lite.status.any(), f"{where}: status {lite.status.tolist()}"
    check_against_oracle(p, lite, dense, where)


@pytest.mark.interpret
def test_unsupported_keys_are_a_status_bit_of_the_rows_reading_them(seed):
    p = make_problem(seed, seq_lens=[600, 600], rows_per_seq=1, spread=0, causal=False)
    page = int(p.block_table[1, 3])  # position 3 * 64 + 5 of sequence 1: token 5 of this page, scales at 4096 + 4 * 5
    p.kv_cache.view(-1, 4352)[page, 4096 + 20 : 4096 + 24] = torch.tensor([100, 109, 110, 110], dtype=torch.uint8)
    p.starts[:] = torch.tensor([0, 0], dtype=torch.int32)
    p.ends[:] = torch.tensor([600, 600], dtype=torch.int32)
    lite, dense = run_both(p)
    where = f"seed {seed}"
    assert lite.status.tolist() == [0, 128] and dense.status.tolist() == [0, 128], f"{where}: {lite.status.tolist()}"
    p.starts[1] = 3 * 64 + 6  # the key left out of the window: the row is answered
    lite, dense = run_both(p)
    assert lite.status.tolist() == [0, 0], f"{where}: {lite.status.tolist()}"
    check_against_oracle(p, lite, dense, where)


@pytest.mark.gpu
@pytest.mark.parametrize("block_rows", [1, 2])
def test_ptx_decode_gives_the_tl_decodes_bits(block_rows, seed):
    p = make_problem(seed, seq_lens=[3000, 2000, 900], rows_per_seq=2, spread=3)
    problem = validate_prefill(*[t.to("cuda") for t in p.args()], topk=p.topk)
    ops = TritonBackend(paged="always").operands(problem)
    schedule = build_split_schedule_torch(problem.row_to_batch, problem.starts, problem.ends, block_rows, 32)
    outs = []
    for use_asm in (True, False):
        out = torch.full((problem.num_rows, problem.max_end), 12345.0, device="cuda")
        launch_paged_scoring(
            problem.cache,
            problem.block_table,
            problem.row_to_batch,
            ops.queries,
            schedule,
            problem.starts,
            problem.ends,
            topk=p.topk,
            programs=ops.programs,
            fault_set=FAULT_DENSE,
            use_asm=use_asm,
            out=out,
        )
        outs.append(out)
    assert torch.equal(outs[0], outs[1]), f"seed {seed}: the PTX and tl decodes differ"
    assert not bool((outs[0] == 12345.0).any()), f"seed {seed}: every score written"


@pytest.mark.gpu
@pytest.mark.parametrize("next_n, topk", [(1, 512), (2, 1024), (4, 512)])
def test_paged_mode_on_the_gpu_is_exact_at_decode_shapes(next_n, topk, seed):
    p = make_problem(seed, seq_lens=[20000, 9000, 33000, 4000] * 4, rows_per_seq=next_n, topk=topk, spread=1)
    lite, dense = run_both(p)
    where = f"[next_n {next_n}, K {topk}] seed {seed}"
    assert not lite.status.any(), f"{where}: status {lite.status.tolist()}"
    check_against_oracle(p, lite, dense, where)


@pytest.mark.gpu
def test_paged_and_prefill_modes_agree_on_the_gpu(seed):
    """Both modes are exact against float64; at two rows a group the paged kernel has the prefill kernel's
    layout and head-sum order: the same bits."""
    p = make_problem(seed, seq_lens=[12000, 7000, 15000], rows_per_seq=2, spread=1)
    problem = validate_prefill(*[t.to("cuda") for t in p.args()], topk=p.topk)
    paged, _ = paged_dense_scores(p, block_rows=2, programs=264)
    prefill, _ = TritonBackend(paged="never").score_dense(problem)
    assert torch.equal(paged, prefill.cpu()), f"seed {seed}: paged (2 rows a group) and prefill scores differ"


@pytest.mark.gpu
@pytest.mark.parametrize("spread", [1, 3])  # 1: ~90 % of tiles narrow (one MMA); 3: every full tile wide
@pytest.mark.parametrize("block_rows", [1, 2])
@pytest.mark.parametrize("cache_format, stride", [("litetopk", 1), ("aiter", 1), ("litetopk", 7)])
def test_gluon_paged_kernel_gives_the_triton_kernels_bits(
    block_rows, cache_format, stride, spread, gluon_variant, seed
):
    if stride != 1 and gluon_variant != "launched" and gluon_paged_options(strided=True) == LAUNCHED_STRIDED:
        pytest.skip("the calibration sample's strided launch is the launched one in this variant (gluon_paged_options)")
    p = make_problem(seed, seq_lens=[9000, 3000, 14000], rows_per_seq=2, spread=spread, causal=False)
    where = f"[block_rows {block_rows}, {cache_format}, stride {stride}, spread {spread}, {gluon_variant}] seed {seed}"
    triton_scores, triton_faults = paged_dense_scores(
        p, block_rows=block_rows, programs=264, cache_format=cache_format, stride=stride
    )
    gluon_scores, gluon_faults = paged_dense_scores(
        p, block_rows=block_rows, programs=396, cache_format=cache_format, gluon=True, stride=stride
    )
    assert not bool((gluon_scores == 12345.0).any()), f"{where}: every score written"
    assert torch.equal(gluon_scores, triton_scores), f"{where}: Gluon and Triton paged scores differ"
    assert torch.equal(gluon_faults, triton_faults), f"{where}: fault words differ"


@pytest.mark.gpu
@pytest.mark.parametrize("next_n", [1, 2])
def test_gluon_paged_scan_answers_as_the_triton_paged_scan(next_n, gluon_variant, seed):
    p = make_problem(seed, seq_lens=[30000, 12000, 41000, 800] * 3, rows_per_seq=next_n, spread=1)
    answers = {}
    for kernel in ("triton", "gluon"):
        with registry.backend_instance("triton", TritonBackend(paged="always", scoring_kernel=kernel)):
            answers[kernel], _ = run_both(p)
    where = f"[next_n {next_n}, {gluon_variant}] seed {seed}"
    for field in ("values", "raw_indices", "physical_indices", "counts", "status"):
        assert torch.equal(getattr(answers["gluon"], field), getattr(answers["triton"], field)), f"{where}: {field}"


@pytest.mark.interpret
@pytest.mark.parametrize("stride, offset", [(4354, 2), (4360, 4), (4608, 0)])
def test_paged_mode_reads_pages_at_any_stride_and_offset(stride, offset, seed):
    """The contract admits pages any stride >= 4352 bytes apart at any offset: the paged mode answers
    them exactly (the Gluon kernel's 16-byte words only where every page starts on 16 bytes)."""
    p = make_problem(seed, seq_lens=[1300, 700], rows_per_seq=2, spread=1)
    p.kv_cache = in_device(in_padded_slab(p.kv_cache, stride, offset, seed=seed), DEVICE)  # (.to() would compact it)
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk)
    assert cache_in_words(problem.cache) == (stride % 16 == 0 and offset % 16 == 0)
    lite, dense = run_both(p)
    where = f"[stride {stride}, offset {offset}] seed {seed}"
    assert not lite.status.any(), f"{where}: status {lite.status.tolist()}"
    check_against_oracle(p, lite, dense, where)


@pytest.mark.interpret
def test_a_second_scan_of_a_paged_problem_starts_from_a_fresh_state(seed):
    """The scan's shared state is set up by the schedule's launch for one scan; a second scan of the same
    problem (a probe timing repeated scans) resets it first and finds the same candidates."""
    p = make_problem(seed, seq_lens=[3000, 2500], rows_per_seq=1, spread=1)
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk)
    backend = TritonBackend(paged="always")
    thresholds, ceilings = calibrate(problem, backend, 600)
    scans = [backend.scan_candidates(problem, thresholds, problem.max_end, ceilings=ceilings) for _ in range(2)]
    for field in ("appended", "thresholds", "nonfinite"):
        assert torch.equal(getattr(scans[0], field), getattr(scans[1], field)), f"seed {seed}: {field}"
    for row, kept in enumerate(scans[0].appended.tolist()):
        first, second = (torch.sort(s.keys[row, :kept]).values for s in scans)
        assert torch.equal(first, second), f"seed {seed}: row {row}'s candidates"


@pytest.mark.interpret
def test_the_programs_of_a_row_raise_its_threshold_to_a_lower_bound(seed):
    """Several programs scan each row (paged.INTERPRETED_PROGRAMS over two rows' tiles): the threshold the
    scan ends with rose above the calibrated one for some row (the shared histogram's raise ran) and is at
    or below every row's true K-th best key (the float64 oracle's K-th best, to the score bound)."""
    p = make_problem(seed, seq_lens=[3300, 3100], rows_per_seq=1, spread=1)
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk)
    backend = TritonBackend(paged="always")
    thresholds, ceilings = calibrate(problem, backend, 1100)
    scan = backend.scan_candidates(problem, thresholds, problem.max_end, ceilings=ceilings)
    final_scores = split_keys(scan.thresholds)[0].double()
    assert bool((scan.thresholds > thresholds).any()), f"seed {seed}: no row's threshold rose"
    scores, bound = oracle_scores(p)
    for row in range(problem.num_rows):
        kth = np.sort(scores[row][np.isfinite(scores[row])])[::-1][p.topk - 1]
        assert float(final_scores[row]) <= kth + bound[row], f"seed {seed}, row {row}: above the K-th best"


@pytest.mark.interpret
@pytest.mark.parametrize("next_n", [1, 2])
def test_the_paged_scan_appends_each_passing_key_once(next_n, gluon_variant, seed):
    """The scan's buffer (several programs a row, each appending a step late and raising the row's shared
    threshold): a row's first `appended` keys are distinct, each the ordering key of a key of its window
    (the same backend's dense score at that position), each at or above the calibrated threshold, and every
    key of the window at or above the final threshold is among them (a key that passes the final threshold
    passed every earlier one, so no program may drop it). On a GPU the Gluon kernel in each variant."""
    if DEVICE == "cpu" and GLUON_VARIANTS[gluon_variant]:
        pytest.skip("the interpreter runs the Triton kernel: the Gluon variants are the GPU's")
    p = make_problem(seed, seq_lens=[3300, 2100, 2900], rows_per_seq=next_n, spread=1)
    problem = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk)
    backend = TritonBackend(paged="always")
    thresholds, ceilings = calibrate(problem, backend, 1100)
    scores, _ = backend.score_dense(problem)
    scan = backend.scan_candidates(problem, thresholds, problem.max_end, ceilings=ceilings)
    where = f"[next_n {next_n}, {gluon_variant}] seed {seed}"
    for row in range(problem.num_rows):
        start, end = int(problem.starts[row]), int(problem.ends[row])
        positions = torch.arange(start, end, device=scores.device)
        window = make_keys(scores[row, start:end], positions)
        got = scan.keys[row, : int(scan.appended[row])]
        assert got.unique().numel() == got.numel(), f"{where}, row {row}: a key appended twice"
        assert bool(torch.isin(got, window).all()), f"{where}, row {row}: an appended key is no key of the window"
        assert bool((got >= thresholds[row]).all()), f"{where}, row {row}: a key below the calibrated threshold"
        must = window[window >= scan.thresholds[row]]
        assert bool(torch.isin(must, got).all()), f"{where}, row {row}: a key above the final threshold is missing"


@pytest.mark.gpu
def test_gluon_paged_kernel_is_refused_for_pages_off_16_bytes(seed):
    p = make_problem(seed, seq_lens=[900, 600], rows_per_seq=1, spread=1)
    p.kv_cache = in_device(in_padded_slab(p.kv_cache, 4354, 2, seed=seed), "cuda")
    with registry.backend_instance("triton", TritonBackend(paged="always", scoring_kernel="gluon")):
        with pytest.raises(BackendUnavailableError, match="16-byte words"):
            litetopk_prefill(*[t.to("cuda") for t in p.args()], topk=p.topk, backend="triton")


@pytest.mark.interpret
@pytest.mark.parametrize("block_rows", [1, 2])
def test_the_paged_prologue_is_the_queries_decode_and_the_schedule_in_one_launch(block_rows, seed, monkeypatch):
    """paged_prologue_kernel (the launch where the Triton stages run) writes what the queries' decode and the
    split schedule's kernel write apart, bit for bit (the interpreter runs it on CPU tensors in CI)."""
    p = make_problem(seed, seq_lens=[900, 300, 1500, 64], rows_per_seq=2, spread=2)
    apart = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk)
    together = validate_prefill(*[t.to(DEVICE) for t in p.args()], topk=p.topk)
    monkeypatch.setattr(paged, "runs_triton_stages", lambda device: False)
    want = paged.paged_operands(apart, block_rows, use_asm=False, gluon=False, num_bins=32)
    want_schedule = build_split_schedule_triton(
        apart.row_to_batch, apart.starts, apart.ends, block_rows, 32, Scratch(DEVICE)
    )
    monkeypatch.setattr(paged, "runs_triton_stages", lambda device: True)
    got = paged.paged_operands(together, block_rows, use_asm=False, gluon=False, num_bins=32)
    for name in ("q_lo", "q_hi", "wq", "rowfac", "q_wide", "q_unsupported"):
        assert torch.equal(getattr(got, name), getattr(want, name)), f"seed {seed}: {name}"
    for name in (
        "groups",
        "group_row",
        "group_count",
        "group_span",
        "tile_offset",
        "faults",
        "appended",
        "hist",
        "raised",
    ):
        assert torch.equal(getattr(got.schedule, name), getattr(want_schedule, name)), f"seed {seed}: {name}"
    assert torch.equal(together.zeroed[1:3], apart.zeroed[1:3]), f"seed {seed}: the flag summary"
