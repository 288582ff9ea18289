"""The engines' decode calls through kernels/adapters.py (issue 30 item 5), on the CPU reference.

Each test builds a batch as the engine holds it at its indexer call (kernels/adapters.py pins the
sources): B requests of raw length L_b (the tokens being verified included), next_n query rows
each, row (b, j) seeing the C4 window [0, (L_b - next_n + 1 + j) // 4) (sglang: seq_lens_casual //
4; vLLM: the native MTP seq_lens // 4). The windows are computed here from that rule alone, never
read back from the adapter, and the adapter's answer, written into the engine's own buffer, must
(a) equal litetopk_prefill called directly on the same problem, bit for bit, every field, and
(b) match the float64 oracle (tests/problems.py), tie-aware. Faulted rows publish nothing.
GPU tests (no host sync, CUDA-graph replay) are marked gpu."""

from __future__ import annotations

import pytest
import torch

from litetopk.kernels import InputError, RowStatus, adapters, litetopk_prefill, random_problem
from litetopk.kernels.problems import RandomProblem
from tests.kernels.test_reference_operator import assert_nothing_published, assert_row_matches_oracle
from tests.problems import oracle_scores, results_equal

H = 64
POISON = 7


def decode_batch(seed: int, raw_lens: list[int], next_n: int, topk: int = 512, device="cpu") -> RandomProblem:
    """The oracle's problem: request b holds max(L_b // 4, 1) C4 keys in permuted pages; row
    b * next_n + j sees [0, max(L_b - next_n + 1 + j, 0) // 4) (an empty window for a padding
    request of length 0, as vLLM's clamp makes it)."""
    keys = [max(length // 4, 1) for length in raw_lens]
    p = random_problem(len(raw_lens) * next_n, keys, topk, seed=seed, spread=1, device=device)
    ends = [max(length - next_n + 1 + j, 0) // 4 for length in raw_lens for j in range(next_n)]
    p.starts.zero_()
    p.ends.copy_(torch.tensor(ends, dtype=torch.int32))
    return p


def check_against_oracle(result, p: RandomProblem, where: str, faulty: dict[int, int] | None = None) -> None:
    """Every row of `result`: the status `faulty` predicts (0 elsewhere); a faulty row publishes
    nothing, the others match the float64 oracle of `p` (tie-aware within the float32 bound)."""
    faulty = faulty or {}
    rows = p.q_fp4.shape[0]
    want_status = [faulty.get(i, 0) for i in range(rows)]
    assert result.status.tolist() == want_status, f"{where}: status {result.status.tolist()}, want {want_status}"
    answerable = RandomProblem(**{**p.__dict__, "ends": torch.where(result.status == 0, p.ends, p.starts)})
    scores, bound = oracle_scores(answerable)
    for i in range(rows):
        if want_status[i]:
            assert_nothing_published(result, i, f"{where} row {i}")
        else:
            assert_row_matches_oracle(result, p, i, scores, bound, False, f"{where} row {i}")


def spy_on_operator(monkeypatch) -> list:
    """Record the arguments the adapter hands to litetopk_prefill."""
    seen = []

    def recording(*args, **kwargs):
        seen.append((args, kwargs))
        return litetopk_prefill(*args, **kwargs)

    monkeypatch.setattr(adapters, "litetopk_prefill", recording)
    return seen


# ---- the engines' tensors, as they hold them ----------------------------------------------------


def sglang_tensors(p: RandomProblem) -> dict:
    """sglang's forward_c4_indexer inputs for `p`: int8 queries, int32 [T, 64] scales, float32
    [T, 64, 1] weights, one page-table row per query token, c4_seq_lens [T], the cache 2-D."""
    rows = p.q_fp4.shape[0]
    return dict(
        q_fp4=p.q_fp4.view(torch.int8),
        q_sf=p.q_scale.view(torch.int32).view(rows, H),
        kv_cache=p.kv_cache,
        page_table=p.block_table[p.row_to_batch.long()].contiguous(),
        weights=p.weights.view(rows, H, 1),
        c4_seq_lens=p.ends.clone(),
    )


def vllm_block_slab(cache: torch.Tensor, seed: int, width: int = 132, block_stride: int = 8640) -> torch.Tensor:
    """`cache` [pages, 4352] copied into vLLM's DeepSeek-V4 indexer allocation: uint8 [blocks, 64,
    width] (FP8-sized, width 132) whose blocks lie block_stride bytes apart; FP4 uses each block's
    first 64 * 68 bytes, the rest is random, drawn from `seed` (never read)."""
    gen = torch.Generator().manual_seed(seed)
    slab = torch.randint(0, 256, (cache.shape[0], block_stride), dtype=torch.uint8, generator=gen).to(cache.device)
    slab[:, : cache.shape[1]] = cache
    return slab[:, : 64 * width].view(cache.shape[0], 64, width)


def vllm_decode_tensors(p: RandomProblem, requests: int, next_n: int, seed: int) -> dict:
    """vLLM's decode-branch inputs for `p`: q uint8 [B, next_n, 64, 64], q_scale int32 [B, next_n, 64],
    the layer's 3-D cache (its padding drawn from `seed`), the per-request block table, weights
    [B * next_n, 64], seq_lens [B, next_n]."""
    return dict(
        q_fp4=p.q_fp4.view(requests, next_n, H, 64),
        q_scale=p.q_scale.view(torch.int32).view(requests, next_n, H),
        kv_cache=vllm_block_slab(p.kv_cache, seed),
        block_table=p.block_table,
        weights=p.weights,
        seq_lens=p.ends.clone().view(requests, next_n),
    )


# ---- decode shapes ------------------------------------------------------------------------------

#: name -> (raw lengths L_b, next_n, K). Windows shorter than K, uneven lengths, a request whose
#: first rows see no key, and vLLM-style padding requests (length 0) are all in here.
DECODE_CASES = {
    "decode next_n=1, 6 uneven requests, K=512": ([6000, 130, 2052, 3, 4500, 2049], 1, 512),
    "MTP next_n=2, windows around K, K=512": ([2050, 2051, 2052, 2053, 4400], 2, 512),
    "MTP next_n=3, K=1024, most windows shorter than K": ([4700, 600, 4100, 9], 3, 1024),
    "MTP next_n=4, a padding request, K=512": ([5000, 0, 1000, 2600], 4, 512),
    "MTP next_n=4, first rows see no key, K=1024": ([5, 6, 7, 8, 4200, 6000], 4, 1024),
}


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_sglang_c4_indexer_decode_matches_the_oracle_and_a_direct_call(name, monkeypatch, seed):
    raw_lens, next_n, k = DECODE_CASES[name]
    p = decode_batch(seed, raw_lens, next_n, k)
    where = f"[sglang: {name}] seed {seed}"
    t = sglang_tensors(p)
    rows = p.q_fp4.shape[0]
    pages = torch.full((rows + 2, k + 64), POISON, dtype=torch.int32)  # padded as sglang's _pad_last_dim may
    raw = torch.full((rows, k), POISON, dtype=torch.int32)
    seen = spy_on_operator(monkeypatch)
    result = adapters.topk_sglang_c4_indexer(
        **t, c4_sparse_page_indices=pages, c4_sparse_raw_indices=raw, topk=k, backend="reference"
    )
    args, _ = seen[0]
    views = (t["q_fp4"], t["q_sf"], t["kv_cache"], t["page_table"], t["weights"], t["c4_seq_lens"])
    assert [args[i].data_ptr() for i in (0, 1, 2, 3, 4, 7)] == [v.data_ptr() for v in views], f"{where}: a copy"
    want = litetopk_prefill(*p.args(), topk=k, backend="reference")
    assert results_equal(result, want) == [], f"{where}: differs from the direct call in {results_equal(result, want)}"
    assert torch.equal(pages[:rows, :k], want.physical_indices), f"{where}: c4_sparse_page_indices"
    assert torch.equal(raw, want.raw_indices), f"{where}: c4_sparse_raw_indices"
    assert bool((pages[rows:] == POISON).all()) and bool((pages[:, k:] == POISON).all()), (
        f"{where}: wrote outside [:T, :K]"
    )
    check_against_oracle(result, p, where)


def test_sglang_mtp_rows_may_share_their_requests_page_table_row(monkeypatch, seed):
    """next_n=3: the operator sees 3 rows per sequence (a block table of one row a request, the request's
    first page-table row, which sglang repeats for every token); the answer is the per-token call's."""
    p = decode_batch(seed, [4700, 600, 4100, 9], 3)
    t = sglang_tensors(p)
    per_token = torch.full((12, p.topk), POISON, dtype=torch.int32)
    grouped = torch.full((12, p.topk), POISON, dtype=torch.int32)
    want = adapters.topk_sglang_c4_indexer(**t, c4_sparse_page_indices=per_token, topk=p.topk, backend="reference")
    seen = spy_on_operator(monkeypatch)
    got = adapters.topk_sglang_c4_indexer(
        **t, c4_sparse_page_indices=grouped, topk=p.topk, next_n=3, backend="reference"
    )
    assert seen[0][0][5].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3], "row_to_batch"
    assert torch.equal(seen[0][0][3], t["page_table"][::3]), "block table: one row a request"
    assert results_equal(got, want) == [] and torch.equal(grouped, per_token), f"seed {seed}"
    with pytest.raises(InputError, match="next_n must be a positive int dividing the 12"):
        adapters.topk_sglang_c4_indexer(**t, c4_sparse_page_indices=grouped, topk=p.topk, next_n=5)


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_vllm_indexer_decode_matches_the_oracle_and_a_direct_call(name, monkeypatch, seed):
    raw_lens, next_n, k = DECODE_CASES[name]
    p = decode_batch(seed, raw_lens, next_n, k)
    where = f"[vLLM: {name}] seed {seed}"
    t = vllm_decode_tensors(p, len(raw_lens), next_n, seed)
    rows = p.q_fp4.shape[0]
    buffer = torch.full((rows + 5, k), POISON, dtype=torch.int32)  # vLLM's [max_num_batched_tokens, K]
    seen = spy_on_operator(monkeypatch)
    result = adapters.topk_vllm_indexer_decode(**t, topk_indices_buffer=buffer, topk=k, backend="reference")
    args, _ = seen[0]
    assert args[2].data_ptr() == t["kv_cache"].data_ptr() and args[2].stride(0) == 8640, (
        f"{where}: the cache was copied"
    )
    views = (t["q_fp4"], t["q_scale"], t["block_table"], t["weights"], t["seq_lens"])
    assert [args[i].data_ptr() for i in (0, 1, 3, 4, 7)] == [v.data_ptr() for v in views], f"{where}: a copy"
    want = litetopk_prefill(*p.args(), topk=k, backend="reference")
    assert results_equal(result, want) == [], f"{where}: differs from the direct call in {results_equal(result, want)}"
    assert torch.equal(buffer[:rows], want.raw_indices), f"{where}: topk_indices_buffer"
    assert bool((buffer[rows:] == POISON).all()), f"{where}: wrote past the decode rows"
    check_against_oracle(result, p, where)


@pytest.mark.parametrize("shape", ["[B, 1]", "[B]", "flattened MTP: [T, 1] with one block-table row per token"])
def test_vllm_decode_takes_every_seq_lens_shape(shape, seed):
    next_n = 3 if shape.startswith("flattened") else 1
    p = decode_batch(seed, [3000, 700, 2100, 12], next_n)
    rows = p.q_fp4.shape[0]
    t = vllm_decode_tensors(p, rows // next_n, next_n, seed)
    if shape == "[B]":
        t["seq_lens"] = p.ends.clone()
    else:  # vLLM's flattened path: each token its own request, the block table expanded per token
        t.update(
            seq_lens=p.ends.clone().view(rows, 1),
            q_fp4=p.q_fp4,
            q_scale=p.q_scale.view(torch.int32).view(rows, H),
            block_table=p.block_table[p.row_to_batch.long()].contiguous(),
        )
    buffer = torch.full((rows, p.topk), POISON, dtype=torch.int32)
    result = adapters.topk_vllm_indexer_decode(**t, topk_indices_buffer=buffer, topk=p.topk, backend="reference")
    want = litetopk_prefill(*p.args(), topk=p.topk, backend="reference")
    where = f"[vLLM seq_lens {shape}] seed {seed}"
    assert results_equal(result, want) == [] and torch.equal(buffer, want.raw_indices), where


# ---- prefill keeps working ----------------------------------------------------------------------


def prefill_chunk(seed: int, raw_lens: list[int], query_lens: list[int]):
    """A vLLM prefill chunk: request r has L_r raw tokens, the last q_r of them queries; token i of r
    sees [0, (L_r - q_r + 1 + i) // 4). Returns (the oracle's problem, cu_seqlen_ks, cu_seqlen_ke,
    cu_seq_lens) as BuildPrefillChunkMetadataKernel writes them (a request of < 4 tokens has no key)."""
    keys = [max(length // 4, 1) for length in raw_lens]
    rows = max(query_lens) * len(raw_lens)  # random_problem splits rows evenly; cut to the real rows below
    p = random_problem(rows, keys, 512, seed=seed, spread=1)
    take = torch.cat([torch.arange(r * max(query_lens), r * max(query_lens) + q) for r, q in enumerate(query_lens)])
    ends = torch.tensor(
        [(length - q + 1 + i) // 4 for length, q in zip(raw_lens, query_lens) for i in range(q)], dtype=torch.int32
    )
    p = RandomProblem(
        **{
            **p.__dict__,
            "q_fp4": p.q_fp4[take].contiguous(),
            "q_scale": p.q_scale[take].contiguous(),
            "weights": p.weights[take].contiguous(),
            "row_to_batch": p.row_to_batch[take].contiguous(),
            "starts": torch.zeros_like(ends),
            "ends": ends,
        }
    )
    cu_seq_lens = torch.tensor([0] + [length // 4 for length in raw_lens], dtype=torch.int32).cumsum(0).to(torch.int32)
    ks = cu_seq_lens[p.row_to_batch.long()]
    return p, ks, ks + ends, cu_seq_lens


@pytest.mark.parametrize(
    "lens",
    [([2000, 3, 900, 2600], [40, 2, 30, 25]), ([1, 2, 5000], [1, 2, 60])],
    ids=["uneven, an empty request between", "two empty requests first"],
)
def test_vllm_prefill_chunk_matches_the_oracle_and_a_direct_call(lens, seed):
    p, ks, ke, cu = prefill_chunk(seed, *lens)
    rows = p.q_fp4.shape[0]
    buffer = torch.full((rows + 3, p.topk), POISON, dtype=torch.int32)
    chunk_rows = buffer[2 : rows + 2]  # topk_indices_buffer[token_start:token_end]
    result = adapters.topk_vllm_indexer_prefill_chunk(
        p.q_fp4,
        p.q_scale.view(torch.int32).view(rows, H),
        vllm_block_slab(p.kv_cache, seed),
        p.block_table,
        p.weights,
        ks,
        ke,
        cu,
        chunk_rows,
        topk=p.topk,
        backend="reference",
    )
    where = f"[vLLM prefill {lens}] seed {seed}"
    want = litetopk_prefill(*p.args(), topk=p.topk, backend="reference")
    # rows of a request without keys may name any request: their windows are empty either way
    assert results_equal(result, want) == [], f"{where}: differs from the direct call in {results_equal(result, want)}"
    assert torch.equal(chunk_rows, want.raw_indices), f"{where}: topk_indices_buffer rows"
    assert bool((buffer[:2] == POISON).all()) and bool((buffer[rows + 2 :] == POISON).all()), (
        f"{where}: outside the chunk"
    )
    check_against_oracle(result, p, where)


def test_vllm_prefill_rows_finds_each_rows_request():
    cu = torch.tensor([0, 0, 5, 5, 5, 9], dtype=torch.int32)  # requests 0, 2, 3 hold no key: 1 and 4 own the rows
    ks = torch.tensor([5, 5, 9, 0, 0], dtype=torch.int32)
    ke = torch.tensor([6, 10, 9, 0, 5], dtype=torch.int32)
    row_to_request, starts, ends = adapters.vllm_prefill_rows(ks, ke, cu)
    assert row_to_request.tolist() == [4, 4, 4, 1, 1] and starts.tolist() == [0] * 5
    assert ends.tolist() == [1, 5, 0, 0, 5] and row_to_request.dtype == torch.int32


# ---- rows at faults -----------------------------------------------------------------------------


def test_sglang_rows_at_faults_publish_nothing_and_the_rest_is_answered(seed):
    p = decode_batch(seed, [3000, 2600, 900, 4100], 2)
    t = sglang_tensors(p)
    t["page_table"][1, 0] = p.kv_cache.shape[0] + 5  # token 1 only: its own page-table row
    t["weights"][4, 7, 0] = float("nan")
    t["c4_seq_lens"][6] = 4 * 64 * p.block_table.shape[1]  # past the table: a window the page table cannot hold
    pages = torch.full((8, p.topk), POISON, dtype=torch.int32)
    result = adapters.topk_sglang_c4_indexer(**t, c4_sparse_page_indices=pages, topk=p.topk, backend="reference")
    faulty = {1: int(RowStatus.INVALID_PAGE), 4: int(RowStatus.NONFINITE), 6: int(RowStatus.INVALID_ROW)}
    where = f"[sglang faults] seed {seed}"
    direct = litetopk_prefill(
        t["q_fp4"].view(torch.uint8),
        p.q_scale,
        p.kv_cache,
        t["page_table"],
        t["weights"].view(8, H),
        torch.arange(8, dtype=torch.int32),
        p.starts,
        t["c4_seq_lens"],
        topk=p.topk,
        backend="reference",
    )
    assert results_equal(result, direct) == [] and torch.equal(pages, direct.physical_indices), where
    check_against_oracle(result, p, where, faulty)


def test_vllm_a_bad_block_faults_every_row_of_its_request(seed):
    next_n = 3
    p = decode_batch(seed, [2600, 1500, 3100], next_n)  # request 2's windows end past max_seq_len
    t = vllm_decode_tensors(p, 3, next_n, seed)
    t["block_table"] = p.block_table.clone()
    t["block_table"][1, 0] = -1  # request 1: all three of its rows see page 0
    buffer = torch.full((9, p.topk), POISON, dtype=torch.int32)
    result = adapters.topk_vllm_indexer_decode(
        **t, topk_indices_buffer=buffer, topk=p.topk, max_seq_len=700, backend="reference"
    )
    bad = int(RowStatus.INVALID_PAGE)
    faulty = {3: bad, 4: bad, 5: bad}
    faulty.update({i: int(RowStatus.INVALID_ROW) for i in range(9) if int(p.ends[i]) > 700 and i not in faulty})
    where = f"[vLLM faults] seed {seed}"
    direct = litetopk_prefill(
        *p.args()[:3], t["block_table"], *p.args()[4:], topk=p.topk, max_seq_len=700, backend="reference"
    )
    assert results_equal(result, direct) == [] and torch.equal(buffer, direct.raw_indices), where
    check_against_oracle(result, p, where, faulty)


# ---- the engines' tensors are checked -----------------------------------------------------------


def test_adapters_refuse_tensors_that_do_not_match(seed):
    p = decode_batch(seed, [900, 300], 2)
    s = sglang_tensors(p)
    v = vllm_decode_tensors(p, 2, 2, seed)
    buffer = torch.empty(4, p.topk, dtype=torch.int32)
    refusals = {
        "c4_seq_lens must hold one length": lambda: adapters.topk_sglang_c4_indexer(
            **{**s, "c4_seq_lens": p.ends[:3].clone()}, c4_sparse_page_indices=buffer, topk=p.topk, backend="reference"
        ),
        "page_table must be int32 \\[4, max_pages\\]": lambda: adapters.topk_sglang_c4_indexer(
            **{**s, "page_table": p.block_table}, c4_sparse_page_indices=buffer, topk=p.topk, backend="reference"
        ),
        "c4_sparse_page_indices must be int32": lambda: adapters.topk_sglang_c4_indexer(
            **s, c4_sparse_page_indices=buffer[:, :100], topk=p.topk, backend="reference"
        ),
        "sglang q_scale must be int32": lambda: adapters.topk_sglang_c4_indexer(
            **{**s, "q_sf": p.q_scale}, c4_sparse_page_indices=buffer, topk=p.topk, backend="reference"
        ),
        "q_fp4 must be one of": lambda: adapters.topk_sglang_c4_indexer(
            **{**s, "q_fp4": p.q_fp4.float()}, c4_sparse_page_indices=buffer, topk=p.topk, backend="reference"
        ),
        "seq_lens must be int32": lambda: adapters.topk_vllm_indexer_decode(
            **{**v, "seq_lens": v["seq_lens"].long()}, topk_indices_buffer=buffer, topk=p.topk, backend="reference"
        ),
        "q_fp4 must hold B \\* next_n = 4": lambda: adapters.topk_vllm_indexer_decode(
            **{**v, "q_fp4": v["q_fp4"][:1]}, topk_indices_buffer=buffer, topk=p.topk, backend="reference"
        ),
        "block_table \\[>= B": lambda: adapters.topk_vllm_indexer_decode(
            **{**v, "block_table": p.block_table[:1]}, topk_indices_buffer=buffer, topk=p.topk, backend="reference"
        ),
        "vLLM kv_cache must be uint8 \\[blocks, 64, >= 68\\]": lambda: adapters.topk_vllm_indexer_decode(
            **{**v, "kv_cache": v["kv_cache"][:, :, :60]}, topk_indices_buffer=buffer, topk=p.topk, backend="reference"
        ),
        "one vLLM kv_cache block must be contiguous": lambda: adapters.topk_vllm_indexer_decode(
            **{**v, "kv_cache": torch.zeros(v["kv_cache"].shape[0], 132, 64, dtype=torch.uint8).transpose(1, 2)},
            topk_indices_buffer=buffer,
            topk=p.topk,
            backend="reference",
        ),
    }
    for message, call in refusals.items():
        with pytest.raises(InputError, match=message):
            call()


# ---- on a GPU: the engine's call is capturable ---------------------------------------------------


def on_cpu(result):
    """A TopKResult with every field on the CPU."""
    return type(result)(**{name: getattr(result, name).cpu() for name in result.__dataclass_fields__})


@pytest.mark.gpu
def test_vllm_decode_on_the_gpu_matches_the_oracle_and_never_synchronizes(seed):
    raw_lens, next_n = [9000, 130, 20000, 7700, 2049, 40000], 2
    p = decode_batch(seed, raw_lens, next_n, device="cuda")
    t = vllm_decode_tensors(p, len(raw_lens), next_n, seed)
    rows = p.q_fp4.shape[0]
    buffer = torch.full((rows + 4, p.topk), POISON, dtype=torch.int32, device="cuda")
    adapters.topk_vllm_indexer_decode(**t, topk_indices_buffer=buffer, topk=p.topk)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        result = adapters.topk_vllm_indexer_decode(**t, topk_indices_buffer=buffer, topk=p.topk)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    result = on_cpu(result)
    assert torch.equal(buffer[:rows].cpu(), result.raw_indices) and bool((buffer[rows:] == POISON).all()), (
        f"seed {seed}"
    )
    check_against_oracle(result, p.to("cpu"), f"[vLLM decode on the GPU] seed {seed}")


@pytest.mark.gpu
def test_sglang_decode_graph_replay_equals_an_eager_call(seed):
    raw_lens = [9000, 130, 20000, 7700]
    p = decode_batch(seed, raw_lens, 3, device="cuda")
    fresh = decode_batch(seed + 1, raw_lens, 3, device="cuda")
    t = sglang_tensors(p)
    pages = torch.full((12, p.topk), POISON, dtype=torch.int32, device="cuda")

    def call():
        return adapters.topk_sglang_c4_indexer(**t, c4_sparse_page_indices=pages, topk=p.topk, max_seq_len=40000 // 4)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for name in ("q_fp4", "q_scale", "kv_cache", "weights"):  # the engine's tensors are views of these
        getattr(p, name).copy_(getattr(fresh, name))
    pages.fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    replayed = pages.clone()
    eager = on_cpu(call())
    assert torch.equal(replayed, pages), f"seed {seed}: the replay differs from an eager call on the same inputs"
    check_against_oracle(eager, p.to("cpu"), f"[sglang graph replay] seed {seed}")
