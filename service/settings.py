"""Service settings: one pydantic-settings class, `LITETOPK_*` environment variables and flags.

Every field is also a command-line flag of `python -m litetopk.service` (`--queue-size 32` sets
`queue_size`); a flag beats the environment, which beats the default. See README "## Service".
This module does not import torch at module level: `python -m litetopk.service --check` reads the
settings and probes the service without loading it.
"""

from __future__ import annotations

import argparse
import grp
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    import torch

DEVICE_NAME = re.compile(r"^(auto|cpu|cuda(:\d+)?|GPU-[0-9A-Fa-f]{8}(-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12})$")


def normalize_uuid(uuid: str) -> str:
    """'GPU-5a6b...' / '5A6B...' -> '5a6b...' (nvidia-smi and torch spell GPU UUIDs differently)."""
    text = str(uuid).strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def gpu_index_by_uuid(uuid: str, visible: Sequence[str]) -> int:
    """The index N of `cuda:N` whose UUID (`visible[N]`, as torch or nvidia-smi spells it) is `uuid`."""
    want = normalize_uuid(uuid)
    for index, candidate in enumerate(visible):
        if normalize_uuid(candidate) == want:
            return index
    listing = ", ".join(f"cuda:{i} GPU-{normalize_uuid(u)}" for i, u in enumerate(visible)) or "none"
    raise ValueError(
        f"device={uuid!r}: no visible GPU has this UUID (visible: {listing}); check `nvidia-smi -L` "
        "and CUDA_VISIBLE_DEVICES / the container's GPU reservation"
    )


