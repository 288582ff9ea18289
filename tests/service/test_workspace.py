"""The service's one operator (workspace, graph runner) and zero-copy outputs, in-process.

The app runs under uvicorn in a thread of this process (a CPU service on a private Unix socket), so
that its executor can be inspected: it holds one workspace, sized from the limits at start, under
one graph runner that replays repeated request shapes, the same tensor after many requests. Output regions on the
operator's device (host regions on a CPU service) are the operator's `out=`; a request with them
answers the same bits as one without, and as the in-process operator.
"""

from __future__ import annotations

import threading

import pytest
import torch
import uvicorn

from litetopk.clients import InvalidRequestProblem, RowFaultProblem, TopKClient
from litetopk.kernels import LiteTopKTuning, litetopk_prefill, workspace_bytes
from litetopk.service.__main__ import bind_unix
from litetopk.service.app import create_app
from litetopk.service.principals import peer_protocol_class
from litetopk.service.settings import ServiceSettings
from tests.problems import make_problem, results_equal
from tests.servers import wait_until

FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status", "repaired", "candidates")
LIMITS = dict(max_rows=8, max_keys=1024, max_batch=2)


@pytest.fixture
def in_process(tmp_path):
    """(app, Unix socket path) of a CPU service running in a thread of this process."""
    settings = ServiceSettings(
        host="", uds=str(tmp_path / "sock" / "s.sock"), device="cpu", log_level="warning", **LIMITS
    )
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning", http=peer_protocol_class()))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [bind_unix(settings)]}, daemon=True)
    thread.start()
    wait_until(
        lambda: (
            not thread.is_alive()
            or (server.started and app.state.service.ready.is_set() and app.state.service.executor.operator is not None)
        ),
        timeout=60,
    )
    assert thread.is_alive(), "the in-process service stopped"
    yield app, settings.uds
    server.should_exit = True
    thread.join(30)


class Spy:
    """Stands in for the operator's graph runner: records each call's keyword arguments, then runs it."""

    def __init__(self, runner):
        self.runner, self.calls = runner, []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        return self.runner(**kwargs)


@pytest.mark.parametrize("transport", ["ipc", "http"])
def test_out_regions_give_the_same_bits_and_one_workspace_serves_every_request(in_process, seed, transport):
    app, uds = in_process
    operator = app.state.service.executor.operator
    workspace, runner = operator.workspace, operator.runner
    pointer, nbytes = workspace.data_ptr(), workspace.numel()
    assert nbytes == workspace_bytes(
        LIMITS["max_rows"],
        LIMITS["max_keys"],
        (512, 1024),
        device="cpu",
        backend="reference",
        max_batch=LIMITS["max_batch"],
    )
    assert runner.workspace is workspace, "the graph runner calls on the one workspace"
    spy = operator.runner = Spy(runner)
    p = make_problem(seed, seq_lens=[700, 500], rows_per_seq=4, topk=512)
    want = litetopk_prefill(*p.args(), topk=p.topk, backend="reference", max_seq_len=LIMITS["max_keys"])
    rows = p.q_fp4.shape[0]
    replays = runner.stats["replays"]
    with TopKClient(uds=uds, transport=transport) as client:
        cache = client.register(p.kv_cache)
        plain = client.topk(*p.args()[:2], cache, *p.args()[3:], topk=p.topk)
        regions = {name: client.register(torch.full_like(getattr(want, name), -5)) for name in FIELDS}
        for attempt in range(3):
            got = client.topk(
                *p.args()[:2], cache, *p.args()[3:], topk=p.topk, out={name: region for name, region in regions.items()}
            )
            assert results_equal(got, plain) == [], f"request {attempt} with out regions vs without (seed {seed})"
            for name, region in regions.items():
                assert torch.equal(region.tensor, getattr(want, name)), f"request {attempt}: region {name}"
                region.tensor.fill_(-5)
    assert results_equal(plain, want) == [], f"the service vs the in-process operator (seed {seed})"
    assert len(spy.calls) == 4
    assert runner.stats["replays"] - replays >= 3, "the repeated request shape is replayed, not captured again"
    for i, kwargs in enumerate(spy.calls):
        assert kwargs["max_seq_len"] == LIMITS["max_keys"], f"call {i}"
        assert sorted(kwargs["out"]) == sorted(FIELDS), f"call {i}: every field is written in place (no allocation)"
        assert all(t.shape[0] == rows for t in kwargs["out"].values())
    assert runner.tuning == app.state.service.tuning == LiteTopKTuning()
    assert operator.workspace is workspace and (workspace.data_ptr(), workspace.numel()) == (pointer, nbytes), (
        "the workspace grew or moved"
    )


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


def test_the_operator_is_built_on_the_worker_thread_only():
    from litetopk.service.executor import DeviceExecutor, WorkspaceLimits
    from litetopk.service.metrics import ServiceMetrics

    executor = DeviceExecutor(torch.device("cpu"), 2, ServiceMetrics())
    with pytest.raises(RuntimeError, match="worker thread"):
        executor.build_operator(WorkspaceLimits(2, 256, 1), "reference")
    assert executor.operator is None


@pytest.mark.parametrize(
    "max_rows,device,want", [(0, "cpu", 256), (0, "cuda", 8192), (40, "cpu", 40), (40, "cuda", 40)]
)
def test_row_limit(max_rows, device, want):
    settings = ServiceSettings(uds="", max_rows=max_rows)
    assert settings.row_limit(torch.device(device)) == want
