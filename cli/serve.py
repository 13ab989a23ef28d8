"""`faultcast serve`: the prediction service."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import secrets
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from faultcast.cli.help_defaults import DefaultsShown
from faultcast.cli.paths import create_parents, missing_input, uncreatable
from faultcast.cli.tls_args import add_server_arguments, server_tls_options
from faultcast.cli.types import Subcommands, duration, limit
from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.actuators import Actuator, NoopActuator, RetryPolicy, WebhookActuator
from faultcast.service.rpc.auth import Role, digest
from faultcast.service.rpc.validation import Limits
from faultcast.tls import TLSConfigError, server_tls

if TYPE_CHECKING:
    from faultcast.service.remediation.spares.prescheduler import SpareProvider

log = logging.getLogger(__name__)

# After SIGTERM the service stops in a few seconds (gRPC grace 2 s, then thread joins); past this,
# something is stuck, and a process that neither serves nor exits is worse than one that exits.
_STOP_LIMIT_S = 60.0
SPARES = ("none", "slurm", "kubernetes", "webhook")  # --spares: where replacements are readied
_FIELDS = {f.name: f for f in dataclasses.fields(ServiceConfig)}


def config_default(name: str) -> Any:
    """ServiceConfig's default for field `name` ("part.field": a nested config's), the default of the
    flag that sets it (tests/test_cli_defaults.py ties them): a flag left out means what leaving the
    field out of ServiceConfig means. Read from the fields, building a nested config alone: a whole
    ServiceConfig() builds its ActionPolicy, which loads the model package (LightGBM) on every command."""
    part, _, leaf = name.partition(".")
    field = _FIELDS[part]
    value = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
    return getattr(value, leaf) if leaf else value


def add_parser(commands: Subcommands) -> None:
    """Add `faultcast serve` and `faultcast token`."""
    serve = commands.add_parser(
        "serve",
        help="the prediction service: ingest, scoring, alerts, remediation",
        formatter_class=DefaultsShown,
    )
    serve.add_argument(
        "--model", type=Path, help="the model directory (faultcast train; default: the shipped model)"
    )
    serve.add_argument("--listen", default="127.0.0.1:50051", help="gRPC address (HOST:PORT)")
    serve.add_argument(
        "--prometheus-port",
        type=int,
        default=9401,
        help="/metrics port; 0 picks a free one (said in the log)",
    )
    serve.add_argument("--no-prometheus", action="store_true", help="serve no /metrics")
    serve.add_argument(
        "--metrics-port-file", type=Path, help="write the bound /metrics port here once serving"
    )
    serve.add_argument(
        "--state-dir",
        type=Path,
        required=True,
        help="the durable alert log and cursors (created when missing)",
    )
    serve.add_argument(
        "--max-threads",
        type=int,
        default=256,
        help="threads for the alerts' unary calls (admins' calls have their own; no open stream holds one)",
    )
    serve.add_argument("--port-file", type=Path, help="write the bound gRPC port here once serving")
    serve.add_argument(
        "--actuator",
        choices=["noop", "slurm", "kubernetes", "webhook"],
        default="noop",
        help="what drains a node (noop: log only)",
    )
    serve.add_argument("--webhook-url", help="for --actuator webhook: where to POST remediations")
    serve.add_argument(
        "--kubeconfig", help="for --actuator kubernetes and --spares kubernetes (default: in-cluster config)"
    )
    serve.add_argument("--scontrol", default="scontrol", help="for --actuator slurm and --spares slurm")
    serve.add_argument(
        "--spares",
        choices=SPARES,
        default="none",
        help="ready a replacement when an alert opens on a registered job's node, for the job to hand "
        "over to at its snapshot (none: the job is requeued after its snapshot)",
    )
    serve.add_argument(
        "--spare-partition", help="for --spares slurm: the partition spares run in (default: the job's own)"
    )
    serve.add_argument("--spare-reservation", help="for --spares slurm: the reservation held for spares")
    serve.add_argument(
        "--spare-export",
        help=(
            "for --spares slurm: sbatch --export for the standby (default NONE: the job owner's login "
            "environment and the standby's variables; ALL passes the service's environment on)"
        ),
    )
    serve.add_argument(
        "--spare-webhook-url",
        help="for --spares webhook: where to POST spare events (default: --webhook-url)",
    )
    serve.add_argument(
        "--spare-allow-owned",
        action="store_true",
        help="for --spares kubernetes: ready standbys for pods a controller (a Job, JobSet) runs too; only "
        "where it does not start the pod the hand-over deletes again (a Job with backoffLimit 0)",
    )
    serve.add_argument(
        "--grace",
        type=duration,
        default=config_default("grace_s"),
        help="remediate this long after a snapshot-and-migrate alert without SNAPSHOT_DONE",
    )
    serve.add_argument(
        "--remediation-attempts",
        type=int,
        default=config_default("retry.max_attempts"),
        help="tries per remediation before it is recorded as failed (1: no retry)",
    )
    serve.add_argument(
        "--remediation-backoff",
        type=duration,
        default=config_default("retry.initial_s"),
        help="wait before the first retry of a failed remediation; each next wait doubles, with jitter",
    )
    serve.add_argument(
        "--remediation-backoff-max",
        type=duration,
        default=config_default("retry.max_s"),
        help="the longest wait between two tries of a remediation",
    )
    serve.add_argument(
        "--silent-after",
        type=int,
        default=config_default("silent_after_steps"),
        metavar="STEPS",
        help="model steps without a sample after which a node is silent: its alerts clear and it is counted",
    )
    serve.add_argument(
        "--failure-grace",
        type=duration,
        default=config_default("silence_grace_s"),
        help="a node whose collector stream broke (not closed with its goodbye) and did not come back "
        "within this long has failed: a FAILED event (node silent)",
    )
    serve.add_argument(
        "--keepalive",
        type=duration,
        default=config_default("keepalive_s"),
        help="ping every stream's peer this often; one that does not answer a ping within 1.5 times this "
        "long is gone (a hung or powered-off node sends no reset)",
    )
    serve.add_argument(
        "--failure-hold",
        type=duration,
        default=config_default("failure_hold_s"),
        help="after a FAILED event, further evidence of the same GPU (or node) within this long is "
        "folded into it, not sent again",
    )
    serve.add_argument(
        "--incident",
        type=duration,
        default=config_default("incident_s"),
        help="a node taken out of service is not taken out again within this long (one incident, one "
        "drain: its jobs are requeued once); a failure stored but never remediated is remediated at a "
        "start if this recent",
    )
    serve.add_argument(
        "--checkpoint-every",
        type=int,
        default=config_default("checkpoint_steps"),
        metavar="STEPS",
        help="save a node's scoring state every this many scored steps (and whenever its alerts change); "
        "a restart replays at most that many steps of journalled samples per node",
    )
    serve.add_argument(
        "--journal-max",
        type=int,
        default=config_default("journal_bytes") >> 20,
        metavar="MIB",
        help="the sample journal holds at most this many MiB: past half of it every node is saved, so "
        "that its segments can go; at it, samples are scored but not journalled",
    )
    archive = serve.add_argument_group("the archive of scored samples (what retraining learns from)")
    archive.add_argument(
        "--archive",
        type=Path,
        metavar="DIR",
        help="keep what was scored, one file per day in the training data format, here "
        "(default: STATE_DIR/archive); `faultcast train --data DIR` reads it",
    )
    archive.add_argument("--no-archive", action="store_true", help="keep no archive")
    archive.add_argument(
        "--retrain-every",
        type=duration,
        default=0.0,
        metavar="DURATION",
        help="retrain on the archive and the label log this often (e.g. 7d), in a child process, and shadow "
        "the challenger beside the serving model (never promoted without `faultcast models promote`); "
        "default: never",
    )
    archive.add_argument(
        "--retrain-prior",
        type=Path,
        action="append",
        default=[],
        metavar="DATA",
        help="a twin world the scheduled retrain learns beside the fleet's days (faultcast retrain --prior)",
    )
    archive.add_argument(
        "--retrain-warm-start",
        action="store_true",
        help="each scheduled retrain continues the model serving then (faultcast retrain --warm-start)",
    )
    archive.add_argument("--retrain-window", help="faultcast retrain --window (its default: 90d)")
    archive.add_argument("--retrain-holdout", help="faultcast retrain --holdout (its default: 14d)")
    archive.add_argument(
        "--archive-days",
        type=float,
        default=config_default("archive_days"),
        metavar="DAYS",
        help="days the archive keeps (older days are removed)",
    )
    archive.add_argument(
        "--archive-max",
        type=int,
        default=config_default("archive_bytes") >> 20,
        metavar="MIB",
        help="the most the archive holds on disk: past it, its oldest days are removed",
    )
    serve.add_argument(
        "--max-drains",
        type=int,
        default=config_default("max_drains"),
        help="circuit breaker: nodes per window",
    )
    serve.add_argument(
        "--drain-window",
        type=duration,
        default=config_default("drain_window_s"),
        help="circuit breaker window",
    )
    serve.add_argument(
        "--max-clock-skew",
        type=limit,
        default=config_default("limits.max_future_s"),
        help="refuse samples this far ahead of the service's clock (0: no check, for the accelerated twin)",
    )
    serve.add_argument(
        "--max-sample-age",
        type=limit,
        default=config_default("limits.max_age_s"),
        help="refuse older samples (0: no check)",
    )
    serve.add_argument(
        "--nodes-file",
        type=Path,
        help="the fleet's node names, one per line: samples from others are refused",
    )
    add_server_arguments(serve)
    serve.set_defaults(handler=run_serve)

    token = commands.add_parser(
        "token", help="make a bearer token: its digest goes to the service's tokens file, the token to stdout"
    )
    token.add_argument("--role", choices=[r.value for r in Role], required=True)
    token.add_argument(
        "--name", required=True, help="the node (collector), job id (trainer) or operator (admin)"
    )
    token.add_argument(
        "--tokens-file", type=Path, required=True, help="append the digest here (created 0600)"
    )
    token.set_defaults(handler=run_token)


def run_token(args: argparse.Namespace) -> int:
    """The token is printed once and stored nowhere; the file keeps only its SHA-256."""
    if not args.name or any(c.isspace() or c == "#" for c in args.name):
        log.error("--name %r: no spaces or '#'", args.name)
        return 2
    why = create_parents([("--tokens-file", args.tokens_file)])
    if why is not None:
        log.error("%s", why)
        return 2
    token = secrets.token_urlsafe(32)
    line = f"sha256:{digest(token)} {args.role} {args.name}\n"
    fd = os.open(args.tokens_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as tokens:
        tokens.write(line)
    print(token)
    return 0


def make_actuator(args: argparse.Namespace) -> Actuator:
    """The actuator the flags choose (none, Slurm, Kubernetes or a webhook)."""
    if args.actuator == "webhook":
        if not args.webhook_url:
            raise SystemExit("--actuator webhook needs --webhook-url")
        return WebhookActuator(args.webhook_url)
    if args.actuator == "slurm":
        from faultcast.service.remediation.slurm import SlurmActuator

        return SlurmActuator(scontrol=args.scontrol)
    if args.actuator == "kubernetes":
        from faultcast.service.remediation.kubernetes import KubernetesActuator

        return (
            KubernetesActuator.from_kubeconfig(args.kubeconfig)
            if args.kubeconfig
            else KubernetesActuator.in_cluster()
        )
    return NoopActuator()


# After a hand-over the actuator ends the old job (service/remediation/spares/prescheduler.py):
# the ones that can, per spare.
_ENDS_THE_JOB = {
    "slurm": ("slurm", "webhook"),
    "kubernetes": ("kubernetes", "webhook"),
    "webhook": ("slurm", "kubernetes", "webhook"),
}


def make_spares(args: argparse.Namespace) -> SpareProvider | None:
    """The spare provider the flags choose (None for --spares none); SystemExit, saying why, for flags
    that cannot work together."""
    kind: str = args.spares
    _check_spare_flags(args)
    if kind == "none":
        return None
    if args.actuator not in _ENDS_THE_JOB[kind]:
        able = " or ".join(_ENDS_THE_JOB[kind])
        raise SystemExit(
            f"--spares {kind} needs --actuator {able}: after a hand-over the actuator ends the old job, "
            f"which --actuator {args.actuator} does not, so it would run on beside its standby"
        )
    try:
        if kind == "slurm":
            return _slurm_spares(args)
        if kind == "webhook":
            return _webhook_spares(args)
        return _kubernetes_spares(args)
    except ValueError as exc:
        raise SystemExit(f"--spares {kind}: {exc}") from exc


def _check_spare_flags(args: argparse.Namespace) -> None:
    """Each --spare-* flag belongs to one kind of spare: given with another, it would be ignored."""
    belongs = {
        "--spare-partition": ("slurm", args.spare_partition is not None),
        "--spare-reservation": ("slurm", args.spare_reservation is not None),
        "--spare-export": ("slurm", args.spare_export is not None),
        "--spare-webhook-url": ("webhook", args.spare_webhook_url is not None),
        "--spare-allow-owned": ("kubernetes", args.spare_allow_owned),
    }
    for flag, (kind, given) in belongs.items():
        if given and args.spares != kind:
            raise SystemExit(f"{flag} is for --spares {kind}, not --spares {args.spares}")
    if args.spare_export is not None and not args.spare_export.strip():
        raise SystemExit("--spare-export needs a value (ALL, NONE, or the variables to pass on)")


def _slurm_spares(args: argparse.Namespace) -> SpareProvider:
    from faultcast.service.remediation.slurm import SlurmCommands
    from faultcast.service.remediation.spares.slurm import SlurmSpares

    # sbatch and scancel beside the configured scontrol, as the Slurm actuator takes scancel.
    where = Path(args.scontrol).parent if os.sep in args.scontrol else None
    return SlurmSpares(
        SlurmCommands(where),
        partition=args.spare_partition or "",
        reservation=args.spare_reservation or "",
        export=args.spare_export or "NONE",
    )


def _webhook_spares(args: argparse.Namespace) -> SpareProvider:
    from faultcast.service.remediation.spares.webhook import WebhookSpares

    url = args.spare_webhook_url or args.webhook_url
    if not url:
        raise SystemExit("--spares webhook needs --spare-webhook-url (or --webhook-url)")
    return WebhookSpares(url)


def _kubernetes_spares(args: argparse.Namespace) -> SpareProvider:
    try:
        from kubernetes.config import ConfigException

        from faultcast.service.remediation.spares.kubernetes import KubernetesSpares
    except ImportError as exc:
        raise SystemExit(
            f"--spares kubernetes needs the Kubernetes client (faultcast[kubernetes]): {exc}"
        ) from exc
    try:
        if args.kubeconfig:
            return KubernetesSpares.from_kubeconfig(args.kubeconfig, allow_owned=args.spare_allow_owned)
        return KubernetesSpares.in_cluster(allow_owned=args.spare_allow_owned)
    except ConfigException as exc:
        raise SystemExit(
            f"--spares kubernetes: no Kubernetes credentials ({exc}); outside a cluster give --kubeconfig"
        ) from exc


def _inventory(path: Path | None) -> frozenset[str]:
    if path is None:
        return frozenset()
    names = frozenset(
        line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
    )
    if not names:
        raise SystemExit(f"{path} names no nodes")
    return names


def service_config(args: argparse.Namespace) -> ServiceConfig:
    """The service's tunables from `faultcast serve`'s flags; ValueError (or OSError, SystemExit for
    the nodes file) on a value the service cannot run with."""
    return ServiceConfig(
        limits=Limits(
            max_future_s=args.max_clock_skew, max_age_s=args.max_sample_age, nodes=_inventory(args.nodes_file)
        ),
        grace_s=args.grace,
        max_drains=args.max_drains,
        drain_window_s=args.drain_window,
        retry=RetryPolicy(
            initial_s=args.remediation_backoff,
            max_s=args.remediation_backoff_max,
            max_attempts=args.remediation_attempts,
        ),
        silent_after_steps=args.silent_after,
        checkpoint_steps=args.checkpoint_every,
        journal_bytes=args.journal_max << 20,
        archive=not args.no_archive,
        archive_dir=args.archive,
        archive_days=args.archive_days,
        archive_bytes=args.archive_max << 20,
        retrain_every_s=args.retrain_every,
        retrain_warm_start=args.retrain_warm_start,
        retrain_flags=(
            *(("--window", args.retrain_window) if args.retrain_window else ()),
            *(("--holdout", args.retrain_holdout) if args.retrain_holdout else ()),
            *(flag for prior in args.retrain_prior for flag in ("--prior", str(prior.resolve()))),
        ),
        silence_grace_s=args.failure_grace,
        keepalive_s=args.keepalive,
        failure_hold_s=args.failure_hold,
        incident_s=args.incident,
    )


def run_serve(args: argparse.Namespace) -> int:
    """`faultcast serve`: run the service until SIGTERM/SIGINT; exit 2 on a bad setting, one line why."""
    from prometheus_client import start_http_server

    from faultcast.model.artifact import ModelError
    from faultcast.service.metrics import ServiceMetrics
    from faultcast.service.rpc.auth import AccessPolicy, TokenBook
    from faultcast.service.server import Service
    from faultcast.service.state.db import StateError

    metrics = ServiceMetrics()
    if args.no_prometheus and args.metrics_port_file:
        log.error("--metrics-port-file contradicts --no-prometheus: there is no /metrics port to write")
        return 2
    spares = make_spares(args)  # flags that cannot work together exit here, before the model loads
    try:
        config = service_config(args)
        tls = server_tls(server_tls_options(args))
        if tls is not None:
            tls.credentials()  # unreadable certificates fail here, before anything starts
        tokens = TokenBook(args.tokens_file) if args.tokens_file is not None else None
    except (TLSConfigError, OSError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    why = (
        missing_input([("--model", args.model)])
        or uncreatable(
            [("--state-dir", args.state_dir), *([("--archive", args.archive)] if args.archive else [])]
        )
        or create_parents([("--port-file", args.port_file), ("--metrics-port-file", args.metrics_port_file)])
    )
    if why is not None:  # the state directory itself is created when the service opens
        log.error("%s", why)
        return 2
    try:
        if args.model is None:  # resolved here, not as the flag's default: parsing stays light
            from faultcast.model.shipped import shipped_model_dir

            args.model = shipped_model_dir()
        service = Service.open(
            args.model, args.state_dir, config, actuator=make_actuator(args), spares=spares, metrics=metrics,
            policy=None if tls is None else AccessPolicy(
                tokens=tokens, trust_domain=args.trust_domain,
                trainers_register=args.job_registration == "trainer", metrics=metrics,
            ),
        )  # fmt: skip  # the policy's arguments grouped as they read, not one per line
    except (ModelError, StateError) as exc:  # one line: what is wrong and what to do
        log.error("%s", exc)
        return 2
    port = service.start(args.listen, max_threads=args.max_threads, tls=tls)
    exporter = (
        None
        if args.no_prometheus
        else start_http_server(args.prometheus_port, registry=service.metrics.registry)[0]
    )
    if exporter is not None:
        # Until December 2026, 0 meant no /metrics: say what it means now.
        picked = "" if args.prometheus_port else " (port 0 picks a free one; --no-prometheus serves none)"
        log.info("serving /metrics on port %d%s", exporter.server_port, picked)
        if args.metrics_port_file:
            args.metrics_port_file.write_text(f"{exporter.server_port}\n")
    done = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        done.set()

    def reload() -> None:
        # Tokens first: a revocation must not wait for a model to load (or be refused).
        if tokens is not None:
            try:
                log.info("tokens reloaded: %d accepted", tokens.reload())
            except (OSError, ValueError) as exc:  # the tokens in force stay in force
                log.error("tokens file refused, the previous tokens stay in force: %s", exc)
        try:
            service.reload()
        except Exception:  # a reload bug must not take the service down; the old model serves on
            log.exception("model reload failed")

    def on_hup(signum: int, frame: FrameType | None) -> None:
        # Not in the handler itself: loading a model takes a while and may log.
        threading.Thread(target=reload, name="faultcast-reload", daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, on_hup)
    if args.port_file:  # last: whoever waits for it may signal at once
        args.port_file.write_text(f"{port}\n")
    log.info("serving on port %d (model %s, state in %s)", port, args.model, args.state_dir)
    # Wake up now and then: a signal delivered to one of gRPC's threads only sets a flag, which
    # the main thread acts on when it runs Python again, and a wait without timeout never does.
    while not done.wait(0.5):
        pass
    log.info("stopping")
    _exit_if_stuck(_STOP_LIMIT_S)
    service.stop()
    if exporter is not None:  # /metrics goes with the service: Prometheus must see it down
        exporter.shutdown()
        exporter.server_close()
    log.info("stopped")
    return 0


def _exit_if_stuck(limit_s: float) -> None:
    """Exit the process `limit_s` from now if it is still there, whatever holds it: the stop, or a
    thread the interpreter waits for on exit (a daemon thread runs on while it waits)."""

    def give_up() -> None:
        log.critical("not stopped %.0f s after the signal; exiting without a clean stop", limit_s)
        logging.shutdown()
        os._exit(1)

    timer = threading.Timer(limit_s, give_up)
    timer.daemon = True
    timer.start()
