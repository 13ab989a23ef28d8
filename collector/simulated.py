"""The collector's simulated source: one node of the fleet twin (faultcast.sim), read live.

It lets everything run without a GPU: `faultcast collect --source simulated`, the demo and the
tests. Each read advances the twin's virtual clock by `interval` seconds of simulated time;
`faultcast collect --speed 60` scrapes every second with a minute of simulated time per scrape.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario

# A live twin runs for at most this long; its schedule is drawn for the whole of it up front.
LIVE_HORIZON_DAYS = 365.0


class SimulatedSource(TwinSource):
    def __init__(
        self,
        *,
        gpus: int = 8,
        seed: int = 0,
        interval: float = 1.0,
        start_unix_nano: int | None = None,
        sim_node: int = 0,
        acceleration: float = 1.0,
        scenarios: Iterable[Scenario] = (),
        days: float = LIVE_HORIZON_DAYS,
    ) -> None:
        start_s = (time.time_ns() if start_unix_nano is None else start_unix_nano) // 10**9
        config = FleetConfig(
            nodes=max(sim_node + 1, 8),
            gpus_per_node=gpus,
            days=days,
            interval_s=interval,
            seed=seed,
            acceleration=acceleration,
            start_unix_s=int(start_s),
        )
        super().__init__(config, sim_node, scenarios)
