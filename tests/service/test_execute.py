"""The device worker's part of /v1/topk (service/routes/topk.py `execute`), with the operator and
the region table replaced: output regions are written where they live.

A GPU service writes into host regions (the client's pooled result scratch, host `out` regions);
on a CPU-only machine the mismatch of devices is played by a service device ("meta") that differs
from the regions' ("cpu"). Inputs move to the service device; outputs must not.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from litetopk.kernels import LiteTopKTuning, TopKResult
from litetopk.service.routes import topk as route


@dataclass
class FakeRegion:
    id: str
    pid: int = 1
    pid_start: int = 1


class FakeTable:
    """acquire() hands out the tensor registered under each name; release() counts."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors
        self.released = 0

    def acquire(self, ref, what, owner, alive=None):
        name = what.removeprefix("out.")
        return FakeRegion(id=name), self.tensors[name]

    def release(self, region):
        self.released += 1


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
    seen = {}

    def fake_operator(*inputs, **kwargs):
        seen["devices"] = {t.device.type for t in inputs}
        return want

    monkeypatch.setattr(route, "litetopk_prefill", fake_operator)
    monkeypatch.setattr(route, "owner_alive", lambda pid, start: True)
    inputs = {name: torch.zeros(4, dtype=torch.uint8) for name in route.INPUTS}
    out_values = torch.full((rows, topk), float("nan"))
    out_slots = torch.full((rows, topk), -7, dtype=torch.int32)
    table = FakeTable({**inputs, "values": out_values, "physical_indices": out_slots})
    request = SimpleNamespace(**{name: object() for name in route.INPUTS}, kv_scale=None, topk=topk, weight_scale=1.0,
                              repair=True, out=[("values", object()), ("physical_indices", object())])
    state = SimpleNamespace(device=torch.device("meta"), table=table, settings=SimpleNamespace(backend="auto", max_keys=64),
                            tuning=LiteTopKTuning(), executor=SimpleNamespace(workspace_for=lambda q_fp4, block_table: None))
    outcome = route.execute(request, state, SimpleNamespace(uid=0))
    assert seen["devices"] == {"meta"}, "inputs go to the service's device"
    assert torch.equal(out_values, want.values), f"the host output region holds the answer (seed {seed})"
    assert torch.equal(out_slots, want.physical_indices), f"the host output region holds the answer (seed {seed})"
    assert sorted(outcome.written) == ["physical_indices", "values"]
    assert set(outcome.fields) == {"raw_indices", "counts", "status", "repaired", "candidates"}
    assert torch.equal(outcome.fields["raw_indices"], want.raw_indices)
    assert table.released == len(route.INPUTS) + 2, "every lease is released"
