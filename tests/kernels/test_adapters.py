"""Engine adapters (kernels/adapters.py) on the CPU reference: zero copy of the inputs (data
pointers reach the operator unchanged; the engines' dtypes and shapes viewed as our bytes), the
answer equal to a direct call, and the engine's index buffer written in place (a strided row view
included). The engines' decode calls: test_adapters_decode.py."""

from __future__ import annotations

import pytest
import torch

from litetopk.kernels import InputError, adapters, litetopk_prefill
from tests.kernels.test_aiter_layout import in_padded_slab
from tests.problems import make_problem


def spy_on_operator(monkeypatch) -> list:
    """Record the tensors the adapter hands to litetopk_prefill."""
    seen = []

    def recording(*args, **kwargs):
        seen.append(args)
        return litetopk_prefill(*args, **kwargs)

    monkeypatch.setattr(adapters, "litetopk_prefill", recording)
    return seen


def test_sglang_adapter_is_zero_copy_and_fills_the_buffer(monkeypatch, seed):
    p = make_problem(seed, seq_lens=[600, 300], rows_per_seq=2, spread=1)
    rows = p.q_fp4.shape[0]
    q_scale = p.q_scale.view(torch.int32).view(rows, 1, 64)  # sglang's int32 [T, 1, 64]
    weights = p.weights.view(rows, 64, 1)
    page_table = p.block_table[p.row_to_batch.long()].contiguous()  # one row per query token
    out = torch.full((rows, p.topk), 7, dtype=torch.int32)
    seen = spy_on_operator(monkeypatch)
    result = adapters.topk_sglang_fp4_indexer(
        p.q_fp4, q_scale, p.kv_cache, page_table, weights, p.starts, p.ends, out, topk=p.topk, backend="reference"
    )
    args = seen[0]
    inputs = (p.q_fp4, q_scale, p.kv_cache, page_table, weights)
    assert [a.data_ptr() for a in args[:5]] == [t.data_ptr() for t in inputs], "an input was copied"
    want = litetopk_prefill(*p.args(), topk=p.topk, backend="reference")
    assert torch.equal(out, want.physical_indices), f"seed {seed}"
    assert torch.equal(result.raw_indices, want.raw_indices), f"seed {seed}"


def test_vllm_adapter_reads_slab_pages_and_fills_a_row_view(monkeypatch, seed):
    p = make_problem(seed, seq_lens=[500, 700], rows_per_seq=2, spread=1)
    rows = p.q_fp4.shape[0]
    cache = in_padded_slab(p.kv_cache, 4608, seed=seed)
    buffer = torch.full((rows + 3, p.topk + 64), 7, dtype=torch.int32)
    view = buffer[1 : rows + 1, : p.topk]
    seen = spy_on_operator(monkeypatch)
    adapters.topk_vllm_indexer(
        p.q_fp4,
        p.q_scale,
        cache,
        p.block_table,
        p.weights,
        p.row_to_batch,
        p.starts,
        p.ends,
        view,
        topk=p.topk,
        backend="reference",
    )
    assert seen[0][2].data_ptr() == cache.data_ptr() and seen[0][2].stride(0) == 4608, "the cache was copied"
    want = litetopk_prefill(*p.args(), topk=p.topk, backend="reference")
    assert torch.equal(view, want.raw_indices), f"seed {seed}"
    assert bool((buffer[0] == 7).all()) and bool((buffer[:, p.topk :] == 7).all()), "wrote outside the view"


def test_adapters_check_the_engine_tensors(seed):
    p = make_problem(seed, seq_lens=[200], rows_per_seq=1, spread=1)
    with pytest.raises(InputError, match="int32"):
        adapters.sglang_q_scale_bytes(p.q_scale)
    with pytest.raises(InputError, match="topk_indices_buffer must be int32"):
        adapters.topk_vllm_indexer(
            *p.args()[:5],
            p.row_to_batch,
            p.starts,
            p.ends,
            torch.empty(1, 3, dtype=torch.int32),
            topk=p.topk,
            backend="reference",
        )


def test_engine_tensors_are_viewed_as_our_bytes(seed):
    """The engines' dtypes and shapes (int8 / float4 queries, int32 [.., 64] scales, sglang's
    [T, 64, 1] weights, vLLM's FP8-sized 3-D cache) become our arguments as views of the same bytes."""
    p = make_problem(seed, seq_lens=[300], rows_per_seq=4, spread=1)
    rows = p.q_fp4.shape[0]
    for q in (p.q_fp4.view(torch.int8), p.q_fp4.view(torch.float4_e2m1fn_x2), p.q_fp4.view(2, 2, 64, 64)):
        view = adapters.query_bytes(q)
        assert view.data_ptr() == p.q_fp4.data_ptr() and torch.equal(view, p.q_fp4), f"{q.dtype} {list(q.shape)}"
    for scales in (p.q_scale.view(torch.int32).view(rows, 64), p.q_scale.view(torch.int32).view(2, 2, 64), p.q_scale):
        view = adapters.query_scale_bytes(scales)
        assert view.data_ptr() == p.q_scale.data_ptr() and torch.equal(view, p.q_scale), f"{list(scales.shape)}"
    assert torch.equal(adapters.head_weights(p.weights.view(rows, 64, 1), rows), p.weights)
    slab = torch.randint(
        0, 256, (p.kv_cache.shape[0], 9000), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )
    slab[:, :4352] = p.kv_cache
    blocks = slab[:, : 64 * 132].view(-1, 64, 132)  # vLLM's layer allocation, blocks 9000 bytes apart
    pages = adapters.vllm_kv_cache_pages(blocks)
    assert pages.data_ptr() == slab.data_ptr() and pages.stride(0) == 9000 and tuple(pages.shape[1:]) == (64, 1, 68)
    assert torch.equal(pages.reshape(-1, 4352), p.kv_cache), "a block's first 4352 bytes are our page"
