"""`faultcast collect`: wires sources, the exporter, the spool and the shipper from the command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from faultcast.catalogue import Scope
from faultcast.cli.paths import create_parents, missing_input
from faultcast.cli.tls_args import add_client_arguments, client_tls_options
from faultcast.cli.types import Subcommands, add_world_flags, duration, limit, scenario, world_from_args
from faultcast.collector.agent import NodeCollector
from faultcast.collector.exporter import SnapshotExporter, start_metrics_server
from faultcast.collector.network import NetworkSource
from faultcast.collector.nvml.source import DEFAULT_TIMEOUT_S, NvmlSource, NvmlUnavailable, nvml_available
from faultcast.collector.probes import PeerProber, parse_peer
from faultcast.collector.shipper import Shipper
from faultcast.collector.source import Source
from faultcast.collector.spool import DEFAULT_MAX_SAMPLES, Spool
from faultcast.collector.table import render_table
from faultcast.dcgm import Vocabulary
from faultcast.readings import NodeSnapshot, unpack
from faultcast.sim.realtime import SimulatedSource
from faultcast.tls import ChannelFactory, TLSConfigError, client_channel_factory

log = logging.getLogger(__name__)

# How far in the past a twin faster than real time starts by default: it must catch up with the wall
# clock before stamping a sample ahead of it, and a default service refuses samples over 6 h old.
DEFAULT_SIM_BACKFILL_S = 4 * 3600.0
_SERVICE_MAX_AGE_S = 6 * 3600.0  # faultcast.service.rpc.validation.Limits.max_age_s
# One sample per model step: the service scores a 60 s grid and keeps each step's last sample, so
# the scrapes in between travel as the step summary of that one sample (faultcast.step_summary).
DEFAULT_SHIP_STEP_S = 60.0


def default_spool_path(node: str) -> Path:
    """Where `node`'s spool lives unless --spool says: under $FAULTCAST_STATE_DIR, else
    $XDG_STATE_HOME, else ~/.local/state. Creates nothing."""
    state = os.environ.get("FAULTCAST_STATE_DIR") or os.environ.get("XDG_STATE_HOME")
    root = Path(state) if state else Path.home() / ".local" / "state"
    return root / "faultcast" / f"spool-{node}.sqlite"


def add_parser(commands: Subcommands) -> None:
    """Add `faultcast collect` and its flags (source, exporter, spool, twin, TLS) to `commands`."""
    p: argparse.ArgumentParser = commands.add_parser(
        "collect", help="read GPU and network metrics, serve /metrics, ship samples to the service"
    )
    p.add_argument(
        "--source",
        choices=["auto", "nvml", "simulated"],
        default="auto",
        help="where GPU readings come from; auto uses NVML when a GPU is present",
    )
    p.add_argument("--interval", type=duration, default=1.0, help="scrape interval (default 1s)")
    p.add_argument(
        "--ship-step",
        type=limit,
        default=DEFAULT_SHIP_STEP_S,
        metavar="DURATION",
        help="ship one sample per epoch-aligned window of this much event time (default 60s, the model's "
        "cadence): the window's last scrape, each GPU with the min/max/mean of its gauges over the window's "
        "scrapes; 0 ships every scrape. /metrics always shows every scrape",
    )
    p.add_argument(
        "--nvml-timeout",
        type=duration,
        default=DEFAULT_TIMEOUT_S,
        help="give up on an NVML call after this long (default 2s): its value is reported missing and that "
        "GPU is skipped until the call returns",
    )
    p.add_argument("--prometheus-port", type=int, default=9400, help="/metrics port; 0 picks a free one")
    p.add_argument("--prometheus-address", default="0.0.0.0", help="/metrics bind address")
    p.add_argument("--no-prometheus", action="store_true", help="do not serve /metrics")
    p.add_argument(
        "--dcgm-names",
        choices=[v.value for v in Vocabulary],
        default=Vocabulary.CLASSIC.value,
        help="names of dcgm-exporter's metrics on /metrics: classic (dcgm-exporter's default CSV up to 4.8, "
        "DCGM_FI_DEV_GPU_TEMP, Hostname label; the default) or canonical (DCGM 4.6's field names in base units, "
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS, DCGM_FI_DEV_SM_CLOCK_HERTZ, hostname label)",
    )
    p.add_argument("--service", metavar="HOST:PORT", help="push samples to the faultcast service")
    p.add_argument(
        "--spool", type=Path, help="spool file (default: $FAULTCAST_STATE_DIR/faultcast/spool-NODE.sqlite)"
    )
    p.add_argument(
        "--spool-max-samples",
        type=int,
        default=DEFAULT_MAX_SAMPLES,
        help="past this many unacknowledged samples the oldest are dropped (default 86,400: 60 days at the default "
        "--ship-step, 24 h with --ship-step 0 at a 1 s interval)",
    )
    p.add_argument(
        "--spool-max-bytes",
        type=int,
        default=None,
        help="bound the spool file to this many bytes (at least 65536); past it, or when the disk fills, "
        "the oldest unacknowledged samples are dropped and counted (default: no byte bound)",
    )
    p.add_argument("--node", default=socket.gethostname(), help="this node's name (default: the hostname)")
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="probe round trips to this peer (repeatable)",
    )
    p.add_argument("--proc-root", type=Path, default=Path("/proc"))
    p.add_argument("--sys-root", type=Path, default=Path("/sys"))
    sim = p.add_argument_group("simulated source (one node of the fleet twin)")
    sim.add_argument("--gpus", type=int, default=8, help="GPUs of the simulated node")
    sim.add_argument("--seed", type=int, default=0, help="the twin's seed")
    add_world_flags(sim)
    sim.add_argument("--sim-node", type=int, default=0, help="which node of the twin to be")
    sim.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="simulated seconds per wall-clock second (60: a simulated minute per second)",
    )
    sim.add_argument("--acceleration", type=float, default=1.0, help="multiply the twin's failure rates")
    sim.add_argument(
        "--sim-start",
        type=int,
        metavar="UNIX_SECONDS",
        help="the twin's start of time, not after now (default: now less --sim-backfill); give the offline "
        "run's start (manifest.json, config.start_unix_s) to replay it sample for sample",
    )
    sim.add_argument(
        "--sim-backfill",
        type=duration,
        metavar="DURATION",
        help="start the twin this long before now (default: 4h when --speed is above 1, else 0). Samples are "
        "never stamped ahead of the wall clock: a twin faster than real time runs from the past, and once it "
        "has caught up it runs at real time",
    )
    sim.add_argument(
        "--scenario",
        action="append",
        type=scenario,
        default=[],
        metavar="MODE:NODE:GPU:AT",
        help="make a GPU fail on cue, AT simulated time after the start (NODE is ignored: "
        "the scenario applies to --sim-node), e.g. hbm_wear:0:3:45m",
    )
    p.add_argument("--once", action="store_true", help="scrape once, print, and exit")
    p.add_argument(
        "--format", choices=["prometheus", "json", "table"], default="prometheus", help="output of --once"
    )
    p.add_argument("--duration", type=duration, help="stop after this long (default: run until signalled)")
    p.add_argument(
        "--table", type=duration, metavar="EVERY", help="print a live table this often (for example 5s)"
    )
    add_client_arguments(p)
    p.set_defaults(handler=run)


def gpu_source(args: argparse.Namespace) -> Source:
    """The GPU source --source asks for; `auto` falls back to the twin, saying why on stderr, when NVML
    is unusable. `nvml` raises NvmlUnavailable instead."""
    if args.source == "simulated":
        return _simulated(args)
    if args.source == "nvml":
        return NvmlSource(timeout=args.nvml_timeout)  # raises NvmlUnavailable with the reason
    available, why = nvml_available()
    if available:
        return NvmlSource(timeout=args.nvml_timeout)
    print(f"faultcast: no usable NVIDIA GPU ({why}); using the simulated source", file=sys.stderr)
    return _simulated(args)


def sim_backfill_s(args: argparse.Namespace) -> float:
    """How long before now the twin starts when --sim-start is not given."""
    if args.sim_backfill is not None:
        return float(args.sim_backfill)
    return DEFAULT_SIM_BACKFILL_S if args.speed > 1 else 0.0


def _simulated(args: argparse.Namespace) -> SimulatedSource:
    """One node of the fleet twin; each scrape advances its clock by interval x speed, up to the wall clock."""
    scenarios = [dataclasses.replace(s, node=args.sim_node) for s in args.scenario]
    return SimulatedSource(
        start_unix_nano=None if args.sim_start is None else args.sim_start * 10**9,
        backfill_s=sim_backfill_s(args),
        gpus=args.gpus,
        seed=args.seed,
        cadence_s=args.interval * args.speed,
        sim_node=args.sim_node,
        acceleration=args.acceleration,
        scenarios=scenarios,
        world=world_from_args(args),
    )


def run(args: argparse.Namespace) -> int:
    """Run the collector as the flags say, until --duration or a signal (or one scrape with --once).
    Returns the exit status: 0, or 2 for bad flags, TLS settings or an unusable --source."""
    problem = _flag_problem(args)
    channels: ChannelFactory | None = None
    try:
        if problem is not None:
            raise _RefusedError(problem)
        if args.service and not args.once:
            channels = _channels(args)
        gpus = _gpus(args)
    except _RefusedError as refused:
        print(f"faultcast: {refused}", file=sys.stderr)
        return 2
    _warn_about_ignored_flags(args, gpus)
    sources, prober = _sources(args, gpus)
    spool = (
        Spool(
            args.spool or default_spool_path(args.node),
            max_samples=args.spool_max_samples,
            max_bytes=args.spool_max_bytes,
        )
        if args.service and not args.once
        else None
    )
    collector = NodeCollector(args.node, sources, spool=spool, ship_step_s=args.ship_step)
    exporter = SnapshotExporter(collector.latest, Vocabulary(args.dcgm_names))
    if args.once:
        try:
            snapshot = collector.scrape()
            print(_format_once(snapshot, args.format, exporter, gpus), end="")
        finally:
            collector.close()
        return 0
    _run_until_stopped(args, collector, exporter, spool, channels, prober)
    return 0


class _RefusedError(Exception):
    """A flag or setting the collector cannot run with; the message is printed after "faultcast: "."""


def _flag_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with flags that argparse cannot check alone, or None."""
    if args.spool_max_bytes is not None and args.spool_max_bytes < 65536:
        return "--spool-max-bytes must be at least 65536"
    spool = args.spool if args.service and not args.once else None
    return missing_input([("--proc-root", args.proc_root), ("--sys-root", args.sys_root)]) or create_parents(
        [("--spool", spool)]
    )


