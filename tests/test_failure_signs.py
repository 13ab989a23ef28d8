"""Evidence that a failure has happened (faultcast.failure_signs), the collector shipping its window at
once when a scrape shows it, and the service's FailureWatch that holds, folds and times silences."""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path

import pytest

from faultcast.catalogue import Scope
from faultcast.collector.agent import NodeCollector
from faultcast.collector.nvml.source import NvmlSource
from faultcast.collector.spool import Spool
from faultcast.failure_signs import FATAL_XIDS, Evidence, FailureSign, failure_signs
from faultcast.readings import DeviceReading, GpuReading, NodeSnapshot, pack
from faultcast.service.failure_events import TrainerReport, failure_event
from faultcast.service.failure_watch import CUT_REJOIN_S, FailureWatch
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.node import NodeTwin
from faultcast.testing.fake_nvml import FakeNvml
from faultcast.v1 import alerts_pb2 as apb

HEALTHY = {
    "gpu_temp": 60.0,
    "power_usage": 500.0,
    "ecc_dbe_volatile": 0.0,
    "row_remap_failure": 0.0,
    **{f"xid_{code}_events": 0.0 for code in (13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120)},
}


def _gpu(index: int = 0, uuid: str = "GPU-a", lost: bool = False, **values: float) -> GpuReading:
    return GpuReading(index, uuid, "H100", pack(Scope.GPU, {**HEALTHY, **values}), lost=lost)


def _with(name: str, value: float) -> GpuReading:
    return GpuReading(0, "GPU-a", "H100", pack(Scope.GPU, {**HEALTHY, name: value}))


def _port(state: float, device: str = "mlx5_0:1") -> DeviceReading:
    return DeviceReading(Scope.IB_PORT, device, pack(Scope.IB_PORT, {"ib_port_state": state}))


def _snapshot(*gpus: GpuReading, t: int = 1, ports: tuple[DeviceReading, ...] = ()) -> NodeSnapshot:
    return NodeSnapshot("node-1", t, gpus, ports, (), ())


def _signs(before: GpuReading, now: GpuReading) -> list[tuple[Evidence, int]]:
    return [(s.evidence, s.xid) for s in failure_signs(_snapshot(before), _snapshot(now, t=2))]


def test_the_critical_xids_are_the_catalogues_failures_among_those_counted() -> None:
    assert sorted(FATAL_XIDS) == [48, 64, 74, 79, 94, 95, 119, 120]


@pytest.mark.parametrize("code", sorted(FATAL_XIDS))
def test_a_critical_xid_that_rises_is_a_sign(code: int) -> None:
    assert _signs(_gpu(), _with(f"xid_{code}_events", 1.0)) == [(Evidence.XID, code)]


@pytest.mark.parametrize("code", [13, 31, 43, 63, 92])
def test_application_and_wear_xids_are_no_sign(code: int) -> None:
    assert _signs(_gpu(), _with(f"xid_{code}_events", 3.0)) == []


def test_the_rules_for_lost_and_uncorrectable_and_a_gpu_that_reads_nothing() -> None:
    assert _signs(_gpu(), _gpu(lost=True)) == [(Evidence.GPU_LOST, 0)]
    assert _signs(_gpu(lost=True), _gpu(lost=True)) == []  # only when it goes
    nothing = GpuReading(0, "GPU-a", "H100", pack(Scope.GPU, {}))
    assert _signs(_gpu(), nothing) == []  # one NVML call past its timeout reads like this: no failure
    assert _signs(_gpu(), _gpu(ecc_dbe_volatile=2.0)) == [(Evidence.UNCORRECTABLE_ECC, 0)]
    assert _signs(_gpu(), _gpu(row_remap_failure=1.0)) == [(Evidence.UNCORRECTABLE_ECC, 0)]


