"""The interface every collector source implements."""

from __future__ import annotations

from typing import Protocol

from faultcast.readings import Reading


class Source(Protocol):
    """A source of readings: NVML, the network stack, or the simulated fleet.

    `read` must not raise for a single bad device or file: it reports what it could read
    (missing values as NaN) and keeps going. It may raise only when the whole source is
    unusable, and the collector then counts a source error and carries on with the others.
    """

    name: str

    def read(self) -> Reading:
        """Everything the source can read now; missing values are NaN."""
        ...

    def close(self) -> None:
        """Release what the source holds (handles, threads); `read` is not called after."""
        ...
