"""The device worker's part of a top-k request (service/topk.py `execute`), with the operator and
the region table replaced: output regions are written where they live.

A GPU service writes into host regions (the client's pooled result scratch, host `out` regions);
on a CPU-only machine the mismatch of devices is played by a service device ("meta") that differs
from the regions' ("cpu"). Inputs move to the service device; outputs must not; the fields not
written into regions land in the answer buffer.
"""

from __future__ import annotations

import gc
import math
import os
import weakref
from dataclasses import dataclass, field
from types import SimpleNamespace

import msgspec
import pytest
import torch

from litetopk.clients.memfd import SealedMemory
from litetopk.kernels import TopKResult
from litetopk.service import topk as life
from litetopk.service.errors import ServiceError
from litetopk.service.operator import DeviceOperator
from litetopk.service.principals import Principal
from litetopk.service.regions import RegionTable
from litetopk.service.schemas import MemfdRegistration
from litetopk.service.wire import DTYPES, RESULT_FIELDS, TopKRequest, dtype_name, result_layout, result_shape


@dataclass(eq=False)
class FakeRegion:
    id: str
    tensor: torch.Tensor
    pid: int = 1
    pid_start: int = 1
    views: dict = field(default_factory=dict)

    def view(self, ref, what, key=None):
        return self.tensor


class FakeTable:
    """One region a tensor, by name; lease() / release_all() count the leases."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.regions = {name: FakeRegion(name, tensor) for name, tensor in tensors.items()}
        self.leased = self.released = 0

    def lease(self, regions, owners, checked=-1):
        self.leased += len(regions)
        return 0

    def release_all(self, regions):
        self.released += len(regions)


class FakeOperator:
    """Writes `want` into the call's `out` tensors (as the operator does) and records the devices."""

    def __init__(self, want: TopKResult):
        self.want, self.devices = want, set()
        rows, topk = want.values.shape
        nbytes = result_layout(RESULT_FIELDS, rows, topk)[1]
        self.results = torch.full((nbytes,), 0xAB, dtype=torch.uint8)  # the device's, holding an earlier call's bytes

    # the service device's result buffer, played by a host tensor, laid out and copied as the service does
    result_buffers = DeviceOperator.result_buffers
    answer_to_host = DeviceOperator.answer_to_host

    def __call__(self, inputs, kv_cache, *, out, **kwargs):
        self.devices |= {t.device.type for t in (*inputs.values(), kv_cache)}
        for name, tensor in out.items():
            tensor.copy_(getattr(self.want, name))
        return TopKResult(**{n: out.get(n, getattr(self.want, n)) for n in RESULT_FIELDS})


def random_result(rows: int, topk: int, gen: torch.Generator) -> TopKResult:
    return TopKResult(
        values=torch.randn(rows, topk, generator=gen),
        raw_indices=torch.randint(0, 10_000, (rows, topk), generator=gen, dtype=torch.int32),
        physical_indices=torch.randint(0, 10_000, (rows, topk), generator=gen, dtype=torch.int32),
        counts=torch.full((rows,), topk, dtype=torch.int32),
        status=torch.zeros(rows, dtype=torch.int32),
        repaired=torch.zeros(rows, dtype=torch.int32),
        candidates=torch.randint(topk, 4 * topk, (rows,), generator=gen, dtype=torch.int32),
    )


