"""The Triton twins of the pipeline's glue (schedule, decode bookkeeping, certificate, repair) against
their torch code, bit for bit, under Triton's interpreter on small shapes; and the launch budget of a
LiteTopK call with every Triton stage (issue 14: <= 60 launches, no stage above 10).

On a CUDA device devices.runs_triton_stages picks the Triton kernels; here (CPU) it picks the torch
code, so these tests make it answer True for one call (bench.probes.host_time.triton_stages_on_cpu)
and compare with the torch call on the same inputs.
"""

from __future__ import annotations

import os

import pytest
import torch

from bench.probes.host_time import count_launches_cpu, triton_stages_on_cpu
from litetopk.kernels import LiteTopKTuning, RowStatus, litetopk_prefill
from litetopk.kernels.scratch import Scratch
from litetopk.kernels.triton.schedule import build_schedule_torch, build_schedule_triton
from tests.kernels.test_reference_operator import assert_same
from tests.problems import make_problem, results_equal

# The Triton backend's prefill mode (int8 keys, a program a row group): its kernels on small problems.
pytestmark = [
    pytest.mark.usefixtures("prefill_mode"),
    pytest.mark.interpret,
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1",
        reason="interpreter only: on a GPU the Triton stages run compiled in every operator test",
    ),
]


def random_metadata(gen: torch.Generator, n: int, batch: int):
    """Effective row metadata (rows at fault and empty windows carry zeros, row_checks.py) of n rows
    over `batch` sequences in random order, about a fifth of them empty."""
    rtb = torch.randint(0, batch, (n,), generator=gen, dtype=torch.int32)
    starts = torch.randint(0, 400, (n,), generator=gen, dtype=torch.int32)
    ends = (starts + torch.randint(-60, 300, (n,), generator=gen, dtype=torch.int32)).clamp_min(0)
    live = ends > starts
    return tuple(torch.where(live, t, 0) for t in (rtb, starts, ends))


@pytest.mark.parametrize("rows, batch, block_rows", [(1, 1, 1), (23, 4, 3), (150, 3, 2), (70, 1, 8), (9, 12, 4)])
@pytest.mark.parametrize("wide", [False, True])
def test_schedule_kernels_equal_the_torch_schedule(rows, batch, block_rows, wide, seed):
    gen = torch.Generator().manual_seed(seed)
    rtb, starts, ends = random_metadata(gen, rows, batch)
    if rows > 2:
        starts[1], ends[1] = starts[2], ends[2]  # a tie: row order decides
    q_wide = torch.rand(rows, generator=gen) < 0.3
    flags = torch.tensor([int(wide), 0], dtype=torch.int32)
    want = build_schedule_torch(rtb, starts, ends, batch, block_rows, q_wide, flags)
    got = build_schedule_triton(rtb, starts, ends, batch, block_rows, q_wide, flags, Scratch("cpu"))
    where = f"rows {rows}, batch {batch}, block_rows {block_rows}, wide {wide}, seed {seed}"
    for field in ("rows", "batch", "span", "q_wide"):
        assert torch.equal(getattr(got, field), getattr(want, field)), f"{where}: {field}"
    for variant, (g, w) in enumerate(zip(got.variants, want.variants)):
        assert torch.equal(g[0], w[0]) and torch.equal(g[1], w[1]), f"{where}: variant {variant}"


def _call(p, tuning, triton_stages: bool):
    def run():
        return litetopk_prefill(*p.args(), topk=p.topk, weight_scale=p.weight_scale, backend="triton", tuning=tuning)

    if not triton_stages:
        return run()
    with triton_stages_on_cpu():
        return run()


