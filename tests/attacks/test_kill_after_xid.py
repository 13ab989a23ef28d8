"""Attack: a service killed within a millisecond of acknowledging an Xid's sample. Its FAILED event,
published by the scoring thread a moment later, never reached the log, and the collector never sends
an acknowledged sample again: the failure was lost. Now the sign is on disk (the state store's
pending failure signs) before the sample is acknowledged; a start publishes a sign whose event is
missing, and the node is drained; one stored already is not published twice. Nothing is derived
from the journal again: a reboot between two journalled samples (a goodbye the journal does not
hold) is no failure after a restart either."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from faultcast.catalogue import Scope, index_of
from faultcast.demo.feed import twin_snapshots
from faultcast.failure_signs import Evidence, FailureSign, failure_signs
from faultcast.model.artifact import load
from faultcast.readings import NodeSnapshot
from faultcast.service.config import ServiceConfig
from faultcast.service.pending_failures import KEY, PendingFailures
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.service.state.store import StateStore
from faultcast.sim.live import TwinSource
from faultcast.v1 import alerts_pb2 as apb
from tests.attacks.victim import FLEET

NODE = FLEET.node_name(1)
WAIT_S = 60.0


def _service(model: Path, state: Path) -> Service:
    config = ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0))
    return Service(load(model), StateStore.in_dir(state), config, model_dir=model)


def _with_xid(sample: NodeSnapshot, gpu: int) -> NodeSnapshot:
    """The sample with GPU `gpu`'s Xid 79 counter one higher."""
    gpus = list(sample.gpus)
    values = list(gpus[gpu].values)
    values[index_of(Scope.GPU)["xid_79_events"]] = max(values[index_of(Scope.GPU)["xid_79_events"]], 0.0) + 1
    gpus[gpu] = replace(gpus[gpu], values=tuple(values))
    return replace(sample, gpus=tuple(gpus))


def _xid_failures(service: Service) -> list[apb.Alert]:
    events = service.store.alerts.read_after(0, [NODE])
    return [
        e
        for e in events
        if e.kind == apb.EVENT_KIND_FAILED and e.failure.evidence == apb.FAILURE_EVIDENCE_XID
    ]


def _now(samples: list[NodeSnapshot]) -> list[NodeSnapshot]:
    """The samples as taken now: the node's clock is the service's (the twin's are from its past)."""
    shift = time.time_ns() - samples[-1].time_unix_nano
    return [replace(s, time_unix_nano=s.time_unix_nano + shift) for s in samples]


def _killed_after_the_xid(model: Path, state: Path, *, published: bool = False) -> list[apb.Alert]:
    """Two samples, the second with an Xid, taken (acknowledged) by a service that dies before its
    scoring thread publishes the failure, or (`published`) right after it stored the event, before
    it took the sign off its pending list; the events stored."""
    first, second = _now(list(twin_snapshots(TwinSource(FLEET, 1), NODE, 2)))
    second = _with_xid(second, 3)
    service = _service(model, state)
    service.store.jobs.register("job-v", [NODE])
    service._ingest(first)
    service._ingest(second)
    if published:  # as the scoring thread stores it
        service.book.failed([(sign, None) for sign in failure_signs(first, second)])
    stored = _xid_failures(service)
    service.store.close()  # killed
    return stored


def test_a_failure_whose_event_a_kill_cut_off_is_published_and_drained_at_the_start(
    stub_model: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    assert _killed_after_the_xid(stub_model, state) == []
    service = _service(stub_model, state)
    service.start("127.0.0.1:0")
    try:
        assert service.remediator.wait_done(1, WAIT_S)
        (failed,) = _xid_failures(service)
        assert (failed.node, failed.gpu, failed.failure.xid) == (NODE, 3, 79)
        assert service.store.remediations.of(failed.id) == ("ok", f"noop: would drain {NODE}")
        assert service.store.settings.get(KEY) is None  # published: nothing left pending
    finally:
        service.stop(0)


def test_a_failure_stored_before_the_kill_is_not_published_twice(stub_model: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    (stored,) = _killed_after_the_xid(stub_model, state, published=True)
    service = _service(stub_model, state)
    service.recover()
    service.score_now()
    assert _xid_failures(service) == [stored]
    assert service.store.settings.get(KEY) is None
    service.store.close()


def test_a_restart_after_a_reboot_raises_no_failure_from_the_journal(
    stub_model: Path, tmp_path: Path
) -> None:
    # The node said goodbye and rebooted between its two samples: at ingest the second is compared
    # with nothing. A replay of the journal through the failure watch compared them and drained it.
    state = tmp_path / "state"
    before, after = _now(list(twin_snapshots(TwinSource(FLEET, 1), NODE, 2)))
    service = _service(stub_model, state)
    service.store.jobs.register("job-v", [NODE])
    watch = service.failure_watch
    watch.stream_opened(NODE)
    service._ingest(before)
    watch.stream_ended(NODE, goodbye=True)  # the collector stops cleanly; the node reboots
    watch.stream_opened(NODE)
    service._ingest(_with_xid(after, 3))
    service.store.close()  # killed
    again = _service(stub_model, state)
    again.recover()
    again.score_now()
    assert _xid_failures(again) == []
    again.store.close()


def test_pending_signs_round_trip_and_an_unreadable_setting_is_dropped(tmp_path: Path) -> None:
    store = StateStore.in_dir(tmp_path)
    sign = FailureSign(NODE, 3, "GPU-x", Evidence.XID, "Xid 79", 1_800_000_000 * 10**9, 79)
    PendingFailures(store.settings).add([sign])
    assert PendingFailures(store.settings).load() == [sign]
    store.settings.save(KEY, '[{"node": 1}]')
    assert PendingFailures(store.settings).load() == []
    store.close()
