"""One node's collector: reads every source each interval and hands the snapshot to the outputs.

The exporter sees every scrape; the spool gets every scrape too, or (with `ship_step_s`) one sample
per epoch-aligned window of that many seconds, summarised by `StepSummariser`. A scrape that shows a
failure has happened (faultcast.failure_signs: a critical Xid, a GPU lost, an uncorrectable error, a
port down) ships its window so far at once (as a partial sample, `window_s` 0, which does not close
the step), so the service hears of the failure in seconds rather than at the window's end; the
window's later scrapes ship at its end as usual, and the service's features combine the two as they
would the whole window."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence

from faultcast import wire
from faultcast.collector.source import Source
from faultcast.collector.spool import Spool
from faultcast.collector.summariser import StepSummariser
from faultcast.failure_signs import failure_signs
from faultcast.readings import NodeSnapshot, Reading

log = logging.getLogger(__name__)


class NodeCollector:
    """Scrapes its sources; keeps the latest snapshot for the exporter; spools it for shipping.

    A source that raises is counted and skipped for that scrape: the others still report. A spool
    that cannot store the snapshot (lack of space never raises: the spool drops and counts; this is
    any other storage error) is counted too; the snapshot is still exported, unsequenced.

    `ship_step_s` > 0 spools one sample per window of that many seconds of event time instead of
    every scrape (faultcast.collector.summariser); the window still open is spooled by `flush` and
    `close`. 0 (the default) spools every scrape.
    """

    def __init__(
        self,
        node: str,
        sources: Sequence[Source],
        *,
        spool: Spool | None = None,
        wall_clock_ns: Callable[[], int] = time.time_ns,
        cpu_clock: Callable[[], float] = time.perf_counter,
        ship_step_s: float = 0.0,
    ) -> None:
        if ship_step_s < 0:
            raise ValueError(f"ship_step_s must not be negative, got {ship_step_s}")
        self.node = node
        self.sources = tuple(sources)
        self.spool = spool
        self.wall_clock_ns = wall_clock_ns
        self.cpu_clock = cpu_clock
        self.scrapes = 0
        self.source_errors = 0
        self.spool_errors = 0
        self.scrape_seconds_total = 0.0
        self.scrape_seconds_max = 0.0
        self._latest: NodeSnapshot | None = None
        self.samples_spooled = 0  # samples handed to the spool: every scrape, or one per window
        self.early_windows = 0  # windows shipped before their end because a scrape showed a failure
        self._previous: NodeSnapshot | None = None  # the scrape before, to compare for failure signs
        self.summariser = StepSummariser(ship_step_s) if ship_step_s > 0 and spool is not None else None

    def latest(self) -> NodeSnapshot | None:
        """The last snapshot scraped, or None before the first scrape (the exporter serves it)."""
        return self._latest

    def scrape(self) -> NodeSnapshot:
        """Read every source once, merge, spool (if any) and keep the snapshot; never raises for a source."""
        started = self.cpu_clock()
        now_ns = self.wall_clock_ns()
        readings: list[Reading] = []
        notes: list[str] = []
        for source in self.sources:
            try:
                readings.append(source.read())
            except Exception as exc:  # a broken source must not stop the others
                self.source_errors += 1
                notes.append(f"{source.name}: {exc}")
                log.warning(
                    "source %s failed: %s", source.name, exc, exc_info=log.isEnabledFor(logging.DEBUG)
                )
        elapsed = self.cpu_clock() - started
        gpus = [g for r in readings for g in r.gpus]
        health = {
            "scrape_duration_seconds": elapsed,
            "gpus_present": float(len(gpus)),
            "gpus_lost": float(sum(g.lost for g in gpus)),
            "source_errors": float(self.source_errors),
        }
        if self.spool is not None:
            health |= {
                "spool_depth": float(self.spool.depth),
                "spool_dropped": float(self.spool.dropped),
                "spool_dropped_no_space": float(self.spool.dropped_no_space),
                "spool_errors": float(self.spool_errors),
                "samples_acked": float(self.spool.acked_through),
            }
        snapshot = NodeSnapshot.merge(self.node, now_ns, readings, health, notes)
        if self.summariser is not None:
            closed = self.summariser.add(snapshot)
            if closed is not None:
                self._spool(closed)
            signs = failure_signs(self._previous, snapshot)
            if signs:
                log.warning(
                    "node %s: %s; shipping the window now",
                    self.node,
                    "; ".join(sign.detail for sign in signs),
                )
                self.early_windows += 1
                partial = self.summariser.flush(partial=True)
                if partial is not None:
                    self._spool(partial)
        elif self.spool is not None:
            snapshot = self._spool(snapshot)
        self.scrapes += 1
        self.scrape_seconds_total += elapsed
        self.scrape_seconds_max = max(self.scrape_seconds_max, elapsed)
        self._latest = self._previous = snapshot
        return snapshot

    def _spool(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """Append the sample to the spool; returns it with its sequence (unchanged if the spool failed)."""
        spool = self.spool
        if spool is None:
            return snapshot
        try:
            sequenced = dataclasses.replace(snapshot, sequence=spool.append(wire.to_proto(snapshot)))
        except sqlite3.Error as exc:  # a failing spool must not stop the scrapes or /metrics
            self.spool_errors += 1
            log.warning("spool %s failed, the sample is not spooled: %s", spool.path, exc)
            return snapshot
        if sequenced.sequence:  # 0: the spool could not take it at all (counted there)
            self.samples_spooled += 1
        return sequenced

    def flush(self) -> NodeSnapshot | None:
        """Spool the window still open (when shipping one sample per window); returns its sample."""
        if self.summariser is None:
            return None
        closed = self.summariser.flush()
        return self._spool(closed) if closed is not None else None

    def run(
        self,
        interval: float,
        *,
        stop: threading.Event,
        duration: float | None = None,
        on_scrape: Callable[[NodeSnapshot], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Scrape every `interval` seconds until `stop` is set or `duration` has passed."""
        started = monotonic()
        next_due = started
        while not stop.is_set():
            snapshot = self.scrape()
            if on_scrape is not None:
                on_scrape(snapshot)
            next_due += interval
            now = monotonic()
            if next_due < now:  # a slow scrape: skip the missed ticks rather than bunch them
                next_due = now + interval - (now - next_due) % interval
            if duration is not None and next_due - started > duration + 1e-9:
                return
            stop.wait(next_due - now)

    def close(self) -> None:
        """Spool the window still open (`flush`), then close every source."""
        self.flush()
        for source in self.sources:
            source.close()
