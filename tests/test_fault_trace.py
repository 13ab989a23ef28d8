"""The shipped InfiniteHBD fault trace and its statistics, checked against the source's own counts and
against figures computed a second, plainer way from the raw events."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import fault_trace as fault_trace_bench
from bench import trace_replay as trace_replay_bench
from faultcast.sim.fault_trace import (
    FLEET_SERVERS,
    STATISTICS_FILE,
    FaultTrace,
    load_trace,
    negative_binomial_k,
    negative_binomial_loglik,
    parse_events,
    trace_file,
    trace_statistics,
)

TRACES = Path(__file__).resolve().parent.parent / "sim" / "traces"
# The source repository's fault_trace.json at 7aacdc8 (sim/traces/README.md).
SOURCE_SHA256 = "5871b881b341c9526223c025eda3a9bd2f0f875cf8d53441688ccd953e11b80d"


@pytest.fixture(scope="module")
def events() -> list[dict[str, Any]]:
    raw: list[dict[str, Any]] = json.loads((TRACES / "infinitehbd_faults.json").read_text(encoding="utf-8"))
    return raw


@pytest.fixture(scope="module")
def trace() -> FaultTrace:
    return load_trace()


def test_the_shipped_file_is_the_sources_byte_for_byte() -> None:
    data = trace_file().read_bytes()
    assert hashlib.sha256(data).hexdigest() == SOURCE_SHA256
    assert data == (TRACES / "infinitehbd_faults.json").read_bytes()
    assert "Apache License" in trace_file("LICENSE-infinitehbd").read_text(encoding="utf-8")


def test_the_data_is_found_beside_the_source_without_package_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without package data (a strict editable install before pyproject declares it), the file beside the
    module's source is read."""

    class Empty:
        def __truediv__(self, _name: str) -> Empty:
            return self

        def is_file(self) -> bool:
            return False

    monkeypatch.setattr("importlib.resources.files", lambda _package: Empty())
    assert trace_file().read_bytes() == (TRACES / "infinitehbd_faults.json").read_bytes()
    with pytest.raises(FileNotFoundError):
        trace_file("no-such-trace.json")


def test_faults_as_the_source_describes_them(trace: FaultTrace) -> None:
    """584 faults on 231 of 400 servers (the source's README), each ending no earlier than it starts."""
    assert len(trace.faults) == 584
    assert trace.servers_with_faults() == 231
    assert trace.fleet_servers == FLEET_SERVERS
    assert all(f.end_day >= f.start_day for f in trace.faults)
    starts = [f.start_day for f in trace.faults]
    assert starts == sorted(starts)


def test_fault_types_match_the_sources_own_counts(trace: FaultTrace) -> None:
    """fault_statistics.json counts faults by Level, Class and Desc: the paired faults agree with it."""
    table = json.loads(trace_file(STATISTICS_FILE).read_text(encoding="utf-8"))
    expected = Counter(
        {
            (level, component, desc): count
            for level, classes in table.items()
            for component, descs in classes.items()
            if component != "LevelTotal"
            for desc, count in descs.items()
            if desc != "ClassTotal"
        }
    )
    assert Counter((f.level, f.component, f.description) for f in trace.faults) == expected


def test_statistics_agree_with_plain_recomputation(trace: FaultTrace, events: list[dict[str, Any]]) -> None:
    s = trace_statistics(trace)
    starts = [e for e in events if e["event_type"] == "fault_start"]
    ends = [e for e in events if e["event_type"] == "fault_end"]
    assert s.faults == len(starts) == len(ends)

    # Concentration: fault_start events per node_id, the 40 busiest of 400 servers.
    per_node = sorted(Counter(e["node_id"] for e in starts).values(), reverse=True)
    assert s.top_servers == 40
    assert s.top_share == pytest.approx(sum(per_node[:40]) / len(starts))

    # The mean repair needs no pairing: every start is paid back by one end.
    total_hours = 24 * (sum(e["event_time"] for e in ends) - sum(e["event_time"] for e in starts))
    assert s.repair_mean_hours == pytest.approx(total_hours / len(starts))

    # Bursts, in whole ticks of the trace's resolution (1e-4 day = 8.64 s): 60 s is 6 ticks and some.
    ticks = sorted(round(e["event_time"] * 10_000) for e in starts)
    after_another = sum(1 for a, b in itertools.pairwise(ticks) if (b - a) * 8.64 <= 60)
    assert s.faults_after_another == after_another

    # Recurrence, by brute force: another start on the same node in (start, start + 7 days].
    followed = sum(
        any(
            o["node_id"] == e["node_id"] and 0 < round((o["event_time"] - e["event_time"]) * 10_000) <= 70_000
            for o in starts
        )
        for e in starts
    )
    assert s.followed == followed


