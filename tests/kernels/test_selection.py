"""Shared selection (docs/contract.md §1 order, §3 outputs): ordering keys, exact top-K, page mapping.

The reference order is written here in Python: score descending, then position ascending, with
-0.0 and +0.0 equal.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from litetopk.kernels import BackendUnavailableError, InputError, RowStatus
from litetopk.kernels.assembly import assemble_result
from litetopk.kernels.dense_selection import RADIX_CONFIG, select_topk_dense, select_topk_radix
from litetopk.kernels.keys import NO_KEY, kth_key, make_keys, select_topk_keys, split_keys

NEG_INF = float("-inf")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def ref_order(scores: list[float], positions: list[int]) -> list[int]:
    """Indices into (scores, positions) in the contract's total order."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], positions[i]))


def ref_topk_rows(scores: np.ndarray, k: int) -> list[list[int]]:
    """Positions of the k best finite-or-+inf entries of each row (-inf means outside the window)."""
    out = []
    for row in scores.tolist():
        live = [j for j, s in enumerate(row) if s != NEG_INF]
        out.append([live[i] for i in ref_order([row[j] for j in live], live)][:k])
    return out


def awkward_scores(gen: np.random.Generator, n: int) -> np.ndarray:
    """float32 scores with many exact ties, both zeros, negatives, subnormals and infinities."""
    pool = np.array([0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 3.4e38, -3.4e38, np.inf, 0.5, 2.0], dtype=np.float32)
    s = gen.standard_normal(n).astype(np.float32)
    pick = gen.random(n) < 0.5
    s[pick] = gen.choice(pool, size=int(pick.sum()))
    return s


def test_keys_sort_in_the_contract_order(seed):
    gen = np.random.default_rng(seed)
    scores = awkward_scores(gen, 4000)
    positions = gen.choice(2**31 - 1, size=4000, replace=False).astype(np.int64)
    positions[:3] = [0, 2**31 - 2, 1]
    keys = make_keys(torch.from_numpy(scores), torch.from_numpy(positions))
    assert keys.dtype == torch.int64
    got = torch.argsort(keys, descending=True, stable=True).tolist()
    want = ref_order([float(s) for s in scores], positions.tolist())
    assert got == want, f"seed {seed}"
    assert len(set(keys.tolist())) == keys.numel(), "distinct positions give distinct keys"


def test_zeros_of_both_signs_tie_and_fall_back_to_position():
    keys = make_keys(torch.tensor([-0.0, 0.0, -0.0]), torch.tensor([3, 7, 1]))
    assert torch.argsort(keys, descending=True).tolist() == [2, 0, 1]


def test_split_keys_inverts_make_keys(seed):
    gen = np.random.default_rng(seed)
    scores = torch.from_numpy(awkward_scores(gen, 1000))
    scores[0] = NEG_INF
    positions = torch.from_numpy(gen.integers(0, 2**31 - 1, size=1000)).int()
    back_scores, back_positions = split_keys(make_keys(scores, positions))
    assert back_scores.dtype == torch.float32 and back_positions.dtype == torch.int32
    assert torch.equal(back_positions, positions), f"seed {seed}"
    assert torch.equal(back_scores, scores + 0.0), f"seed {seed}"  # -0.0 comes back as +0.0
    assert not torch.signbit(back_scores[scores == 0]).any()


def test_no_key_is_below_every_key_and_splits_to_padding():
    lowest = make_keys(torch.tensor([NEG_INF, -3.4e38]), torch.tensor([2**31 - 1, 2**31 - 1]))
    assert (lowest > NO_KEY).all()
    scores, positions = split_keys(torch.tensor([NO_KEY, NO_KEY]))
    assert scores.tolist() == [NEG_INF, NEG_INF] and positions.tolist() == [-1, -1]