def test_an_nvml_call_hung_ten_seconds_is_a_sign_and_one_past_the_timeout_is_not() -> None:
    def hung(seconds: float, lost: bool = False) -> GpuReading:
        values = pack(Scope.GPU, {**HEALTHY, "nvml_slowest_call_seconds": seconds})
        return GpuReading(0, "GPU-a", "H100", values, lost=lost)

    assert _signs(hung(0.004), hung(2.1)) == []  # one call past the collector's 2 s timeout
    assert _signs(hung(8.0), hung(10.5)) == [(Evidence.NVML_UNREACHABLE, 0)]
    assert _signs(hung(11.0), hung(12.0)) == []  # hung already: said once
    assert _signs(hung(float("nan")), hung(30.0)) == []  # unread before
    assert _signs(hung(0.004), hung(30.0, lost=True)) == [(Evidence.GPU_LOST, 0)]


def test_a_collector_reports_a_gpu_whose_call_hangs_unreachable_once_it_has_hung_ten_seconds() -> None:
    """A real NvmlSource over the fake NVML with one call hung; its clock runs ahead on demand (the
    lanes wait in real time for the 0.2 s timeout; the hang's age is read from the clock)."""
    fake = FakeNvml(gpus=2)
    ahead = [0.0]
    source = NvmlSource(fake, timeout=0.2, clock=lambda: time.perf_counter() + ahead[0])
    hang = fake.hang(1, "nvmlDeviceGetPowerUsage")
    try:
        scrapes = [
            NodeSnapshot.merge("node-1", t, [source.read()], {}) for t in (1, 2)
        ]  # hung 0.2 s, then on
        ahead[0] = 11.0
        scrapes.append(NodeSnapshot.merge("node-1", 3, [source.read()], {}))  # hung 11 s
        signs = [failure_signs(before, now) for before, now in itertools.pairwise(scrapes)]
        assert signs[0] == []  # past the timeout, skipped: no failure yet
        (unreachable,) = signs[1]
        assert (unreachable.evidence, unreachable.gpu, unreachable.time_unix_nano) == (
            Evidence.NVML_UNREACHABLE,
            1,
            3,
        )
        assert "has not returned for 11 s" in unreachable.detail
    finally:
        hang.release()
        source.close()


def test_resets_swaps_missing_values_and_a_first_sample_are_no_sign() -> None:
    assert _signs(_gpu(ecc_dbe_volatile=5.0), _gpu(ecc_dbe_volatile=0.0)) == []  # a driver reload
    assert _signs(_gpu(xid_79_events=float("nan")), _gpu(xid_79_events=1.0)) == []  # unread before
    assert _signs(_gpu(uuid="GPU-a"), _gpu(uuid="GPU-b", xid_79_events=4.0)) == []  # another GPU
    assert failure_signs(None, _snapshot(_gpu(lost=True))) == []


def test_a_port_that_leaves_active_is_a_node_level_sign() -> None:
    before, after = _snapshot(ports=(_port(4.0),)), _snapshot(ports=(_port(1.0),), t=2)
    (sign,) = failure_signs(before, after)
    assert (sign.evidence, sign.gpu, sign.time_unix_nano) == (Evidence.IB_PORT_DOWN, -1, 2)
    assert "mlx5_0:1" in sign.detail
    assert failure_signs(after, dataclasses.replace(after, time_unix_nano=3)) == []  # down, not going


