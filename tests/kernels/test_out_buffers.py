"""Caller-owned result buffers (`out=`, issue 14) on the reference backend.

A caller passes tensors for any subset of the TopKResult fields, strided row views such as
`buf[2:2 + rows, :K]` included: they are written in place (the result holds those very tensors),
nothing around them is touched, and the answer is bit for bit the one of a call without `out`.
An `out` that overlaps an input or another output, or has the wrong dtype or shape, or names a
field TopKResult does not have, is an InputError raised before anything runs.
"""

from __future__ import annotations

import pytest
import torch

from litetopk.kernels import (
    InputDtypeError,
    InputError,
    InputShapeError,
    allocate_workspace,
    dense_topk_prefill,
    litetopk_prefill,
)
from tests.problems import make_problem

FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status", "repaired", "candidates")
OPERATORS = {"litetopk": litetopk_prefill, "dense": dense_topk_prefill}
SENTINEL = {torch.float32: 12345.5, torch.int32: -777}


def problem(seed: int, topk: int = 512):
    p = make_problem(seed, seq_lens=[700, 300], rows_per_seq=3, topk=topk, spread=1)
    p.weights[4, 3] = float("nan")  # one faulty row: its fields are written too (nothing published)
    return p


def call(operator: str, p, **kw):
    return OPERATORS[operator](*p.args(), topk=p.topk, weight_scale=p.weight_scale, backend="reference", **kw)


def strided_out(rows: int, k: int) -> tuple[dict, dict]:
    """(out views, the buffers they lie in): every [rows, K] field is buf[2:2 + rows, :K] of a wider,
    taller buffer; every [rows] field is column 1 of a [rows + 4, 3] buffer (stride 3)."""
    buffers, out = {}, {}
    for name in FIELDS:
        dtype = torch.float32 if name == "values" else torch.int32
        if name in ("values", "raw_indices", "physical_indices"):
            buf = torch.full((rows + 5, k + 9), SENTINEL[dtype], dtype=dtype)
            out[name] = buf[2 : 2 + rows, :k]
        else:
            buf = torch.full((rows + 4, 3), SENTINEL[dtype], dtype=dtype)
            out[name] = buf[2 : 2 + rows, 1]
        assert not out[name].is_contiguous()
        buffers[name] = buf
    return out, buffers


@pytest.mark.parametrize("topk", [512, 1024])
@pytest.mark.parametrize("operator", list(OPERATORS))
def test_strided_views_are_written_in_place(operator, topk, seed):
    p = problem(seed, topk)
    rows = p.q_fp4.shape[0]
    want = call(operator, p)
    assert int(want.status[4]) != 0 and int(want.status[0]) == 0, "the case needs a faulty and a good row"
    out, buffers = strided_out(rows, topk)
    pointers = {name: t.data_ptr() for name, t in out.items()}
    before = {name: b.clone() for name, b in buffers.items()}
    got = call(operator, p, out=out)
    where = f"{operator}, K={topk}, seed {seed}"
    for name in FIELDS:
        field = getattr(got, name)
        assert field is out[name] or (field.data_ptr() == pointers[name] and field.stride() == out[name].stride()), (
            f"{where}: {name} is not the caller's tensor"
        )
        assert out[name].data_ptr() == pointers[name], f"{where}: {name} moved"
        assert field.dtype == getattr(want, name).dtype and torch.equal(field, getattr(want, name)), (
            f"{where}: {name} differs from the call without out"
        )
        # everything of the buffer outside the view is untouched
        outside = torch.ones_like(buffers[name], dtype=torch.bool)
        if buffers[name].ndim == 2 and buffers[name].shape[1] > 3:
            outside[2 : 2 + rows, :topk] = False
        else:
            outside[2 : 2 + rows, 1] = False
        assert torch.equal(buffers[name][outside], before[name][outside]), f"{where}: {name}: a neighbour was written"


@pytest.mark.parametrize("operator", list(OPERATORS))
def test_a_subset_of_fields_and_the_rest_allocated(operator, seed):
    p = problem(seed)
    rows = p.q_fp4.shape[0]
    want = call(operator, p)
    buf = torch.full((rows + 3, p.topk + 5), -9, dtype=torch.int32)
    view = buf[1 : 1 + rows, 3 : 3 + p.topk]
    got = call(operator, p, out={"physical_indices": view})
    assert got.physical_indices.data_ptr() == view.data_ptr()
    for name in FIELDS:
        assert torch.equal(getattr(got, name), getattr(want, name)), f"{operator}: {name}"
    assert (buf[0] == -9).all() and (buf[1 + rows :] == -9).all()
    assert (buf[:, :3] == -9).all() and (buf[:, 3 + p.topk :] == -9).all()


