"""`faultcast serve`: the prediction service."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from faultcast.durations import parse_duration, parse_limit
from faultcast.service.remediation import Actuator, CircuitBreaker, NoopActuator, WebhookActuator
from faultcast.service.validation import Limits

log = logging.getLogger(__name__)


def add_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="the prediction service: ingest, scoring, alerts, remediation")
    serve.add_argument("--model", type=Path, required=True, help="the model directory (faultcast train)")
    serve.add_argument("--listen", default="127.0.0.1:50051", help="gRPC address (HOST:PORT)")
    serve.add_argument("--prometheus-port", type=int, default=9401, help="metrics port (0: none)")
    serve.add_argument("--state-dir", type=Path, required=True, help="the durable alert log and cursors")
    serve.add_argument(
        "--max-threads", type=int, default=256,
        help="threads for the alert and admin calls; each open Subscribe holds one (collectors' streams do not)",
    )  # fmt: skip
    serve.add_argument("--port-file", type=Path, help="write the bound gRPC port here once serving")
    serve.add_argument(
        "--actuator", choices=["noop", "slurm", "kubernetes", "webhook"], default="noop",
        help="what drains a node (noop: log only)",
    )  # fmt: skip
    serve.add_argument("--webhook-url", help="for --actuator webhook: where to POST remediations")
    serve.add_argument("--kubeconfig", help="for --actuator kubernetes (default: in-cluster config)")
    serve.add_argument("--scontrol", default="scontrol", help="for --actuator slurm")
    serve.add_argument(
        "--grace", type=parse_duration, default=300.0,
        help="remediate this long after a snapshot-and-migrate alert without SNAPSHOT_DONE",
    )  # fmt: skip
    serve.add_argument("--max-drains", type=int, default=4, help="circuit breaker: nodes per window")
    serve.add_argument("--drain-window", type=parse_duration, default=3600.0, help="circuit breaker window")
    serve.add_argument(
        "--max-clock-skew", type=parse_limit, default=300.0,
        help="refuse samples this far ahead of the service's clock (0: no check, for the accelerated twin)",
    )  # fmt: skip
    serve.add_argument(
        "--max-sample-age", type=parse_limit, default=6 * 3600.0, help="refuse older samples (0: no check)"
    )
    serve.add_argument(
        "--nodes-file",
        type=Path,
        help="the fleet's node names, one per line: samples from others are refused",
    )
    serve.set_defaults(handler=run_serve)


def make_actuator(args: argparse.Namespace) -> Actuator:
    if args.actuator == "webhook":
        if not args.webhook_url:
            raise SystemExit("--actuator webhook needs --webhook-url")
        return WebhookActuator(args.webhook_url)
    if args.actuator == "slurm":
        from faultcast.service.slurm import SlurmActuator

        return SlurmActuator(scontrol=args.scontrol)
    if args.actuator == "kubernetes":
        from faultcast.service.kubernetes import KubernetesActuator

        return (
            KubernetesActuator.from_kubeconfig(args.kubeconfig)
            if args.kubeconfig
            else KubernetesActuator.in_cluster()
        )
    return NoopActuator()


def _inventory(path: Path | None) -> frozenset[str]:
    if path is None:
        return frozenset()
    names = frozenset(
        line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
    )
    if not names:
        raise SystemExit(f"{path} names no nodes")
    return names


def run_serve(args: argparse.Namespace) -> int:
    from prometheus_client import start_http_server

    from faultcast.model.artifact import ModelError
    from faultcast.service.server import Service

    try:
        service = Service(
            args.model, args.state_dir, actuator=make_actuator(args),
            limits=Limits(
                max_future_s=args.max_clock_skew, max_age_s=args.max_sample_age, nodes=_inventory(args.nodes_file)
            ),
            grace_s=args.grace, breaker=CircuitBreaker(args.max_drains, args.drain_window),
        )  # fmt: skip
    except ModelError as exc:
        log.error("%s", exc)
        return 2
    port = service.start(args.listen, max_threads=args.max_threads)
    if args.prometheus_port:
        start_http_server(args.prometheus_port, registry=service.metrics.registry)
    done = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        done.set()

    def reload() -> None:
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
    service.stop()
    return 0
