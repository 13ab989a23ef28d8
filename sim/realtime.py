"""The collector's simulated source: one node of the fleet twin (faultcast.sim), read live.

It lets everything run without a GPU: `faultcast collect --source simulated`, the demo and the
tests. Each read advances the twin's virtual clock by `cadence_s` seconds of simulated time;
`faultcast collect --speed 60` scrapes every second with a minute of simulated time per scrape.

A sample is never stamped ahead of the wall clock, so that a service with the default clock-skew
check takes it. A twin run faster than real time therefore starts in the past (`backfill_s`, or
an explicit start) and catches up; from then on it runs at real time: a read before the next
sample is due returns the latest sample again, stamped now, as a real GPU read twice between two
changes would.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable

from faultcast.readings import Reading
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.sim.world import World

log = logging.getLogger(__name__)

# A live twin runs for at most this long; its schedule is drawn for the whole of it up front.
LIVE_HORIZON_DAYS = 365.0


class SimulatedSource(TwinSource):
    """One twin node on a virtual clock that never runs ahead of `wall_clock_ns`.

    The twin's time starts at `start_unix_nano`, or `backfill_s` seconds before now when that is
    None; a start ahead of the wall clock raises ValueError.
    """

    def __init__(
        self,
        *,
        gpus: int = 8,
        seed: int = 0,
        cadence_s: float = 1.0,
        start_unix_nano: int | None = None,
        backfill_s: float = 0.0,
        sim_node: int = 0,
        acceleration: float = 1.0,
        scenarios: Iterable[Scenario] = (),
        days: float = LIVE_HORIZON_DAYS,
        world: World | None = None,
        wall_clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if backfill_s < 0:
            raise ValueError(f"the backfill must be zero or more seconds, not {backfill_s}")
        now_ns = wall_clock_ns()
        start_ns = now_ns - round(backfill_s * 1e9) if start_unix_nano is None else start_unix_nano
        if start_ns > now_ns:
            raise ValueError(
                f"the twin's start is {(start_ns - now_ns) / 1e9:.0f} s ahead of the wall clock: its samples "
                "would be stamped in the future"
            )
        config = FleetConfig(
            nodes=max(sim_node + 1, 8),
            gpus_per_node=gpus,
            days=days,
            cadence_s=cadence_s,
            seed=seed,
            acceleration=acceleration,
            start_unix_s=int(start_ns // 10**9),
            world=World() if world is None else world,
        )
        super().__init__(config, sim_node, scenarios)
        self.wall_clock_ns = wall_clock_ns
        self._latest: Reading | None = None
        self._real_time = False

    @property
    def real_time(self) -> bool:
        """Whether the twin has caught up with the wall clock (and now waits for it)."""
        return self._real_time

    def next_due_unix_nano(self) -> int:
        """The time stamp of the twin's next sample."""
        return self.config.start_unix_s * 10**9 + round(self.virtual_time_s * 1e9)

    def read(self) -> Reading:
        """The twin's next sample once the wall clock has reached its time, else the latest again, stamped now."""
        now_ns = self.wall_clock_ns()
        if self._latest is not None and self.next_due_unix_nano() > now_ns:
            if not self._real_time:
                self._real_time = True
                log.info(
                    "the twin caught up with the wall clock: it runs at real time from now on, one sample "
                    "every %g s (the latest is read again in between)",
                    self.config.cadence_s,
                )
            return dataclasses.replace(self._latest, time_unix_nano=now_ns)
        self._latest = super().read()
        return self._latest
