"""A node's twin telemetry with an HBM precursor, pushed to a real service over gRPC a few samples at
a time and scored at once, so a test can stop at the first alert (or the first of a kind)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc

from faultcast.demo.feed import push, twin_snapshots
from faultcast.service.server import Service
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.v1 import alerts_pb2 as apb

FLEET = FleetConfig(nodes=4, days=1.0, seed=77, acceleration=1.0)
TWIN_NODE, GPU, FAIL_S = 2, 3, 10 * 3600.0
QUIET = int((FAIL_S - 60 * 60) / FLEET.cadence_s)  # an hour before the failure: no precursor yet
LAST = int((FAIL_S - 5 * 60) / FLEET.cadence_s)  # five minutes before it


class Feed:
    """The twin node's samples under the name `node`, pushed one stream at a time and scored at once."""

    def __init__(self, service: Service, target: str, node: str) -> None:
        self.service, self.target, self.node, self.sent = service, target, node, 0
        self.source = TwinSource(FLEET, TWIN_NODE, [Scenario("hbm_wear", TWIN_NODE, GPU, FAIL_S, 40 * 60.0)])

    def until(self, count: int) -> None:
        """Push samples up to number `count`, then score."""
        with grpc.insecure_channel(self.target) as channel:
            snapshots = twin_snapshots(self.source, self.node, count - self.sent, self.sent + 1)
            acks = push(channel, self.node, snapshots)
        assert acks[-1].acked_through == count
        self.sent = count
        self.service.score_now()

    def until_alert(self, done: Callable[[Sequence[apb.Alert]], bool]) -> list[apb.Alert]:
        """Push sample by sample until `done(active alerts)`; the events stored meanwhile."""
        first = self.service.store.alerts.last_id
        while not done(self.service.book.active()):
            assert self.sent < LAST, "the precursor reached its end first"
            self.until(self.sent + 1)
        return self.service.store.alerts.read_after(first)