def _channels(args: argparse.Namespace) -> ChannelFactory:
    try:
        return client_channel_factory(client_tls_options(args))
    except TLSConfigError as exc:
        raise _RefusedError(f"--service: {exc}") from None


def _gpus(args: argparse.Namespace) -> Source:
    """The GPU source the flags choose, or _RefusedError saying why it cannot be used."""
    if args.sim_start is not None and args.sim_backfill is not None:
        raise _RefusedError("give --sim-start or --sim-backfill, not both")
    if args.sim_backfill is not None and args.sim_backfill < 0:
        raise _RefusedError("--sim-backfill must not be negative")
    try:
        return gpu_source(args)
    except NvmlUnavailable as exc:
        raise _RefusedError(f"--source nvml: {exc}") from None
    except ValueError as exc:  # a --sim-start in the future, a bad --nvml-timeout
        raise _RefusedError(str(exc)) from None


def _warn_about_ignored_flags(args: argparse.Namespace, gpus: Source) -> None:
    if (
        isinstance(gpus, SimulatedSource)
        and args.sim_start is None
        and sim_backfill_s(args) >= _SERVICE_MAX_AGE_S
    ):
        print(
            "faultcast: warning: with --sim-backfill of 6 h or more the first samples are older than a default "
            "service takes (--max-sample-age)",
            file=sys.stderr,
        )
    if isinstance(gpus, SimulatedSource) and args.peer:
        print(
            "faultcast: --peer is ignored with the simulated source (it simulates its peers)", file=sys.stderr
        )
    if args.once and args.service:
        print(
            "faultcast: --service is ignored with --once (a single scrape is printed, not shipped)",
            file=sys.stderr,
        )


