"""Background threads that outlive their own errors.

A service thread (scoring, saving cursors) that died on an exception used to leave the service
SERVING with that part of it gone for good. A supervised thread logs the traceback, counts the
restart (faultcast_thread_restarts_total{thread}) and runs its loop again after a backoff, until the
service stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

# The wait before the first restart, doubling after each death up to the most.
RESTART_BACKOFF_S = (0.1, 10.0)


def start_supervised(
    name: str,
    loop: Callable[[], None],
    stopping: threading.Event,
    on_restart: Callable[[str], None],
    backoff_s: tuple[float, float] = RESTART_BACKOFF_S,
) -> threading.Thread:
    """Run `loop` (which returns once `stopping` is set) on a daemon thread named faultcast-`name`,
    restarting it whenever it raises; `on_restart(name)` is called at each restart."""

    def supervise() -> None:
        delay_s = backoff_s[0]
        while not stopping.is_set():
            try:
                loop()
                return
            except Exception:
                log.exception("the %s thread died; restarting it in %.1f s", name, delay_s)
                on_restart(name)
                if stopping.wait(delay_s):
                    return
                delay_s = min(2 * delay_s, backoff_s[1])

    thread = threading.Thread(target=supervise, name=f"faultcast-{name}", daemon=True)
    thread.start()
    return thread
