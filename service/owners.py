"""Owner checks of registrations: which process's death retires a region (litetopk.clients.owners
reads /proc the same way for both sides)."""

from __future__ import annotations

import logging

from litetopk.clients.owners import owner_alive, pid_max, process_start

from .errors import ServiceError

log = logging.getLogger("litetopk.service")


def check_owner(pid: int | None, pid_ns: int | None, service_pid_ns: int | None,
                foreign_pid_namespace: str) -> tuple[int | None, str | None]:
    """(pid to track, its start time) of a registration naming owner `pid` in namespace `pid_ns`.

    Refuses (422) a pid above this host's pid_max, a pid of no live process, and a pid of another
    pid namespace (`foreign_pid_namespace`; with the policy 'untrack' it is registered untracked).
    """
    if pid is not None and pid > pid_max():
        raise ServiceError("validation_error", f"owner pid {pid} is above this host's pid_max ({pid_max()}): "
                           "it names no process")
    if pid is not None and pid_ns is not None and service_pid_ns is not None and pid_ns != service_pid_ns:
        if foreign_pid_namespace == "refuse":
            raise ServiceError(
                "foreign_pid_namespace", f"owner pid {pid} lives in pid namespace {pid_ns}, this service in "
                f"{service_pid_ns}: it cannot tell whether that process is alive. Share the pid namespace "
                "(compose `pid: service:<service>` or `pid: host`) or send pid=null "
                "(TopKClient(owner_pid=None), LITETOPK_CLIENT_OWNER_PID=none) and unregister explicitly")
        log.warning("owner pid %d is from pid namespace %d (not %d): registered untracked", pid, pid_ns,
                    service_pid_ns)
        return None, None
    start = process_start(pid) if pid is not None else None
    if pid is not None and not owner_alive(pid, start):
        raise ServiceError("validation_error", f"owner pid {pid} is not a running process "
                           "(send pid=null when the service does not share the owner's pid namespace)")
    return pid, start


__all__ = ["check_owner", "owner_alive"]
