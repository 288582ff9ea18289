"""Regions in-process (RegionTable) and over HTTP: ids, generations, bounds, leases, owners, principals."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch

from litetopk.clients import TopKClient
from litetopk.clients.memfd import SealedMemory
from litetopk.service.errors import ServiceError
from litetopk.service.regions import RegionTable, RetireReason, normalize_uuid, owner_alive
from litetopk.service.schemas import MemfdRegistration, RegionSlice
from tests.servers import wait_until

ME = os.getuid()


@pytest.fixture
def block():
    memory = SealedMemory(4096)
    yield memory
    memory.close_fd()


def registration(size=4096, **fields) -> MemfdRegistration:
    return MemfdRegistration(kind="memfd", ticket="t" * 16, size=size, **fields)


def register(table, block, owner=ME, **fields):
    """Register `block` (a dup of its fd: the table consumes the fd it is given)."""
    return table.register_memfd(registration(**fields), os.dup(block.fd), owner)


def ref(region, offset=0, dtype="int32", shape=(4,)):
    return RegionSlice(region=region.id, generation=region.generation, offset=offset, dtype=dtype, shape=list(shape))


def test_shm_region_is_shared_memory_not_a_copy(block):
    table = RegionTable(torch.device("cpu"))
    region = register(table, block, pid=os.getpid())
    mine = torch.frombuffer(block.mapping, dtype=torch.int32)
    mine[:4] = torch.tensor([1, 2, 3, 4])
    leased, view = table.acquire(ref(region), "x", ME)
    assert view.tolist() == [1, 2, 3, 4]
    view[0] = 99
    assert int(mine[0]) == 99
    table.release(leased)


def test_int32_values_are_read_in_the_region_itself_and_dropped_when_it_closes(block):
    table = RegionTable(torch.device("cpu"))
    region = register(table, block)
    mine = torch.frombuffer(block.mapping, dtype=torch.int32)
    mine[2:6] = torch.tensor([7, 0, -3, 2**31 - 1])
    values = region.int32s(ref(region, 8), "x")
    assert list(values) == [7, 0, -3, 2**31 - 1] and region.int32s(ref(region, 8), "x") is values, "kept"
    mine[2] = 8
    assert values[0] == 8, "a view of the memory, not a copy"
    table.unregister(region.id, ME)
    assert region.views == {}, "dropped with the views when the region closes"


@pytest.mark.parametrize(
    "offset,dtype,shape,code",
    [
        (4096, "uint8", (1,), "out_of_bounds"),
        (0, "float32", (1025,), "out_of_bounds"),
        (2, "int32", (1,), "misaligned_offset"),
    ],
)
def test_bounds_and_alignment(block, offset, dtype, shape, code):
    table = RegionTable(torch.device("cpu"))
    region = register(table, block)
    with pytest.raises(ServiceError) as err:
        table.check(ref(region, offset, dtype, shape), "x", ME)
    assert err.value.code == code, (offset, dtype, shape)


def test_generations_and_stale_lookups(block):
    table = RegionTable(torch.device("cpu"))
    retired = []
    table.on_retire = retired.append
    first = register(table, block)
    second = register(table, block, size=2048)
    assert second.id == first.id and second.generation == first.generation + 1
    with pytest.raises(ServiceError) as err:
        table.check(ref(first), "x", ME)
    assert err.value.code == "stale_region"
    table.check(ref(second), "x", ME)
    table.unregister(second.id, ME)
    with pytest.raises(ServiceError) as err:
        table.get(second.id, ME)
    assert err.value.code == "stale_region" and "unregistered" in err.value.detail
    with pytest.raises(ServiceError) as err:
        table.get("rnever", ME)
    assert err.value.code == "unknown_region"
    assert [r.reason for r in retired] == [RetireReason.SUPERSEDED, RetireReason.UNREGISTERED]


def test_another_principal_sees_nothing(block):
    """Another uid can neither find, lease, re-register over nor unregister a region: its id does not exist."""
    table = RegionTable(torch.device("cpu"))
    mine = register(table, block)
    other = ME + 1
    for attempt in (
        lambda: table.get(mine.id, other),
        lambda: table.check(ref(mine), "x", other),
        lambda: table.acquire(ref(mine), "x", other),
        lambda: table.unregister(mine.id, other),
    ):
        with pytest.raises(ServiceError) as err:
            attempt()
        assert err.value.code == "unknown_region", err.value.detail
    assert table.list(other) == [] and table.list(ME) == [mine]
    theirs = register(table, block, owner=other)
    assert theirs.id != mine.id and mine.live and mine.generation == 1, "the same memory of another uid is its own"
    table.unregister(mine.id, ME)
    with pytest.raises(ServiceError) as err:
        table.get(mine.id, other)
    assert err.value.code == "unknown_region", "a retired region of another uid is not even stale"


def test_unregister_waits_for_running_leases(block):
    table = RegionTable(torch.device("cpu"))
    region = register(table, block)
    leased, _ = table.acquire(ref(region), "x", ME)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (table.unregister(region.id, ME), done.set()))
    waiter.start()

    def retired() -> bool:
        try:
            table.release(table.acquire(ref(region), "x", ME)[0])
        except ServiceError:
            return True  # retired at once: no new lease
        return False

    wait_until(retired, timeout=30)
    assert not done.is_set(), "unregister returned while a request still used the region"
    table.release(leased)
    waiter.join(5)
    assert done.is_set() and region.base is None


def test_dead_owner_regions_are_dropped(block):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    table = RegionTable(torch.device("cpu"))
    region = register(table, block, pid=child.pid)
    assert table.drop_dead_owners() == []
    child.kill()
    child.wait()
    assert not owner_alive(child.pid, region.pid_start)
    assert table.drop_dead_owners() == [region]
    assert region.reason is RetireReason.OWNER_DIED
    with pytest.raises(ServiceError) as err:
        table.get(region.id, ME)
    assert err.value.code == "stale_region" and "died" in err.value.detail


@pytest.mark.parametrize("how", ["superseded", "owner died, found by a lookup", "owner died, found by a lease"])
def test_a_region_retired_without_leases_is_closed_at_once(block, how):
    """However a region is retired, its memory is let go of (views, base, handle: `close`) as soon as no
    request uses it; here none does, so at once."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    table = RegionTable(torch.device("cpu"))
    closed = []
    region = register(table, block, pid=child.pid)
    region.close = lambda: closed.append(region.id)
    table.release(table.acquire(ref(region), "x", ME)[0])
    assert region.views, "a view is kept while the region lives"
    if how == "superseded":
        register(table, block, pid=os.getpid())
    else:
        child.kill()
        child.wait()
        with pytest.raises(ServiceError) as err:
            if how.endswith("lookup"):
                table.get(region.id, ME)
            else:
                table.lease([region], [region])
        assert err.value.code == "stale_region", how
    child.kill()
    child.wait()
    assert not region.live and region.base is None and region.views == {} and closed == [region.id], how


