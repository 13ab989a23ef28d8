"""The NVML binding as the collector sees it: loading it, the codes it acts on, and whether NVML works.

The binding is injected everywhere (`pynvml` by default, `FakeNvml` in tests and benches), so every
part of the NVML source runs without a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

# One logger for every part of the NVML source, under the name it had as one module, so that an
# operator's logging configuration for "faultcast.collector.nvml.source" still covers all of it.
logger = logging.getLogger("faultcast.collector.nvml.source")

# pynvml ships no type hints (mypy sees it as Any); its handles and results are ctypes objects.
# `Nvml` names the binding module, or a stand-in such as FakeNvml, wherever it is passed around.
Nvml = Any


class NvmlUnavailable(RuntimeError):  # noqa: N818  (the CLI's name; "unavailable" reads as the error)
    """NVML cannot be used on this machine: no library, no driver, or no GPU."""


def load(nvml: Nvml | None) -> Nvml:
    """`nvml` itself, or the `pynvml` module when None; NvmlUnavailable if it is not installed."""
    if nvml is not None:
        return nvml
    try:
        import pynvml  # imported lazily: the package imports fine on machines without a driver
    except ImportError as err:
        raise NvmlUnavailable(
            "cannot use NVML: the nvidia-ml-py package (module pynvml) is not installed"
        ) from err
    return pynvml


def explain(nvml: Nvml, err: object) -> str:
    """A sentence an operator can act on, for an NVMLError raised while starting NVML."""
    code = getattr(err, "value", None)
    reasons = {
        nvml.NVML_ERROR_LIBRARY_NOT_FOUND: "the NVML library (libnvidia-ml.so.1) was not found: "
        "the NVIDIA driver is not installed or not mounted into this container",
        nvml.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
        nvml.NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices (/dev/nvidia*)",
        nvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "the NVML library and the kernel driver versions "
        "differ: reload the driver or reboot",
    }
    return reasons.get(code, f"NVML failed to start: {err}")


def nvml_available(nvml: Nvml | None = None) -> tuple[bool, str]:
    """Whether NVML loads and sees at least one GPU; the string says why not (or what it saw).

    Starts and shuts NVML down again; used by `--source auto` to choose a source.
    """
    try:
        lib = load(nvml)
    except NvmlUnavailable as err:
        return False, str(err)
    try:
        lib.nvmlInit()
    except lib.NVMLError as err:
        return False, explain(lib, err)
    try:
        count = int(lib.nvmlDeviceGetCount())
    except lib.NVMLError as err:
        return False, f"NVML started but could not count GPUs: {err}"
    finally:
        try:
            lib.nvmlShutdown()
        except lib.NVMLError as err:
            logger.debug("nvmlShutdown failed: %s", err)
    if count == 0:
        return False, "NVML started but found no GPU"
    return True, f"NVML sees {count} GPU(s)"


@dataclass(frozen=True, slots=True)
class NvmlCodes:
    """The binding's exception class and the return codes the source treats specially."""

    error: Any  # pynvml.NVMLError, the binding's (untyped) exception root; its .value is the code
    # Permanent absences: the GPU lacks the field, or an older driver lacks the function.
    unsupported: frozenset[int]
    gpu_is_lost: int
    timeout: int  # what nvmlEventSetWait raises on an empty queue
    success: int
    xid_event: int  # the event type mask of Xid critical errors

    @classmethod
    def of(cls, lib: Nvml) -> NvmlCodes:
        """The codes as `lib` defines them."""
        return cls(
            error=lib.NVMLError,
            unsupported=frozenset({lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_FUNCTION_NOT_FOUND}),
            gpu_is_lost=lib.NVML_ERROR_GPU_IS_LOST,
            timeout=lib.NVML_ERROR_TIMEOUT,
            success=lib.NVML_SUCCESS,
            xid_event=lib.nvmlEventTypeXidCriticalError,
        )


def as_text(value: object) -> str:
    """A string the binding returned, as text (pynvml hands some C strings back as bytes)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Notes:
    """What went wrong while opening NVML: each note is logged once as a warning and kept."""

    def __init__(self) -> None:
        self._texts: list[str] = []

    def add(self, message: str, *args: object) -> None:
        """Log `message % args` as a warning and keep its text."""
        logger.warning(message, *args)
        self._texts.append(message % args)

    @property
    def texts(self) -> tuple[str, ...]:
        """Every note so far, oldest first."""
        return tuple(self._texts)