def test_a_collector_ships_its_window_at_once_when_a_scrape_shows_a_failure(tmp_path: Path) -> None:
    fake = FakeNvml(gpus=2)
    clock = iter(range(10**9, 10**12, 10**9))  # a scrape a second, in one 60 s window
    spool = Spool(tmp_path / "spool.sqlite")
    collector = NodeCollector(
        "node-1", [NvmlSource(fake)], spool=spool, ship_step_s=60.0, wall_clock_ns=lambda: next(clock)
    )
    for _ in range(5):
        collector.scrape()
    assert spool.last_sequence == 0  # the window is still open
    fake.inject_xid(1, 79)
    collector.scrape()
    assert (spool.last_sequence, collector.early_windows) == (1, 1)
    collector.scrape()  # the same window goes on; its later scrapes ship at its end
    assert spool.last_sequence == 1
    collector.close()
    spool.close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_watch_gives_one_sign_per_gpu_and_folds_what_follows_within_the_hold() -> None:
    clock = Clock()
    watch = FailureWatch(hold_s=600.0, clock=clock)
    assert watch.observe(_snapshot(_gpu(), _gpu(1, "GPU-b"))) == []
    xid_and_dbe = _gpu(xid_79_events=1.0, ecc_dbe_volatile=1.0)
    (sign,) = watch.observe(_snapshot(xid_and_dbe, _gpu(1, "GPU-b"), t=2))  # two signs, one GPU
    assert (sign.gpu, sign.evidence, sign.xid) == (0, Evidence.XID, 79)
    watch.hold(sign, 41)
    assert watch.observe(_snapshot(_gpu(lost=True, xid_79_events=1.0), _gpu(1, "GPU-b"), t=3)) == []
    assert (watch.held_on_node("node-1"), watch.folded) == (41, 2)
    (other,) = watch.observe(_snapshot(_gpu(lost=True), _gpu(1, "GPU-b", lost=True), t=4))
    assert other.gpu == 1  # another GPU is not held by the first one's failure
    assert (
        watch.observe(_snapshot(_gpu(), _gpu(1, "GPU-b"), t=3)) == []
    )  # a late sample: compared with nothing
    clock.now += 601
    assert watch.held_on_node("node-1") == 0


def test_a_broken_stream_not_back_within_the_grace_is_a_silent_node_and_a_goodbye_is_not() -> None:
    clock = Clock()
    watch = FailureWatch(silence_grace_s=3.0, clock=clock, wall_clock_ns=lambda: 7)
    for node in ("a", "b", "c", "d", "e"):
        watch.stream_opened(node)
    watch.stream_ended("a", goodbye=False)
    watch.stream_ended("b", goodbye=True)
    assert watch.next_silence_check() == 3.0
    clock.now += 2.9
    assert watch.silent() == []
    clock.now += 0.1
    (sign,) = watch.silent()
    assert (sign.node, sign.gpu, sign.evidence, sign.time_unix_nano) == ("a", -1, Evidence.NODE_SILENT, 7)
    assert watch.next_silence_check() is None  # b said goodbye
    watch.stream_ended("c", goodbye=False)
    watch.stream_opened("c")  # back (a collector restarting) before the grace ends
    clock.now += 10
    assert watch.silent() == []


def test_when_half_the_nodes_break_at_once_it_is_the_service_that_was_cut_off() -> None:
    clock = Clock()
    watch = FailureWatch(silence_grace_s=3.0, clock=clock)
    for node in ("a", "b", "c", "d"):
        watch.stream_opened(node)
    watch.stream_ended("a", goodbye=False)
    clock.now += 1
    watch.stream_ended("b", goodbye=False)
    clock.now += 5
    assert (watch.silent(), watch.cut_off) == ([], 2)


def test_a_cut_off_is_decided_once_for_the_whole_burst() -> None:
    clock = Clock()
    watch = FailureWatch(silence_grace_s=3.0, clock=clock)
    for node in ("a", "b", "c", "d", "e", "f"):
        watch.stream_opened(node)
    for node in ("a", "b", "c"):  # the service's network drops: streams break over a second
        watch.stream_ended(node, goodbye=False)
        clock.now += 0.5
    clock.now += 2.0  # a's grace is over, c's not yet: c may still come back, so nothing is decided
    assert (watch.silent(), watch.cut_off) == ([], 0)
    assert watch.next_silence_check() == pytest.approx(0.5)  # when c's grace is over
    clock.now += 0.5
    assert (watch.silent(), watch.cut_off) == ([], 3)
    clock.now += 5.0  # c is not judged alone later
    assert watch.silent() == []
    for node in ("a", "b", "c"):  # the service's network is back: they reconnect
        watch.stream_opened(node)
    clock.now += 60.0
    assert watch.silent() == []
    assert watch.next_silence_check() is None


def test_a_node_with_a_second_stream_open_is_not_silent_when_one_breaks() -> None:
    clock = Clock()
    watch = FailureWatch(silence_grace_s=3.0, clock=clock)
    for node in ("a", "a", "b", "c"):
        watch.stream_opened(node)
    watch.stream_ended("a", goodbye=False)
    clock.now += 10
    assert watch.silent() == []


