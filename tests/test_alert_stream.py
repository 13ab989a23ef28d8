"""The alert contract of proto/README.md over real gRPC against a real (insecure) service: where a
subscription starts, the caught-up marker and the model it names, the replay/live boundary under
concurrent appends, stale cursors, listing then resuming, and acknowledgements validated even
without authentication.

Events are appended to the service's durable log directly (as the alert book does), so each test
controls exactly what the log holds."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import grpc
import pytest

from faultcast.service.config import ServiceConfig
from faultcast.service.model_info import model_info
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.rpc.api import HEAD_ID_KEY
from faultcast.service.scoring import model_version
from faultcast.service.server import Service
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

WAIT_S = 30.0
_nodes = count()


@dataclass
class Served:
    service: Service
    channel: grpc.Channel

    @property
    def stub(self) -> apb_grpc.AlertsStub:
        return apb_grpc.AlertsStub(self.channel)


@pytest.fixture(scope="module")
def served(stub_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    model_dir = tmp_path_factory.mktemp("serving") / "model"
    shutil.copytree(stub_model, model_dir)
    service = Service.open(
        model_dir, tmp_path_factory.mktemp("state"), ServiceConfig(grace_s=3600.0), actuator=NoopActuator()
    )
    port = service.start("127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield Served(service, channel)
    channel.close()
    service.stop(0)


def _node() -> str:
    """A node no other test wrote events for: each test reads only its own nodes' events."""
    return f"node-s{next(_nodes)}"


def _opened(node: str, gpu: int = 0, padding: int = 0) -> apb.Alert:
    return apb.Alert(
        node=node,
        gpu=gpu,
        state=apb.ALERT_STATE_OPEN,
        kind=apb.EVENT_KIND_OPENED,
        risk=0.5,
        action=apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE,
        # Some weight per event, so that a long replay cannot sit in one flow-control window.
        top_features=[apb.FeatureContribution(feature="x" * padding)] if padding else [],
    )


def _updated(of: apb.Alert) -> apb.Alert:
    return apb.Alert(
        node=of.node,
        gpu=of.gpu,
        state=apb.ALERT_STATE_OPEN,
        kind=apb.EVENT_KIND_UPDATED,
        opened_id=of.opened_id,
        risk=0.8,
        action=apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE,
    )


def _cleared(of: apb.Alert) -> apb.Alert:
    return apb.Alert(
        node=of.node,
        gpu=of.gpu,
        state=apb.ALERT_STATE_CLEARED,
        kind=apb.EVENT_KIND_CLEARED,
        opened_id=of.opened_id,
        clear_reason=apb.CLEAR_REASON_RISK_FELL,
        cleared_reason="risk fell",
    )


class Stream:
    """One Subscribe call read message by message; a missing message fails the test at the deadline."""

    def __init__(self, stub: apb_grpc.AlertsStub, request: apb.SubscribeRequest) -> None:
        self.call = stub.Subscribe(request, timeout=WAIT_S)
        self._messages = iter(self.call)

    def next(self) -> apb.SubscribeResponse:
        return next(self._messages)

    def alert(self) -> apb.Alert:
        message = self.next()
        assert message.HasField("alert"), message
        return message.alert

    def caught_up(self) -> apb.CaughtUp:
        message = self.next()
        assert message.HasField("caught_up"), message
        return message.caught_up

    def close(self) -> None:
        self.call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave cancel untyped


