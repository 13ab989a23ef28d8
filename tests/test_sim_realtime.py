"""The simulated collector never stamps a sample ahead of the wall clock: faster than real time it
starts in the past, catches up, then runs at real time, so a service with default limits takes every
sample. Checked on a controlled clock, and with real `faultcast collect` processes pushing to a real
service started with the default clock-skew and sample-age limits."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from faultcast.readings import Reading
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.realtime import SimulatedSource

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))
S = 10**9
T0 = 1_800_000_000 * S  # the controlled wall clock's start, a whole second


def _time(reading: Reading) -> int:
    assert reading.time_unix_nano is not None  # the twin stamps its own samples
    return reading.time_unix_nano


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self, now_ns: int) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += round(seconds * S)


def test_a_twin_ahead_of_real_time_starts_in_the_past_catches_up_and_then_waits_for_the_clock() -> None:
    clock = Clock(T0)
    source = SimulatedSource(gpus=2, seed=3, cadence_s=60.0, backfill_s=180.0, wall_clock_ns=clock)
    offline = TwinSource(
        FleetConfig(
            nodes=8, gpus_per_node=2, days=365.0, cadence_s=60.0, seed=3, start_unix_s=(T0 - 180 * S) // S
        )
    )
    stamps: list[tuple[int, int]] = []  # (sample time, wall clock at the read)
    twin_steps: list[Reading] = []
    for _ in range(4):  # the backfill: one twin step per read, as fast as the collector reads
        reading = source.read()
        stamps.append((_time(reading), clock()))
        twin_steps.append(reading)
        clock.advance(0.25)
    assert [t for t, _ in stamps] == [T0 + k * 60 * S for k in (-3, -2, -1, 0)]
    assert not source.real_time
    for _ in range(3):  # caught up: the latest sample again, stamped now, until the next is due
        held = source.read()
        stamps.append((_time(held), clock()))
        assert [g.values for g in held.gpus] == [g.values for g in twin_steps[-1].gpus]
        clock.advance(0.25)
    assert source.real_time
    clock.advance(60.0)
    reading = source.read()  # due now: the twin's next step, at its own time
    stamps.append((_time(reading), clock()))
    twin_steps.append(reading)
    assert reading.time_unix_nano == T0 + 60 * S
    # Never ahead of the wall clock, never backwards.
    assert all(stamp <= now for stamp, now in stamps)
    assert [s for s, _ in stamps] == sorted(s for s, _ in stamps)
    # The twin's steps are still the offline twin's, sample for sample.
    for step in twin_steps:
        expected = offline.read()
        assert step.time_unix_nano == expected.time_unix_nano
        np.testing.assert_array_equal([g.values for g in step.gpus], [g.values for g in expected.gpus])


def test_a_start_ahead_of_the_wall_clock_is_refused() -> None:
    clock = Clock(T0)
    with pytest.raises(ValueError, match="ahead of the wall clock"):
        SimulatedSource(gpus=1, start_unix_nano=T0 + 10 * S, wall_clock_ns=clock)
    SimulatedSource(gpus=1, start_unix_nano=T0, wall_clock_ns=clock)  # now itself is fine


def _collect(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FAULTCAST, "collect", "--source", "simulated", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _first_sample_s(*args: str) -> tuple[float, float, float]:
    """(wall clock before, first sample's time, wall clock after) of `collect --once`, in seconds."""
    before = time.time()
    done = _collect("--gpus", "1", "--once", "--format", "json", *args)
    assert done.returncode == 0, done.stderr
    return before, json.loads(done.stdout)["time_unix_nano"] / S, time.time()


def test_collect_starts_a_fast_twin_hours_back_by_default_and_keeps_sim_start() -> None:
    # The default backfill at speed > 1: 4 h, under a default service's 6 h sample age.
    before, first, after = _first_sample_s("--speed", "240")
    assert before - 4 * 3600 - 1 <= first <= after - 4 * 3600
    before, first, after = _first_sample_s()  # speed 1: from now
    assert before - 1 <= first <= after
    before, first, after = _first_sample_s("--speed", "60", "--sim-backfill", "30m")
    assert before - 1800 - 1 <= first <= after - 1800
    _, first, _ = _first_sample_s("--speed", "240", "--sim-start", "1767571200")
    assert first == 1767571200


def test_collect_refuses_a_start_in_the_future_and_contradicting_flags() -> None:
    future = _collect("--once", "--sim-start", str(int(time.time()) + 3600))
    assert future.returncode == 2
    assert "ahead of the wall clock" in future.stderr
    both = _collect("--once", "--sim-start", "1767571200", "--sim-backfill", "1h")
    assert both.returncode == 2
    assert "not both" in both.stderr


# -- real collectors, a real service with default limits ---------------------------------------


@pytest.fixture(scope="module")
def service(service_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, int]]:
    service = Service.open(service_model, tmp_path_factory.mktemp("state"))  # default limits
    assert (service.limits.max_future_s, service.limits.max_age_s) == (
        Limits().max_future_s,
        Limits().max_age_s,
    )
    port = service.start("127.0.0.1:0")
    yield service, port
    service.stop(0)