@pytest.mark.parametrize("rows", [6, 5])  # 5: each [rows] field of int32 ends 4 bytes short of its 8-byte boundary
def test_output_regions_are_written_in_place_on_another_device(rows, monkeypatch, seed):
    topk = 512
    gen = torch.Generator().manual_seed(seed)
    want = random_result(rows, topk, gen)
    operator = FakeOperator(want)
    monkeypatch.setattr(life.OWNERS, "alive", lambda pid, start: True)
    inputs = {name: torch.zeros(4, dtype=torch.uint8) for name in life.INPUTS}
    out_values = torch.full((rows, topk), float("nan"))
    out_slots = torch.full((rows, topk), -7, dtype=torch.int32)
    table = FakeTable({**inputs, "values": out_values, "physical_indices": out_slots})
    named = {name: SimpleNamespace(shape=[rows, 64, 64]) for name in life.INPUTS}
    out = SimpleNamespace(**{**{n: None for n in RESULT_FIELDS}, "values": object(), "physical_indices": object()})
    request = SimpleNamespace(**named, kv_scale=None, topk=topk, weight_scale=1.0, repair=True, out=out)
    state = SimpleNamespace(
        device=torch.device("meta"), table=table, executor=SimpleNamespace(operator_for=lambda rows, batch: operator)
    )
    ref = SimpleNamespace(offset=0, dtype="uint8", shape=[4])
    refs = [(name, ref, table.regions[name]) for name in life.INPUTS]
    refs += [(f"out.{name}", ref, table.regions[name]) for name in ("values", "physical_indices")]
    admitted = life.Admitted(
        request, refs, [region for _, _, region in refs], {"values": object(), "physical_indices": object()}, rows
    )
    outcome = life.execute(admitted, state)
    assert operator.devices == {"meta"}, "inputs go to the service's device"
    assert torch.equal(out_values, want.values), f"the host output region holds the answer (seed {seed})"
    assert torch.equal(out_slots, want.physical_indices), f"the host output region holds the answer (seed {seed})"
    assert sorted(outcome.written) == ["physical_indices", "values"]
    fields = outcome.fields()
    assert set(fields) == {"raw_indices", "counts", "status", "repaired", "candidates"}
    assert torch.equal(fields["raw_indices"], want.raw_indices), "the answer buffer holds the other fields"
    inside = {i for e in admitted.entries for i in range(e["offset"], e["offset"] + e["nbytes"])}
    leaked = [i for i, byte in enumerate(outcome.buffer) if i not in inside and byte]
    assert not leaked, f"rows {rows}: padding bytes {leaked[:8]} carry the device buffer's earlier contents"
    assert table.released == len(life.INPUTS) + 2, "every lease is released"


# ------------------------------------------------------------- kept admissions and their bindings


ROWS, TOPK = 2, 512
INPUT_SLICES = {  # name -> (dtype, shape) of each input, laid out one after another in one region
    "q_fp4": ("uint8", [ROWS, 64, 64]),
    "q_scale": ("uint8", [ROWS, 64, 4]),
    "kv_cache": ("uint8", [1, 64 * 68]),
    "weights": ("float32", [ROWS, 64]),
    "block_table": ("int32", [1, 1]),
    "row_to_batch": ("int32", [ROWS]),
    "starts": ("int32", [ROWS]),
    "ends": ("int32", [ROWS]),
}


