"""The errors of `litetopk.kernels`, as one tree.

Layer: types, at the bottom of `litetopk.kernels` (imports nothing of the package).

    LiteTopKError                      base of everything this package raises on purpose
    ├── InputError (ValueError)        a tensor has the wrong dtype, shape, device or layout, or an
    │   │                              argument is out of its range; raised before any device work
    │   ├── InputDtypeError            a tensor argument has a dtype the operator does not take
    │   ├── InputShapeError            a tensor argument has the wrong rank or extent
    │   └── UnsupportedTopKError       `topk` is not in SUPPORTED_TOPK
    ├── RowFaultError                  one or more rows cannot be answered: bad batch index or window
    │   │                              (INVALID_ROW), a live page id outside the cache
    │   │                              (INVALID_PAGE), a NaN/inf weight or score (NONFINITE), or a
    │   │                              capacity event with repair=False; carries the rows and flags
    │   │                              (raised by `TopKResult.raise_for_status`)
    ├── BackendUnavailableError        the requested backend cannot run here (missing package, wrong
    │   (RuntimeError)                 device); never answered by silently using another backend
    └── DeviceError (RuntimeError)     a device or compiler failure, translated at the backend seam

The service maps this tree to problem+json codes in one place (`litetopk.service.errors`).
"""

from __future__ import annotations

from collections.abc import Sequence


class LiteTopKError(Exception):
    """Base class of every error `litetopk.kernels` raises on purpose."""


class InputError(LiteTopKError, ValueError):
    """An argument is malformed (dtype, shape, device, layout or range); says what to change."""


class InputDtypeError(InputError):
    """A tensor argument has a dtype the operator does not take (the message names the allowed ones)."""


class InputShapeError(InputError):
    """A tensor argument has the wrong rank or extent (the message names the expected shape)."""


class UnsupportedTopKError(InputError):
    """`topk` is not one of SUPPORTED_TOPK."""


class RowFaultError(LiteTopKError):
    """Rows that published nothing, with the status flags that say why.

    `rows` and `flags` are parallel lists of row indices and their status bit sets.
    """

    def __init__(self, message: str, rows: Sequence[int], flags: Sequence[int]):
        super().__init__(message)
        self.rows = [int(r) for r in rows]
        self.flags = [int(f) for f in flags]


class BackendUnavailableError(LiteTopKError, RuntimeError):
    """The requested backend cannot run on this machine or for these inputs."""


class DeviceError(LiteTopKError, RuntimeError):
    """A device, driver or compiler failure, raised from the foreign exception."""
