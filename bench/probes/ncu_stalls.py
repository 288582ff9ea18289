"""Summarize an Nsight Compute source page (`ncu -i REPORT --page source --print-source sass --csv`, as
bench/device/gpu_ncu_paged.sh writes it): the warp stall samples of one kernel by reason, by opcode, and by the
instructions that drew the most, with their reasons.

    python3 -m bench.probes.ncu_stalls ncu-paged-sass-64x1x65536x512.csv[.gz] [--top 40] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import json


def read_rows(path: str) -> list[dict]:
    """The per-instruction rows of the CSV (the first line names the kernel, the second is the header)."""
    raw = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    with raw as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def _int(value: str) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):  # "-", or a short row
        return 0


def summarize(rows: list[dict], top: int) -> dict:
    """Samples by stall reason (the not-issued ones and "selected"), by opcode, and the `top` instructions."""
    reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    by_reason = collections.Counter()
    by_opcode = collections.Counter()
    heaviest = []
    for i, row in enumerate(rows):
        samples = _int(row.get("Warp Stall Sampling (All Samples)", "0"))
        source = row["Source"].strip()
        words = source.split()
        opcode = (words[1] if words and words[0].startswith("@") else (words[0] if words else "")).split(".")[0]
        per_reason = {k[len("stall_") :]: _int(row[k]) for k in reasons if _int(row[k])}
        by_reason.update(per_reason)
        by_opcode[opcode] += samples
        heaviest.append((samples, i, source, per_reason))
    total = sum(by_reason.values()) or 1
    heaviest.sort(reverse=True)
    return dict(
        samples=total,
        by_reason={k: round(100 * v / total, 1) for k, v in by_reason.most_common()},
        by_opcode={k: round(100 * v / total, 1) for k, v in by_opcode.most_common(20)},
        heaviest=[
            dict(index=i, source=source, percent=round(100 * s / total, 2), reasons=reasons_)
            for s, i, source, reasons_ in heaviest[:top]
        ],
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--json", default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    summary = summarize(read_rows(args.csv), args.top)
    print(f"{summary['samples']} samples")
    print("by reason: " + ", ".join(f"{k} {v}%" for k, v in summary["by_reason"].items()))
    print("by opcode: " + ", ".join(f"{k} {v}%" for k, v in summary["by_opcode"].items()))
    for h in summary["heaviest"]:
        reasons = " ".join(f"{k}:{v}" for k, v in sorted(h["reasons"].items(), key=lambda x: -x[1])[:3])
        source = " ".join(h["source"].split())[:60]
        print(f"{h['index']:5d} {h['percent']:5.2f}%  {source:60s} {reasons}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