@pytest.mark.parametrize("n, k", [(5000, 512), (512, 512), (513, 512), (100, 512), (0, 512), (3000, 1024)])
def test_select_topk_keys_is_sorted_and_padded(n, k, seed):
    gen = np.random.default_rng(seed)
    scores = awkward_scores(gen, 3 * n).reshape(3, n)
    positions = np.tile(gen.permutation(max(n, 1))[:n], (3, 1))
    keys = make_keys(torch.from_numpy(scores), torch.from_numpy(positions))
    top = select_topk_keys(keys, k)
    assert tuple(top.shape) == (3, k)
    for r in range(3):
        order = ref_order(scores[r].tolist(), positions[r].tolist())[:k]
        want = [int(keys[r, i]) for i in order] + [NO_KEY] * (k - min(n, k))
        assert top[r].tolist() == want, f"row {r}, n={n}, k={k}, seed {seed}"
    assert torch.equal(kth_key(keys, k), top[:, k - 1])


DENSE_CASES = {
    "random widths above k": dict(rows=4, width=3000, k=512, pool=None, masked=0.3),
    "many exact ties across the k-th place": dict(rows=4, width=3000, k=512, pool=[1.0, 2.0, 3.0], masked=0.1),
    "all equal": dict(rows=3, width=2000, k=1024, pool=[0.25], masked=0.0),
    "both zeros and -0 ties": dict(rows=3, width=1500, k=512, pool=[0.0, -0.0], masked=0.2),
    "width k + 1": dict(rows=2, width=513, k=512, pool=[1.0, 2.0], masked=0.0),
    "width k": dict(rows=2, width=512, k=512, pool=None, masked=0.0),
    "width below k": dict(rows=2, width=100, k=512, pool=None, masked=0.5),
    "every entry outside the window": dict(rows=2, width=700, k=512, pool=None, masked=1.0),
    "width 0": dict(rows=2, width=0, k=512, pool=None, masked=0.0),
    "every other row tied, K = 1024": dict(
        rows=6, width=2500, k=1024, pool=[-1.5, 0.5, 4.0], masked=0.2, tied_rows=True
    ),
}


@pytest.mark.interpret
@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="interpreter only: on a GPU every dense operator test runs the Triton twin compiled",
)
@pytest.mark.parametrize("case", list(DENSE_CASES))
def test_the_triton_tie_settlement_equals_the_torch_one(case, seed):
    """settle_ties' Triton twin (kernels/dense_selection.py, no host sync) gives select_topk_dense the
    torch code's keys, bit for bit, on every dense case (ties across the k-th place, both zeros, rows
    with and without ties side by side)."""
    from bench.probes.host_time import triton_stages_on_cpu

    c = DENSE_CASES[case]
    scores = torch.from_numpy(dense_case_scores(c, seed))
    want = select_topk_dense(scores, c["k"])
    with triton_stages_on_cpu():
        got = select_topk_dense(scores, c["k"])
    assert torch.equal(got, want), f"{case}, seed {seed}: rows {(got != want).any(dim=1).nonzero().flatten().tolist()}"


@pytest.mark.parametrize(
    "twin",
    [
        "torch",
        pytest.param(
            "triton",
            marks=[
                pytest.mark.interpret,
                pytest.mark.skipif(
                    os.environ.get("TRITON_INTERPRET") != "1",
                    reason="interpreter only: on a GPU the dense operator tests run it",
                ),
            ],
        ),
    ],
)
@pytest.mark.parametrize("case", [n for n, c in DENSE_CASES.items() if c["width"] > c["k"]])
def test_settle_ties_fixes_any_choice_among_tied_positions(twin, case, seed):
    """A value top-k may return any of the positions of a tied value (a GPU top-k does): emulated by
    torch.topk over randomly permuted columns. settle_ties then makes every row exact."""
    from litetopk.kernels.dense_selection import settle_ties_torch

    c = DENSE_CASES[case]
    scores = torch.from_numpy(dense_case_scores(c, seed))
    k = c["k"]
    perm = torch.randperm(c["width"], generator=torch.Generator().manual_seed(seed))
    values, at = torch.topk(scores[:, perm], k + 1, dim=1, largest=True, sorted=True)
    keys = torch.where(torch.isneginf(values), NO_KEY, make_keys(values, perm[at]))
    if twin == "torch":
        settle_ties_torch(scores, values, keys, k)
    else:
        from litetopk.kernels.dense_selection import settle_ties_triton

        settle_ties_triton(scores, values.contiguous(), keys, k)
    _, positions = split_keys(select_topk_keys(keys, k))
    for r, want in enumerate(ref_topk_rows(scores.numpy(), k)):
        assert positions[r].tolist() == want + [-1] * (k - len(want)), f"{case}, {twin}, row {r}, seed {seed}"


