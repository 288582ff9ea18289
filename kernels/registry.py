"""The backend registry: which ScoringBackend serves a call, and the device guard every call runs in.

Layer: public face, its lowest module (ops.py runs the operator with it; graphs.py and workspace.py
take their backends from it; operator.py re-exports BACKEND_NAMES, get_backend and resolve_backend).
It loads each backend on first use, lazily, so that a backend's toolchain is imported only when it
is asked for:

    BACKEND_NAMES          "auto", "reference", "triton", "flydsl"
    get_backend(name, d)   the shared instance of a backend, checked to run on device d
    new_backend(name, d)   a fresh instance (workspace sizing: its cached operands go with it)
    backend_instance(...)  a block in which one name runs a given instance (probes, test fixtures)
    resolve_backend(...)   the name "auto" stands for on a device (what the service reports)
    on_device(d, backend)  the device made current; foreign failures -> DeviceError

"auto" picks by the inputs' device: a CUDA (NVIDIA) device -> "triton", a ROCm gfx950 device ->
"flydsl", anything else -> "reference". A backend that cannot run raises BackendUnavailableError; no
request is ever served by another backend than the one asked for.
"""

from __future__ import annotations

import contextlib

import torch

from .backend import ScoringBackend
from .devices import is_cuda, is_gfx950
from .errors import DeviceError, InputError, LiteTopKError

BACKEND_NAMES = ("auto", "reference", "triton", "flydsl")


def _load_backend(name: str) -> ScoringBackend:
    if name == "reference":
        from .reference import ReferenceBackend

        return ReferenceBackend()
    if name == "triton":
        from .triton import TritonBackend

        return TritonBackend()
    if name == "flydsl":
        from .flydsl import FlyDSLBackend

        return FlyDSLBackend()
    raise InputError(f"backend={name!r} is not known; choose one of {BACKEND_NAMES}")


_BACKENDS: dict[str, ScoringBackend] = {}


def _resolve(name: str, device: torch.device) -> str:
    if name == "auto":
        return "triton" if is_cuda(device) else "flydsl" if is_gfx950(device) else "reference"
    return name


@contextlib.contextmanager
def backend_instance(name: str, backend: ScoringBackend):
    """Inside the block, calls with backend=`name` ("auto" resolving to it included) run `backend` (e.g.
    TritonBackend(paged="never"): one mode of a backend for a probe or a benchmark); the previous
    instance is back afterwards, whatever happens inside. Not thread-safe (the registry is global)."""
    had, previous = name in _BACKENDS, _BACKENDS.get(name)
    _BACKENDS[name] = backend
    try:
        yield backend
    finally:
        if had:
            _BACKENDS[name] = previous
        else:
            _BACKENDS.pop(name, None)


def get_backend(name: str, device: torch.device) -> ScoringBackend:
    """The backend `name` ("auto" resolved for `device`), checked to run on `device`."""
    name = _resolve(name, device)
    if name not in _BACKENDS:
        _BACKENDS[name] = _load_backend(name)
    backend = _BACKENDS[name]
    backend.check_device(device)
    return backend


def new_backend(name: str, device: torch.device) -> ScoringBackend:
    """A new instance of the backend `name` ("auto" resolved for `device`), checked to run on `device`
    (workspace sizing: its cached operands go with it, not with the shared instance)."""
    backend = _load_backend(_resolve(name, device))
    backend.check_device(device)
    return backend


def resolve_backend(name: str, device: torch.device) -> str:
    """The backend name `name` stands for on `device` ("auto" resolved), checked to run there.

    Parameters
    ----------
    name : str
        One of BACKEND_NAMES.
    device : torch.device
        The device the calls will run on.

    Returns
    -------
    str
        "reference", "triton" or "flydsl": what a service reports as the backend it serves with.
        Raises BackendUnavailableError where that backend cannot run on `device`.

    Example
    -------
    >>> resolve_backend("auto", torch.device("cpu"))
    'reference'
    """
    return get_backend(name, device).name


@contextlib.contextmanager
def on_device(device: torch.device, backend: ScoringBackend):
    """Make `device` current and translate foreign failures into DeviceError."""
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    try:
        with guard:
            yield
    except LiteTopKError:
        raise
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        raise DeviceError(f"the {backend.name} backend failed on {device}: {exc}") from exc


__all__ = ["BACKEND_NAMES", "backend_instance", "get_backend", "new_backend", "on_device", "resolve_backend"]