def visible_gpu_uuids() -> list[str]:
    """`torch.cuda.get_device_properties(i).uuid` of every visible GPU, in index order."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]


def default_socket_path() -> str:
    """`${XDG_RUNTIME_DIR:-/tmp}/litetopk/litetopk.sock` (the client computes the same path)."""
    return str(Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / "litetopk" / "litetopk.sock")


class ServiceSettings(BaseSettings):
    """Everything the service reads at start; immutable afterwards."""

    model_config = SettingsConfigDict(env_prefix="LITETOPK_", frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="TCP address to listen on ('' disables TCP)")
    port: int = Field(8471, ge=0, le=65535, description="TCP port (0: pick a free one, printed at start)")
    uds: str = Field(
        default_factory=default_socket_path, description="Unix socket path; its directory is created 0700 ('' disables)"
    )
    uds_mode: int = Field(
        0o600,
        ge=0,
        le=0o777,
        description="permissions of the Unix socket, octal (0660: its group may connect too; "
        "the directory then gets the matching search bit)",
    )
    uds_group: str = Field(
        "", description="group (name or gid) of the Unix socket and its directory ('' keeps the service's own)"
    )
    device: str = Field(
        "auto",
        description="'auto' (cuda:0 when CUDA is available, else cpu), 'cpu', 'cuda:N' or "
        "'GPU-<uuid>' (the visible GPU with that UUID, nvidia-smi -L)",
    )
    backend: Literal["auto", "reference", "triton", "flydsl"] = Field(
        "auto", description="operator backend; 'auto' picks by device (kernels.operator)"
    )
    calibration: Literal["sample", "scan"] = Field(
        "sample",
        description="where LiteTopK's thresholds come from: 'sample' (a calibration stage) or 'scan' "
        "(the scan calibrates itself: triton backend only; another backend fails the start)",
    )
    max_rows: int = Field(
        0,
        ge=0,
        description="query rows per request; the device workspace is sized for it "
        "(larger requests: invalid_input). 0: 8192 on a GPU, 256 on the CPU",
    )
    max_keys: int = Field(
        65536,
        ge=1,
        description="longest key window (compressed positions) a row may see; the "
        "workspace is sized for it (rows beyond it: invalid_row)",
    )
    max_batch: int = Field(
        256,
        ge=1,
        description="sequences (block-table rows) per request: a decode batch; the "
        "workspace is sized for it (larger requests: invalid_input)",
    )
    graphs: bool = Field(
        True,
        description="replay repeated request shapes from the operator's CUDA graphs "
        "(LiteTopKGraphs; on the CPU the same staging, no graphs)",
    )
    max_graphs: int = Field(
        16, ge=1, description="request shapes (graphs) kept at once; the least recently used is dropped"
    )
    ipc: bool = Field(True, description="serve the IPC channel (msgpack frames) on ipc.sock beside the Unix socket")
    ipc_max_connections: int = Field(
        1024, ge=1, description="IPC connections at once (a thread each; overloaded beyond)"
    )
    ipc_max_connections_per_uid: int = Field(
        256,
        ge=1,
        description="IPC connections of one uid, so that one cannot take every connection (overloaded beyond)",
    )
    ipc_max_in_flight: int = Field(
        1024, ge=1, description="requests of one IPC connection in flight at once (overloaded beyond)"
    )
    max_regions_per_principal: int = Field(
        4096, ge=1, description="live regions one principal may hold (region_quota_exceeded beyond)"
    )
    max_region_bytes_per_principal: int = Field(
        2**40, ge=1, description="bytes of live regions one principal may hold (region_quota_exceeded beyond)"
    )
    resource_log_interval_s: float = Field(
        10.0,
        gt=0,
        description="a resource shortage (no file descriptors left) is logged at most once per this interval",
    )
    queue_size: int = Field(64, ge=1, description="requests waiting for the device worker before 429")
    max_request_bytes: int = Field(16 * 2**20, ge=1024, description="largest request body (413 above)")
    request_timeout_s: float = Field(60.0, gt=0, description="queue wait + device time per request (504 above)")
    json_result_max_bytes: int = Field(
        16 * 2**10, ge=0, description="results larger than this go out binary when the client accepts it"
    )
    retry_after_s: int = Field(1, ge=1, description="Retry-After seconds sent with 429/503")
    region_check_interval_s: float = Field(2.0, gt=0, description="how often regions of dead owners are dropped")
    shutdown_timeout_s: float = Field(30.0, gt=0, description="grace period for in-flight requests at shutdown")
    foreign_pid_namespace: Literal["refuse", "untrack"] = Field(
        "refuse",
        description="a region whose owner pid is from another pid namespace: 'refuse' "
        "(foreign_pid_namespace) or 'untrack' (register it with pid null)",
    )
    warmup: bool = Field(True, description="run a tiny warm-up problem before /readyz turns ready")
    fault_delay_s: float = Field(
        0.0,
        ge=0,
        description="fault injection for tests: the worker sleeps this long before each job (0 in production)",
    )
    fault_gate_file: str = Field(
        "",
        description="fault injection for tests: the worker takes the next job from the "
        "queue only while this file exists (a test orders events by creating it; '' in "
        "production)",
    )
    token_file: str = Field(
        "",
        description="where the TCP bearer token is written (0600) at start: '' beside the "
        "Unix socket (<socket dir>/token), 'none' no token (TCP then refuses "
        "region operations), or a path in a directory the service owns",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="level of the service's and uvicorn's loggers"
    )

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if not DEVICE_NAME.match(value):
            raise ValueError(f"device={value!r} is not served; use 'auto', 'cpu', 'cuda:N' or 'GPU-<uuid>'")
        return value

    @field_validator("uds_mode", mode="before")
    @classmethod
    def _octal_mode(cls, value):
        if isinstance(value, str):  # the environment and flags spell modes in octal: 0660, 660, 0o660
            try:
                value = int(value.strip().lower().removeprefix("0o"), 8)
            except ValueError as exc:
                raise ValueError(f"uds_mode={value!r} is not an octal mode such as 0600 or 0660") from exc
        if isinstance(value, int) and value & 0o600 != 0o600:
            raise ValueError(f"uds_mode={value:04o} must let the service's own user read and write (0600 at least)")
        return value

    def tuning(self, backend: str):
        """The operator's LiteTopKTuning for these settings on the resolved `backend`; ValueError when
        the backend cannot run it (calibration='scan' off the triton backend)."""
        from litetopk.kernels import LiteTopKTuning

        if self.calibration == "scan" and backend != "triton":
            raise ValueError(
                f"calibration='scan' needs the triton backend; this service runs {backend!r} "
                "(set CALIBRATION=sample, or BACKEND=triton on an NVIDIA device)"
            )
        return LiteTopKTuning(calibration=self.calibration)

    def torch_device(self, visible_uuids: Sequence[str] | None = None) -> torch.device:
        """The pinned device: 'auto' resolves to cuda:0 when CUDA is available, else cpu; 'GPU-<uuid>' to
        the visible GPU with that UUID (ValueError naming the visible ones when none has it)."""
        import torch

        if self.device == "auto":
            return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        if self.device.startswith("GPU-"):
            uuids = visible_gpu_uuids() if visible_uuids is None else visible_uuids
            return torch.device("cuda", gpu_index_by_uuid(self.device, uuids))
        device = torch.device(self.device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", 0)
        return device

    def row_limit(self, device: torch.device) -> int:
        """`max_rows`, or where it is 0 the default for `device`'s type: 8192 on a GPU (a prefill chunk;
        a decode batch of 256 sequences x 2 rows fits too), 256 on the CPU (the reference backend; its
        workspace sizing runs the operator at the bounds)."""
        return self.max_rows or (8192 if device.type == "cuda" else 256)

    def socket_group_id(self) -> int | None:
        """The gid `uds_group` names (None when empty); ValueError for a group this host does not know."""
        if not self.uds_group:
            return None
        if self.uds_group.isdigit():
            return int(self.uds_group)
        try:
            return grp.getgrnam(self.uds_group).gr_gid
        except KeyError:
            raise ValueError(f"uds_group={self.uds_group!r}: no such group here; give a group name or a gid") from None

    def socket_dir_mode(self) -> int:
        """0700, plus the search bit for the group / others when the socket lets them connect."""
        return 0o700 | (0o010 if self.uds_mode & 0o070 else 0) | (0o001 if self.uds_mode & 0o007 else 0)

    def token_path(self) -> Path | None:
        """Where the TCP bearer token goes (None: no token, TCP refuses region operations)."""
        if self.token_file.lower() == "none" or (not self.token_file and not self.uds):
            return None
        return Path(self.token_file) if self.token_file else Path(self.uds).parent / "token"

    def socket_dir(self) -> Path:
        """Create the Unix socket's directory (`socket_dir_mode`, `uds_group`) without following links.

        Its parents are created as usual; the directory itself is created 0700, or, when it exists,
        opened with O_NOFOLLOW | O_DIRECTORY and refused (PermissionError saying why) if it is a
        symbolic link, not a directory, or owned by another uid. Mode and group are set on that fd.
        """
        directory = Path(self.uds).parent
        mode, gid = self.socket_dir_mode(), self.socket_group_id()
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            what = "a symbolic link" if os.path.islink(directory) else "not a directory"
            raise PermissionError(
                f"{directory} is {what}: the socket directory must be a real directory owned "
                "by this user; remove it or choose --uds elsewhere"
            ) from exc
        try:
            info = os.fstat(fd)
            if info.st_uid != os.getuid():
                raise PermissionError(
                    f"{directory} belongs to uid {info.st_uid}, not to this user (uid "
                    f"{os.getuid()}); choose --uds elsewhere"
                )
            if gid is not None and info.st_gid != gid:
                try:
                    os.fchown(fd, -1, gid)
                except PermissionError as exc:
                    raise PermissionError(
                        f"uds_group={self.uds_group!r}: this user is not a member of gid {gid} "
                        "(add it: compose `group_add`), so the socket cannot be given to it"
                    ) from exc
            if stat.S_IMODE(info.st_mode) != mode:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
        return directory


def cli_parser() -> argparse.ArgumentParser:
    """One flag per field (`--queue-size` for `queue_size`); `settings_from_args` reads them back."""
    parser = argparse.ArgumentParser(
        prog="python -m litetopk.service", description="GPU-pinned top-k index selection service (litetopk)"
    )
    for name, field in ServiceSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=field.description
            )
        else:
            parser.add_argument(
                flag, dest=name, default=None, help=f"{field.description} (env LITETOPK_{name.upper()})"
            )
    return parser


def settings_from_args(args: argparse.Namespace) -> ServiceSettings:
    """Settings from parsed flags, then env, then defaults (other attributes of `args` are ignored)."""
    given = {k: v for k, v in vars(args).items() if k in ServiceSettings.model_fields and v is not None}
    return ServiceSettings(**given)


def parse_cli(argv: list[str] | None = None) -> ServiceSettings:
    """Settings from flags (one per field, `--queue-size` for `queue_size`), then env, then defaults."""
    return settings_from_args(cli_parser().parse_args(argv))


__all__ = [
    "ServiceSettings",
    "cli_parser",
    "default_socket_path",
    "gpu_index_by_uuid",
    "normalize_uuid",
    "parse_cli",
    "settings_from_args",
    "visible_gpu_uuids",
]
