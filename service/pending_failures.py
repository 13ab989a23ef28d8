"""Failure signs taken at ingest whose FAILED events are not stored yet, kept in the state store.

A sign is found on the ingest path and its FAILED event is stored a moment later by the scoring
thread; the sample is acknowledged in between, so a kill there would lose the failure (the collector
never sends that sample again). The sign is written here before the acknowledgement, and taken off
once its event is stored; a start publishes what is left. Failures are rare, so one small write per
sign costs nothing on the ingest path.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable

from faultcast.failure_signs import Evidence, FailureSign
from faultcast.service.state.db import StateWriteError
from faultcast.service.state.settings import Settings

log = logging.getLogger(__name__)

KEY = "pending_failure_signs"
SignKey = tuple[str, int, str, int, int]


def sign_key(sign: FailureSign) -> SignKey:
    """What tells one sign from another: where, what, and the sample it was seen in."""
    return sign.node, sign.gpu, sign.evidence.value, sign.xid, sign.time_unix_nano


class PendingFailures:
    """The signs whose events are not stored yet; thread-safe (ingest adds, the scoring thread
    takes off)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._pending: dict[SignKey, FailureSign] = {}
        self.unwritten = 0  # writes the store refused: those signs would not outlive a kill

    def load(self) -> list[FailureSign]:
        """What an earlier run left (also kept here until `done`); an unreadable setting is logged
        and dropped."""
        raw = self.settings.get(KEY)
        if raw is None:
            return []
        try:
            signs = [_sign(entry) for entry in json.loads(raw)]
        except (ValueError, TypeError, KeyError) as exc:
            log.error("the failure signs an earlier run left are unreadable (%s); going on without them", exc)
            return []
        with self._lock:
            self._pending.update((sign_key(s), s) for s in signs)
        return signs

    def add(self, signs: Iterable[FailureSign]) -> None:
        """Keep the signs until their events are stored (before their sample is acknowledged)."""
        with self._lock:
            self._pending.update((sign_key(s), s) for s in signs)
            self._write()

    def done(self, signs: Iterable[FailureSign]) -> None:
        """Their events are stored: nothing left to keep."""
        with self._lock:
            gone = [self._pending.pop(sign_key(s), None) for s in signs]
            if any(g is not None for g in gone):
                self._write()

    def _write(self) -> None:
        """Write what is pending (the lock held); a refusal is logged and counted by the store."""
        value = json.dumps([_entry(s) for s in self._pending.values()]) if self._pending else None
        try:
            self.settings.save(KEY, value)
        except StateWriteError as exc:
            self.unwritten += 1
            log.warning("failure signs not kept for a restart (%s): a kill now would lose them", exc)


def _entry(sign: FailureSign) -> dict[str, object]:
    return {
        "node": sign.node,
        "gpu": sign.gpu,
        "uuid": sign.uuid,
        "evidence": sign.evidence.value,
        "detail": sign.detail,
        "time_unix_nano": sign.time_unix_nano,
        "xid": sign.xid,
    }


def _sign(entry: dict[str, object]) -> FailureSign:
    match entry:
        case {
            "node": str(node),
            "gpu": int(gpu),
            "uuid": str(uuid),
            "evidence": str(evidence),
            "detail": str(detail),
            "time_unix_nano": int(time_ns),
            "xid": int(xid),
        }:
            return FailureSign(node, gpu, uuid, Evidence(evidence), detail, time_ns, xid)
    raise TypeError(f"a pending failure sign of unexpected form: {entry!r:.200}")
