"""Service settings: one pydantic-settings class, `LITETOPK_*` environment variables and flags.

Every field is also a command-line flag of `python -m litetopk.service` (`--queue-size 32` sets
`queue_size`); a flag beats the environment, which beats the default. See README "## Service".
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_socket_path() -> str:
    """`${XDG_RUNTIME_DIR:-/tmp}/litetopk/litetopk.sock` (the client computes the same path)."""
    return str(Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / "litetopk" / "litetopk.sock")


class ServiceSettings(BaseSettings):
    """Everything the service reads at start; immutable afterwards."""

    model_config = SettingsConfigDict(env_prefix="LITETOPK_", frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="TCP address to listen on ('' disables TCP)")
    port: int = Field(8471, ge=0, le=65535, description="TCP port (0: pick a free one, printed at start)")
    uds: str = Field(default_factory=default_socket_path,
                     description="Unix socket path; its directory is created 0700 ('' disables)")
    device: str = Field("auto", description="'auto' (cuda:0 when CUDA is available, else cpu), 'cpu' or 'cuda:N'")
    backend: Literal["auto", "reference", "triton", "flydsl"] = Field(
        "auto", description="operator backend; 'auto' picks by device (kernels.operator)")
    queue_size: int = Field(64, ge=1, description="requests waiting for the device worker before 429")
    max_request_bytes: int = Field(16 * 2**20, ge=1024, description="largest request body (413 above)")
    request_timeout_s: float = Field(60.0, gt=0, description="queue wait + device time per request (504 above)")
    json_result_max_bytes: int = Field(
        16 * 2**10, ge=0, description="results larger than this go out binary when the client accepts it")
    retry_after_s: int = Field(1, ge=1, description="Retry-After seconds sent with 429/503")
    region_check_interval_s: float = Field(2.0, gt=0, description="how often regions of dead owners are dropped")
    shutdown_timeout_s: float = Field(30.0, gt=0, description="grace period for in-flight requests at shutdown")
    warmup: bool = Field(True, description="run a tiny warm-up problem before /readyz turns ready")
    fault_delay_s: float = Field(0.0, ge=0, description="fault injection for tests: the worker sleeps this long "
                                 "before each job (0 in production)")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field("info", description="uvicorn log level")

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if value == "auto":
            return value
        try:
            device = torch.device(value)
        except RuntimeError as exc:
            raise ValueError(f"device={value!r} is not a device name; use 'auto', 'cpu' or 'cuda:N'") from exc
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"device={value!r}: only 'cpu' and 'cuda:N' are served")
        return value

    def torch_device(self) -> torch.device:
        """The pinned device: 'auto' resolves to cuda:0 when CUDA is available, else cpu."""
        if self.device == "auto":
            return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", 0)
        return device

    def socket_dir(self) -> Path:
        """Create the Unix socket's directory 0700 (refusing one that another user owns)."""
        directory = Path(self.uds).parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.stat()
        if info.st_uid != os.getuid():
            raise PermissionError(f"{directory} belongs to uid {info.st_uid}, not to this user; choose --uds elsewhere")
        if stat.S_IMODE(info.st_mode) != 0o700:
            directory.chmod(0o700)
        return directory


def parse_cli(argv: list[str] | None = None) -> ServiceSettings:
    """Settings from flags (one per field, `--queue-size` for `queue_size`), then env, then defaults."""
    parser = argparse.ArgumentParser(prog="python -m litetopk.service",
                                     description="GPU-pinned top-k index selection service (litetopk)")
    for name, field in ServiceSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None,
                                help=field.description)
        else:
            parser.add_argument(flag, dest=name, default=None, help=f"{field.description} (env LITETOPK_{name.upper()})")
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    return ServiceSettings(**given)


__all__ = ["ServiceSettings", "default_socket_path", "parse_cli"]