def test_on_the_twin_only_failures_the_collector_sees_are_signs_and_no_healthy_gpu_is() -> None:
    """Four twin nodes over two days at 400x the failure rate (healthy look-alikes at their own rates:
    application Xids, Xid 63/92, SBE bursts, link noise, lost scrapes): every sign is a failure's, at
    the first sample after it. The twin shows the Xid of a GPU that falls off the bus (79) and then
    the GPU lost; its other failures take the GPU or node dark without one (a gap of the twin, not of
    the rule: a silent node is seen from its stream, which the twin has not)."""
    config = FleetConfig(nodes=4, days=2.0, seed=11, acceleration=400.0, chunk_steps=500)
    seen: dict[tuple[int, int, int], float] = {}  # (node, gpu, xid) -> when, in the twin's seconds
    for node in range(config.nodes):
        source, before = TwinSource(config, node), None
        for _ in range(config.steps):
            reading = source.read()
            if not reading.gpus and not reading.devices:
                continue  # the node dark, or its scrape lost: nothing to compare
            assert reading.time_unix_nano is not None
            now = NodeSnapshot.merge(f"n{node}", reading.time_unix_nano, [reading], {})
            signs = failure_signs(before, now)
            assert all(s.gpu >= 0 for s in signs)  # no port went down
            for s in signs:
                if s.evidence is Evidence.XID:
                    seen[(node, s.gpu, s.xid)] = s.time_unix_nano / 1e9 - config.start_unix_s
            before = now
    expected = {
        (node, f.gpu, f.xid): f.fail_s
        for node in range(config.nodes)
        for f in NodeTwin(config, node, []).schedule.failures
        if f.fail_s < config.horizon_s and f.xid == 79 and f.gpu is not None
    }
    assert expected  # the seed has a GPU off the bus
    assert seen.keys() == expected.keys()
    assert all(0 <= seen[k] - expected[k] <= config.cadence_s for k in expected)  # the next sample


def test_a_failed_event_names_the_alerts_that_foresaw_it_and_takes_their_mode_for_a_gpu_off_the_bus() -> None:
    info = apb.ModelInfo(version="m")
    pcie = apb.Alert(id=9, opened_id=7, node="node-1", gpu=1, gpus=[1], mode=apb.FAILURE_MODE_PCIE)
    other = apb.Alert(id=8, opened_id=8, node="node-1", gpu=4, gpus=[4], mode=apb.FAILURE_MODE_COOLING)
    off_the_bus = FailureSign("node-1", 1, "GPU-b", Evidence.XID, "Xid 79", 5, xid=79)
    event = failure_event(off_the_bus, [pcie, other], info)
    assert (event.kind, event.state, event.gpu, event.time_unix_nano) == (
        apb.EVENT_KIND_FAILED,
        apb.ALERT_STATE_FAILED,
        1,
        5,
    )
    assert list(event.failure.foreseen_by) == [7]  # the alert on the failed GPU, not the one on GPU 4
    assert event.mode == apb.FAILURE_MODE_PCIE  # why it fell off the bus: what the alert on it saw
    unforeseen = failure_event(off_the_bus, [other], info)
    assert (unforeseen.mode, list(unforeseen.failure.foreseen_by)) == (apb.FAILURE_MODE_DETACHMENT, [])
    network = apb.Alert(id=6, opened_id=6, node="node-1", gpu=-1, gpus=[1, 2], mode=apb.FAILURE_MODE_NVLINK)
    assert list(failure_event(off_the_bus, [network, other], info).failure.foreseen_by) == [
        6
    ]  # GPU 1 joined it
    port = FailureSign("node-1", -1, "", Evidence.IB_PORT_DOWN, "port", 5)
    assert list(failure_event(port, [pcie, other], info).failure.foreseen_by) == [7, 8]  # node-level: all
    dbe = FailureSign("node-1", 1, "GPU-b", Evidence.XID, "Xid 48", 5, xid=48)
    assert failure_event(dbe, [pcie], info).mode == apb.FAILURE_MODE_HBM_WEAR  # the Xid says it
    report = TrainerReport("job", apb.TRAINER_FAILURE_NCCL_WATCHDOG, 3, "")
    said = failure_event(FailureSign("node-1", -1, "", Evidence.TRAINER_REPORT, "", 5), [], info, report)
    assert (said.mode, said.failure.drains_node, said.failure.rank) == (
        apb.FAILURE_MODE_NCCL_TIMEOUT,
        False,
        3,
    )


