"""The device's two ceilings, measured once per run, and a call's floor under them.

- copy bandwidth: a large device-to-device copy (`dst.copy_(src)`, 1 GiB on a GPU), counting the bytes
  read and written (2 x size / time): what streaming bytes through HBM reaches in practice;
- int8 rate: `torch._int_mm` of large int8 matrices (8192^3 on a GPU: A [M, K] row-major times B
  given as [N, K] transposed, cuBLASLt's fast layout), 2 M N K operations / time.
Both are timed by bench.common.timing.CallTimer (median of the reps, L2 flushed before each). The
floor of a call is max(bytes / copy bandwidth, int8 operations / int8 rate): it reads its bytes once
at the copy's speed, or does its multiply-adds at the matmul's rate, whichever takes longer.
"""

from __future__ import annotations

import torch

from bench.common.timing import CallTimer


def measure_ceilings(
    timer: CallTimer, *, copy_bytes: int | None = None, mm_size: int | None = None, reps: int = 10
) -> dict:
    """{"copy_bytes_per_s", "int8_ops_per_s", and how each was measured}: sizes default to 1 GiB and
    8192 on a GPU, 64 MiB and 512 on the CPU."""
    device = timer.device
    cuda = device.type == "cuda"
    copy_bytes = copy_bytes or ((1 << 30) if cuda else (64 << 20))
    mm_size = mm_size or (8192 if cuda else 512)
    src = torch.ones(copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy = timer.measure({"copy": lambda: dst.copy_(src)}, reps=reps, warm=2)["copy"]  # noqa: F821
    del src, dst
    ceilings = dict(
        copy_bytes_per_s=2.0 * copy_bytes / (copy["median_us"] * 1e-6),
        copy=dict(
            bytes=copy_bytes,
            counted="read + write",
            median_us=copy["median_us"],
            min_us=copy["min_us"],
            best_bytes_per_s=2.0 * copy_bytes / (copy["min_us"] * 1e-6),
        ),
    )
    a = torch.randint(-128, 128, (mm_size, mm_size), dtype=torch.int8, device=device)
    b = torch.randint(-128, 128, (mm_size, mm_size), dtype=torch.int8, device=device)  # B^T, [N, K]
    ops = 2.0 * mm_size**3
    try:
        mm = timer.measure({"int_mm": lambda: torch._int_mm(a, b.t())}, reps=reps, warm=2)["int_mm"]  # noqa: F821
    except RuntimeError as exc:  # this torch has no int8 matmul here: said in the report, floors from bytes only
        ceilings.update(int8_ops_per_s=None, int8=dict(op="torch._int_mm", error=f"{type(exc).__name__}: {exc}"[:300]))
    else:
        ceilings.update(
            int8_ops_per_s=ops / (mm["median_us"] * 1e-6),
            int8=dict(
                m=mm_size,
                n=mm_size,
                k=mm_size,
                op="torch._int_mm",
                median_us=mm["median_us"],
                min_us=mm["min_us"],
                best_ops_per_s=ops / (mm["min_us"] * 1e-6),
            ),
        )
    del a, b
    if cuda:
        torch.cuda.empty_cache()
    return ceilings


def floor_us(nbytes: float, ops: float, ceilings: dict) -> tuple[float, str]:
    """(microseconds, "bytes" or "int8"): the call's floor under the measured ceilings and the one that sets it
    ("bytes (no int8 rate)" where the int8 rate could not be measured)."""
    by_bytes = nbytes / ceilings["copy_bytes_per_s"] * 1e6
    if ceilings["int8_ops_per_s"] is None:
        return by_bytes, "bytes (no int8 rate)"
    by_ops = ops / ceilings["int8_ops_per_s"] * 1e6
    return (by_bytes, "bytes") if by_bytes >= by_ops else (by_ops, "int8")