def _sources(args: argparse.Namespace, gpus: Source) -> tuple[list[Source], PeerProber | None]:
    """The GPU source and, on a real node, this machine's network (the simulated node reports its own)."""
    if isinstance(gpus, SimulatedSource):
        return [gpus], None
    prober = PeerProber([parse_peer(p) for p in args.peer]) if args.peer else None
    return [gpus, NetworkSource(args.proc_root, args.sys_root, prober=prober)], prober


def _run_until_stopped(
    args: argparse.Namespace,
    collector: NodeCollector,
    exporter: SnapshotExporter,
    spool: Spool | None,
    channels: ChannelFactory | None,
    prober: PeerProber | None,
) -> None:
    """Scrape every --interval, serving /metrics and shipping to the service, until --duration or
    SIGINT/SIGTERM; then print the summary."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    shipper = (
        Shipper(args.service, spool, args.node, channel_factory=channels)
        if spool is not None and channels is not None
        else None
    )
    server = None
    if not args.no_prometheus:
        server = start_metrics_server(exporter.render, args.prometheus_port, args.prometheus_address)
        print(
            f"serving /metrics on http://{args.prometheus_address}:{server.server_port}/metrics", flush=True
        )
    if prober is not None:
        prober.start()
    if shipper is not None:
        shipper.start()
    printer = _TablePrinter(args.table) if args.table else None
    started = time.monotonic()
    try:
        collector.run(args.interval, stop=stop, duration=args.duration, on_scrape=printer)
    finally:
        collector.flush()  # the window still open is spooled, and shipped before the shipper stops
        if shipper is not None:
            shipper.close()
        if server is not None:
            server.shutdown()
            server.server_close()
        collector.close()  # closes the network source, and with it the prober
    print(_summary(collector, time.monotonic() - started, shipper, spool))
    if spool is not None:
        spool.close()


class _TablePrinter:
    def __init__(self, every: float) -> None:
        self.every = every
        self._last = -math.inf

    def __call__(self, snapshot: NodeSnapshot) -> None:
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            print(render_table(snapshot), end="\n\n", flush=True)


def _summary(collector: NodeCollector, elapsed: float, shipper: Shipper | None, spool: Spool | None) -> str:
    latest = collector.latest()
    lines = [
        "summary",
        f"  scrapes {collector.scrapes} in {elapsed:.1f} s; source errors {collector.source_errors}",
        f"  scrape time mean {1000 * collector.scrape_seconds_total / max(collector.scrapes, 1):.2f} ms, "
        f"max {1000 * collector.scrape_seconds_max:.2f} ms",
    ]
    if latest is not None:
        exported = sum(1 for g in latest.gpus for v in g.values if not math.isnan(v))
        lines.append(
            f"  GPUs {len(latest.gpus)} ({sum(g.lost for g in latest.gpus)} lost); "
            f"{exported} GPU values and {len(latest.devices)} network devices in the last scrape"
        )
    if spool is not None:
        per = (
            f"one per {collector.summariser.step_s:g} s window"
            if collector.summariser is not None
            else "every scrape"
        )
        lines.append(f"  samples spooled {collector.samples_spooled} ({per})")
    if shipper is not None and spool is not None:
        lines.append(
            f"  shipped {shipper.stats.samples_sent} samples, acked through {spool.acked_through}, "
            f"spool depth {spool.depth}, dropped {spool.dropped}, "
            f"stream failures {shipper.stats.stream_failures}"
        )
    return "\n".join(lines)


def _format_once(snapshot: NodeSnapshot, fmt: str, exporter: SnapshotExporter, gpus: Source) -> str:
    if fmt == "prometheus":
        return exporter.render().decode()
    if fmt == "table":
        return render_table(snapshot) + "\n"
    return json.dumps(snapshot_to_json(snapshot, gpus), indent=2, allow_nan=False) + "\n"


def _clean(values: dict[str, float]) -> dict[str, float | None]:
    return {k: (None if math.isnan(v) else v) for k, v in values.items()}


def snapshot_to_json(snapshot: NodeSnapshot, gpus: Source | None = None) -> dict[str, object]:
    """A JSON-safe view of a snapshot (missing values are null), with NVML call latencies when known."""
    out: dict[str, object] = {
        "node": snapshot.node,
        "time_unix_nano": snapshot.time_unix_nano,
        "source": gpus.name if gpus is not None else None,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "model_name": g.model_name,
                "lost": g.lost,
                "values": _clean(unpack(Scope.GPU, g.values)),
            }
            for g in snapshot.gpus
        ],
        "devices": [
            {"scope": d.scope.value, "device": d.device, "values": _clean(unpack(d.scope, d.values))}
            for d in snapshot.devices
        ],
        "host": _clean(unpack(Scope.HOST, snapshot.host)),
        "collector": _clean(unpack(Scope.COLLECTOR, snapshot.collector)),
    }
    if isinstance(gpus, NvmlSource):
        out["nvml_call_latency"] = gpus.call_stats_json()
    return out