def test_a_lease_passed_its_last_check_still_finds_a_region_retired_since(block):
    """`lease` skips looking at each region only while no region at all was retired since the lease that
    returned `checked`: any retirement (here of another region) makes it look again, and a retired
    region of the request is refused."""
    table = RegionTable(torch.device("cpu"))
    other = SealedMemory(4096)
    region, unrelated = register(table, block), register(table, other)
    checked = table.lease([region], [])
    table.release_all([region])
    assert table.lease([region], [], checked) == checked, "nothing retired since: the same count"
    table.release_all([region])
    table.unregister(unrelated.id, ME)
    checked = table.lease([region], [], checked)
    table.release_all([region])
    table.unregister(region.id, ME)
    with pytest.raises(ServiceError) as err:
        table.lease([region], [], checked)
    assert err.value.code == "stale_region" and region.leases == 0
    other.close_fd()


@pytest.mark.parametrize("policy", ["refuse", "untrack"])
def test_owner_from_another_pid_namespace_is_never_tracked(block, policy):
    table = RegionTable(torch.device("cpu"), foreign_pid_namespace=policy)
    assert table.pid_ns == os.stat("/proc/self/ns/pid").st_ino
    foreign = dict(pid=os.getpid(), pid_ns=table.pid_ns + 1)
    if policy == "refuse":
        with pytest.raises(ServiceError) as err:
            register(table, block, **foreign)
        assert err.value.code == "foreign_pid_namespace", err.value.detail
        assert table.list() == []
    else:
        region = register(table, block, **foreign)
        assert (region.pid, region.pid_start) == (None, None), "a pid of another namespace names nobody here"
    mine = register(table, block, owner=ME + 1, pid=os.getpid(), pid_ns=table.pid_ns)
    assert mine.pid == os.getpid() and mine.pid_start is not None


