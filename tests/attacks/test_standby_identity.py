"""The standby seam, tried as an attacker tried it, against a real service over TLS with
bearer tokens and spares readied through a real webhook receiver (the "scheduler", which is handed
each spare's claim and starts the standby with it).

The attack: the trainer of job X asked AwaitHandOver(standby_for=X, job_id=V), so that its own
hand-over would name V's id as X's standby; from then on X's identity acted for V (listed V's
alerts, moved its registration, declined or acknowledged them with a snapshot directory of its
choosing) and V's real standby was told GO into that directory. The same root let anyone with a
job's identity squat its spare. Each step is refused now, the real standby is untouched, and a
restart keeps the refusals (they come from what is on disk: no hand-over was ever recorded)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from faultcast.service.remediation.spares.webhook import WebhookSpares
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from tests.attacks.remediation_parts import migrate_alert
from tests.attacks.tokened import Tokened, tokened_service
from tests.webhook_receiver import Receiver, receiving

ATTACKER, VICTIM = "job-a", "job-b"  # trainer identities of tests/attacks/tokened.py
NODES = {ATTACKER: "node-x", VICTIM: "node-v"}
WAIT_S = 10.0


@pytest.fixture
def scheduler() -> Iterator[tuple[Receiver, str]]:
    """The webhook receiver: keeps every prepare_spare event, the spare's claim included, as a
    scheduler starting the standby with `standby_env` would."""
    with receiving() as running:
        yield running


def _prepared(receiver: Receiver, job: str) -> dict[str, Any]:
    """The prepare_spare event of the job's spare."""
    return receiver.wait_for(lambda e: e["event"] == "prepare_spare" and e["job_id"] == job, WAIT_S)


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    return grpc.StatusCode.OK


def _until(what: str, predicate: Callable[[], bool]) -> None:
    """Poll another thread's progress until `predicate` holds; fail after WAIT_S."""
    waited = threading.Event()  # never set: its wait is the pause between looks
    for _ in range(int(WAIT_S / 0.01)):
        if predicate():
            return
        waited.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _warn(served: Tokened, job: str) -> apb.Alert:
    """A snapshot-and-migrate alert on the job's node, heard by the service's listeners as the alert
    book would tell them (the spare is asked for, the grace timer armed)."""
    alert = migrate_alert(served.service.store, NODES[job])
    assert served.service.prescheduler is not None
    served.service.prescheduler.on_alerts([alert])
    served.service.remediator.on_alerts([alert])
    served.service.prescheduler.drain_calls()
    return alert


def _register(served: Tokened) -> None:
    for job, node in NODES.items():
        with served.channel(job) as channel:
            apb_grpc.AlertsStub(channel).RegisterJob(
                apb.RegisterJobRequest(job_id=job, nodes=[node], stands_by=True)
            )


def _acts_for_the_victim(served: Tokened, victim_alert: apb.Alert) -> dict[str, grpc.StatusCode]:
    """What the attacker's identity gets for each thing the attack did with the victim's authority."""
    with served.channel(ATTACKER) as channel:
        stub = apb_grpc.AlertsStub(channel)
        return {
            "list": _code(lambda: stub.ListActiveAlerts(apb.ListActiveAlertsRequest(job_id=VICTIM))),
            "register": _code(
                lambda: stub.RegisterJob(apb.RegisterJobRequest(job_id=VICTIM, nodes=[NODES[ATTACKER]]))
            ),
            "decline": _code(
                lambda: stub.Acknowledge(
                    apb.AcknowledgeRequest(
                        alert_id=victim_alert.id, job_id=VICTIM, action=apb.ACK_ACTION_DECLINED
                    )
                )
            ),
            "snapshot_done": _code(
                lambda: stub.Acknowledge(
                    apb.AcknowledgeRequest(
                        alert_id=victim_alert.id,
                        job_id=VICTIM,
                        action=apb.ACK_ACTION_SNAPSHOT_DONE,
                        step=7,
                        checkpoint_uri="file:///tmp/attacker/step-000000007",
                    )
                )
            ),
        }


def _await(served: Tokened, who: str, request: apb.AwaitHandOverRequest) -> apb.HandOver:
    with served.channel(who) as channel:
        reply: apb.HandOver = apb_grpc.AlertsStub(channel).AwaitHandOver(request, timeout=WAIT_S + 10)
        return reply