def test_xid_94_is_a_failure_that_drains_nothing_and_does_not_hide_a_worse_one() -> None:
    """NVIDIA's catalogue answers a contained ECC error (Xid 94) with an application restart: a FAILED
    event that drains nothing, and its hold does not swallow a double-bit error on the GPU after it."""
    info = apb.ModelInfo(version="m")
    contained = FailureSign("node-1", 0, "GPU-a", Evidence.XID, "Xid 94", 5, xid=94)
    assert not failure_event(contained, [], info).failure.drains_node
    assert failure_event(dataclasses.replace(contained, xid=95), [], info).failure.drains_node
    watch = FailureWatch(clock=Clock())
    watch.observe(_snapshot(_gpu()))
    (sign,) = watch.observe(_snapshot(_gpu(xid_94_events=1.0), t=2))
    watch.hold(sign, 5)
    (worse,) = watch.observe(_snapshot(_gpu(xid_94_events=1.0, xid_48_events=1.0), t=3))
    assert (worse.xid, watch.held_on_node("node-1")) == (48, 5)


def test_a_trainers_report_holds_only_trainer_reports_and_hides_no_hardware_evidence() -> None:
    """A job that reported a dead rank on the node does not hide the node's port going down or its
    collector falling silent: each raises its own sign (and FAILED event, which drains the node)."""
    clock = Clock()
    watch = FailureWatch(hold_s=5.0, silence_grace_s=1.0, clock=clock)
    report = FailureSign("node-1", -1, "", Evidence.TRAINER_REPORT, "dead rank", 1)
    watch.hold(report, 40)
    assert watch.held_on_node("node-1") == 40  # a second rank's report folds into it
    watch.observe(_snapshot(_gpu(), ports=(_port(4.0),)))
    (port,) = watch.observe(_snapshot(_gpu(), t=2, ports=(_port(1.0),)))
    assert port.evidence is Evidence.IB_PORT_DOWN
    watch.hold(port, 41)
    for node in ("node-1", "node-2", "node-3"):
        watch.stream_opened(node)
    watch.stream_ended("node-1", goodbye=False)
    clock.now += 1.0
    (silent,) = watch.silent()
    assert (silent.node, silent.evidence) == ("node-1", Evidence.NODE_SILENT)


def test_a_node_is_compared_anew_after_its_collector_restarts() -> None:
    """A port that went down is not raised again by the first sample after the collector's restart (a
    reboot, a repair) that still shows it down: the node starts again from that sample."""
    watch = FailureWatch(clock=Clock(), hold_s=0.0)
    watch.observe(_snapshot(_gpu(), ports=(_port(4.0),)))
    watch.stream_opened("node-1")
    watch.stream_ended("node-1", goodbye=True)  # stopped for the repair
    assert watch.observe(_snapshot(_gpu(), t=2, ports=(_port(1.0),))) == []
    watch.observe(_snapshot(_gpu(), t=3, ports=(_port(4.0),)))  # repaired at last
    (down,) = watch.observe(_snapshot(_gpu(), t=4, ports=(_port(1.0),)))  # and down again: a failure
    assert down.evidence is Evidence.IB_PORT_DOWN


def _flap(watch: FailureWatch, clock: Clock, node: str, times: int) -> None:
    """The node's stream breaks and comes back `times` times, 1.5 s apart."""
    for _ in range(times):
        watch.stream_ended(node, goodbye=False)
        clock.now += 0.3
        watch.stream_opened(node)
        clock.now += 1.2


