"""The service's one operator workspace and zero-copy outputs (issue 14 item 6), in-process.

The app runs under uvicorn in a thread of this process (a CPU service on a private Unix socket), so
that its executor can be inspected: it holds one workspace, sized from the limits at start and
handed to every operator call, the same tensor after many requests. Output regions on the
operator's device (host regions on a CPU service) are the operator's `out=`; a request with them
answers the same bits as one without, and as the in-process operator.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
import uvicorn

from litetopk.clients import InvalidRequestProblem, RowFaultProblem, TopKClient
from litetopk.kernels import LiteTopKTuning, litetopk_prefill, workspace_bytes
from litetopk.service.__main__ import bind_unix
from litetopk.service.app import create_app
from litetopk.service.principals import peer_protocol_class
from litetopk.service.routes import topk as topk_route
from litetopk.service.settings import ServiceSettings
from tests.problems import make_problem, results_equal

FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status", "repaired", "candidates")
LIMITS = dict(max_rows=8, max_keys=1024, max_batch=2)


@pytest.fixture
def in_process(tmp_path):
    """(app, Unix socket path) of a CPU service running in a thread of this process."""
    settings = ServiceSettings(host="", uds=str(tmp_path / "sock" / "s.sock"), device="cpu", log_level="warning",
                               **LIMITS)
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning", http=peer_protocol_class()))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [bind_unix(settings)]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (server.started and app.state.service.ready.is_set()
               and app.state.service.executor.workspace is not None):
        assert time.monotonic() < deadline and thread.is_alive(), "the in-process service did not get ready"
        time.sleep(0.05)
    yield app, settings.uds
    server.should_exit = True
    thread.join(30)


@pytest.fixture
def calls(monkeypatch):
    """The keyword arguments of every operator call the route makes (the real operator runs)."""
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return litetopk_prefill(*args, **kwargs)

    monkeypatch.setattr(topk_route, "litetopk_prefill", spy)
    return seen


def test_out_regions_give_the_same_bits_and_one_workspace_serves_every_request(in_process, calls, seed):
    app, uds = in_process
    executor = app.state.service.executor
    workspace = executor.workspace
    pointer, nbytes = workspace.data_ptr(), workspace.numel()
    assert nbytes == workspace_bytes(LIMITS["max_rows"], LIMITS["max_keys"], (512, 1024), device="cpu",
                                     backend="reference", max_batch=LIMITS["max_batch"])
    p = make_problem(seed, seq_lens=[700, 500], rows_per_seq=4, topk=512)
    want = litetopk_prefill(*p.args(), topk=p.topk, backend="reference", max_seq_len=LIMITS["max_keys"])
    rows = p.q_fp4.shape[0]
    with TopKClient(uds=uds) as client:
        cache = client.register(p.kv_cache)
        plain = client.topk(*p.args()[:2], cache, *p.args()[3:], topk=p.topk)
        regions = {name: client.register(torch.full_like(getattr(want, name), -5)) for name in FIELDS}
        for attempt in range(3):
            got = client.topk(*p.args()[:2], cache, *p.args()[3:], topk=p.topk,
                              out={name: region for name, region in regions.items()})
            assert results_equal(got, plain) == [], f"request {attempt} with out regions vs without (seed {seed})"
            for name, region in regions.items():
                assert torch.equal(region.tensor, getattr(want, name)), f"request {attempt}: region {name}"
                region.tensor.fill_(-5)
    assert results_equal(plain, want) == [], f"the service vs the in-process operator (seed {seed})"
    assert len(calls) == 4
    for i, kwargs in enumerate(calls):
        assert kwargs["workspace"] is workspace, f"call {i} did not get the executor's workspace"
        assert kwargs["max_seq_len"] == LIMITS["max_keys"]
        assert kwargs["tuning"] is app.state.service.tuning == LiteTopKTuning(), f"call {i}: the settings' tuning"
    assert calls[0]["out"] is None
    assert all(sorted(kwargs["out"]) == sorted(FIELDS) for kwargs in calls[1:]), "host regions are the operator's out="
    assert all(kwargs["out"]["values"].shape == (rows, p.topk) for kwargs in calls[1:])
    assert executor.workspace is workspace and (workspace.data_ptr(), workspace.numel()) == (pointer, nbytes), \
        "the workspace grew or moved"


def test_requests_beyond_the_limits(in_process, seed):
    _, uds = in_process
    with TopKClient(uds=uds) as client:
        many = make_problem(seed, seq_lens=[600], rows_per_seq=LIMITS["max_rows"] + 1, topk=512)
        with pytest.raises(InvalidRequestProblem) as err:
            client.topk(*many.args(), topk=512)
        assert err.value.code == "invalid_input" and "LITETOPK_MAX_ROWS" in err.value.detail, err.value.detail
        sequences = make_problem(seed, seq_lens=[300] * (LIMITS["max_batch"] + 1), rows_per_seq=1, topk=512)
        with pytest.raises(InvalidRequestProblem) as err:
            client.topk(*sequences.args(), topk=512)
        assert err.value.code == "invalid_input" and "LITETOPK_MAX_BATCH" in err.value.detail, err.value.detail
        long = make_problem(seed, seq_lens=[LIMITS["max_keys"] + 200], rows_per_seq=2, topk=512)
        with pytest.raises(RowFaultProblem) as err:
            client.topk(*long.args(), topk=512)
        assert err.value.code == "invalid_row" and err.value.rows == [0, 1], err.value.detail


def test_the_workspace_is_allocated_on_the_worker_thread_only():
    from litetopk.service.executor import DeviceExecutor, WorkspaceLimits
    from litetopk.service.metrics import ServiceMetrics

    executor = DeviceExecutor(torch.device("cpu"), 2, ServiceMetrics())
    with pytest.raises(RuntimeError, match="worker thread"):
        executor.allocate_workspace(WorkspaceLimits(2, 256, 1), "reference")
    assert executor.workspace is None


@pytest.mark.parametrize("max_rows,device,want",
                         [(0, "cpu", 256), (0, "cuda", 8192), (40, "cpu", 40), (40, "cuda", 40)])
def test_row_limit(max_rows, device, want):
    settings = ServiceSettings(uds="", max_rows=max_rows)
    assert settings.row_limit(torch.device(device)) == want