def test_statistics_hold_together(trace: FaultTrace) -> None:
    s = trace_statistics(trace)
    for share in (s.top_share, s.top_share_of_faulted, s.followed_share, s.followed_after_repair_share):
        assert 0.0 <= share <= 1.0
    assert s.servers_with_faults <= s.fleet_servers <= 400
    assert sum(s.servers_by_count) == s.fleet_servers
    assert sum(n * servers for n, servers in enumerate(s.servers_by_count)) == s.faults
    assert s.fleet_servers - s.servers_by_count[0] == s.servers_with_faults
    assert s.count_mean == pytest.approx(s.faults / s.fleet_servers)
    assert s.followed_same_component <= s.followed <= s.faults
    assert s.faults_after_another + s.bursts == s.faults_in_bursts
    assert sum(n for _, n in s.burst_components) == s.faults_in_bursts
    assert 2 <= s.largest_burst <= s.faults_in_bursts
    for q in (s.repair_hours, s.recurrence_days):
        assert q.p10 <= q.p25 <= q.p50 <= q.p75 <= q.p90
    assert s.repair_hours.p50 == pytest.approx(float(np.median([f.repair_hours for f in trace.faults])))
    assert s.zero_repairs == sum(f.start_day == f.end_day for f in trace.faults)


def _small_trace_events() -> list[dict[str, Any]]:
    """Three servers of a fleet of ten: a out on days 1-1.5, c from 30 s later to day 2, b on days 10-11
    and 13-13.25."""
    return [
        _event("a", 1.0, "fault_start"),
        _event("c", 1.0 + 30 / 86_400, "fault_start"),
        _event("a", 1.5, "fault_end"),
        _event("c", 2.0, "fault_end"),
        _event("b", 10.0, "fault_start"),
        _event("b", 11.0, "fault_end"),
        _event("b", 13.0, "fault_start"),
        _event("b", 13.25, "fault_end"),
    ]


def test_a_small_trace_by_hand() -> None:
    """Three servers of a fleet of ten: b fails twice, 3 days apart; a and c start 30 s apart."""
    events = _small_trace_events()
    s = trace_statistics(parse_events(events, fleet_servers=10))
    assert (s.faults, s.servers_with_faults, s.top_servers) == (4, 3, 1)
    assert s.top_share == 0.5
    assert s.servers_by_count == (7, 2, 1)
    assert (s.followed, s.followed_after_repair) == (1, 1)
    assert s.recurrence_days.p50 == 3.0
    assert s.uptime_days.p50 == 2.0
    assert (s.faults_after_another, s.faults_in_bursts, s.bursts, s.largest_burst) == (1, 2, 1, 2)
    # Repairs of 12 h (a), 24 h less 30 s (c), 24 h and 6 h (b): the median is between the middle two.
    assert s.repair_hours.p50 == pytest.approx((12 + 24 - 30 / 3600) / 2)
    # a and c are down together for a while; the window ends at b's last return, day 13.25.
    assert s.down_max == 2
    assert s.down_mean == pytest.approx((0.5 + (1 - 30 / 86_400) + 1 + 0.25) / 13.25)


def test_the_reader_refuses_a_broken_trace() -> None:
    with pytest.raises(ValueError, match="no open fault_start"):
        parse_events([_event("a", 1.0, "fault_end")], fleet_servers=1)
    with pytest.raises(ValueError, match="never end"):
        parse_events([_event("a", 1.0, "fault_start")], fleet_servers=1)
    with pytest.raises(ValueError, match="more than the fleet"):
        parse_events([_event(s, 1.0, t) for s in "ab" for t in ("fault_start", "fault_end")], fleet_servers=1)
    with pytest.raises(ValueError, match="event_time"):
        parse_events([{**_event("a", 1.0, "fault_start"), "event_time": "soon"}], fleet_servers=1)


def test_the_dispersion_is_the_likelihoods_maximum() -> None:
    """The fitted k beats its neighbours, and recovers the shape of a large negative-binomial sample."""
    rng = np.random.default_rng(7)
    counts = [int(c) for c in rng.negative_binomial(0.9, 0.9 / (0.9 + 1.5), size=20_000)]
    k = negative_binomial_k(counts)
    assert k == pytest.approx(0.9, rel=0.05)
    mean, histogram = float(np.mean(counts)), Counter(counts)

    def loglik(k: float) -> float:
        return negative_binomial_loglik(histogram, k, mean)

    assert loglik(k) >= max(loglik(k * 1.02), loglik(k / 1.02))
    assert negative_binomial_k([1, 1, 1, 1]) == math.inf