def dense_case_scores(c: dict, seed: int) -> np.ndarray:
    """A DENSE_CASES score matrix with fresh random entries (pool: drawn from those values; tied_rows:
    only every other row drawn from the pool, the rest normal scores without ties)."""
    gen = np.random.default_rng(seed)
    if c.get("tied_rows"):
        scores = gen.standard_normal(c["rows"] * c["width"]).astype(np.float32)
    else:
        scores = awkward_scores(gen, c["rows"] * c["width"])
        scores[np.isposinf(scores)] = 7.0
    if c["pool"] is not None:
        pooled = gen.choice(np.array(c["pool"], dtype=np.float32), size=c["rows"] * c["width"])
        every = np.repeat(np.arange(c["rows"]) % 2 == 0, c["width"]) if c.get("tied_rows") else True
        scores = np.where(every, pooled, scores).astype(np.float32)
    scores = scores.reshape(c["rows"], c["width"])
    scores[gen.random(scores.shape) < c["masked"]] = NEG_INF
    return scores


@pytest.mark.parametrize("case", list(DENSE_CASES))
def test_select_topk_dense_is_exact(case, seed):
    c = DENSE_CASES[case]
    scores = dense_case_scores(c, seed)
    top = select_topk_dense(torch.from_numpy(scores), c["k"])
    values, positions = split_keys(top)
    for r, want in enumerate(ref_topk_rows(scores, c["k"])):
        got = positions[r].tolist()
        assert got == want + [-1] * (c["k"] - len(want)), f"{case}, row {r}, seed {seed}"
        assert values[r, : len(want)].tolist() == [float(scores[r, j]) + 0.0 for j in want], f"{case}, row {r}"
        assert (values[r, len(want) :] == NEG_INF).all(), f"{case}, row {r}: padding"


#: the selector's forms (RADIX_CONFIG): the digits' (two counts, the sure and boundary keys collected) or the
#: candidates' (a sharper floor, the keys at or above it collected), and the collect's two ways of taking list slots,
#: a block at a time or a warp at a time (on a GPU one atomic a list a warp, _warp_append's inline PTX; under the
#: interpreter one atomic a key)
FORMS = {
    "digits, block slots": dict(candidates=False, warp_slots=False),
    "digits, warp slots": dict(candidates=False, warp_slots=True),
    "candidates, block slots": dict(candidates=True, warp_slots=False),
    "candidates, warp slots": dict(candidates=True, warp_slots=True),
}


@pytest.fixture(params=list(FORMS))
def form(request, monkeypatch):
    for key, value in FORMS[request.param].items():
        monkeypatch.setitem(RADIX_CONFIG, key, value)
    return request.param


@pytest.mark.interpret
@pytest.mark.parametrize("case", list(DENSE_CASES))
def test_the_radix_selector_equals_the_torch_selector(case, form, seed):
    """select_topk_radix (the digits form: count the first digits, collect the sure and boundary keys, rank them; the
    candidates form: a floor from 2K group maxima, the keys at or above it listed and sorted; exact by itself) gives
    the torch selector's keys bit for bit on every dense case: on a GPU compiled, with each warp's equal digits
    counted by one atomic; on the CPU under the interpreter, one atomic a key. Scores are poisoned -inf where no case
    entry lies, so a key read past a row's width would show."""
    c = DENSE_CASES[case]
    scores = torch.from_numpy(dense_case_scores(c, seed))
    want = select_topk_dense(scores, c["k"])
    padded = torch.full((c["rows"], c["width"] + 64), NEG_INF)
    padded[:, : c["width"]] = scores
    got = select_topk_radix(padded[:, : c["width"]].to(DEVICE), c["k"]).cpu()
    assert torch.equal(got, want), (
        f"{case}, {form}, seed {seed}: rows {(got != want).any(dim=1).nonzero().flatten().tolist()}"
    )