CASES = {
    # two overflowing rows, one repair slot: one repaired, one keeps its bit
    "overflow beyond the repair slots, invalid and empty rows": (
        dict(seq_lens=[700, 500], rows_per_seq=2, spread=1),
        LiteTopKTuning(candidate_capacity=40, repair_rows=1),
    ),
    "underfill repaired, calibrated": (
        dict(seq_lens=[1100], rows_per_seq=3, spread=1),
        LiteTopKTuning(sample_size=500, calibration_offset=1e30),
    ),
    "wide and unsupported vectors": (dict(seq_lens=[600, 300], rows_per_seq=2, spread=3), LiteTopKTuning()),
    # a NaN scale byte in row 1's queries and in a key of sequence 1: the scan's nonfinite flags
    "nonfinite scores": (dict(seq_lens=[600, 400], rows_per_seq=2), LiteTopKTuning()),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_triton_stages_return_the_torch_stages_bits(name, seed):
    build, tuning = CASES[name]
    p = make_problem(seed, **build, note=name)
    if name.startswith("overflow"):
        p.row_to_batch[0] = 7  # a bad batch index: INVALID_ROW
        p.starts[3] = p.ends[3] = 0  # an empty window
    if name.startswith("wide"):  # key 5 of sequence 0 and a head of row 3 span 10 binades: UNSUPPORTED
        page = int(p.block_table[0, 0])
        p.kv_cache.view(-1, 4352)[page, 5 * 64 : 6 * 64] = 0x22
        p.kv_cache.view(-1, 4352)[page, 4096 + 5 * 4 : 4096 + 6 * 4] = torch.tensor(
            [117, 127, 127, 127], dtype=torch.uint8
        )
        p.q_fp4[3, 9] = 0x22
        p.q_scale[3, 9] = torch.tensor([117, 127, 127, 127], dtype=torch.uint8)
        # row 2 and sequence 1's keys one binade (spread-3 data can hold an unsupported vector of its own)
        p.q_scale[2] = 127
        for page in p.block_table[1, : -(-300 // 64)].tolist():
            p.kv_cache.view(-1, 4352)[page, 4096:] = 127
    if name.startswith("nonfinite"):
        p.q_scale[1, 2, 0] = 255
        p.kv_cache.view(-1, 4352)[int(p.block_table[1, 0]), 4096 + 7 * 4] = 255
    torch_stages = _call(p, tuning, triton_stages=False)
    triton_stages = _call(p, tuning, triton_stages=True)
    where = f"[{name}] seed {seed}"
    assert results_equal(triton_stages, torch_stages) == [], f"{where}: fields differ"
    assert_same(triton_stages, torch_stages, torch.ones(p.q_fp4.shape[0], dtype=torch.bool), where)
    if name.startswith("overflow"):
        assert int(torch_stages.status[0]) == int(RowStatus.INVALID_ROW), where
        assert int(torch_stages.repaired.sum()) == 1, f"{where}: one slot, one repaired row"
        assert int((torch_stages.status == int(RowStatus.OVERFLOW)).sum()) == 1, f"{where}: {torch_stages.status}"
    if name.startswith("wide"):
        unsupported = ((torch_stages.status & int(RowStatus.UNSUPPORTED)) != 0).tolist()
        assert unsupported == [True, True, False, True], f"{where}: UNSUPPORTED rows {torch_stages.status.tolist()}"
    if name.startswith("underfill"):
        assert int(torch_stages.repaired.sum()) == 3, f"{where}: every row is repaired"
    if name.startswith("nonfinite"):
        # NONFINITE on rows 1-3 only (the random data can make rows UNSUPPORTED too, by the draw: not checked here)
        nonfinite = ((torch_stages.status & int(RowStatus.NONFINITE)) != 0).tolist()
        assert nonfinite == [False, True, True, True], f"{where}: {torch_stages.status.tolist()}"


def test_a_litetopk_call_stays_within_the_launch_budget():
    counts = count_launches_cpu(rows=2)  # the counts do not depend on the rows (the grids do)
    total = sum(counts.values())
    assert total <= 60, f"{total} launches per call (budget 60): {dict(counts)}"
    assert max(counts.values()) <= 10, f"a stage above 10 launches: {dict(counts)}"
    for stage in ("litetopk.decode", "litetopk.schedule", "litetopk.scan", "litetopk.certify", "litetopk.repair"):
        assert counts[stage] > 0, f"{stage} not seen: the profiler ranges changed ({dict(counts)})"