def _event(server: str, day: float, kind: str) -> dict[str, Any]:
    return {
        "node_id": server,
        "event_time": day,
        "event_type": kind,
        "fault_type": {"Level": "Hardware Failure", "Class": "GPU", "Desc": "GPU xid Error"},
    }


def test_the_benchmark_prints_the_measured_figures(
    trace: FaultTrace, capsys: pytest.CaptureFixture[str]
) -> None:
    fault_trace_bench.main()
    out = capsys.readouterr().out
    s = trace_statistics(trace)
    assert f"faults                   {s.faults}\n" in out
    assert f"{100 * s.top_share:.1f} % of faults" in out
    assert f"median {s.repair_hours.p50:.2f}" in out


def test_servers_down_at_once_on_a_grid_of_the_traces_ticks(trace: FaultTrace) -> None:
    """Every server's repair periods painted onto the trace's 8.64-s ticks, a server counted once."""
    s = trace_statistics(trace)
    ticks = round(s.last_event_day * 10_000)
    down = np.zeros(ticks, dtype=np.int16)
    for faults in trace.by_server().values():
        mine = np.zeros(ticks, dtype=bool)
        for f in faults:
            mine[round(f.start_day * 10_000) : round(f.end_day * 10_000)] = True
        down += mine
    assert s.down_mean == pytest.approx(float(down.mean()), rel=1e-6)
    assert s.down_max == int(down.max())
    assert s.down_p99 == int(np.sort(down)[math.ceil(0.99 * ticks) - 1])


def test_a_gap_of_exactly_the_window_counts_whatever_float_noise_says() -> None:
    """8.0028 - 1.0028 is 7.000000000000001 in floating point: in the trace's ticks it is 7 days, within."""
    events = [
        _event("a", 1.0028, "fault_start"),
        _event("a", 1.5, "fault_end"),
        _event("a", 8.0028, "fault_start"),
        _event("a", 8.5, "fault_end"),
    ]
    assert 8.0028 - 1.0028 > 7.0
    s = trace_statistics(parse_events(events, fleet_servers=1))
    assert s.followed == 1
    assert s.count_variance == 0.0  # one server: no spread to measure


def test_the_replay_gives_every_fault_a_twin_mode(trace: FaultTrace) -> None:
    """bench/trace_replay.py: each fault stands for a twin mode, at its own start and repair."""
    from faultcast.sim.modes import BY_NAME

    modes = Counter(trace_replay_bench.trace_mode(f) for f in trace.faults)
    assert set(modes) <= set(BY_NAME)
    assert modes["hbm_wear"] == sum("ECC" in f.description for f in trace.faults)
    assert modes["software"] == sum(f.level != "Hardware Failure" for f in trace.faults)
    draw = trace_replay_bench.trace_draw(trace, np.random.default_rng(0))
    assert draw.times_s.tolist() == [f.start_day * 86_400 for f in trace.faults]
    assert draw.repairs_s.tolist() == [f.repair_hours * 3600 for f in trace.faults]


def test_the_warm_pool_and_the_breaker_by_hand() -> None:
    """The small trace: a is out on days 1-1.5, c from 30 s later to day 2, b on days 10-11 and 13-13.25."""
    events = _small_trace_events()
    small = parse_events(events, fleet_servers=10)
    # One spare: c finds it taken by a; more than one server is out from c's start to a's return.
    dry, short = trace_replay_bench.pool_dry(small, 1, 20.0)
    assert dry == 1
    assert short == pytest.approx((0.5 - 30 / 86_400) / 20.0)
    assert trace_replay_bench.pool_dry(small, 2, 20.0) == (0, 0.0)
    # The default breaker takes 4 distinct nodes an hour: a fifth within the hour is refused, a node
    # already taken is not, and an hour later there is room again.
    drains = [(f"n{i}", 60.0 * i) for i in range(5)] + [("n0", 400.0), ("n5", 3700.0)]
    assert fault_trace_bench.breaker_refusals(drains) == (1, [0.0])


def test_a_year_into_a_job_a_checkpoints_last_nanosecond_does_not_stall_it() -> None:
    """The trace's replay (349 days) found it: an alert's snapshot waiting for a write whose rest the clock
    cannot tell from now (1e-9 s at 1.7e7 s) was scheduled for now, again and again. It ends the write."""
    from faultcast.goodput import engine

    job = engine._Job(
        engine.Policy("b", 1800.0, True),
        trace_replay_bench.COSTS,
        engine.SparePool(1),
        engine.Outcome(wall_s=3e7),
    )
    job.t = job.snapshot_at = 1.68e7
    job.writing = trace_replay_bench.COSTS.checkpoint_s - 1.07e-9
    job.on_internal()
    assert job.next_internal() > job.t