@pytest.mark.parametrize(("nodes", "flappers"), [(3, 1), (5, 2)])
def test_flapping_collectors_cannot_declare_a_cut_off(nodes: int, flappers: int) -> None:
    """While a minority of collectors break and reopen their streams, a node that really dies is
    silent: a node that came back within the grace is no part of a cut, and a flapping node is flagged
    and never counted towards one."""
    clock = Clock()
    heard: list[tuple[str, bool, int]] = []

    class Listener:
        def flapping(self, node: str, now_flapping: bool, nodes_flapping: int) -> None:
            heard.append((node, now_flapping, nodes_flapping))

    watch = FailureWatch(silence_grace_s=2.0, clock=clock, flaps=Listener())
    names = [f"node-{i}" for i in range(1, nodes + 1)]
    for node in names:
        watch.stream_opened(node)
    dead, flapping = names[1], [n for n in names if n != names[1]][:flappers]
    watch.stream_ended(dead, goodbye=False)
    for _ in range(4):  # through the dead node's grace and well past it, every flapper broken at times
        for node in flapping:
            watch.stream_ended(node, goodbye=False)
        clock.now += 0.7
        assert watch.silent() == []  # nothing is decided while a flapper may still come back
        for node in flapping:
            watch.stream_opened(node)
        clock.now += 0.8
        if (signs := watch.silent()) != []:
            break
    assert [(s.node, s.evidence) for s in signs] == [(dead, Evidence.NODE_SILENT)]
    assert watch.cut_off == 0
    _flap(watch, clock, flapping[0], 3)
    assert flapping[0] in watch.flapping()
    assert (flapping[0], True) in [(n, f) for n, f, _ in heard]
    clock.now += 61.0
    assert watch.flapping() == []  # quiet for a window: it flaps no more
    assert heard[-1][1] is False


def test_a_cut_off_that_does_not_come_back_is_silent_after_all() -> None:
    """Collectors that hang together (every one SIGSTOPped within a grace) look like the service cut
    off; once other nodes are heard again, those not back within CUT_REJOIN_S are silent: a cut-off
    postpones the verdict, it does not forget the nodes. While nobody at all is heard, none is."""
    clock = Clock()
    watch = FailureWatch(silence_grace_s=1.0, clock=clock)
    for node in ("a", "b", "c", "d"):
        watch.stream_opened(node)
    for node in ("a", "b", "c", "d"):
        watch.stream_ended(node, goodbye=False)
    clock.now += 1.0
    assert (watch.silent(), watch.cut_off) == ([], 4)
    clock.now += 100.0
    assert watch.silent() == []  # nobody is heard: the service may be the one cut off
    watch.stream_opened("a")  # the network is back; a reconnects, the others do not
    clock.now += CUT_REJOIN_S - 1
    assert watch.silent() == []
    assert watch.next_silence_check() == pytest.approx(1.0)
    clock.now += 1.0
    signs = watch.silent()
    assert sorted(s.node for s in signs) == ["b", "c", "d"]
    assert all("broke 131.0 s ago" in s.detail for s in signs)  # since its stream broke


def _watch_of(nodes: int, clock: Clock, grace_s: float = 2.0) -> tuple[FailureWatch, list[str]]:
    watch = FailureWatch(silence_grace_s=grace_s, clock=clock)
    names = [f"n{i}" for i in range(nodes)]
    for node in names:
        watch.stream_opened(node)
    return watch, names


def test_a_node_that_flaps_does_not_put_off_the_verdict_on_a_cut_off() -> None:
    """Two of three nodes die together (taken for a cut-off); the one still heard breaks and reopens
    its stream every 10 s. The cut-off's nodes are silent CUT_REJOIN_S after some node was first heard
    again (here: as the cut was decided), not after its last reconnection; at that time nobody is
    heard, so the verdict waits for some node to be heard, if only for a moment, not for CUT_REJOIN_S
    more."""
    clock = Clock()
    watch, (a, b, c) = _watch_of(3, clock)
    watch.stream_ended(b, goodbye=False)
    watch.stream_ended(c, goodbye=False)
    clock.now += 2.0
    assert (watch.silent(), watch.cut_off) == ([], 2)
    decided = clock.now
    while clock.now < decided + CUT_REJOIN_S - 1:  # a: 9 s heard, 1 s not, from the decision on
        clock.now += 9.0
        watch.stream_ended(a, goodbye=False)
        assert watch.silent() == []
        clock.now += 1.0
        if clock.now < decided + CUT_REJOIN_S:
            watch.stream_opened(a)
            assert watch.silent() == []
    assert clock.now == decided + CUT_REJOIN_S
    assert watch.silent() == []  # nobody is heard now: the service itself may be cut off
    clock.now += 0.2
    watch.stream_opened(a)
    clock.now += 0.2
    watch.stream_ended(a, goodbye=False)
    clock.now += 0.1
    assert sorted(s.node for s in watch.silent()) == [b, c]


