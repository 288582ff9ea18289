"""Owner processes of regions, read the same way by the clients and the service.

A region names the process whose death retires it (`pid`) and the pid namespace that pid lives
in (`pid_ns`: the inode of /proc/self/ns/pid), so that a service in another pid namespace refuses
the pid instead of tracking whichever unrelated process has that number there. A pid is bounded
by the kernel's `pid_max` (read once); a larger one names no process.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

PID_NAMESPACE_PATH = "/proc/self/ns/pid"
PID_MAX_PATH = "/proc/sys/kernel/pid_max"
PID_MAX_LIMIT = 2**22  # the kernel's PID_MAX_LIMIT on 64-bit: no pid_max is larger


def pid_namespace() -> int | None:
    """This process's pid namespace id (st_ino of /proc/self/ns/pid); None where it cannot be read."""
    try:
        return os.stat(PID_NAMESPACE_PATH).st_ino
    except OSError:
        return None


@functools.cache
def pid_max() -> int:
    """The largest pid of this host (/proc/sys/kernel/pid_max, read once; PID_MAX_LIMIT without procfs)."""
    try:
        return int(Path(PID_MAX_PATH).read_text())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def process_start(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time): tells a live owner from a reused pid."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first); None without it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            return stat_file.read().decode(errors="replace").rsplit(")", 1)[-1].split()
    except OSError:
        return None


def owner_alive(pid: int | None, start: str | None) -> bool:
    """False when process `pid` is gone, a zombie, or a different process under a reused pid.

    `pid` must be at most `pid_max()` (the service bounds it at registration)."""
    if pid is None:
        return True
    if not 1 <= pid <= pid_max():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    fields = _stat_fields(pid)
    if fields is None:
        return True  # no procfs: the kill probe is all we have
    if fields and fields[0] in ("Z", "X"):
        return False
    return start is None or (len(fields) > 19 and fields[19] == start)


__all__ = ["PID_MAX_LIMIT", "owner_alive", "pid_max", "pid_namespace", "process_start"]
