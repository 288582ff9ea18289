"""The device worker's part of a top-k request (service/topk.py `execute`), with the operator and
the region table replaced: output regions are written where they live.

A GPU service writes into host regions (the client's pooled result scratch, host `out` regions);
on a CPU-only machine the mismatch of devices is played by a service device ("meta") that differs
from the regions' ("cpu"). Inputs move to the service device; outputs must not; the fields not
written into regions land in the answer buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from litetopk.kernels import TopKResult
from litetopk.service import topk as life
from litetopk.service.wire import RESULT_FIELDS


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

    def lease(self, regions, owners):
        self.leased += len(regions)

    def release_all(self, regions):
        self.released += len(regions)


class FakeOperator:
    """Writes `want` into the call's `out` tensors (as the operator does) and records the devices."""

    def __init__(self, want: TopKResult):
        self.want, self.devices = want, set()

    def result_buffers(self, names, rows, topk):  # the service device's buffers, played by host tensors
        return {n: torch.empty_like(getattr(self.want, n)) for n in names}

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


def test_output_regions_are_written_in_place_on_another_device(monkeypatch, seed):
    rows, topk = 6, 512
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
    assert table.released == len(life.INPUTS) + 2, "every lease is released"
