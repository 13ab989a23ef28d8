"""One call per world, run where the work is: in this process, in a pool of local processes, or on a
Dask cluster.

Training replays every world through the features, and each world's replay is independent of the
others': the natural unit to spread. A Dask client (`faultcast train --dask-scheduler`, a
LocalCluster in the tests) runs the calls on its workers, so a user with many machines trains on
hundreds of worlds with the same command; without one, `jobs` local processes share the machine's
cores. Results come back in the order of the calls whatever finished first, so the outcome is the
same however the work was spread.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

Result = TypeVar("Result")


def map_worlds(
    function: Callable[..., Result],
    calls: Sequence[tuple[Any, ...]],
    *,
    jobs: int = 1,
    client: Any = None,
) -> list[Result]:
    """`function(*args)` for each of `calls`, in their order: on the Dask `client`'s workers when
    given, else in `jobs` local processes (spawned: a forked child would inherit the parent's
    threads' locks), else here. `function` must be importable by name (a module's top level)."""
    if client is not None:
        futures = [client.submit(function, *args, pure=False) for args in calls]
        gathered: list[Result] = client.gather(futures)
        return gathered
    if jobs <= 1 or len(calls) <= 1:
        return [function(*args) for args in calls]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(calls)), mp_context=context) as pool:
        futures = [pool.submit(function, *args) for args in calls]
        return [future.result() for future in futures]