@pytest.mark.parametrize("trainers_register", [True, False], ids=["trainers-register", "admins-register"])
def test_no_trainer_can_make_itself_another_jobs_standby_and_a_restart_keeps_it_so(
    stub_model: Path,
    tmp_path: Path,
    scheduler: tuple[Receiver, str],
    trainers_register: bool,
) -> None:
    receiver, url = scheduler
    spares = WebhookSpares(url)
    with tokened_service(stub_model, tmp_path, spares=spares) as served:
        _register(served)  # (trainers register here; the admin-registration service is the restart)
        mine, theirs = _warn(served, ATTACKER), _warn(served, VICTIM)
        own_claim = _prepared(receiver, ATTACKER)["standby_env"]["FAULTCAST_STANDBY_CLAIM"]
        before = served.counted("faultcast_auth_denied_total", reason="standby_claim")

        # 1. The latch: without a claim, with a guess, even with its own spare's claim (the attacker
        # may read its own standby's environment), the attacker cannot name the victim as its standby.
        for claim in ("", "guess", own_claim):
            attempt = apb.AwaitHandOverRequest(
                standby_for=ATTACKER, job_id=VICTIM, node="node-q", wait_seconds=0.0, claim=claim
            )
            refused = _code(lambda attempt=attempt: _await(served, ATTACKER, attempt))  # type: ignore[misc]
            assert refused == grpc.StatusCode.PERMISSION_DENIED, claim
        assert served.counted("faultcast_auth_denied_total", reason="standby_claim") == before + 2
        assert served.counted("faultcast_auth_denied_total", reason="standby_job") >= 1

        # 2. Its own hand-over then names no standby: the job is requeued, nobody inherits anything.
        with served.channel(ATTACKER) as channel:
            answer = apb_grpc.AlertsStub(channel).Acknowledge(
                apb.AcknowledgeRequest(
                    alert_id=mine.id,
                    job_id=ATTACKER,
                    action=apb.ACK_ACTION_SNAPSHOT_DONE,
                    step=5,
                    checkpoint_uri="file:///tmp/attacker/step-000000005",
                )
            )
        assert VICTIM not in answer.remediation
        assert "standby" not in answer.remediation
        assert served.service.store.remediations.predecessors(VICTIM) == []

        # 3. Nothing done with the victim's authority is allowed.
        assert _acts_for_the_victim(served, theirs) == dict.fromkeys(
            ("list", "register", "decline", "snapshot_done"), grpc.StatusCode.PERMISSION_DENIED
        )

        # 4. The squat: the victim's spare cannot be taken by its own job's identity without the claim,
        # and its real standby, which has it, waits under the id the scheduler named and goes.
        event = _prepared(receiver, VICTIM)
        squat = apb.AwaitHandOverRequest(
            standby_for=VICTIM, job_id=event["standby_job_id"], node="node-q", wait_seconds=0.0
        )
        assert _code(lambda: _await(served, VICTIM, squat)) == grpc.StatusCode.PERMISSION_DENIED
        real = apb.AwaitHandOverRequest(
            standby_for=VICTIM,
            job_id=event["standby_env"]["FAULTCAST_JOB_ID"],
            node="node-s",
            wait_seconds=WAIT_S,
            claim=event["standby_env"]["FAULTCAST_STANDBY_CLAIM"],
            alert_id=theirs.id,
        )
        replies: list[apb.HandOver] = []
        standby = threading.Thread(target=lambda: replies.append(_await(served, VICTIM, real)))
        standby.start()
        prescheduler = served.service.prescheduler
        assert prescheduler is not None
        spare = prescheduler.spare_of(VICTIM)
        assert spare is not None
        _until("the standby's call to be held", lambda: spare.waiting > 0)
        with served.channel(VICTIM) as channel:
            apb_grpc.AlertsStub(channel).Acknowledge(
                apb.AcknowledgeRequest(
                    alert_id=theirs.id,
                    job_id=VICTIM,
                    action=apb.ACK_ACTION_SNAPSHOT_DONE,
                    step=9,
                    checkpoint_uri="file:///ckpt/victim/step-000000009",
                )
            )
        standby.join(WAIT_S + 10)
        assert [(r.state, r.checkpoint_uri) for r in replies] == [
            (apb.HAND_OVER_STATE_GO, "file:///ckpt/victim/step-000000009")
        ]
        assert served.service.store.remediations.predecessors(event["standby_job_id"]) == [VICTIM]

    # 5. A restart (the same state directory) keeps every refusal: they rest on what is on disk.
    with tokened_service(
        stub_model, tmp_path, spares=spares, trainers_register=trainers_register
    ) as restarted:
        assert restarted.service.store.remediations.predecessors(VICTIM) == []
        after = _acts_for_the_victim(restarted, theirs)
        assert set(after.values()) == {grpc.StatusCode.PERMISSION_DENIED}
        # The restarted service has no spare of the attacker's job: its latch is let go, and leaves
        # nothing behind.
        latch = apb.AwaitHandOverRequest(standby_for=ATTACKER, job_id=VICTIM, node="n", claim=own_claim)
        assert _await(restarted, ATTACKER, latch).state == apb.HAND_OVER_STATE_RELEASED
        assert restarted.service.store.remediations.predecessors(VICTIM) == []