#: score rows whose K-th best shares its first or both digits with many keys (select_topk_radix's boundary)
CLUSTERED = {
    "clustered: randn x 0.01 + 4": lambda gen, shape: gen.standard_normal(shape) * 0.01 + 4.0,
    "agree in 22 bits, ties": lambda gen, shape: 1.0 + gen.integers(0, 200, shape) * 2.0**-22,
    "one value, a few larger": lambda gen, shape: np.where(gen.random(shape) < 0.03, 4.0, 3.0),
    "one negative value, a few positive": lambda gen, shape: np.where(gen.random(shape) < 0.03, 5.0, -3.0),
}


@pytest.mark.interpret
@pytest.mark.parametrize("case", list(CLUSTERED))
@pytest.mark.parametrize("cap", [None, 512])
def test_the_radix_selector_on_clustered_scores(case, cap, form, seed):
    """Scores whose K-th best shares its first digit (a quarter binade) with thousands of keys, or both digits (22
    bits): the second digit splits the first; with the sort's cap at k, a boundary fuller than that takes the
    radix narrowing over the last 10 bits and the column order of equal scores (radix_finish_kernel's last branch).
    In the candidates form more keys than the list holds reach the floor (its cap: 2k, or k) and the finish narrows
    between the floor and the row's best score (across binades and signs: the narrowing's widest first digit)."""
    gen = np.random.default_rng(seed)
    scores = torch.from_numpy(CLUSTERED[case](gen, (2, 3000)).astype(np.float32))
    scores[1, 2500:] = NEG_INF
    got = select_topk_radix(scores.to(DEVICE), 512, cap=cap).cpu()
    want = select_topk_dense(scores, 512)
    assert torch.equal(got, want), (
        f"{case}, cap {cap}, {form}, seed {seed}: rows {(got != want).any(dim=1).nonzero().flatten().tolist()}"
    )


@pytest.mark.interpret
@pytest.mark.parametrize("width", [20000, 2048 * 20])
def test_the_radix_floor_is_the_smallest_strided_group_maximum(width, seed):
    """radix_floor_kernel: each row's largest score in each of K strided groups (the column modulo K), per program;
    their smallest over the groups (the floor, _floor) is a lower bound of the K-th best score (K distinct keys
    reach it), and on normal scores it leaves out most keys, which the counting launches then skip. A row with a
    group of no key has no floor (DEAD), here a row of thousands of keys, its answer still exact. The counters are
    zeroed by the same launch."""
    from litetopk.kernels.dense_selection import DEAD, radix_floor_kernel, radix_spans

    k, rows = 512, 3
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, width, generator=gen)
    scores[1, torch.rand(width, generator=gen) < 0.3] = NEG_INF
    scores[2, 5::k] = NEG_INF  # thousands of keys, group 5 none: no floor
    assert (scores[2] > NEG_INF).sum() >= k
    per_row, span = radix_spans(rows, width)
    assert per_row > 1, "the case must split rows over programs"
    partial = torch.full((rows, per_row, k), 7, dtype=torch.int32, device=DEVICE)
    hist = torch.full((rows, 2, 2048), 7, dtype=torch.int32, device=DEVICE)
    counts = torch.full((rows,), 7, dtype=torch.int64, device=DEVICE)
    radix_floor_kernel[(rows, per_row)](
        scores.to(DEVICE), width, width, span, partial, hist, counts, GROUPS=k, BLOCK=2048, STAGES=1, HISTOGRAMS=True
    )
    assert not hist.any() and not counts.any(), "the counters must be zeroed"
    floors = partial.amax(dim=1).amin(dim=1).cpu()
    assert floors[2] == DEAD, "a group without a key: no floor"
    assert torch.equal(select_topk_radix(scores.to(DEVICE), k).cpu(), select_topk_dense(scores, k)), "the answers"
    for r in range(2):
        groups = torch.full((k,), NEG_INF)
        for g in range(k):
            groups[g] = scores[r, g::k].max()
        want = float(groups.min())
        bits = int(floors[r]) if floors[r] >= 0 else int(floors[r]) ^ 0x7FFFFFFF  # (keys._ordered_bits inverted)
        got = float(torch.tensor([bits], dtype=torch.int32).view(torch.float32))
        assert got == want, f"row {r}: floor {got}, the smallest group maximum {want}"
        kth = float(scores[r].topk(k).values[-1])
        live = int((scores[r] > NEG_INF).sum())
        # ~1 - K^(-K / keys) of the keys reach the floor: 15 % of 20,000, 21 % of 14,000, 5 % of 65,536; the floor
        # is the smallest of K maxima, so its spread is wide: a third of 14,000 keys is passed on ~1 % of the draws,
        # half on ~4e-6 (the chance that one of 512 maxima of 27 normal keys lies below their median)
        kept = int((scores[r] >= want).sum())
        assert want <= kth and kept < live // 2, f"row {r}: floor {want}, K-th best {kth}, {kept} of {live} keys kept"


