"""Attack: a service killed within a millisecond of acknowledging an Xid's sample. The sample is in
the journal (it is written before the acknowledgement) but its FAILED event, published by the
scoring thread a moment later, never reached the log: the failure was lost, as the replay fed the
journal to the scorer only. Now every journalled sample goes through the failure watch again, and a
failure without its event is published at the start and drains its node; one already stored is not
published twice."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from faultcast.catalogue import Scope, index_of
from faultcast.demo.feed import twin_snapshots
from faultcast.failure_signs import failure_signs
from faultcast.model.artifact import load
from faultcast.readings import NodeSnapshot
from faultcast.service.config import ServiceConfig
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


def _killed_after_the_xid(model: Path, state: Path, *, published: bool = False) -> list[apb.Alert]:
    """Two samples, the second with an Xid, taken (journalled) by a service that dies before its
    scoring thread publishes the failure, or (`published`) right after it stored the event; the
    events stored."""
    first, second = list(twin_snapshots(TwinSource(FLEET, 1), NODE, 2))
    # Taken now: the node's clock is the service's (the twin's samples are from its past).
    shift = time.time_ns() - second.time_unix_nano
    first, second = (replace(s, time_unix_nano=s.time_unix_nano + shift) for s in (first, second))
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
    finally:
        service.stop(0)


def test_a_failure_stored_before_the_kill_is_held_again_not_published_twice(
    stub_model: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    (stored,) = _killed_after_the_xid(stub_model, state, published=True)
    service = _service(stub_model, state)
    service.recover()
    assert service.failure_watch.held_on_node(NODE) == stored.id  # as the run before held it
    service.score_now()
    assert _xid_failures(service) == [stored]
    service.store.close()