@pytest.mark.parametrize(("nodes", "flappers"), [(3, 1), (5, 2)])
def test_a_node_found_flapping_unmakes_the_cut_off_it_was_counted_in(nodes: int, flappers: int) -> None:
    """A node dies as a minority of collectors stays away longer than a grace: at the decision their
    first break looks like a cut-off. When they turn out to flap (their third break within a minute,
    after coming back) the cut is decided again without them: no cut, and the dead node is silent at
    once rather than CUT_REJOIN_S after the decision."""
    clock = Clock()
    watch, names = _watch_of(nodes, clock)
    dead, flapping = names[1], [n for n in names if n != names[1]][:flappers]
    for node in [dead, *flapping]:
        watch.stream_ended(node, goodbye=False)
    clock.now += 2.0
    assert (watch.silent(), watch.cut_off) == ([], 1 + flappers)
    clock.now += 0.2  # the flappers come back just after the decision
    for node in flapping:
        watch.stream_opened(node)
    clock.now += 0.8
    for node in flapping:  # and go away again, for 1.5 s
        watch.stream_ended(node, goodbye=False)
    clock.now += 1.5
    for node in flapping:
        watch.stream_opened(node)
    assert watch.silent() == []
    clock.now += 1.5
    for node in flapping:  # the third break within a minute: flapping
        watch.stream_ended(node, goodbye=False)
    assert sorted(watch.flapping()) == sorted(flapping)
    assert watch.next_silence_check() == 0.0
    assert [(s.node, s.evidence) for s in watch.silent()] == [(dead, Evidence.NODE_SILENT)]


def test_a_flapping_node_is_never_counted_towards_a_cut_off() -> None:
    """A node already flapping breaks with a dead one (one of three): the dead node is silent after its
    grace, and is not kept waiting for the flapper's grace either, which may end in its coming back."""
    clock = Clock()
    watch, (flapper, dead, _) = _watch_of(3, clock)
    _flap(watch, clock, flapper, 3)
    assert watch.flapping() == [flapper]
    watch.stream_ended(dead, goodbye=False)
    watch.stream_ended(flapper, goodbye=False)  # away with it, for good: silent too, not a cut
    clock.now += 2.0
    assert (sorted(s.node for s in watch.silent()), watch.cut_off) == (sorted([flapper, dead]), 0)

    clock = Clock()
    watch, (flapper, dead, _) = _watch_of(3, clock)
    _flap(watch, clock, flapper, 3)
    watch.stream_ended(dead, goodbye=False)
    clock.now += 1.0
    watch.stream_ended(flapper, goodbye=False)  # within the dead node's grace
    clock.now += 1.0
    assert [s.node for s in watch.silent()] == [dead]
    clock.now += 0.5
    watch.stream_opened(flapper)
    clock.now += 10.0
    assert (watch.silent(), watch.cut_off) == ([], 0)


def test_when_half_the_fleet_flaps_it_is_the_service_that_is_cut_off() -> None:
    """The service's network drops three times within a minute: every node flaps. The fourth drop is
    still a cut-off, not every node silent (and drained): flapping nodes are left out of a cut-off
    only while they are a minority of the fleet."""
    clock = Clock()
    watch, names = _watch_of(4, clock)
    for _ in range(3):
        for node in names:
            watch.stream_ended(node, goodbye=False)
        clock.now += 1.0
        for node in names:
            watch.stream_opened(node)
        clock.now += 5.0
    assert watch.flapping() == names
    for node in names:
        watch.stream_ended(node, goodbye=False)
    clock.now += 2.0
    assert (watch.silent(), watch.cut_off) == ([], 4)