def _refusal(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        call()  # type: ignore[operator]
    return refused.value


# -- where a subscription starts -----------------------------------------------------------------


def test_a_live_subscription_is_caught_up_at_once_and_names_the_serving_model(served: Served) -> None:
    node = _node()
    store = served.service.store
    store.alerts.append([_opened(node)])
    stream = Stream(served.stub, apb.SubscribeRequest(nodes=[node], start=apb.START_FROM_LIVE))
    try:
        marker = stream.caught_up()
        assert marker.head_id == store.alerts.last_id
        model = served.service.model
        assert marker.model == model_info(model)
        assert marker.model.version == model_version(model)
        assert marker.model.threshold == pytest.approx(model.threshold)
        assert marker.model.horizon_seconds == pytest.approx(model.horizon_s)
        assert marker.model.cadence_seconds == pytest.approx(model.feature_config.cadence_s)
        assert (marker.model.open_after_scores, marker.model.clear_after_scores) == (
            model.policy.k,
            model.policy.clear_steps,
        )
        assert 0 < marker.model.hold_threshold <= marker.model.threshold
        (live,) = store.alerts.append([_opened(node, gpu=1)])
        assert stream.alert() == live  # the alert open before the subscription was not replayed
    finally:
        stream.close()


@pytest.mark.parametrize("start", [apb.START_FROM_UNSPECIFIED, apb.START_FROM_OPEN_ALERTS])
def test_a_new_subscriber_gets_the_newest_event_of_each_open_alert_and_nothing_stale(
    served: Served, start: apb.StartFrom.ValueType
) -> None:
    node, elsewhere = _node(), _node()
    store = served.service.store
    (first,) = store.alerts.append([_opened(node, gpu=0)])
    (update,) = store.alerts.append([_updated(first)])
    (gone,) = store.alerts.append([_opened(node, gpu=1)])
    store.alerts.append([_cleared(gone), _opened(elsewhere)])
    (still,) = store.alerts.append([_opened(node, gpu=2)])
    stream = Stream(served.stub, apb.SubscribeRequest(nodes=[node], start=start))
    try:
        assert [stream.alert().id, stream.alert().id] == [update.id, still.id]
        assert stream.caught_up().head_id == store.alerts.last_id
        (cleared,) = store.alerts.append([_cleared(still)])
        assert stream.alert() == cleared
    finally:
        stream.close()


def test_history_is_replayed_in_order_then_caught_up_then_live_with_nothing_lost_or_repeated(
    served: Served,
) -> None:
    """Events appended while the subscriber is still replaying come once each, after the marker."""
    node, other = _node(), _node()
    store = served.service.store
    before = [
        a
        for a in store.alerts.append(
            [_opened(n, gpu=i % 8, padding=2000) for i in range(2500) for n in (node, other)]
        )
        if a.node == node
    ]
    stream = Stream(served.stub, apb.SubscribeRequest(nodes=[node], start=apb.START_FROM_HISTORY))
    received: list[apb.SubscribeResponse] = [stream.next()]  # the replay has begun
    appended: list[apb.Alert] = []

    def append_meanwhile() -> None:
        for _ in range(20):
            appended.extend(a for a in store.alerts.append([_opened(node), _opened(other)]) if a.node == node)

    appender = threading.Thread(target=append_meanwhile)
    appender.start()
    try:
        # The replay is 2,500 events of 2 kB: far more than is in flight when the appends begin.
        while len(received) < len(before) + 1 + 20:
            received.append(stream.next())
        appender.join(WAIT_S)
    finally:
        stream.close()
    markers = [i for i, m in enumerate(received) if m.HasField("caught_up")]
    assert markers == [len(before)]
    head = received[markers[0]].caught_up.head_id
    replayed = [m.alert.id for m in received[: markers[0]]]
    live = [m.alert.id for m in received[markers[0] + 1 :]]
    assert replayed == [a.id for a in before]
    assert head >= before[-1].id
    assert live == [a.id for a in appended]
    assert all(i > head for i in live)


def test_a_cursor_resumes_after_itself_and_sees_every_later_event_of_its_nodes(served: Served) -> None:
    node = _node()
    store = served.service.store
    (a,) = store.alerts.append([_opened(node)])
    b, _ = store.alerts.append([_updated(a), _opened(_node())])
    (c,) = store.alerts.append([_cleared(a)])
    stream = Stream(served.stub, apb.SubscribeRequest(nodes=[node], resume_after=a.id))
    try:
        assert [stream.alert(), stream.alert()] == [b, c]  # cleared events too: a cursor misses nothing
        assert stream.caught_up().head_id == store.alerts.last_id
    finally:
        stream.close()


def test_a_cursor_beyond_the_head_is_refused_out_of_range_naming_the_head(served: Served) -> None:
    node = _node()
    served.service.store.alerts.append([_opened(node)])
    head = served.service.store.alerts.last_id
    refused = _refusal(
        lambda: Stream(served.stub, apb.SubscribeRequest(nodes=[node], resume_after=head + 1000)).next()
    )
    assert isinstance(refused, grpc.Call)
    assert refused.code() == grpc.StatusCode.OUT_OF_RANGE
    assert str(head) in (refused.details() or "")
    assert dict(refused.trailing_metadata() or ())[HEAD_ID_KEY] == str(head)


@pytest.mark.parametrize(
    "request_",
    [
        apb.SubscribeRequest(nodes=["node-x"], resume_after=1, start=apb.START_FROM_LIVE),
        apb.SubscribeRequest(nodes=["node-x"], resume_after=1, start=apb.START_FROM_OPEN_ALERTS),
        apb.SubscribeRequest(nodes=["node-x"], start=9),  # type: ignore[arg-type]  # not a StartFrom
    ],
)
def test_a_start_choice_with_a_cursor_or_an_undefined_one_is_invalid(
    served: Served, request_: apb.SubscribeRequest
) -> None:
    served.service.store.alerts.append([_opened("node-x")])  # the cursor is within the log
    refused = _refusal(lambda: Stream(served.stub, request_).next())
    assert isinstance(refused, grpc.Call)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- listing --------------------------------------------------------------------------------------


def test_listing_then_resuming_from_its_head_id_leaves_no_gap(served: Served) -> None:
    node = _node()
    store = served.service.store
    empty = served.stub.ListActiveAlerts(apb.ListActiveAlertsRequest(nodes=[node]))
    assert list(empty.alerts) == []
    assert empty.head_id == store.alerts.last_id > 0  # an empty listing still says where the log is
    (a,) = store.alerts.append([_opened(node)])
    (b,) = store.alerts.append([_opened(node, gpu=1)])
    (a2,) = store.alerts.append([_updated(a)])
    listing = served.stub.ListActiveAlerts(apb.ListActiveAlertsRequest(nodes=[node]))
    assert [x.id for x in listing.alerts] == [a2.id, b.id]  # newest event of each, oldest alert first
    assert listing.head_id == store.alerts.last_id
    (after,) = store.alerts.append([_cleared(b)])
    stream = Stream(served.stub, apb.SubscribeRequest(nodes=[node], resume_after=listing.head_id))
    try:
        assert stream.alert() == after
        assert stream.caught_up().head_id == after.id
    finally:
        stream.close()


# -- acknowledgements -----------------------------------------------------------------------------


@pytest.fixture
def registered(served: Served) -> tuple[str, apb.Alert, apb.Alert, apb.Alert]:
    """A job on a node with an open alert (opened and updated) and a cleared one."""
    node = _node()
    job = f"job-{node}"
    served.stub.RegisterJob(apb.RegisterJobRequest(job_id=job, nodes=[node]))
    store = served.service.store
    opened, gone = store.alerts.append([_opened(node, gpu=0), _opened(node, gpu=1)])
    update, cleared = store.alerts.append([_updated(opened), _cleared(gone)])
    return job, opened, update, cleared


def _ack(alert_id: int, job_id: str, action: int) -> apb.AcknowledgeRequest:
    return apb.AcknowledgeRequest(alert_id=alert_id, job_id=job_id, action=action)  # type: ignore[arg-type]


def test_acknowledgements_are_validated_without_authentication(
    served: Served, registered: tuple[str, apb.Alert, apb.Alert, apb.Alert]
) -> None:
    job, opened, _, cleared = registered
    store = served.service.store
    served.stub.RegisterJob(apb.RegisterJobRequest(job_id="job-elsewhere", nodes=[_node()]))
    cases = {
        "undefined action": (_ack(opened.id, job, 42), grpc.StatusCode.INVALID_ARGUMENT, "RECEIVED"),
        "no action": (_ack(opened.id, job, 0), grpc.StatusCode.INVALID_ARGUMENT, "SNAPSHOT_DONE"),
        "no job": (
            _ack(opened.id, "", apb.ACK_ACTION_SNAPSHOT_DONE),
            grpc.StatusCode.INVALID_ARGUMENT,
            "job_id",
        ),
        "unregistered job": (
            _ack(opened.id, "job-nobody", apb.ACK_ACTION_SNAPSHOT_DONE),
            grpc.StatusCode.FAILED_PRECONDITION,
            "not registered",
        ),
        "another job": (
            _ack(opened.id, "job-elsewhere", apb.ACK_ACTION_SNAPSHOT_DONE),
            grpc.StatusCode.PERMISSION_DENIED,
            opened.node,
        ),
        "a cleared event": (
            _ack(cleared.id, job, apb.ACK_ACTION_RECEIVED),
            grpc.StatusCode.INVALID_ARGUMENT,
            f"opened_id {cleared.opened_id}",
        ),
        "no such event": (
            _ack(store.alerts.last_id + 100, job, apb.ACK_ACTION_RECEIVED),
            grpc.StatusCode.NOT_FOUND,
            "",
        ),
        "an id beyond any event": (_ack(2**63, job, apb.ACK_ACTION_RECEIVED), grpc.StatusCode.NOT_FOUND, ""),
    }
    for what, (request, code, says) in cases.items():
        refused = _refusal(lambda request=request: served.stub.Acknowledge(request))
        assert isinstance(refused, grpc.Call)
        assert (refused.code(), says in (refused.details() or "")) == (code, True), (what, refused.details())
    assert store.acks.of(opened.id) == []  # nothing refused was recorded
    assert store.acks.of(cleared.id) == []
    assert served.service.remediator.done == []


def test_any_open_event_of_an_alert_may_be_acknowledged(
    served: Served, registered: tuple[str, apb.Alert, apb.Alert, apb.Alert]
) -> None:
    job, opened, update, _ = registered
    store = served.service.store
    for n, event in enumerate((opened, update), 1):
        reply = served.stub.Acknowledge(_ack(event.id, job, apb.ACK_ACTION_RECEIVED))
        assert reply.accepted
        # Recorded for the alert (under which of its ids is the remediator's business).
        assert [a.job_id for a in store.acks.of(opened.id) + store.acks.of(update.id)] == [job] * n


def test_snapshot_done_for_an_alert_whose_risk_fell_back_drains_nothing(
    served: Served, registered: tuple[str, apb.Alert, apb.Alert, apb.Alert]
) -> None:
    job, _, _, cleared = registered  # the alert on GPU 1 cleared: its risk fell back
    reply = served.stub.Acknowledge(_ack(cleared.opened_id, job, apb.ACK_ACTION_SNAPSHOT_DONE))
    assert reply.accepted
    assert "nothing to remediate" in reply.remediation
    assert served.service.store.remediations.of(cleared.opened_id) is None


def test_a_job_registration_names_real_nodes(served: Served) -> None:
    for nodes in ([""], ["node a"], [_node(), ""]):
        refused = _refusal(
            lambda nodes=nodes: served.stub.RegisterJob(apb.RegisterJobRequest(job_id="j", nodes=nodes))
        )
        assert isinstance(refused, grpc.Call)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_replay_cut_short_by_a_stopping_service_is_not_called_complete(
    stub_model: Path, tmp_path: Path
) -> None:
    service = Service.open(stub_model, tmp_path)
    node = _node()
    service.store.alerts.append([_opened(node, padding=2000) for _ in range(3000)])
    port = service.start("127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = Stream(
                apb_grpc.AlertsStub(channel), apb.SubscribeRequest(nodes=[node], start=apb.START_FROM_HISTORY)
            )
            assert stream.alert().id > 0
            service.stopping.set()  # what stop() sets first; the stream must not claim the replay is done
            messages: list[apb.SubscribeResponse] = []

            def read_to_the_end() -> None:
                while True:
                    messages.append(stream.next())

            with pytest.raises(grpc.RpcError) as ended:
                read_to_the_end()
            assert not any(m.HasField("caught_up") for m in messages)
            assert len(messages) < 2999
            assert isinstance(ended.value, grpc.Call)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        service.stop(0)


def test_a_stopping_service_ends_a_live_subscription_with_unavailable(
    stub_model: Path, tmp_path: Path
) -> None:
    # A client that reconnects only on errors must hear an error: an OK end left it deaf.
    service = Service.open(stub_model, tmp_path)
    port = service.start("127.0.0.1:0")
    stopping = threading.Thread(target=service.stop, args=(5.0,))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = Stream(
                apb_grpc.AlertsStub(channel), apb.SubscribeRequest(nodes=[_node()], start=apb.START_FROM_LIVE)
            )
            assert stream.next().HasField("caught_up")  # live now
            stopping.start()
            with pytest.raises(grpc.RpcError) as ended:
                stream.next()
    finally:
        if stopping.is_alive() or stopping.ident is not None:
            stopping.join()
        else:
            service.stop(0)
    assert isinstance(ended.value, grpc.Call)
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "stopping" in (ended.value.details() or "")
