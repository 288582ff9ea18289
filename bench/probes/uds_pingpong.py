"""The floor of one request and answer over a Unix socket between two Python processes on this host.

Why. Over `ipc` a decode request's client + transport share (its client time minus the service's own phases)
was ~0.08 ms on the 2-core CI-sized VM and ~0.28 ms on the H100's host (bench/results/service-h100-v19/):
this probe says how much of that is the host's (two thread wake-ups a round trip, each after the thread
blocked in recv) rather than the service's or the client's Python. A child process answers each
`--size`-byte message with one of the same size; the parent times the round trips in two modes:
    block   recv() blocks until the message arrives (what the client and the service do today);
    spin    both sides poll recv(MSG_DONTWAIT) for up to --spin-us before blocking, so that a message
            that arrives within that time finds its thread running (no wake-up).
Prints a table (p50 / p99 us), writes <out>/uds-pingpong-<host>.json.

    python -m bench.probes.uds_pingpong --out DIR [--iters 5000] [--size 512] [--spin-us 200]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.common import RESULTS_DIR
from bench.common.report import run_info

MODES = ("block", "spin")


def _recv_exact(sock: socket.socket, size: int, spin_s: float) -> bytes:
    """`size` bytes from `sock`: polled without blocking for up to `spin_s` seconds first (0: block at once)."""
    if spin_s:
        deadline = time.perf_counter() + spin_s
        while time.perf_counter() < deadline:
            try:
                data = sock.recv(size, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            return _rest(sock, data, size)
    return _rest(sock, sock.recv(size), size)


def _rest(sock: socket.socket, data: bytes, size: int) -> bytes:
    """`data` completed to `size` bytes from `sock` (blocking); b"" once the peer has closed."""
    while data and len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def _answer(sock: socket.socket, size: int) -> None:
    """The child: answer every message with one of the same size (the mode comes with each message's first byte)."""
    while True:
        data = _recv_exact(sock, size, 0.0)
        if not data:
            return
        spin_us = data[0]  # 0: block mode; else the spin in units of 10 us for the next message
        sock.sendall(data)
        if spin_us:
            data = _recv_exact(sock, size, spin_us * 1e-5)
            if not data:
                return
            sock.sendall(data)


def _round_trips(sock: socket.socket, size: int, iters: int, spin_us: int) -> list[float]:
    """Seconds of each of `iters` round trips; in spin mode the two sides alternate block-then-spin pairs."""
    seconds = []
    message = bytes([0]) + bytes(size - 1)
    spin_message = bytes([max(1, spin_us // 10)]) + bytes(size - 1)
    for _ in range(iters):
        if spin_us:  # a blocking round trip that arms the child's spin, then the timed one
            sock.sendall(spin_message)
            _recv_exact(sock, size, spin_us * 1e-6)
            start = time.perf_counter()
            sock.sendall(message)
            _recv_exact(sock, size, spin_us * 1e-6)
        else:
            start = time.perf_counter()
            sock.sendall(message)
            _recv_exact(sock, size, 0.0)
        seconds.append(time.perf_counter() - start)
    return seconds


def _summary(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {
        "p50_us": 1e6 * statistics.median(ordered),
        "p99_us": 1e6 * ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "iters": len(ordered),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=5000)
    parser.add_argument("--size", type=int, default=512, help="bytes a message (an IPC decode request is ~0.5 KB)")
    parser.add_argument("--spin-us", type=int, default=200, help="the spin mode's poll before blocking (<= 2,550)")
    parser.add_argument("--out", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)
    if not 10 <= args.spin_us <= 2550 or args.size < 1:
        parser.error("--spin-us takes 10..2550, --size at least 1")
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        parent.close()
        try:
            _answer(child, args.size)
        finally:
            os._exit(0)
    child.close()
    report = {**run_info(torch.device("cpu"), sys.argv[1:] if argv is None else argv, "bench.probes.uds_pingpong")}
    report.update(host=os.uname().nodename, cores=os.cpu_count(), size=args.size, spin_us=args.spin_us, modes={})
    try:
        for mode in MODES:
            spin = args.spin_us if mode == "spin" else 0
            _round_trips(parent, args.size, min(200, args.iters), spin)  # warm-up
            report["modes"][mode] = _summary(_round_trips(parent, args.size, args.iters, spin))
            got = report["modes"][mode]
            print(f"{mode:6s} p50 {got['p50_us']:8.1f} us   p99 {got['p99_us']:8.1f} us")
    finally:
        parent.close()
        os.waitpid(pid, 0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"uds-pingpong-{report['host']}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
