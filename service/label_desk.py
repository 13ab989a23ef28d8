"""What operators do to the fleet's label log through the Admin API: add failures (a harvested log, a
fault found by hand), judge alerts true or false, and read the log back (service/state/labels.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from faultcast.service.state.labels import (
    MAX_DETAIL_CHARS,
    MODE_FROM_PB,
    VERDICT_FROM_PB,
    FailureLabel,
    LabelSource,
    Verdict,
    failure_from_pb,
    failure_to_pb,
    verdict_to_pb,
)
from faultcast.service.state.store import StateStore
from faultcast.service.training_labels import training_labels
from faultcast.v1 import alerts_pb2 as apb

log = logging.getLogger(__name__)

MAX_FAILURES_PER_CALL = 10_000
DEFAULT_LIST_LIMIT = 1_000


class LabelRefusedError(ValueError):
    """A label request that cannot be carried out; `not_found` when it names an alert the log lacks."""

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


class LabelDesk:
    """The Admin API's label operations over the state store; `horizon_s` says how far after an acted-on
    alert a failure still settles it (the serving model's horizon)."""

    def __init__(self, store: StateStore, horizon_s: Callable[[], float]) -> None:
        self.store, self.horizon_s = store, horizon_s

    def add_failures(self, request: apb.AddFailuresRequest, by: str) -> apb.AddFailuresResponse:
        """Store the failures (all or none); LabelRefusedError naming the first bad one."""
        if len(request.failures) > MAX_FAILURES_PER_CALL:
            raise LabelRefusedError(
                f"{len(request.failures)} failures in one call: at most {MAX_FAILURES_PER_CALL:,}; send them in parts"
            )
        try:
            failures = [failure_from_pb(f, LabelSource.OPERATOR) for f in request.failures]
        except ValueError as exc:
            raise LabelRefusedError(str(exc)) from None
        added, there = self.store.labels.add(failures, by)
        log.info("%s added %d failures to the label log (%d were there already)", by, added, there)
        return apb.AddFailuresResponse(added=added, already_there=there)

    def judge_alert(self, request: apb.JudgeAlertRequest, by: str) -> apb.JudgeAlertResponse:
        """Record a verdict on a predicting alert (and, TRUE, the failure it confirms)."""
        verdict = VERDICT_FROM_PB.get(request.verdict)
        if verdict is None:
            raise LabelRefusedError(
                "give a verdict: VERDICT_TRUE (the hardware was failing) or VERDICT_FALSE"
            )
        event = self.store.alerts.get(request.alert_id) if request.alert_id else None
        if event is None:
            raise LabelRefusedError(f"no alert {request.alert_id} in the alert log", not_found=True)
        opened = self.store.alerts.get(event.opened_id) or event
        if opened.state == apb.ALERT_STATE_FAILED:
            raise LabelRefusedError(
                f"alert {opened.id} is a FAILED event, already a failure in the label log; verdicts are for "
                "alerts that predicted one"
            )
        failure = None
        if verdict is Verdict.TRUE:
            last = self.store.alerts.newest_event(opened.id) or opened
            failure = FailureLabel(
                node=opened.node,
                gpu=opened.gpu,
                mode=MODE_FROM_PB.get(opened.mode),
                time_ns=request.failure_unix_nano or last.time_unix_nano,
                source=LabelSource.OPERATOR,
                uuid=opened.gpu_uuid,
                detail=f"alert {opened.id} judged true: {request.why}"[:MAX_DETAIL_CHARS],
                alert_id=opened.id,
            )
        try:
            stored, stored_failure = self.store.labels.judge(opened.id, verdict, request.why, by, failure)
        except ValueError as exc:  # the failure's time
            raise LabelRefusedError(str(exc)) from None
        log.info("%s judged alert %d %s: %s", by, opened.id, verdict.value, request.why)
        reply = apb.JudgeAlertResponse(verdict=verdict_to_pb(stored))
        if stored_failure is not None:
            reply.failure.CopyFrom(failure_to_pb(stored_failure))
        return reply

    def list_labels(self, request: apb.ListLabelsRequest) -> apb.ListLabelsResponse:
        """A page of failures and verdicts, and the alerts left censored now."""
        limit = min(request.limit or DEFAULT_LIST_LIMIT, MAX_FAILURES_PER_CALL)
        labels = self.store.labels
        return apb.ListLabelsResponse(
            failures=[failure_to_pb(f) for f in labels.failures(request.after_failure_id, limit)],
            verdicts=[verdict_to_pb(v) for v in labels.verdicts(request.after_verdict_id, limit)],
            censored_alerts=[s.alert_id for s in training_labels(self.store, self.horizon_s()).censored],
        )
