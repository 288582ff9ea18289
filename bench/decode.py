"""Decode benchmark (issue 30, item 6): LiteTopK at the shapes an inference worker calls every step.

A case is B sequences x next_n query rows (MTP; the rows at the end of each sequence, row i of
sequence b seeing [0, L_b - next_n + 1 + i), bench/common/problems.py) x L C4 keys x K, named
`{B}x{next_n}x{L}-k{K}`; `{B}x{next_n}xmixed-k{K}` has uneven lengths drawn log-uniform in
--mixed-range (short and long sequences in one batch). The keys are random MXFP4 in a paged cache
whose pages are shuffled over the whole cache (block_table not the identity), one cache per (B, L)
shared by its next_n and K; rows sequence-major (row_to_batch[r] = r // next_n), max_seq_len = max L.

For each case:
- GPU time (bench.common.timing.CallTimer: L2 flushed before each call, the GPU held by a spin while
  the host enqueues it, CUDA events around it; median of --reps after --warmup rounds, the three
  variants interleaved) of LiteTopK through the graph runner (`runner`: LiteTopKGraphs, one per
  cache, inputs staged), LiteTopK eager (`eager`: litetopk_prefill) and the dense path (`dense`:
  dense_topk_prefill); their host time per call (wall time to return) and host syncs in the JSON;
- the floor (bench/common/roofline.py): max(bytes / measured copy bandwidth, int8 operations /
  measured torch._int_mm rate), bytes = 68 per key of each sequence (read once: the union of its
  rows' windows) + the rows' queries and float32 weights, operations = 2 x 64 heads x 128 dims per
  (row, key of its window); each variant's time / floor;
- exactness, after timing: LiteTopK (eager and runner) == dense bit for bit (values as int32 bits, raw
  and physical indices, counts, status), counts == min(K, window), no status bit set; a failure is a
  red FAIL in the table, listed at the end, and the exit status 1.
Cases whose estimated memory exceeds --memory-budget are skipped (said in the table and JSON); an
out-of-memory error skips the case the same way. With --time-limit, cases not started in time are
listed as skipped; SIGTERM (timeout) ends the run with the table, JSON and PNG of what was measured.
The JSON is rewritten after every case.

    python -m bench.decode --out bench/results                # the grid on the GPU (~90 cases)
    python -m bench.decode --quick --out $OUT                 # the goal shapes of issue 30
    python -m bench.decode --batch 128 --next-n 2 --keys 32768 --topk 1024
    python -m bench.decode --device cpu --reps 2              # tiny shapes, reference backend (CI)
On the device: STEPS=decode bash bench/device/h200_session.sh (DECODE_ARGS="--quick").
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import gc
import json
import os
import signal
import sys
import time
import traceback

import torch
from rich.markup import escape

from bench.common.problems import (
    KEY_BYTES,
    PAGE_BYTES,
    QUERY_BYTES,
    decode_lengths,
    decode_queries,
    paged_pages,
    paged_random_cache,
)
from bench.common.report import run_info
from bench.common.roofline import floor_us, measure_ceilings
from bench.common.timing import CallTimer
from litetopk.kernels import (
    LiteTopKGraphs,
    LiteTopKTuning,
    TopKResult,
    dense_topk_prefill,
    litetopk_prefill,
    resolve_backend,
)
from litetopk.kernels.pipeline import DENSE_ROUTE_BYTES

CHECKED = ("values", "raw_indices", "physical_indices", "counts", "status")  # LiteTopK == dense, bit for bit
VARIANTS = ("runner", "eager", "dense")
SPARE_PAGES = 7
GPU = dict(
    batch=[1, 8, 64, 256],
    keys=["16384", "65536", "131072", "mixed"],
    mixed_range=(1024, 131072),
    reps=20,
    warmup=3,
    quick=[
        "1x1x65536-k512",
        "64x1x65536-k512",
        "128x2x32768-k1024",
        "8x4x16384-k1024",
        "64x2xmixed-k512",
        "256x1x131072-k1024",
    ],
)
CPU = dict(
    batch=[1, 4],
    keys=["256", "2048", "mixed"],
    mixed_range=(64, 2048),
    reps=3,
    warmup=1,
    quick=["1x1x2048-k512", "4x2x1024-k1024", "4x4xmixed-k512"],
)


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    next_n: int
    keys: int | None  # None: mixed lengths
    topk: int

    @property
    def name(self) -> str:
        return f"{self.batch}x{self.next_n}x{'mixed' if self.keys is None else self.keys}-k{self.topk}"

    @classmethod
    def parse(cls, name: str) -> Case:
        shape, k = name.split("-k")
        batch, next_n, keys = shape.split("x", 2)
        return cls(int(batch), int(next_n), None if keys == "mixed" else int(keys), int(k))


class Stop(BaseException):
    """SIGTERM (the device step's timeout): finish the report with what was measured."""


def estimate_bytes(lengths: list[int], rows: int) -> int:
    """A generous device-memory estimate of a case: the cache, three times int8 keys and exponents for
    every sequence at the longest length (decoded operands are sized from the bounds, batch x max L: in
    the runner's workspace, the eager and the dense calls'), four copies of the dense [rows, max L]
    float32 score matrix (scores, top-k temporaries, int64 order keys), and 1 GiB for the rest (the
    flush buffer, candidate buffers, results)."""
    bound = len(lengths) * max(lengths)
    return paged_pages(lengths, SPARE_PAGES) * PAGE_BYTES + 3 * bound * 136 + 16 * rows * max(lengths) + (1 << 30)


def build_cases(args) -> list[Case]:
    if args.quick:
        cases = [Case.parse(name) for name in args.defaults["quick"]]
    else:
        cases = [
            Case(b, n, None if keys == "mixed" else int(keys), k)
            for b in args.batch
            for keys in args.keys
            for n in args.next_n
            for k in args.topk
            if not (keys == "mixed" and b == 1)
        ]  # one sequence has no uneven lengths
    return [c for c in cases if any(fnmatch.fnmatchcase(c.name, pattern) for pattern in args.cases)]


def _syncs(fn) -> str:
    """ "none", or the first host sync of one call (torch.cuda.set_sync_debug_mode("error"))."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return "none"
    except RuntimeError as exc:
        return f"sync: {str(exc).splitlines()[0][:120]}"
    finally:
        torch.cuda.set_sync_debug_mode(0)


def _differs(got: TopKResult, want: TopKResult, fields) -> dict[str, int]:
    """{field: rows that differ} over `fields` (values compared as int32 bits)."""
    out = {}
    for name in fields:
        a, b = getattr(got, name), getattr(want, name)
        if a.dtype == torch.float32:
            a, b = a.view(torch.int32), b.view(torch.int32)
        rows = (a != b).reshape(a.shape[0], -1).any(dim=1).sum().item() if a.shape == b.shape else a.shape[0]
        if rows:
            out[name] = int(rows)
    return out


def check(results: dict[str, TopKResult], ends: torch.Tensor, topk: int) -> dict:
    """Exactness of a case (module docstring): {"ok", "eager_vs_dense", "runner_vs_dense", "bad_counts_rows",
    "status_rows", ...}: mismatches as {field: rows}. `repaired` and `candidates` are metrics, not answers
    (a scan whose threshold rises as programs finish may keep other candidates from run to run): reported
    for the eager call and the runner, not compared."""
    eager, runner, dense = results["eager"], results["runner"], results["dense"]
    want_counts = ends.clamp(max=topk).to(torch.int32)
    out = dict(
        eager_vs_dense=_differs(eager, dense, CHECKED),
        runner_vs_dense=_differs(runner, dense, CHECKED),
        bad_counts_rows=int((dense.counts != want_counts).sum()),
        status_rows={name: int((r.status != 0).sum()) for name, r in results.items()},
        repaired_rows=int(eager.repaired.sum()),
        runner_repaired_rows=int(runner.repaired.sum()),
        candidates_mean=float(eager.candidates.double().mean()),
        candidates_max=int(eager.candidates.max()),
        runner_candidates_mean=float(runner.candidates.double().mean()),
    )
    out["ok"] = not (
        out["eager_vs_dense"] or out["runner_vs_dense"] or out["bad_counts_rows"] or any(out["status_rows"].values())
    )
    return out


def run_case(
    case: Case, lengths: list[int], cache, block_table, queries: dict, runner, timer: CallTimer, args, ceilings: dict
) -> dict:
    inputs = (
        queries["q_fp4"],
        queries["q_scale"],
        cache,
        block_table,
        queries["weights"],
        queries["row_to_batch"],
        queries["starts"],
        queries["ends"],
    )
    max_end = max(lengths)
    calls = {
        "runner": lambda: runner(*inputs, topk=case.topk, max_seq_len=max_end),
        "eager": lambda: litetopk_prefill(
            *inputs, topk=case.topk, max_seq_len=max_end, backend=args.backend, tuning=args.tuning
        ),
        "dense": lambda: dense_topk_prefill(
            *inputs, topk=case.topk, max_seq_len=max_end, backend=args.backend, selector=args.dense_selector
        ),
    }
    t0 = time.perf_counter()
    for fn in calls.values():  # compile, capture the runner's graph
        fn()
    timer.sync()
    first_s = time.perf_counter() - t0
    syncs = {name: _syncs(fn) for name, fn in calls.items()} if timer.cuda else {}
    times = timer.measure(calls, reps=args.reps, warm=args.warmup)
    results = {name: fn() for name, fn in calls.items()}  # the runner's is a replay of its graph
    exact = check(results, queries["ends"], case.topk)
    rows = len(lengths) * case.next_n
    windows = queries["ends"].long().sum().item()
    nbytes = sum(lengths) * KEY_BYTES + rows * QUERY_BYTES
    ops = 2.0 * 64 * 128 * windows
    floor, bound = floor_us(nbytes, ops, ceilings)
    return dict(
        rows=rows,
        keys_read=sum(lengths),
        row_keys=int(windows),
        max_end=max_end,
        bytes=nbytes,
        ops=ops,
        floor_us=floor,
        floor_bound=bound,
        times=times,
        syncs=syncs,
        first_calls_s=first_s,
        ratio={name: times[name]["median_us"] / floor for name in VARIANTS},
        runner_over_dense=times["runner"]["median_us"] / times["dense"]["median_us"],
        exact=exact,
        runner_stats=dict(runner.stats),
        peak_bytes=torch.cuda.max_memory_allocated() if timer.cuda else None,
    )  # since the group began


def _error(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" (at {os.path.basename(where.filename)}:{where.lineno})" if where else ""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}{at}"


def _oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def run_group(batch: int, keys: int | None, cases: list[Case], args, timer, ceilings, record, deadline) -> None:
    """The cases of one cache (sequences x lengths): build it, one runner for it, each next_n's queries."""
    seed = (args.seed * 1_000_003 + batch * 7919 + (keys or 1)) % (1 << 31)
    lengths = decode_lengths(batch, keys, mixed_range=tuple(args.mixed_range), seed=seed)
    shape = dict(lengths=lengths if keys is None else None, lengths_min=min(lengths), lengths_max=max(lengths))
    rows = batch * max(c.next_n for c in cases)
    estimate = estimate_bytes(lengths, rows)
    if deadline is not None and time.perf_counter() > deadline:
        for c in cases:
            record(c, dict(shape, skipped="time limit (--time-limit)"))
        return
    if estimate > args.memory_budget:
        for c in cases:
            record(
                c,
                dict(
                    shape,
                    skipped=f"memory: estimated {estimate / 2**30:.1f} GiB > budget "
                    f"{args.memory_budget / 2**30:.1f} GiB",
                ),
            )
        return
    cache = block_table = runner = queries = None
    try:
        t0 = time.perf_counter()
        cache, block_table = paged_random_cache(
            lengths, seed=seed, device=args.device, spread=args.spread, spare_pages=SPARE_PAGES
        )
        runner = LiteTopKGraphs(
            rows,
            max(lengths),
            tuple(sorted({c.topk for c in cases})),
            device=args.device,
            backend=args.backend,
            max_batch=batch,
            max_graphs=len(cases) + 1,
            tuning=args.tuning,
        )
        timer.sync()
        shape["build_s"] = time.perf_counter() - t0
        for next_n in sorted({c.next_n for c in cases}):
            queries = decode_queries(lengths, next_n, seed=seed + next_n, device=args.device, spread=args.spread)
            for c in (c for c in cases if c.next_n == next_n):
                if deadline is not None and time.perf_counter() > deadline:
                    record(c, dict(shape, skipped="time limit (--time-limit)"))
                    continue
                try:
                    record(
                        c,
                        dict(shape, **run_case(c, lengths, cache, block_table, queries, runner, timer, args, ceilings)),
                    )
                except Exception as exc:  # noqa: BLE001 -- recorded as the case's error (red, exit status 1), never hidden
                    record(
                        c,
                        dict(
                            shape,
                            **({"skipped": f"out of memory ({_error(exc)})"} if _oom(exc) else {"error": _error(exc)}),
                        ),
                    )
                    if timer.cuda:
                        torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001 -- as above, for every case of the group
        for c in cases:
            record(
                c,
                dict(
                    shape,
                    **(
                        {"skipped": f"out of memory ({_error(exc)})"}
                        if _oom(exc)
                        else {"error": f"building the cache or runner: {_error(exc)}"}
                    ),
                ),
                replace=False,
            )
    finally:
        del cache, block_table, runner, queries
        gc.collect()
        if timer.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def _us(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def table(report: dict):
    from rich.table import Table

    c = report["ceilings"]
    unit = "GPU us" if report["device"].startswith("cuda") else "wall us (CPU)"
    title = (
        f"decode top-k on {report['card']['name']} ({report['backend']}): {unit}, median of {report['reps']}; "
        f"copy {c['copy_bytes_per_s'] / 1e12:.3g} TB/s, int8 "
        + (f"{c['int8_ops_per_s'] / 1e12:.4g} TOP/s" if c["int8_ops_per_s"] else f"n/a ({escape(c['int8']['error'])})")
    )
    t = Table(title=title)
    for col in (
        "case",
        "rows",
        "keys read",
        "runner",
        "eager",
        "dense",
        "floor",
        "runner/floor",
        "eager/floor",
        "runner/dense",
        "exact",
        "notes",
    ):
        t.add_column(col, justify="left" if col in ("case", "exact", "notes") else "right")
    for r in report["cases"]:
        if "times" not in r:
            why = r.get("skipped") or r.get("error")
            t.add_row(
                r["case"],
                "",
                "",
                "",
                "",
                "",
                "",
                "",
                "",
                "",
                "" if "skipped" in r else "[bold red]ERROR[/]",
                f"[{'yellow' if 'skipped' in r else 'red'}]{escape(why)}[/]",
            )
            continue
        ms = {v: r["times"][v]["median_us"] for v in VARIANTS}
        e = r["exact"]
        bad = {k: v for k, v in e.items() if k in ("eager_vs_dense", "runner_vs_dense") and v}
        if e["bad_counts_rows"]:
            bad["counts != min(K, window)"] = e["bad_counts_rows"]
        if any(e["status_rows"].values()):
            bad["status"] = e["status_rows"]
        notes = [
            f"{v} host-bound x{r['times'][v]['host_bound_reps']}" for v in VARIANTS if r["times"][v]["host_bound_reps"]
        ]
        notes += [f"{v} {s}" for v, s in r["syncs"].items() if s != "none"]
        if e["repaired_rows"]:
            notes.append(f"{e['repaired_rows']} repaired")
        t.add_row(
            r["case"],
            str(r["rows"]),
            f"{r['keys_read']:,}",
            _us(ms["runner"]),
            _us(ms["eager"]),
            _us(ms["dense"]),
            f"{_us(r['floor_us'])} {r['floor_bound']}",
            f"{r['ratio']['runner']:.1f}x",
            f"{r['ratio']['eager']:.1f}x",
            f"{r['runner_over_dense']:.2f}",
            "[bold red]FAIL " + json.dumps(bad) + "[/]" if bad else "[green]yes[/]",
            escape("; ".join(notes)),
        )
    return t


def plot(report: dict, path: str) -> None:
    """Per K a column: time per call against the keys read (next_n 1, 2, 4 drawn a little right of each
    other), the floor as a bar; below, each variant's time / floor with the issue's 2x line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    done = [r for r in report["cases"] if "times" in r]
    ks = sorted({r["topk"] for r in done}) or [512]
    fig, axes = plt.subplots(
        2, len(ks), figsize=(7 * len(ks), 9), squeeze=False, sharex="col", gridspec_kw=dict(height_ratios=(3, 2))
    )
    style = dict(runner=("o", "tab:blue"), eager=("^", "tab:orange"), dense=("s", "tab:green"))
    unit = "GPU us" if report["device"].startswith("cuda") else "wall us (CPU)"
    for col, k in enumerate(ks):
        cases = [r for r in done if r["topk"] == k]
        x = [r["keys_read"] * 1.07 ** (r["next_n"].bit_length() - 1) for r in cases]
        top, bottom = axes[0][col], axes[1][col]
        for v, (marker, color) in style.items():
            top.scatter(x, [r["times"][v]["median_us"] for r in cases], marker=marker, color=color, label=v, alpha=0.7)
            bottom.scatter(x, [r["ratio"][v] for r in cases], marker=marker, color=color, label=v, alpha=0.7)
        top.scatter(x, [r["floor_us"] for r in cases], marker="_", color="black", s=150, label="floor")
        bottom.axhline(2.0, color="black", lw=0.8, ls="--", label="2x the floor")
        top.set(yscale="log", ylabel=f"{unit} per call", title=f"K = {k}")
        bottom.set(
            xscale="log", yscale="log", ylabel="time / floor", xlabel="C4 keys read (sum of the sequences' lengths)"
        )
        for ax in (top, bottom):
            ax.grid(True, which="both", alpha=0.3)
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.legend(fontsize=8)
    fig.suptitle(f"decode top-k on {report['card']['name']} ({report['backend']}): time per call and the floor")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse(argv):
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--backend",
        default="auto",
        help="litetopk backend of every variant (auto: triton on NVIDIA, reference on the CPU)",
    )
    p.add_argument("--batch", type=int, nargs="+", help="sequences per call (GPU default 1 8 64 256; CPU 1 4)")
    p.add_argument("--next-n", type=int, nargs="+", default=[1, 2, 4], help="query rows per sequence (MTP)")
    p.add_argument(
        "--keys",
        nargs="+",
        help="C4 keys per sequence, or 'mixed' (GPU default 16384 65536 131072 mixed; CPU 256 2048 mixed)",
    )
    p.add_argument("--topk", type=int, nargs="+", default=[512, 1024])
    p.add_argument(
        "--cases", nargs="+", default=["*"], help="keep cases whose name matches a glob ('64x1x*', '*mixed*')"
    )
    p.add_argument(
        "--quick", action="store_true", help="the issue's goal shapes and a few others (a short device call)"
    )
    p.add_argument(
        "--mixed-range",
        type=int,
        nargs=2,
        metavar=("LO", "HI"),
        help="lengths of the mixed batches (GPU 1024 131072; CPU 64 2048)",
    )
    p.add_argument("--reps", type=int, help="timed calls per variant (median; GPU 20, CPU 3)")
    p.add_argument("--warmup", type=int, help="untimed rounds after the first calls (GPU 3, CPU 1)")
    p.add_argument("--spread", type=int, default=0, help="MXFP4 block-scale spread (bench/common/problems.py)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--memory-budget", type=float, help="GiB a case may use (default 90 %% of the device's memory)")
    p.add_argument(
        "--time-limit", type=float, help="seconds from the start: begin no case after this (the rest listed as skipped)"
    )
    p.add_argument(
        "--dense-route-bytes",
        type=int,
        default=DENSE_ROUTE_BYTES,
        help="LiteTopKTuning.dense_route_bytes of the runner and eager calls (default: its default; 0: the scan)",
    )
    p.add_argument(
        "--dense-selector",
        default="torch",
        choices=["torch", "flashinfer", "radix"],
        help="the dense path's selector (radix: CUDA only)",
    )
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results"), help="folder of decode-<tag>.json / .png")
    p.add_argument("--tag", help="file name tag (default: the card, e.g. h100, h200, cpu)")
    args = p.parse_args(argv)
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and args.device.index is None:  # set_device and the runner want an index
        args.device = torch.device("cuda", torch.cuda.current_device())
    args.tuning = LiteTopKTuning(dense_route_bytes=args.dense_route_bytes)
    args.defaults = GPU if args.device.type == "cuda" else CPU
    args.batch = args.batch or args.defaults["batch"]
    args.keys = args.keys or args.defaults["keys"]
    args.mixed_range = args.mixed_range or args.defaults["mixed_range"]
    args.reps = args.reps or args.defaults["reps"]
    args.warmup = args.warmup or args.defaults["warmup"]
    for keys in args.keys:
        if keys != "mixed" and not keys.isdigit():
            p.error(f"--keys {keys}: give key counts or 'mixed'")
    if args.memory_budget is None:
        total = (
            torch.cuda.get_device_properties(args.device).total_memory
            if args.device.type == "cuda"
            else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        )
        args.memory_budget = 0.9 * total
    else:
        args.memory_budget *= 2**30
    return args


def _tag(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    return next((t for t in ("h100", "h200", "b200", "a100", "mi300", "mi355") if t in name), "gpu")


def main(argv=None) -> int:
    began = time.perf_counter()  # --time-limit counts from here (the ceilings and the first compiles included)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    if args.device.type == "cuda":
        torch.cuda.set_device(args.device)
        torch.cuda.reset_peak_memory_stats()
    args.backend = resolve_backend(args.backend, args.device)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(width=220)
    cases = build_cases(args)
    if not cases:
        console.print("[red]no case left after the filters[/]")
        return 2
    tag = args.tag or _tag(args.device)
    os.makedirs(args.out, exist_ok=True)
    json_path, png_path = os.path.join(args.out, f"decode-{tag}.json"), os.path.join(args.out, f"decode-{tag}.png")
    report = dict(
        run_info(args.device, argv, "bench.decode"),
        backend=args.backend,
        reps=args.reps,
        warmup=args.warmup,
        seed=args.seed,
        spread=args.spread,
        dense_route_bytes=args.dense_route_bytes,
        dense_selector=args.dense_selector,
        mixed_range=list(args.mixed_range),
        memory_budget=args.memory_budget,
        windows="row i of sequence b: [0, L_b - next_n + 1 + i)",
        block_table="shuffled pages, -1 padded",
        floor="max((68 B x keys read + 4,608 B x rows) / copy_bytes_per_s, 2 x 64 x 128 x row keys / int8_ops_per_s)",
        cases=[],
        complete=False,
    )

    def save():
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)

    timer = CallTimer(args.device)
    report["timer"] = dict(flush_bytes=timer.flush_bytes, spin_cycles_per_us=timer.cycles_per_us)
    console.print(
        f"decode: {len(cases)} cases on {report['card']['name']} ({args.backend}); measuring the ceilings ..."
    )
    report["ceilings"] = measure_ceilings(timer)
    save()
    start = time.perf_counter()
    deadline = began + args.time_limit if args.time_limit else None

    def on_term(signum, frame):
        raise Stop()

    previous = signal.signal(signal.SIGTERM, on_term)
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        groups.setdefault((c.batch, c.keys), []).append(c)
    order = sorted(groups, key=lambda g: (g[0] * (g[1] or args.mixed_range[1]), g[1] is None))
    try:
        with Progress(
            TextColumn("decode: {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("", total=len(cases))

            def record(case: Case, result: dict, replace: bool = True) -> None:
                if not replace and any(r["case"] == case.name for r in report["cases"]):
                    return
                entry = dict(
                    case=case.name,
                    batch=case.batch,
                    next_n=case.next_n,
                    keys="mixed" if case.keys is None else case.keys,
                    topk=case.topk,
                    **result,
                )
                report["cases"].append(entry)
                save()
                progress.advance(task)
                if "times" in entry:
                    t = {v: _us(entry["times"][v]["median_us"]) for v in VARIANTS}
                    ok = "exact" if entry["exact"]["ok"] else "[bold red]NOT EXACT[/]"
                    progress.console.print(
                        f"{case.name}: runner {t['runner']} eager {t['eager']} dense {t['dense']} us, "
                        f"floor {_us(entry['floor_us'])} us, {ok}"
                    )
                else:
                    progress.console.print(
                        f"{case.name}: "
                        + (escape(entry["skipped"]) if "skipped" in entry else f"[red]{escape(entry['error'])}[/]")
                    )

            for g in order:
                progress.update(task, description=f"{g[0]} sequences x {'mixed' if g[1] is None else g[1]} keys")
                run_group(g[0], g[1], groups[g], args, timer, report["ceilings"], record, deadline)
        report["complete"] = True
    except (Stop, KeyboardInterrupt):
        report["interrupted"] = f"stopped after {time.perf_counter() - start:.0f} s"
        console.print(f"[bold yellow]decode: {report['interrupted']}: writing what was measured[/]")
    except Exception as exc:  # noqa: BLE001 -- e.g. a sticky CUDA error in a group's cleanup: the run fails, loudly
        report["aborted"] = _error(exc)
        console.print(f"[bold red]decode: aborted: {escape(report['aborted'])}[/]")
        traceback.print_exc()
    finally:
        signal.signal(signal.SIGTERM, previous)
    done = {r["case"] for r in report["cases"]}
    for c in cases:
        if c.name not in done:
            report["cases"].append(
                dict(
                    case=c.name,
                    batch=c.batch,
                    next_n=c.next_n,
                    topk=c.topk,
                    keys="mixed" if c.keys is None else c.keys,
                    skipped="not run (stopped)",
                )
            )
    failures = [r["case"] for r in report["cases"] if "error" in r or ("exact" in r and not r["exact"]["ok"])]
    failures += ["(aborted)"] if "aborted" in report else []
    report["failures"] = failures
    report["elapsed_s"] = time.perf_counter() - start
    save()
    console.print(table(report))
    plot(report, png_path)
    console.print(f"decode: wrote {json_path} and {png_path}")
    if failures:
        console.print(
            f"[bold red]decode: FAILED: {len(failures)} case(s) not exact or in error: {', '.join(failures)}[/]"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