def bad_outs(p) -> dict:
    rows, k = p.q_fp4.shape[0], p.topk
    q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends = p.args()
    two = torch.zeros(rows, 2 * k, dtype=torch.int32)
    return {
        "overlaps row_to_batch": ({"counts": row_to_batch}, InputError, "overlaps row_to_batch"),
        "overlaps ends (a view)": ({"status": ends[:]}, InputError, "overlaps ends"),
        "overlaps the cache": (
            {"values": kv_cache.view(torch.float32).view(-1)[: rows * k].view(rows, k)},
            InputError,
            "overlaps kv_cache",
        ),
        "two outputs share memory": (
            {"raw_indices": two[:, :k], "physical_indices": two[:, k // 2 : k // 2 + k]},
            InputError,
            "overlaps",
        ),
        "values int32": ({"values": torch.zeros(rows, k, dtype=torch.int32)}, InputDtypeError, "float32"),
        "counts int64": ({"counts": torch.zeros(rows, dtype=torch.int64)}, InputDtypeError, "int32"),
        "raw_indices K - 1 wide": (
            {"raw_indices": torch.zeros(rows, k - 1, dtype=torch.int32)},
            InputShapeError,
            "shape",
        ),
        "status one row short": ({"status": torch.zeros(rows - 1, dtype=torch.int32)}, InputShapeError, "shape"),
        "status as [rows, 1]": ({"status": torch.zeros(rows, 1, dtype=torch.int32)}, InputShapeError, "shape"),
        "unknown field": ({"indices": torch.zeros(rows, k, dtype=torch.int32)}, InputError, "not a result field"),
        "not a tensor": ({"counts": [0] * rows}, InputError, "torch.Tensor"),
        "stride 0": ({"counts": torch.zeros(1, dtype=torch.int32).expand(rows)}, InputError, "share memory"),
    }


@pytest.mark.parametrize("operator", list(OPERATORS))
@pytest.mark.parametrize("case", list(bad_outs(make_problem(0, seq_lens=[300], rows_per_seq=2))))
def test_bad_out_is_an_input_error(case, operator, seed):
    p = problem(seed)
    out, error, words = bad_outs(p)[case]
    originals = {
        name: t.clone()
        for name, t in zip(
            ("q_fp4", "q_scale", "kv_cache", "block_table", "weights", "row_to_batch", "starts", "ends"), p.args()
        )
    }
    with pytest.raises(InputError) as info:
        call(operator, p, out=out)
    assert isinstance(info.value, error), f"{case}: raised {type(info.value).__name__}: {info.value}"
    assert words in str(info.value), f"{case}: message {str(info.value)!r} should say {words!r}"
    for name, t in zip(originals, p.args()):
        assert torch.equal(
            t.view(torch.uint8) if t.dtype == torch.float32 else t,
            originals[name].view(torch.uint8) if t.dtype == torch.float32 else originals[name],
        ), f"{case}: input {name} was written"


def test_out_must_be_a_dict(seed):
    p = problem(seed)
    with pytest.raises(InputError, match="out must be a dict"):
        call("litetopk", p, out=[torch.zeros(6, dtype=torch.int32)])


@pytest.mark.parametrize("operator", list(OPERATORS))
def test_out_and_workspace_together(operator, seed):
    """`out` views and a reused workspace in one call: the bits of a plain call, twice over."""
    p = problem(seed)
    rows = p.q_fp4.shape[0]
    want = call(operator, p)
    workspace = allocate_workspace(
        rows,
        p.block_table.shape[1] * 64,
        p.topk,
        device="cpu",
        backend="reference",
        max_batch=p.block_table.shape[0],
        dense=operator == "dense",
    )
    for attempt in range(2):
        out, _ = strided_out(rows, p.topk)
        got = call(operator, p, out=out, workspace=workspace)
        for name in FIELDS:
            assert getattr(got, name).data_ptr() == out[name].data_ptr(), f"{operator}: {name} is not the caller's"
            assert torch.equal(getattr(got, name), getattr(want, name)), f"{operator}, call {attempt}: {name} differs"
