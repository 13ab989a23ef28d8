"""The fleet's label log in the training format: one failure log (failures.csv) and the hours training
must leave out (censored.csv), from the state database's labels, verdicts and remediations.

Failures: every source's rows, merged where they are one fault. A row of the same node (the same GPU,
or either at node level) and the same mode (or either unknown) within `gap_s` after another is the
same failure, which keeps the earliest time and the GPU and mode whichever row knew them (a kernel
log's Xid 79 and the service's FAILED event for it are one failure; so are a Slurm drain and the Xid
that caused it). Left out: a FAILED event of a node gone silent that no other source confirms (a cut
network or a crashed collector looks the same as a dead host; the model must not learn that a healthy
node fails), and a failure an operator's TRUE verdict added when the alert's newest verdict is FALSE.

Censored: an alert whose node was taken out on its prediction (remediation outcome ok) and that no
failure on that GPU (or node) within the horizon after its last event and no verdict has settled. The
fault may have been prevented, or there was none: its hours are neither positive nor negative. The
span runs from a horizon before the alert opened (samples that would have been positives had the
fault come) to a horizon after its last event. A FALSE verdict makes the hours negatives again; a
TRUE verdict makes them positives (through the failure it adds).
"""

from __future__ import annotations

import csv
import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from faultcast.model.importers.failure_log import Failure, write_failures
from faultcast.service.state.labels import FailureLabel, LabelSource, Verdict
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb

DEFAULT_GAP_S = 3600.0  # as `faultcast failures` folds one fault's repeated lines
CENSORED_FIELDS = ("start", "end", "node", "gpu", "alert_id", "why")
_UNCONFIRMED = frozenset({"node_silent"})  # evidence that alone does not show hardware failed
_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class CensoredSpan:
    """Hours of one GPU (gpu -1: the node) whose label nobody knows: an alert acted on and not settled."""

    node: str
    gpu: int
    start_ns: int
    end_ns: int
    alert_id: int
    why: str


@dataclass(frozen=True, slots=True)
class TrainingLabels:
    """What the label log says, ready for training: merged failures (each with the sources that saw it)
    and the censored spans; `left_out` counts the rows not used, by why."""

    failures: list[tuple[FailureLabel, frozenset[LabelSource]]]
    censored: list[CensoredSpan]
    left_out: dict[str, int]


def training_labels(store: StateStore, horizon_s: float, gap_s: float = DEFAULT_GAP_S) -> TrainingLabels:
    """The label log's failures merged and its unsettled acted-on alerts censored (module docstring)."""
    verdicts = store.labels.newest_verdicts()
    left_out: dict[str, int] = defaultdict(int)
    usable = []
    for f in store.labels.failures():
        if f.source is LabelSource.OPERATOR and f.alert_id and verdicts.get(f.alert_id) is Verdict.FALSE:
            left_out["taken back by a FALSE verdict"] += 1
        else:
            usable.append(f)
    merged = _merge(usable, gap_s)
    failures = []
    for failure, sources, evidence in merged:
        if sources == {LabelSource.FAILURE_EVENT} and evidence <= _UNCONFIRMED:
            left_out["a silent node no other source confirms"] += 1
        else:
            failures.append((failure, frozenset(sources)))
    censored = _censored(store, [f for f, _ in failures], verdicts, horizon_s)
    return TrainingLabels(failures, censored, dict(left_out))


def _same_fault(kept: FailureLabel, new: FailureLabel, gap_ns: int) -> bool:
    return (
        kept.node == new.node
        and (kept.gpu == new.gpu or -1 in (kept.gpu, new.gpu))
        and (kept.mode == new.mode or None in (kept.mode, new.mode))
        and 0 <= new.time_ns - kept.time_ns <= gap_ns
    )