@pytest.mark.interpret
def test_the_candidates_floor_is_the_kth_largest_of_2k_group_maxima(seed):
    """radix_threshold_kernel: each row's floor is the K-th largest of its 2K strided group maxima (the column modulo
    2K, over the row's programs: radix_floor_kernel), DEAD where fewer than K groups hold a key, and its best score
    the row's largest; a floor too low would stay exact and only make rows slow, so it is checked here. At most
    ~1.4 K keys of a normal row reach it (JOURNAL 23b: ~708 of 20,000 at K = 512)."""
    from litetopk.kernels.dense_selection import DEAD, radix_floor_kernel, radix_spans, radix_threshold_kernel

    k, rows, width = 512, 4, 20000
    groups = 2 * k
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, width, generator=gen)
    scores[1, torch.rand(width, generator=gen) < 0.3] = NEG_INF
    scores[2] = torch.where(torch.rand(width, generator=gen) < 0.01, 3.0, -2.0)  # many ties, both signs
    scores[3, torch.arange(width) % 4 != 0] = NEG_INF  # keys in 256 groups only: no floor
    per_row, span = radix_spans(rows, width)
    assert per_row > 1, "the case must split rows over programs"
    partial = torch.full((rows, per_row, groups), 7, dtype=torch.int32, device=DEVICE)
    counts = torch.full((rows,), 7, dtype=torch.int64, device=DEVICE)
    bounds = torch.full((rows, 2), 7, dtype=torch.int32, device=DEVICE)
    radix_floor_kernel[(rows, per_row)](
        scores.to(DEVICE),
        width,
        width,
        span,
        partial,
        None,
        counts,
        GROUPS=groups,
        BLOCK=2048,
        STAGES=1,
        HISTOGRAMS=False,
    )
    assert not counts.any(), "the list lengths must be zeroed"
    radix_threshold_kernel[(rows,)](partial, per_row, bounds, TOPK=k, GROUPS=groups, STAGES=3)
    bounds = bounds.cpu()

    def score_of(bits: int) -> float:  # (keys._ordered_bits inverted)
        bits = bits if bits >= 0 else bits ^ 0x7FFFFFFF
        return float(torch.tensor([bits], dtype=torch.int32).view(torch.float32))

    for r in range(rows):
        maxima = torch.stack([scores[r, g::groups].max() for g in range(groups)])
        live_maxima = maxima[maxima > NEG_INF]
        assert score_of(int(bounds[r, 1])) == float(scores[r].max()), f"row {r}: the best score"
        if live_maxima.numel() < k:
            assert int(bounds[r, 0]) == DEAD, f"row {r}: {live_maxima.numel()} groups hold a key: no floor"
            continue
        want = float(live_maxima.topk(k).values[-1])
        assert score_of(int(bounds[r, 0])) == want, f"row {r}: floor {score_of(int(bounds[r, 0]))}, want {want}"
        assert want <= float(scores[r].topk(k).values[-1]), f"row {r}: the floor above the K-th best"
        if r == 0:
            kept = int((scores[r] >= want).sum())
            assert kept < 2 * k, f"row {r}: {kept} keys reach the floor of a normal row"