def test_uuid_spellings():
    assert normalize_uuid("GPU-5A6B7C8D-0000") == normalize_uuid("5a6b7c8d-0000") == "5a6b7c8d-0000"


# ----------------------------------------------------------------------------------- over HTTP


def test_register_list_get_unregister(service):
    with (
        TopKClient(service.url, token=service.token) as client,
        httpx.Client(base_url=service.url, headers=service.auth) as http,
    ):
        region = client.register(torch.arange(100, dtype=torch.int32))
        listed = {r["id"]: r for r in client.regions()}
        assert listed[region.id]["kind"] == "memfd" and listed[region.id]["pid"] == os.getpid()
        assert listed[region.id]["access"] == "read_write"
        assert http.get(f"/v1/regions/{region.id}").json()["size"] == 400
        client.unregister(region)
        assert http.get(f"/v1/regions/{region.id}").json()["code"] == "stale_region"
        assert region.id not in {r["id"] for r in client.regions()}
        client.unregister(region)  # idempotent


def test_delete_with_wrong_generation_is_stale(service):
    with TopKClient(uds=service.uds) as client, httpx.Client(base_url=service.url, headers=service.auth) as http:
        region = client.register(torch.zeros(8))
        response = http.delete(f"/v1/regions/{region.id}", params={"generation": region.generation + 1})
        assert response.status_code == 409 and response.json()["code"] == "stale_region"


def test_client_process_killed_while_holding_regions(service):
    script = (
        "import sys, time, torch\n"
        "from litetopk.clients import TopKClient\n"
        f"c = TopKClient(uds={service.uds!r})\n"
        "r = c.register(torch.zeros(1024))\n"
        "print(r.id, flush=True)\n"
        "time.sleep(120)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        region_id = child.stdout.readline().strip()
        with httpx.Client(base_url=service.url, headers=service.auth) as http:
            assert http.get(f"/v1/regions/{region_id}").status_code == 200
            child.kill()
            child.wait()
            deadline = time.monotonic() + 20
            while http.get(f"/v1/regions/{region_id}").status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.05)  # the service checks owners every 0.2 s here
            doc = http.get(f"/v1/regions/{region_id}").json()
        assert doc["code"] == "stale_region" and "died" in doc["detail"], doc
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_owner_watch_sees_every_exit_past_one_epoll_call():
    """More owners exit at once than one epoll call reports (EXITED_AT_ONCE): each is then asked alone (its
    pidfd polled), and every one reads as dead while a live owner reads as alive."""
    from litetopk.service.owners import EXITED_AT_ONCE, OwnerWatch, process_start

    watch = OwnerWatch()
    sleeper = [sys.executable, "-c", "import time, sys; time.sleep(float(sys.argv[1]))"]
    short = [subprocess.Popen([*sleeper, "1.5"]) for _ in range(EXITED_AT_ONCE + 6)]
    live = subprocess.Popen([*sleeper, "60"])
    try:
        owners = [(p.pid, process_start(p.pid)) for p in (*short, live)]
        for owner in owners:
            watch.watch(*owner)
        assert all(p.poll() is None for p in short), "every owner was watched alive (by pidfd)"
        for p in short:
            p.wait()
        wait_until(lambda: not any(watch.alive(*owner) for owner in owners[:-1]), timeout=10)
        assert watch.alive(*owners[-1]), "the live owner"
    finally:
        live.kill()
        live.wait()
        watch.close()
