"""/v1/topk against a live service: answers equal (torch.equal, every field) to the in-process
reference operator, over TCP and the Unix socket, in JSON and binary, into output regions, with
the cache in either format (ours, or AITER's kv_cache + kv_scale pair)."""

from __future__ import annotations

import pytest
import torch

from litetopk.clients import TopKClient
from litetopk.kernels import litetopk_prefill
from litetopk.kernels.aiter_layout import aiter_pages_from_litetopk
from tests.problems import make_problem, results_equal

CASES = {
    "causal-k512": dict(seed=1, seq_lens=[700, 690], rows_per_seq=4, topk=512),
    "window-k512": dict(seed=2, seq_lens=[700, 520], rows_per_seq=4, topk=512, causal=False),
    "short-k1024-padded": dict(seed=3, seq_lens=[700, 1100], rows_per_seq=4, topk=1024),
    "bf16-weights-scaled": dict(
        seed=4, seq_lens=[650, 700], rows_per_seq=4, topk=512, weights_dtype=torch.bfloat16, weight_scale=0.125
    ),
}


def ref_topk(problem):
    return litetopk_prefill(*problem.args(), topk=problem.topk, weight_scale=problem.weight_scale, backend="reference")


@pytest.fixture(params=["tcp", "uds"])
def client(request, service):
    c = TopKClient(service.url, token=service.token) if request.param == "tcp" else TopKClient(uds=service.uds)
    yield c
    c.close()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("result_format", ["json", "binary"])
def test_plain_tensors_equal_reference(client, case, result_format):
    p = make_problem(**CASES[case])
    got = client.topk(*p.args(), topk=p.topk, weight_scale=p.weight_scale, result_format=result_format)
    assert results_equal(got, ref_topk(p)) == [], f"{case} via {client.endpoint} as {result_format}"


@pytest.mark.parametrize("case", ["causal-k512", "short-k1024-padded"])
def test_registered_regions_equal_reference(client, case):
    p = make_problem(**CASES[case])
    cache = client.register(p.kv_cache)
    q = client.register(p.q_fp4)
    meta = client.register(torch.cat([p.row_to_batch, p.starts, p.ends]))
    rows = p.q_fp4.shape[0]
    r2b, st, en = meta.tensor[:rows], meta.tensor[rows : 2 * rows], meta.tensor[2 * rows :]  # slices, sent by reference
    got = client.topk(q, p.q_scale, cache, p.block_table, p.weights, r2b, st, en, topk=p.topk)
    assert results_equal(got, ref_topk(p)) == [], case
    for region in (cache, q, meta):
        client.unregister(region)


def test_results_into_output_regions(client):
    p = make_problem(**CASES["causal-k512"])
    rows = p.q_fp4.shape[0]
    cache = client.register(p.kv_cache)
    values = client.register(torch.zeros(rows, p.topk))
    physical = client.register(torch.zeros(rows, p.topk, dtype=torch.int32))
    got = client.topk(
        *p.args()[:2], cache, *p.args()[3:], topk=p.topk, out={"values": values, "physical_indices": physical.tensor}
    )
    want = ref_topk(p)
    assert results_equal(got, want) == []
    assert torch.equal(values.tensor, want.values) and torch.equal(physical.tensor, want.physical_indices)
    assert got.values.data_ptr() == values.tensor.data_ptr(), "the result is the caller's region (zero copy)"
    for region in (cache, values, physical):
        client.unregister(region)


def test_repair_false_keeps_capacity_bits(client):
    p = make_problem(**CASES["causal-k512"])
    got = client.topk(*p.args(), topk=p.topk, repair=True)
    strict = client.topk(*p.args(), topk=p.topk, repair=False)
    want = litetopk_prefill(*p.args(), topk=p.topk, backend="reference", repair=False)
    assert results_equal(strict, want) == []
    assert results_equal(got, ref_topk(p)) == []


def test_reruns_are_bit_identical(client):
    p = make_problem(**CASES["window-k512"])
    first = client.topk(*p.args(), topk=p.topk)
    assert results_equal(first, client.topk(*p.args(), topk=p.topk)) == []


def test_aiter_cache_format_answers_as_ours(client, seed):
    """One random problem, its cache in our format and in AITER's (kernels.aiter_layout), as plain
    tensors, as two regions and as two slices of one region: every answer equal to ours."""
    p = make_problem(seed, seq_lens=[700, 690], rows_per_seq=4, topk=512)
    values, scales = aiter_pages_from_litetopk(p.kv_cache)
    ours = client.topk(*p.args(), topk=p.topk)
    assert results_equal(ours, ref_topk(p)) == []
    args = list(p.args())

    def aiter(cache, kv_scale):
        args[2] = cache
        return client.topk(*args, topk=p.topk, kv_scale=kv_scale)

    assert results_equal(aiter(values, scales), ours) == [], "plain tensors (staged)"
    cache, scale = client.register(values, access="read_only"), client.register(scales, access="read_only")
    assert results_equal(aiter(cache, scale), ours) == [], "two regions"
    both = client.register(torch.cat([values.flatten(), scales.flatten()]), access="read_only")
    split = values.numel()
    got = aiter(both.tensor[:split].view(values.shape), both.tensor[split:].view(scales.shape))
    assert results_equal(got, ours) == [], "two slices of one region"
    for region in (cache, scale, both):
        client.unregister(region)
