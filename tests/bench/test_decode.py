"""bench.decode on the CPU (reference backend, tiny shapes): its problems are the decode batches it
claims (MTP windows at the end of each sequence, rows sequence-major, shuffled pages), a run writes a
JSON with every case exact and a PNG, and a LiteTopK != dense case fails the run loudly."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from bench import decode
from bench.common.problems import decode_lengths, decode_queries, paged_random_cache
from litetopk.kernels import PAGE_SIZE, pack_kv_cache, unpack_kv_cache

LAYOUTS = [([300], 1), ([64, 65, 1], 2), ([700, 129, 2048, 5], 4)]


@pytest.mark.parametrize(("lengths", "next_n"), LAYOUTS, ids=[f"{len(n)}seq-n{k}" for n, k in LAYOUTS])
def test_decode_problem_is_a_paged_mtp_batch(lengths, next_n, seed):
    case = f"lengths={lengths} next_n={next_n} seed={seed}"
    cache, table = paged_random_cache(lengths, seed=seed, device="cpu", spare_pages=3, chunk_pages=5)
    q = decode_queries(lengths, next_n, seed=seed, device="cpu")
    rows = len(lengths) * next_n
    assert torch.equal(q["row_to_batch"], torch.arange(rows, dtype=torch.int32) // next_n), case
    want_ends = [n - next_n + 1 + i for n in lengths for i in range(next_n)]
    assert q["ends"].tolist() == [max(0, e) for e in want_ends] and not q["starts"].any(), case
    pages = [-(-n // PAGE_SIZE) for n in lengths]
    assert table.shape == (len(lengths), max(pages)) and table.dtype == torch.int32, case
    used = torch.cat([table[b, :p] for b, p in enumerate(pages)])
    assert used.unique().numel() == used.numel() and 0 <= used.min() and used.max() < cache.shape[0], case
    assert all((table[b, p:] == -1).all() for b, p in enumerate(pages)), case
    assert cache.shape[0] == sum(pages) + 3, case
    # The keys lie where the block table says (the contract's layout): packing what unpack reads
    # gives back the cache's bytes on every live page.
    for b, n in enumerate(lengths):
        k_fp4, k_scale = unpack_kv_cache(cache, table[b : b + 1], n)
        repacked = pack_kv_cache(k_fp4, k_scale, table[b : b + 1], cache.shape[0])
        for p in range(pages[b]):
            slots = min(PAGE_SIZE, n - p * PAGE_SIZE)
            page = table[b, p]
            assert torch.equal(repacked[page, : slots * 64], cache[page, : slots * 64]), case
            assert torch.equal(repacked[page, 4096 : 4096 + slots * 4], cache[page, 4096 : 4096 + slots * 4]), case


def test_mixed_lengths_are_log_uniform_in_the_range():
    lengths = decode_lengths(64, None, mixed_range=(1024, 131072), seed=3)
    assert lengths == decode_lengths(64, None, mixed_range=(1024, 131072), seed=3)
    assert min(lengths) >= 1024 and max(lengths) <= 131072
    assert min(lengths) < 4096 and max(lengths) > 32768, lengths  # short and long sequences in one batch
    assert decode_lengths(3, 2048, mixed_range=(1, 2), seed=0) == [2048] * 3


def test_case_names_and_filters():
    args = decode.parse(
        [
            "--device",
            "cpu",
            "--batch",
            "1",
            "8",
            "--next-n",
            "1",
            "4",
            "--keys",
            "256",
            "mixed",
            "--topk",
            "512",
            "--cases",
            "8x*",
        ]
    )
    assert [c.name for c in decode.build_cases(args)] == [
        "8x1x256-k512",
        "8x4x256-k512",
        "8x1xmixed-k512",
        "8x4xmixed-k512",
    ]
    assert decode.Case.parse("128x2x32768-k1024") == decode.Case(128, 2, 32768, 1024)
    quick = decode.build_cases(decode.parse(["--device", "cpu", "--quick"]))
    assert [c.name for c in quick] == decode.CPU["quick"]


# A row shorter than K (256 keys); next_n = 4 over uneven lengths (windows shorter and longer than K).
ARGS = [
    "--device",
    "cpu",
    "--batch",
    "1",
    "3",
    "--next-n",
    "1",
    "4",
    "--keys",
    "256",
    "mixed",
    "--topk",
    "512",
    "--mixed-range",
    "200",
    "1000",
    "--reps",
    "1",
    "--warmup",
    "1",
    "--cases",
    "1x1x*",
    "3x4xmixed*",
]


def test_decode_bench_runs_on_the_cpu(tmp_path):
    assert decode.main([*ARGS, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "decode-cpu.json").read_text())
    assert (tmp_path / "decode-cpu.png").exists()
    assert report["complete"] and report["failures"] == [] and report["backend"] == "reference"
    assert report["ceilings"]["copy_bytes_per_s"] > 0 and report["ceilings"]["int8_ops_per_s"] > 0
    assert report["command"].startswith("python -m bench.decode --device cpu") and report["source_sha256"]
    names = [c["case"] for c in report["cases"]]
    assert names == ["1x1x256-k512", "3x4xmixed-k512"]
    for c in report["cases"]:
        assert c["exact"]["ok"], c
        assert set(c["times"]) == {"runner", "eager", "dense"}, c
        assert c["floor_us"] > 0 and c["ratio"]["runner"] > 0, c
        assert c["rows"] == c["batch"] * c["next_n"], c
    mixed = report["cases"][-1]
    assert len(mixed["lengths"]) == 3 and all(200 <= n <= 1000 for n in mixed["lengths"]), mixed
    assert mixed["keys_read"] == sum(mixed["lengths"]), mixed


def test_a_case_where_litetopk_differs_from_dense_fails_loudly(tmp_path, monkeypatch, capsys):
    real = decode.dense_topk_prefill

    def off_by_one(*args, **kwargs):  # a dense answer with one published index moved
        result = real(*args, **kwargs)
        raw = result.raw_indices.clone()
        raw[0, 0] += 1
        return dataclasses.replace(result, raw_indices=raw)

    monkeypatch.setattr(decode, "dense_topk_prefill", off_by_one)
    assert decode.main([*ARGS, "--cases", "1x1x*", "--out", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "decode-cpu.json").read_text())
    assert report["failures"] == ["1x1x256-k512"]
    assert report["cases"][0]["exact"]["eager_vs_dense"] == {"raw_indices": 1}, report["cases"][0]["exact"]
    assert "FAIL" in capsys.readouterr().out