def _merge(
    failures: list[FailureLabel], gap_s: float
) -> list[tuple[FailureLabel, set[LabelSource], set[str]]]:
    """One row per fault, earliest first: (the fault, its sources, the FAILED events' evidence)."""
    gap_ns = int(gap_s * _NS)
    by_node: dict[str, list[tuple[FailureLabel, set[LabelSource], set[str]]]] = defaultdict(list)
    for f in sorted(failures, key=lambda f: (f.time_ns, f.id)):
        kept = by_node[f.node]
        # The fault it joins: one of the same mode first, else the earliest (a drain follows the first).
        candidates = [i for i, (fault, _, _) in enumerate(kept) if _same_fault(fault, f, gap_ns)]
        if candidates:
            i = min(candidates, key=lambda i: (kept[i][0].mode != f.mode, kept[i][0].time_ns))
            fault, sources, evidence = kept[i]
            kept[i] = (_fill(fault, f), sources | {f.source}, evidence | {f.evidence or f.source.value})
        else:
            kept.append((f, {f.source}, {f.evidence or f.source.value}))
    return sorted((row for rows in by_node.values() for row in rows), key=lambda r: r[0].time_ns)


def _fill(fault: FailureLabel, other: FailureLabel) -> FailureLabel:
    """The fault with the GPU and the mode the other row knew where it did not."""
    gpu = fault.gpu if fault.gpu >= 0 else other.gpu
    uuid = fault.uuid or (other.uuid if other.gpu == gpu else "")
    return replace(fault, gpu=gpu, uuid=uuid, mode=fault.mode or other.mode, xid=fault.xid or other.xid)


def _censored(
    store: StateStore, failures: list[FailureLabel], verdicts: dict[int, Verdict], horizon_s: float
) -> list[CensoredSpan]:
    horizon_ns = int(horizon_s * _NS)
    by_node: dict[str, list[FailureLabel]] = defaultdict(list)
    for f in failures:
        by_node[f.node].append(f)
    spans = []
    for alert_id, node in store.remediations.succeeded():
        opened = store.alerts.get(alert_id)
        if opened is None or opened.state != apb.ALERT_STATE_OPEN or alert_id in verdicts:
            continue  # a FAILED event's drain, or settled by an operator
        last = store.alerts.newest_event(alert_id) or opened
        gpus = set(opened.gpus) | {opened.gpu}
        start, end = opened.time_unix_nano - horizon_ns, last.time_unix_nano + horizon_ns
        came = any(
            opened.time_unix_nano - horizon_ns <= f.time_ns <= end
            and (f.gpu < 0 or f.gpu in gpus or opened.gpu < 0)
            for f in by_node[node]
        )
        if not came:
            spans.append(
                CensoredSpan(node, opened.gpu, max(start, 0), end, alert_id, "drained on the prediction")
            )
    return spans


def write(labels: TrainingLabels, out: Path) -> tuple[Path, Path]:
    """Write `out`/failures.csv (FAILURE_FIELDS) and `out`/censored.csv; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    failures_csv, censored_csv = out / "failures.csv", out / "censored.csv"
    write_failures(failures_csv, (_as_row(f, sources) for f, sources in labels.failures))
    with censored_csv.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CENSORED_FIELDS)
        for span in labels.censored:
            writer.writerow(
                [_iso(span.start_ns), _iso(span.end_ns), span.node, "" if span.gpu < 0 else span.gpu,
                 span.alert_id, span.why]
            )  # fmt: skip
    return failures_csv, censored_csv


def _as_row(f: FailureLabel, sources: frozenset[LabelSource]) -> Failure:
    said = "+".join(sorted(s.value for s in sources))
    return Failure(
        time_s=f.time_ns / _NS,
        node=f.node,
        gpu=f.gpu if f.gpu >= 0 else None,
        uuid=f.uuid,
        mode=f.mode.value if f.mode is not None else "unknown",
        xid=f.xid or None,
        description=f"[{said}] {f.detail}".strip(),
    )


def _iso(time_ns: int) -> str:
    moment = dt.datetime.fromtimestamp(time_ns / _NS, tz=dt.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
