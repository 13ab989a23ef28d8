"""Worker lanes: run a job on a thread of its own, and stop waiting for a call in it that hangs.

A call into C (a driver, the kernel) cannot be interrupted, so a hung call must not be waited for.
A `Lane` runs one job at a time on its own worker thread. The job stamps `lane.started` before each
call it makes; `Deadline.wait` waits for the job only until the call in flight has run `timeout`
seconds, then returns False. The caller then sets `lane.abandoned` and goes on: the job checks that
flag after each call and returns early, while the worker stays inside the hung call. The lane takes
no new job until that call returns (`lane.stuck`), so a lane holds at most one stuck thread and
stuck threads never pile up. Without a timeout a job runs on the calling thread, through the same
code, so the two modes cannot drift apart.

Nothing here knows about NVML. One hand-off per job, not per call: a hand-off costs 15-30 us of
CPU, which per NVML call would be 14-28 ms per scrape (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Callable, Iterable

logger = logging.getLogger(__name__)

Job = Callable[[], object]


class Lane:
    """One worker thread that runs one job at a time; the caller may stop waiting for it.

    `busy` is held from `submit` until the job is over. What the caller may rely on: `result` is
    the job's return value once `wait_idle` is True; `started` is when the job's call in flight
    began (the job stamps it); `partial` is whatever the job chose to publish so far (kept if the
    caller stops waiting); after `abandoned` is set, the job is expected to return at its next
    check, and `returned_after` then says how long the abandoned call took. A bare lock, not an
    Event, signals the end of a job: its acquire and release are single C calls, which made the
    hand-off about 4x cheaper in a one-off scratch measurement.
    """

    __slots__ = (
        "abandoned",
        "busy",
        "jobs",
        "name",
        "partial",
        "result",
        "returned_after",
        "started",
        "stuck_call",
        "submitted",
        "thread",
        "thread_name",
    )

    def __init__(self, name: str, *, thread_name: str | None = None) -> None:
        self.name = name
        self.thread_name = thread_name or f"lane-{name}"
        self.jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.busy = threading.Lock()  # released by the worker, whichever thread took it
        self.thread: threading.Thread | None = None  # started on the first job
        self.result: object = None
        self.submitted = 0.0  # when the job was handed over (the caller's clock)
        self.started = 0.0  # when the call in flight began
        self.abandoned = False
        self.partial: list[object] | None = None  # the job's results so far, for a partial answer
        self.stuck_call = ""  # what the abandoned job was doing, for the caller's log lines
        self.returned_after = math.nan  # how long the abandoned call took, once it returned

    @property
    def stuck(self) -> bool:
        """Whether the caller gave up on the job and it has not returned yet."""
        return self.abandoned and self.busy.locked()

    def wait_idle(self, timeout: float | None) -> bool:
        """Whether the job is over within `timeout` seconds (0: right now; None: no limit)."""
        limit = -1.0 if timeout is None else min(max(timeout, 0.0), threading.TIMEOUT_MAX)
        if self.busy.acquire(timeout=limit):
            self.busy.release()
            return True
        return False

    def submit(self, job: Job, now: float, *, threaded: bool) -> None:
        """Start `job` (on the worker if `threaded`, else right here); `now` stamps it.

        Raises RuntimeError if the lane is still busy: check `stuck` or `wait_idle` first.
        """
        self.result = self.partial = None
        self.abandoned = False
        self.returned_after = math.nan
        self.submitted = self.started = now
        if not self.busy.acquire(blocking=False):
            raise RuntimeError(f"lane {self.name} got a job while busy")
        if not threaded:
            self._run(job)
            return
        if self.thread is None:
            self.thread = threading.Thread(target=self._serve, name=self.thread_name, daemon=True)
            self.thread.start()
        self.jobs.put(job)

    def _serve(self) -> None:
        jobs = self.jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            self._run(job)
            job = None  # hold no reference to the job's owner between jobs (it is finalised by GC)

    def _run(self, job: Job) -> None:
        try:
            self.result = job()
        except Exception:  # jobs catch their own; this keeps the worker alive whatever happens
            logger.exception("worker %s failed unexpectedly", self.thread_name)
        finally:
            self.busy.release()

    def stop(self) -> None:
        """Let the worker end once its job (a stuck call included) is over."""
        if self.thread is not None:
            self.jobs.put(None)
            self.thread = None


def stop_lanes(lanes: Iterable[Lane]) -> None:
    """Stop every lane's worker (each ends once its job is over); safe as a GC finaliser."""
    for lane in lanes:
        lane.stop()


class Deadline:
    """How long one call in a lane may run before the caller stops waiting, measured on `clock`.

    `timeout=None` runs jobs on the calling thread, unbounded. `clock` gives monotonic seconds; the
    job must stamp `lane.started` with the same clock.
    """

    __slots__ = ("clock", "threaded", "timeout")

    def __init__(self, timeout: float | None, clock: Callable[[], float]) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"a call timeout must be positive seconds or None, not {timeout!r}")
        self.timeout = timeout
        self.clock = clock
        # Whether jobs run on the lanes' worker threads (only then can a hung call be left).
        self.threaded = timeout is not None

    def start(self, lane: Lane, job: Job) -> None:
        """Hand `job` to `lane` now."""
        lane.submit(job, self.clock(), threaded=self.threaded)

    def wait(self, lane: Lane) -> bool:
        """Whether the lane's job finished before its call in flight ran `timeout` seconds."""
        clock, timeout = self.clock, self.timeout
        if timeout is None:
            return True  # the job ran on this thread
        while True:
            # The job restamps `started` per call, so the deadline moves on with the calls.
            remaining = lane.started + timeout - clock()
            if lane.wait_idle(remaining):
                return True
            if remaining <= 0.0:
                return False
