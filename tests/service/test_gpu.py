"""The service on CUDA: regions by CUDA IPC handle, a pinned device, a foreign GPU refused.

Marked `gpu` / `multigpu`; reported as skipped where no (or one) CUDA device exists.
"""

from __future__ import annotations

import base64
import os

import httpx
import pytest
import torch

from litetopk.clients import RegionProblem, TopKClient
from litetopk.kernels import litetopk_prefill
from litetopk.kernels.aiter_layout import aiter_pages_from_litetopk
from tests.problems import make_problem, results_equal
from tests.servers import start_service

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


def uuid_of(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


@pytest.fixture(scope="module")
def gpu_service(request):
    # One service per device for the module, its workspace sized for these tests' calls (at most 400 rows of 2
    # sequences, windows under 1,024 keys) rather than the GPU defaults (8,192 rows, 65,536 keys, 256 sequences),
    # whose warm-up sizes the workspace over every mode and sample class and compiles for minutes on a cold cache.
    process, directory = start_service(
        device=request.param, backend="auto", max_rows=512, max_keys=1024, max_batch=2, timeout=240
    )
    yield process
    process.stop()
    directory.cleanup()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("gpu_service", ["cuda:0"], indirect=True)
def test_cuda_ipc_regions_equal_in_process(gpu_service):
    p = make_problem(31, seq_lens=[700, 690], rows_per_seq=4).to("cuda:0")
    want = litetopk_prefill(*p.args(), topk=p.topk, backend="auto")
    with TopKClient(uds=gpu_service.uds) as client:
        cache = client.register(p.kv_cache)
        assert cache.kind == "cuda_ipc"
        values = client.register(torch.zeros(8, 512, device="cuda:0"))
        # the host tallies of device regions (status, candidates) are read back by the service in one copy
        status, candidates = (client.register(torch.full((8,), -7, dtype=torch.int32, device="cuda:0")) for _ in "ab")
        out = {"values": values, "status": status, "candidates": candidates}
        got = client.topk(p.q_fp4, p.q_scale, cache, *p.args()[3:], topk=p.topk, out=out)
        assert results_equal(got, want) == []
        assert got.values.data_ptr() == values.tensor.data_ptr(), "the service wrote into the caller's GPU memory"
        assert torch.equal(status.tensor, want.status), "status written into the caller's region"
        assert torch.equal(candidates.tensor, got.candidates) and bool((candidates.tensor >= 0).all())


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("gpu_service", ["cuda:0"], indirect=True)
def test_aiter_cache_format_by_cuda_ipc_answers_as_ours(gpu_service):
    """AITER's kv_cache + kv_scale pair registered by CUDA IPC (two regions, read in place on the
    device): the service's answer equals its answer for our format and the in-process one."""
    p = make_problem(33, seq_lens=[700, 690], rows_per_seq=4).to("cuda:0")
    values, scales = aiter_pages_from_litetopk(p.kv_cache)
    want = litetopk_prefill(*p.args(), topk=p.topk, backend="auto")
    with TopKClient(uds=gpu_service.uds) as client:
        cache, scale = client.register(values, access="read_only"), client.register(scales, access="read_only")
        assert (cache.kind, scale.kind) == ("cuda_ipc", "cuda_ipc")
        got = client.topk(p.q_fp4, p.q_scale, cache, *p.args()[3:], topk=p.topk, kv_scale=scale)
        assert results_equal(got, want) == []
        assert results_equal(client.topk(*p.args(), topk=p.topk), want) == [], "our format on the same service"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("gpu_service", ["cuda:0"], indirect=True)
def test_results_into_host_memory_equal_in_process(gpu_service):
    """A GPU service writing into host regions: the client's pooled result scratch (results over
    1 MiB) and an explicit host `out` region get the device's answer, copied straight into them."""
    p = make_problem(32, seq_lens=[700, 690], rows_per_seq=100, spread=1).to("cuda:0")  # Triton-supported scales
    want = litetopk_prefill(*p.args(), topk=p.topk, backend="auto")
    with TopKClient(uds=gpu_service.uds) as client:
        cache = client.register(p.kv_cache)
        for _ in range(2):  # the second call reuses the pooled scratch region
            got = client.topk(p.q_fp4, p.q_scale, cache, *p.args()[3:], topk=p.topk)
            assert results_equal(got, want) == []
        values = client.register(torch.full((p.q_fp4.shape[0], p.topk), float("nan")))
        assert values.kind != "cuda_ipc"
        got = client.topk(p.q_fp4, p.q_scale, cache, *p.args()[3:], topk=p.topk, out={"values": values})
        assert results_equal(got, want) == []
        assert torch.equal(values.tensor, want.values.cpu()), "the host region holds the answer"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("gpu_service", ["cuda:0"], indirect=True)
def test_raw_handle_that_does_not_open(gpu_service):
    registration = {
        "kind": "cuda_ipc",
        "handle": base64.b64encode(os.urandom(64)).decode(),
        "device_uuid": uuid_of(0),
        "size": 4096,
        "pid": os.getpid(),
    }
    doc = httpx.post(f"{gpu_service.url}/v1/regions", json=registration, headers=gpu_service.auth).json()
    assert doc["code"] == "ipc_unavailable", doc


@pytest.mark.multigpu
@needs_two_gpus
@pytest.mark.parametrize("gpu_service", ["cuda:1"], indirect=True)
def test_service_pinned_to_the_second_gpu(gpu_service):
    p1 = make_problem(32, seq_lens=[700, 690], rows_per_seq=4).to("cuda:1")
    want = litetopk_prefill(*p1.args(), topk=p1.topk, backend="auto")
    torch.cuda.set_device(0)  # the caller's current device must not matter
    with TopKClient(gpu_service.url, token=gpu_service.token) as client:
        assert client.info()["device_uuid"] in uuid_of(1).lower()
        with pytest.raises(RegionProblem) as err:
            client.register(torch.zeros(1024, device="cuda:0"))
        assert err.value.code == "foreign_device"
        got = client.topk(*p1.args(), topk=p1.topk)
        assert results_equal(got, want) == []