def _ingest(service: Service) -> dict[str, float]:
    """The service's ingest counters: node samples taken, and refusals by reason."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(service.metrics.registry).decode()):
        for sample in family.samples:
            if sample.name == "faultcast_ingest_node_samples_total":
                out["taken"] = sample.value
            elif sample.name == "faultcast_ingest_rejects_total" and sample.value:
                out[sample.labels["reason"]] = sample.value
    return out


def _push(port: int, node: str, spool: Path, *extra: str) -> tuple[int, int]:
    """Run a collector at 240x real time until it exits; its scrapes and the samples it shipped (all
    acknowledged): one per minute of event time (the default --ship-step)."""
    done = _collect(
        "--node",
        node,
        "--speed",
        "240",
        "--interval",
        "250ms",
        "--no-prometheus",
        "--duration",
        "4s",
        "--service",
        f"127.0.0.1:{port}",
        "--insecure",
        "--spool",
        str(spool),
        *extra,
    )
    assert done.returncode == 0, done.stderr
    summary = done.stdout[done.stdout.index("summary") :]
    scrapes = int(summary.split("scrapes ")[1].split()[0])
    samples = int(summary.split("samples spooled ")[1].split()[0])
    assert f"acked through {samples}, spool depth 0" in summary, summary
    return scrapes, samples


def test_a_collector_at_240x_is_taken_whole_by_a_service_with_default_limits(
    service: tuple[Service, int], tmp_path: Path
) -> None:
    svc, port = service
    before = _ingest(svc)
    scrapes, samples = _push(port, "live-default", tmp_path / "spool.sqlite")
    after = _ingest(svc)
    # 16 scrapes of a minute each: 16 simulated minutes in 4 s, which today's start at "now" would
    # stamp up to 15 minutes ahead of the service's clock (refused past 5). Each is a window of its
    # own, so each is shipped.
    assert scrapes >= 10
    assert samples == scrapes
    assert after["taken"] - before.get("taken", 0.0) == samples
    assert {k: v for k, v in after.items() if k != "taken"} == {
        k: v for k, v in before.items() if k != "taken"
    }
    assert svc.latest_event_s <= time.time()


def test_a_twin_that_catches_up_goes_on_at_real_time_and_is_still_taken_whole(
    service: tuple[Service, int], tmp_path: Path
) -> None:
    svc, port = service
    before = _ingest(svc)
    scrapes, samples = _push(port, "live-caught-up", tmp_path / "spool.sqlite", "--sim-backfill", "2m")
    after = _ingest(svc)
    # Two minutes of backfill take two scrapes (a window each); the rest, at real time, share the
    # minutes of the wall clock they fall in: every window's sample is taken.
    assert 3 <= samples < scrapes
    assert after["taken"] - before.get("taken", 0.0) == samples
    assert {k: v for k, v in after.items() if k != "taken"} == {
        k: v for k, v in before.items() if k != "taken"
    }
    # Two minutes of backfill take two scrapes; the rest ran at real time, stamped by the wall clock.
    assert time.time() - 10 < svc.latest_event_s <= time.time()