def test_a_call_of_fewer_rows_carves_no_more(monkeypatch):
    """The bytes select_topk_radix carves (its answer, the floor's maxima, counters and lists) grow with the rows and
    never with fewer keys, so that a workspace sized at a call's most rows and keys holds every smaller call; counted
    with the launches made no-ops (only the carving runs). Rows x programs a row alone would not: 255 rows of 32,768
    keys take 3 programs a row, 256 take 2 (a review's finding)."""
    from litetopk.kernels import dense_selection
    from litetopk.kernels.scratch import Scratch

    monkeypatch.setattr(type(dense_selection.radix_count_kernel), "run", lambda self, *args, **kwargs: None)

    def carved(rows, width, k):
        scratch = Scratch(torch.device("cpu"))
        select_topk_radix(torch.empty(rows, width), k, scratch=scratch)
        return scratch.used

    for k, candidates in ((512, False), (1024, False), (512, True), (1024, True)):
        monkeypatch.setitem(RADIX_CONFIG, "candidates", candidates)
        assert carved(255, 32768, k) <= carved(256, 32768, k), (
            f"K={k}, candidates {candidates}: 255 rows carve more than 256"
        )
        assert carved(127, 65536, k) <= carved(128, 65536, k), (
            f"K={k}, candidates {candidates}: 127 rows carve more than 128"
        )
        assert carved(3, 350208, k) <= carved(3, 350210, k), f"K={k}, candidates {candidates}: fewer keys carve more"


