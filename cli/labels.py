"""`faultcast labels`: the fleet's label log, which retraining learns from.

`list`, `judge`, `add` and `import` talk to a running service (Admin API, an admin's identity);
`export` reads a state directory (the service may be running: SQLite readers do not block it) and
writes the training format: failures.csv and censored.csv (service/training_labels.py).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from faultcast.cli.admin_client import add_service_arguments, admin_call, iso_time
from faultcast.cli.types import Subcommands, duration

if TYPE_CHECKING:  # the CLI loads grpc only when a subcommand talks to the service
    from faultcast.v1 import alerts_pb2 as apb_types

_SOURCES = ("kernel_log", "slurm", "harvested", "operator")
_BATCH = 5_000  # failures per AddFailures call (the service takes up to 10,000)


def add_parser(commands: Subcommands) -> None:
    """Register `faultcast labels` and its subcommands."""
    parser = commands.add_parser(
        "labels",
        help="the fleet's label log: failures and verdicts that retraining learns from",
        description="The label log the service keeps: failures from its own FAILED events, harvested logs "
        "and operators, and operators' verdicts on alerts. An alert whose node was drained on its prediction "
        "and that nothing settled is censored: perhaps a failure prevented, never counted as a false alarm.",
    )
    sub = parser.add_subparsers(dest="labels_command", required=True, metavar="ACTION")

    listing = add_service_arguments(sub.add_parser("list", help="print the label log"))
    listing.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    listing.set_defaults(handler=_list)

    judge = add_service_arguments(sub.add_parser("judge", help="say whether an alert was right"))
    judge.add_argument("alert_id", type=int, help="the alert (any of its event ids)")
    judge.add_argument(
        "verdict", choices=["true", "false"], help="true: the hardware was failing; false: it was not"
    )
    judge.add_argument("--why", default="", help="what was found (a diagnostic, a repair ticket)")
    judge.add_argument(
        "--failure-time",
        type=_time,
        help="true: when the failure struck (ISO 8601; default: the alert's last event)",
    )
    judge.set_defaults(handler=_judge)

    add = add_service_arguments(sub.add_parser("add", help="add a failure the service did not see"))
    add.add_argument("--node", required=True)
    add.add_argument("--gpu", type=int, default=-1, help="the GPU index (default: the whole node)")
    add.add_argument(
        "--time", type=_time, required=True, help="when it struck (ISO 8601, UTC unless it says)"
    )
    add.add_argument(
        "--mode", help="the failure mode (faultcast.modes: hbm_wear, nvlink, ...); default unknown"
    )
    add.add_argument("--xid", type=int, default=0)
    add.add_argument("--why", default="", help="what was found")
    add.set_defaults(handler=_add)

    imp = add_service_arguments(
        sub.add_parser("import", help="add a failure log (failures.csv, e.g. from `faultcast failures`)")
    )
    imp.add_argument("failures", type=Path, help="the failure log CSV")
    imp.add_argument("--source", choices=_SOURCES, default="harvested", help="where its failures came from")
    imp.set_defaults(handler=_import)

    export = sub.add_parser("export", help="write the label log in the training format (reads --state-dir)")
    export.add_argument("--state-dir", type=Path, required=True, help="the service's state directory")
    export.add_argument("--out", type=Path, required=True, help="folder for failures.csv and censored.csv")
    export.add_argument(
        "--horizon",
        type=duration,
        default=1800.0,
        help="how long after an acted-on alert a failure settles it",
    )
    export.set_defaults(handler=_export)


def _time(text: str) -> int:
    """An ISO 8601 time as Unix nanoseconds (UTC when it names no zone)."""
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time (e.g. 2026-12-07T10:31:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1e9)


def _list(args: argparse.Namespace) -> int:
    from faultcast.v1 import alerts_pb2 as apb

    after_failure = after_verdict = 0
    censored: list[int] = []
    while True:
        page = admin_call(args, "faultcast labels", "ListLabels", apb.ListLabelsRequest(after_failure_id=after_failure,
                                                                after_verdict_id=after_verdict))  # fmt: skip
        assert isinstance(page, apb.ListLabelsResponse)
        for f in page.failures:
            _print_failure(f, args.json)
        for v in page.verdicts:
            _print_verdict(v, args.json)
        censored = list(page.censored_alerts)
        if not page.failures and not page.verdicts:
            break
        after_failure = page.failures[-1].id if page.failures else after_failure
        after_verdict = page.verdicts[-1].id if page.verdicts else after_verdict
    for alert_id in censored:
        if args.json:
            print(json.dumps({"kind": "censored", "alert_id": alert_id}))
        else:
            print(
                f"censored  alert {alert_id}: drained on its prediction, nothing settled it (prevented or unknown)"
            )
    return 0


def _print_failure(f: object, as_json: bool) -> None:
    from google.protobuf.json_format import MessageToDict

    from faultcast.v1 import alerts_pb2 as apb

    assert isinstance(f, apb.FailureLabel)
    if as_json:
        print(json.dumps({"kind": "failure", **MessageToDict(f, preserving_proto_field_name=True)}))
        return
    where = f.node if f.gpu < 0 else f"{f.node} gpu {f.gpu}"
    mode = apb.FailureMode.Name(f.mode).removeprefix("FAILURE_MODE_").lower()
    source = apb.LabelSource.Name(f.source).removeprefix("LABEL_SOURCE_").lower()
    print(
        f"failure   #{f.id} {iso_time(f.time_unix_nano)} {where} {mode} from {source} by {f.recorded_by}: {f.detail}"
    )


def _print_verdict(v: object, as_json: bool) -> None:
    from google.protobuf.json_format import MessageToDict

    from faultcast.v1 import alerts_pb2 as apb

    assert isinstance(v, apb.AlertVerdict)
    if as_json:
        print(json.dumps({"kind": "verdict", **MessageToDict(v, preserving_proto_field_name=True)}))
        return
    said = apb.Verdict.Name(v.verdict).removeprefix("VERDICT_").lower()
    print(f"verdict   #{v.id} alert {v.alert_id} {said} by {v.recorded_by}: {v.why}")


def _judge(args: argparse.Namespace) -> int:
    from faultcast.v1 import alerts_pb2 as apb

    verdict = apb.VERDICT_TRUE if args.verdict == "true" else apb.VERDICT_FALSE
    reply = admin_call(
        args,
        "faultcast labels",
        "JudgeAlert",
        apb.JudgeAlertRequest(
            alert_id=args.alert_id, verdict=verdict, why=args.why, failure_unix_nano=args.failure_time or 0
        ),
    )
    assert isinstance(reply, apb.JudgeAlertResponse)
    _print_verdict(reply.verdict, False)
    if reply.HasField("failure"):
        _print_failure(reply.failure, False)
    return 0


def _mode_pb(name: str | None) -> apb_types.FailureMode.ValueType:
    from faultcast.modes import FailureMode
    from faultcast.v1 import alerts_pb2 as apb

    if not name or name == "unknown":
        return apb.FAILURE_MODE_UNSPECIFIED
    try:
        return apb.FailureMode.Value(FailureMode(name).proto_name)
    except ValueError:
        known = ", ".join(m.value for m in FailureMode)
        raise SystemExit(f"faultcast labels: unknown mode {name!r} (known: {known}, or unknown)") from None


def _add(args: argparse.Namespace) -> int:
    from faultcast.v1 import alerts_pb2 as apb

    failure = apb.FailureLabel(
        node=args.node, gpu=args.gpu, mode=_mode_pb(args.mode), time_unix_nano=args.time, xid=args.xid,
        detail=args.why, source=apb.LABEL_SOURCE_OPERATOR,
    )  # fmt: skip
    reply = admin_call(args, "faultcast labels", "AddFailures", apb.AddFailuresRequest(failures=[failure]))
    assert isinstance(reply, apb.AddFailuresResponse)
    print("added" if reply.added else "already in the label log")
    return 0


def read_failure_log(path: Path) -> Iterator[tuple[int, str, int, str, str, int, str]]:
    """(time ns, node, gpu, uuid, mode, xid, description) of each row of a failures.csv; SystemExit naming
    the line of a bad row."""
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise SystemExit(f"faultcast labels: cannot read {path}: {exc.strerror}") from None
    with handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                yield (
                    _time(row["timestamp"]),
                    row["node"],
                    int(row["gpu"]) if row.get("gpu") else -1,
                    row.get("uuid") or "",
                    row.get("mode") or "",
                    int(row["xid"]) if row.get("xid") else 0,
                    row.get("description") or "",
                )
            except (KeyError, ValueError, TypeError, argparse.ArgumentTypeError) as exc:
                raise SystemExit(f"faultcast labels: {path}:{line}: {exc}") from None


def _import(args: argparse.Namespace) -> int:
    from faultcast.v1 import alerts_pb2 as apb

    source = apb.LabelSource.Value(f"LABEL_SOURCE_{args.source.upper()}")
    rows = [
        apb.FailureLabel(node=node, gpu=gpu, gpu_uuid=uuid, mode=_mode_pb(mode), time_unix_nano=t, xid=xid,
                         detail=text, source=source)
        for t, node, gpu, uuid, mode, xid, text in read_failure_log(args.failures)
    ]  # fmt: skip
    added = there = 0
    for start in range(0, len(rows), _BATCH):
        reply = admin_call(
            args,
            "faultcast labels",
            "AddFailures",
            apb.AddFailuresRequest(failures=rows[start : start + _BATCH]),
        )
        assert isinstance(reply, apb.AddFailuresResponse)
        added, there = added + reply.added, there + reply.already_there
    print(f"{args.failures}: {len(rows)} failures, {added} added, {there} already in the label log")
    return 0


def _export(args: argparse.Namespace) -> int:
    from faultcast.service.state.db import StateError
    from faultcast.service.state.store import DATABASE_NAME, StateStore
    from faultcast.service.training_labels import training_labels, write

    database = args.state_dir / DATABASE_NAME
    if not database.exists():
        print(
            f"faultcast labels export: no state database in {args.state_dir} ({DATABASE_NAME})",
            file=sys.stderr,
        )
        return 2
    try:
        store = StateStore(database)
    except StateError as exc:
        print(f"faultcast labels export: {exc}", file=sys.stderr)
        return 2
    try:
        labels = training_labels(store, args.horizon)
    finally:
        store.close()
    failures_csv, censored_csv = write(labels, args.out)
    left = ", ".join(f"{n} {why}" for why, n in labels.left_out.items()) or "none"
    print(
        f"wrote {failures_csv} ({len(labels.failures)} failures) and {censored_csv} "
        f"({len(labels.censored)} censored alerts); left out: {left}"
    )
    return 0
