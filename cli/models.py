"""`faultcast models`: the model registry of a running service (Admin API, an admin's identity).

`list` prints the registered models and the registry's log; `add` copies a model directory (a path on
the service's machine) into the registry; `promote` serves a registered model now and `rollback` the one
that served before, both without a restart. Every change records who made it and `--why`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from faultcast.cli.admin_client import add_service_arguments, admin_call, iso_time
from faultcast.cli.types import Subcommands

if TYPE_CHECKING:  # the CLI loads grpc only when a subcommand talks to the service
    from faultcast.v1 import alerts_pb2 as apb_types


def add_parser(commands: Subcommands) -> None:
    """Register `faultcast models` and its subcommands."""
    parser = commands.add_parser(
        "models",
        help="the model registry: list, add, promote and roll back models without a restart",
        description="The models a service may serve, kept in its state directory (models/), and a log of "
        "who added, promoted and rolled back which, and why. The registry's serving model also serves "
        "after a restart, whatever --model says.",
    )
    sub = parser.add_subparsers(dest="models_command", required=True, metavar="ACTION")

    listing = add_service_arguments(
        sub.add_parser("list", help="print the registered models and the registry's log")
    )
    listing.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    listing.set_defaults(handler=_list)

    add = add_service_arguments(sub.add_parser("add", help="copy a model directory into the registry"))
    add.add_argument("path", type=Path, help="the model directory, on the service's machine")
    add.add_argument("--why", required=True, help="what the model is for (a retrain, a fix)")
    add.set_defaults(handler=_add)

    promote = add_service_arguments(sub.add_parser("promote", help="serve a registered model now"))
    promote.add_argument("id", help="the model's id (`faultcast models list`), or a prefix of its digest")
    promote.add_argument("--why", required=True, help="why it should serve (its evaluation, a ticket)")
    promote.add_argument(
        "--force",
        action="store_true",
        help="promote the shadowed challenger even where the shadow's comparison does not find it better",
    )
    promote.set_defaults(handler=_promote)

    rollback = add_service_arguments(
        sub.add_parser("rollback", help="serve again the model that served before")
    )
    rollback.add_argument("--why", required=True, help="what was wrong with the model serving")
    rollback.set_defaults(handler=_rollback)

    shadow = add_service_arguments(
        sub.add_parser("shadow", help="score a registered model beside the serving one, alerting nothing")
    )
    shadow.add_argument("id", nargs="?", default="", help="the challenger's id (none with --stop)")
    shadow.add_argument("--stop", action="store_true", help="end the shadow")
    shadow.add_argument("--why", required=True, help="why it is tried (or stopped)")
    shadow.set_defaults(handler=_shadow)

    compare = add_service_arguments(
        sub.add_parser(
            "compare", help="the shadowed challenger against the serving model on the fleet's labels"
        )
    )
    compare.add_argument("--json", action="store_true", help="the comparison as one JSON object")
    compare.set_defaults(handler=_compare)


def _kind(event: apb_types.ModelEvent) -> str:
    from faultcast.v1 import alerts_pb2 as apb

    return apb.ModelEventKind.Name(event.kind).removeprefix("MODEL_EVENT_KIND_").lower()


def _event_line(event: apb_types.ModelEvent) -> str:
    moved = f" (from {event.from_model_id})" if event.from_model_id else ""
    when = iso_time(event.recorded_unix_nano)
    return f"{when}  {_kind(event):<11}  {event.model_id}{moved}  by {event.by}: {event.why}"


def _list(args: argparse.Namespace) -> int:
    from faultcast.v1 import alerts_pb2 as apb

    reply = admin_call(args, "faultcast models", "ListModels", apb.ListModelsRequest())
    assert isinstance(reply, apb.ListModelsResponse)
    if args.json:
        for m in reply.models:
            print(json.dumps({"id": m.id, "digest": m.digest, "serving": m.serving, "version": m.version,
                              "threshold": m.threshold, "trained_at": m.trained_at, "source": m.source,
                              "training_data": m.training_data, "path": m.path, "added_by": m.added.by,
                              "why": m.added.why}))  # fmt: skip
        for e in reply.events:
            print(json.dumps({"event": _kind(e), "model_id": e.model_id, "from_model_id": e.from_model_id,
                              "by": e.by, "why": e.why, "at": iso_time(e.recorded_unix_nano)}))  # fmt: skip
        return 0
    print(f"serving: {reply.serving_id or '(a model from outside the registry)'}  {reply.serving_version}")
    if reply.shadow_id:
        print(f"shadow:  {reply.shadow_id} (scored beside it, alerting nothing)")
    print(f"{'':2}{'id':<16}  {'threshold':>9}  {'trained at':<20}  source")
    for m in reply.models:
        mark = "*" if m.serving else " "
        print(f"{mark} {m.id:<16}  {m.threshold:>9.4g}  {m.trained_at:<20}  {m.source}")
    if reply.events:
        print("\nlog:")
        for e in reply.events:
            print("  " + _event_line(e))
    return 0


def _add(args: argparse.Namespace) -> int:
    from faultcast.v1 import alerts_pb2 as apb

    # Absolute as this shell sees it: the service's working directory is not the admin's.
    path = str(args.path.expanduser().absolute())
    reply = admin_call(args, "faultcast models", "AddModel", apb.AddModelRequest(path=path, why=args.why))
    assert isinstance(reply, apb.AddModelResponse)
    if reply.already_there:
        print(
            f"model {reply.model.id} is registered already (added by {reply.model.added.by}); nothing changed"
        )
    else:
        print(f"added model {reply.model.id} (threshold {reply.model.threshold:.4g}); promote it with "
              f"`faultcast models promote {reply.model.id} --why ...`")  # fmt: skip
    return 0


def _promote(args: argparse.Namespace) -> int:
    from faultcast.v1 import alerts_pb2 as apb

    reply = admin_call(
        args,
        "faultcast models",
        "PromoteModel",
        apb.PromoteModelRequest(id=args.id, why=args.why, force=args.force),
    )
    assert isinstance(reply, apb.ModelChange)
    print(_event_line(reply.event))
    print(f"serving {reply.model_version}")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from faultcast.v1 import alerts_pb2 as apb

    reply = admin_call(args, "faultcast models", "RollbackModel", apb.RollbackModelRequest(why=args.why))
    assert isinstance(reply, apb.ModelChange)
    print(_event_line(reply.event))
    print(f"serving {reply.model_version}")
    return 0


def _shadow(args: argparse.Namespace) -> int:
    from faultcast.v1 import alerts_pb2 as apb

    if bool(args.id) == args.stop:
        raise SystemExit("faultcast models shadow: give a model id, or --stop")
    reply = admin_call(
        args,
        "faultcast models",
        "ShadowModel",
        apb.ShadowModelRequest(id=args.id, why=args.why, stop=args.stop),
    )
    assert isinstance(reply, apb.ModelChange)
    print(_event_line(reply.event))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from faultcast.v1 import alerts_pb2 as apb

    reply = admin_call(args, "faultcast models", "CompareShadow", apb.CompareShadowRequest())
    assert isinstance(reply, apb.ShadowComparison)
    if args.json:
        print(
            json.dumps(
                MessageToDict(
                    reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
                )
            )
        )
        return 0
    print(f"challenger {reply.challenger_id}: {'BETTER' if reply.better else 'not better'}")
    print(reply.summary)
    return 0