def _slices(region, layout: dict) -> dict:
    """{name: wire slice of `region`} of `layout` (name -> (dtype, shape)), one after another."""
    slices, offset = {}, 0
    for name, (dtype, shape) in layout.items():
        slices[name] = {
            "region": region.id,
            "generation": region.generation,
            "offset": offset,
            "dtype": dtype,
            "shape": shape,
        }
        offset += -(-math.prod(shape) * DTYPES[dtype].itemsize // 64) * 64
    return slices


OUT_LAYOUT = {
    name: (dtype_name(dtype), list(result_shape(name, ROWS, TOPK))) for name, (dtype, _) in RESULT_FIELDS.items()
}


class Engine:
    """An in-process table with an engine's regions (inputs read-only, every result field in one
    read-write region) and a kept admission of its request, executed by the real `execute` with the
    operator replaced (FakeOperator)."""

    def __init__(self):
        self.table = RegionTable(torch.device("cpu"))
        self.principal = Principal(uid=os.getuid(), gid=os.getgid(), pid=os.getpid(), via="unix")
        self.blocks = {"inputs": SealedMemory(1 << 16), "outs": SealedMemory(1 << 16)}
        self.inputs = self.register("inputs", "read_only")
        self.outs = self.register("outs", "read_write")
        self.want = random_result(ROWS, TOPK, torch.Generator().manual_seed(5))
        self.operator = FakeOperator(self.want)
        self.state = SimpleNamespace(
            table=self.table,
            backend="reference",
            device=torch.device("cpu"),
            executor=SimpleNamespace(operator_for=lambda rows, batch: self.operator),
        )
        self.admissions = life.Admissions(self.state, self.principal.uid)

    def register(self, name: str, access: str):
        memory = self.blocks[name]
        registration = MemfdRegistration(kind="memfd", ticket="t" * 16, size=memory.size, access=access, pid=None)
        return self.table.register_memfd(registration, os.dup(memory.fd), self.principal.uid)

    def request(self) -> tuple[bytes, TopKRequest]:
        """(its bytes: the admissions' key, the request) naming the current regions."""
        body = {**_slices(self.inputs, INPUT_SLICES), "topk": TOPK, "out": _slices(self.outs, OUT_LAYOUT)}
        packed = msgspec.msgpack.encode(body)
        return packed, msgspec.msgpack.decode(packed, type=TopKRequest)

    def run(self) -> life.Admitted:
        key, request = self.request()
        admitted = self.admissions.admit(key, lambda: request)
        life.execute(admitted, self.state)
        return admitted

    def out_values(self) -> torch.Tensor:
        """The values field as the engine sees it in its own mapping of the output region."""
        mine = torch.frombuffer(self.blocks["outs"].mapping, dtype=torch.uint8)
        return mine[: ROWS * TOPK * 4].view(torch.float32).view(ROWS, TOPK)

    def close(self) -> None:
        self.table.close_all()
        for memory in self.blocks.values():
            memory.close_fd()


@pytest.fixture
def engine():
    engine = Engine()
    yield engine
    engine.close()


def test_a_kept_admission_binds_its_views_once(engine):
    first = engine.run()
    binding = first.binding
    assert binding is not None and first in engine.outs.bindings and first in engine.inputs.bindings
    assert torch.equal(engine.out_values(), engine.want.values), "the result lands in the output region"
    engine.out_values().zero_()
    again = engine.run()
    assert again is first and again.binding is binding, "the same request: the same admission and binding"
    assert torch.equal(engine.out_values(), engine.want.values), "written again through the kept binding"
    engine.blocks["unrelated"] = SealedMemory(4096)
    engine.table.unregister(engine.register("unrelated", "read_only").id, engine.principal.uid)
    assert engine.run() is first and first.binding is binding, "another region retired: its own still live"


def test_an_admission_not_kept_keeps_no_binding(engine):
    _, request = engine.request()
    admitted = life.admit(request, engine.state, engine.principal.uid)  # HTTP's: one request, then gone
    life.execute(admitted, engine.state)
    assert admitted.binding is None and admitted not in engine.outs.bindings
    assert torch.equal(engine.out_values(), engine.want.values)


@pytest.mark.parametrize("retirement", ["unregistered", "superseded"])
def test_a_closed_region_drops_the_bindings_over_it(engine, retirement):
    """A region unregistered (or registered again: a new generation) closes; the kept admissions that
    view it lose their binding, so no view of its mapping outlives it, and the request naming it is
    refused until the engine names the region anew, which binds anew."""
    kept = engine.run()
    old_key = engine.request()[0]
    view = weakref.ref(kept.binding.outs["values"])
    if retirement == "unregistered":
        engine.table.unregister(engine.outs.id, engine.principal.uid)
        engine.outs = engine.register("outs", "read_write")  # registered again after: a new id
    else:
        engine.outs = engine.register("outs", "read_write")  # the same memfd again: the next generation
    assert kept.binding is None, "the closed region dropped the binding over it"
    gc.collect()
    assert view() is None, "no view of the closed region's mapping is left"
    with pytest.raises(ServiceError) as err:
        engine.admissions.admit(old_key, lambda: msgspec.msgpack.decode(old_key, type=TopKRequest))
    assert err.value.code == "stale_region", (retirement, err.value)
    engine.out_values().zero_()
    fresh = engine.run()
    assert fresh is not kept and fresh.binding is not None and fresh in engine.outs.bindings
    assert torch.equal(engine.out_values(), engine.want.values), "the new registration is written"


def test_http_admissions_are_kept_by_uid_and_only_once_admitted(engine):
    """UidAdmissions (HTTP's kept admissions): a body admitted for a uid is found again for that uid (any of its
    processes), not decoded again; another uid gets nothing of it (its own admission, refused: the regions are not
    its own), and a refused request keeps nothing."""
    kept = life.UidAdmissions()
    key, request = engine.request()
    uid = engine.principal.uid
    first = kept.admit(engine.state, uid, key, lambda: request)

    def decoded_again():
        raise AssertionError("a kept body is decoded again")

    assert kept.admit(engine.state, uid, key, decoded_again) is first
    with pytest.raises(ServiceError) as err:
        kept.admit(engine.state, uid + 1, key, lambda: request)
    assert err.value.code == "unknown_region", err.value
    assert kept.uids == [uid], "a refused request keeps nothing and evicts no uid"