def test_the_floors_buffer_grows_with_the_rows_alone():
    """select_topk_radix carves the floor's maxima for rows x radix_spans' programs a row from a buffer of (programs +
    rows) x its groups (K, or 2K in the candidates form): that bound must hold at every rows and width, so that a
    workspace sized at a call's most rows and keys (workspace.workspace_bytes) holds the calls of fewer of either (a
    review found 255 rows needing more than 256 where the buffer was rows x programs a row)."""
    from litetopk.kernels.dense_selection import RADIX_CONFIG, radix_spans

    programs = RADIX_CONFIG["programs"]
    for rows in range(1, 1100):
        for width in (1, 2047, 2048, 2049, 32768, 65535, 131072, 350208, 1 << 20):
            per_row, span = radix_spans(rows, width)
            assert rows * per_row < programs + rows and per_row * span >= width > (per_row - 1) * span, (rows, width)


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [1, 4])
@pytest.mark.parametrize(
    "rows, width, k",
    [
        (1, 65536, 512),
        (64, 65536, 512),
        (128, 32768, 1024),
        (3, 131072, 1024),
        (2, 65536 - 777, 512),
        (64, 50000, 1024),
    ],
)
def test_the_radix_selector_at_decode_sizes(rows, width, k, stages, form, seed, monkeypatch):
    """Decode-sized score rows (normal scores, clustered ones, rows of one value, windows of random lengths, a few
    exact ties) on the GPU: the radix selector equals the torch selector bit for bit in each form, its column loops
    pipelined (RADIX_CONFIG "stages") or not; widths that are no multiple of a block end in a masked one. The
    selector's lists and answer are carved from a workspace of poison bytes (each int64 0x7F7F...: a key above every
    real one), so that a list slot that is counted but never written shows."""
    from litetopk.kernels.scratch import Scratch

    monkeypatch.setitem(RADIX_CONFIG, "stages", stages)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.randn(rows, width, device="cuda", generator=gen)
    scores[:, ::97] = 1.5  # ties
    scores[::2] = scores[::2] * 0.01 + 4.0  # every other row clustered: many keys share the boundary's first digit
    scores[1::4] = 2.0  # rows of one value (a padded decode row): every key at the floor
    # rows of three values, most at the middle one: more keys than the lists hold between the floor and the best
    three = torch.rand(rows, width, device="cuda", generator=gen)
    scores[3::8] = torch.where(three < 0.002, 3.0, torch.where(three < 0.4, 2.0, 1.0))[3::8]
    ends = torch.randint(width // 2, width + 1, (rows,), device="cuda", generator=gen)
    scores[torch.arange(width, device="cuda")[None, :] >= ends[:, None]] = NEG_INF
    poisoned = Scratch(scores.device, torch.full((32 << 20,), 0x7F, dtype=torch.uint8, device="cuda"))
    got, want = select_topk_radix(scores, k, scratch=poisoned), select_topk_dense(scores, k)
    assert torch.equal(got, want), f"{rows}x{width} K={k}, stages {stages}, {form}"


def test_the_radix_selector_wants_its_kernels_device(seed):
    with pytest.raises(BackendUnavailableError, match="radix"):
        select_topk_dense(torch.zeros(2, 600), 512, selector="radix")


def test_select_topk_dense_rejects_an_unknown_selector():
    with pytest.raises(InputError, match="selector"):
        select_topk_dense(torch.zeros(2, 600), 512, selector="bogus")


def test_assemble_result_publishes_nothing_for_rows_with_status(seed):
    gen = np.random.default_rng(seed)
    scores = gen.standard_normal((3, 600)).astype(np.float32)
    scores[2, 100:] = NEG_INF  # row 2: a window of 100 keys
    top = select_topk_dense(torch.from_numpy(scores), 512)
    table = torch.tensor([[4, 0, 9, 2, 7, 1, 3, 5, 6, 8]], dtype=torch.int32)
    status = torch.tensor([0, int(RowStatus.NONFINITE), 0], dtype=torch.int32)
    result = assemble_result(
        top,
        torch.zeros(3, dtype=torch.int32),
        table,
        status,
        torch.tensor([0, 0, 1]),
        torch.tensor([600, 600, 100]),
    )
    assert result.counts.tolist() == [512, 0, 100]
    assert result.status.tolist() == [0, 4, 0] and result.repaired.tolist() == [0, 0, 1]
    assert (result.raw_indices[1] == -1).all() and (result.physical_indices[1] == -1).all()
    assert (result.values[1] == NEG_INF).all()
    assert (result.raw_indices[2, 100:] == -1).all() and (result.physical_indices[2, 100:] == -1).all()
    for r in (0, 2):
        n = int(result.counts[r])
        raw = result.raw_indices[r, :n].long()
        assert torch.equal(result.physical_indices[r, :n].long(), table[0, raw // 64].long() * 64 + raw % 64)
        assert torch.equal(result.values[r, :n], torch.from_numpy(scores[r])[raw])
    for name in ("values", "raw_indices", "physical_indices", "counts", "status", "repaired", "candidates"):
        tensor = getattr(result, name)
        assert tensor.dtype == (torch.float32 if name == "values" else torch.int32), name


def test_flashinfer_selector_without_the_package_is_a_clear_error(seed):
    """Where flashinfer is absent (CI), asking for it fails with BackendUnavailableError, never a
    silent switch to torch.topk."""
    import importlib.util

    from litetopk.kernels import BackendUnavailableError
    from litetopk.kernels.dense_selection import select_topk_dense

    if importlib.util.find_spec("flashinfer") is not None:
        pytest.skip("flashinfer is installed here: the GPU benchmark exercises it")
    scores = torch.randn(2, 600, generator=torch.Generator().manual_seed(seed))
    with pytest.raises(BackendUnavailableError, match="flashinfer"):
        select_topk_dense(scores, 512, selector="flashinfer")
