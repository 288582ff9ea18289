"""Owner checks of registrations: which process's death retires a region (litetopk.clients.owners
reads /proc the same way for both sides)."""

from __future__ import annotations

import logging
import os
import select
import threading

from litetopk.clients.owners import owner_alive, pid_max, process_start

from .errors import ServiceError

log = logging.getLogger("litetopk.service")


def check_owner(
    pid: int | None, pid_ns: int | None, service_pid_ns: int | None, foreign_pid_namespace: str
) -> tuple[int | None, str | None]:
    """(pid to track, its start time) of a registration naming owner `pid` in namespace `pid_ns`.

    Refuses (422) a pid above this host's pid_max, a pid of no live process, and a pid of another
    pid namespace (`foreign_pid_namespace`; with the policy 'untrack' it is registered untracked).
    """
    if pid is not None and pid > pid_max():
        raise ServiceError(
            "validation_error", f"owner pid {pid} is above this host's pid_max ({pid_max()}): it names no process"
        )
    if pid is not None and pid_ns is not None and service_pid_ns is not None and pid_ns != service_pid_ns:
        if foreign_pid_namespace == "refuse":
            raise ServiceError(
                "foreign_pid_namespace",
                f"owner pid {pid} lives in pid namespace {pid_ns}, this service in "
                f"{service_pid_ns}: it cannot tell whether that process is alive. Share the pid namespace "
                "(compose `pid: service:<service>` or `pid: host`) or send pid=null "
                "(TopKClient(owner_pid=None), LITETOPK_CLIENT_OWNER_PID=none) and unregister explicitly",
            )
        log.warning("owner pid %d is from pid namespace %d (not %d): registered untracked", pid, pid_ns, service_pid_ns)
        return None, None
    start = process_start(pid) if pid is not None else None
    if pid is not None and not owner_alive(pid, start):
        raise ServiceError(
            "validation_error",
            f"owner pid {pid} is not a running process "
            "(send pid=null when the service does not share the owner's pid namespace)",
        )
    return pid, start


EXITED_AT_ONCE = 64  # exited owners one epoll call reports (more: each is asked alone)


class OwnerWatch:
    """Owner processes watched by pidfd (one fd per owner process, shared by its regions, not one per
    region): `alive(pid, start)` asks one epoll set holding every pidfd which owners have exited (one
    call, ~0.5 us, whatever the number of owners; exact under pid reuse) and falls back to reading
    /proc (owner_alive) for an owner it holds no pidfd for (pidfd_open refused, e.g. no fds left).
    Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._fds: dict[tuple, list] = {}  # (pid, start) -> [pidfd, regions watching it]
        self._exited = select.epoll()  # every pidfd: readable once its process has exited

    def watch(self, pid: int | None, start: str | None) -> None:
        if pid is None:
            return
        with self._lock:
            entry = self._fds.get((pid, start))
            if entry is not None:
                entry[1] += 1
                return
            try:
                fd = os.pidfd_open(pid)
            except (OSError, AttributeError):
                return  # /proc it is, for this owner
            if not owner_alive(pid, start):  # the pid was reused between registration and now
                os.close(fd)
                return
            try:
                self._exited.register(fd, select.EPOLLIN)
            except OSError:  # no room in the set: /proc it is, for this owner
                os.close(fd)
                return
            self._fds[(pid, start)] = [fd, 1]

    def unwatch(self, pid: int | None, start: str | None) -> None:
        with self._lock:
            entry = self._fds.get((pid, start))
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self._fds[(pid, start)]
                self._exited.unregister(entry[0])
                os.close(entry[0])

    def alive(self, pid: int | None, start: str | None) -> bool:
        if pid is None:
            return True
        entry = self._fds.get((pid, start))
        if entry is None:
            return owner_alive(pid, start)
        exited = self._exited.poll(0, EXITED_AT_ONCE)  # (fd, events) of owners that have exited: usually none
        if not exited:
            return True
        if len(exited) < EXITED_AT_ONCE:
            dead = any(ready == entry[0] for ready, _ in exited)
        else:  # more exited owners than one call returns: ask this owner's pidfd alone
            poller = select.poll()  # not select(): fds past 1,023 (the service raises RLIMIT_NOFILE)
            try:
                poller.register(entry[0], select.POLLIN)
                dead = bool(poller.poll(0))
            except (OSError, ValueError):
                return owner_alive(pid, start)
        if self._fds.get((pid, start)) is not entry:  # unwatched meanwhile (its fd number may be reused): ask /proc
            return owner_alive(pid, start)
        return not dead

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._fds.values():
                self._exited.unregister(fd)
                os.close(fd)
            self._fds.clear()


__all__ = ["OwnerWatch", "check_owner", "owner_alive"]
