"""`faultcast demo` (what `make run` runs): the whole loop on the fleet twin, at accelerated time.

Collector processes (`faultcast collect --source simulated`) each simulate one node, with failures
ordered on cue, and push their samples to the service; the service scores them with a model (trained
on a twin on first run) and streams alerts; a console subscriber plays the trainer: it prints each
alert with the lead it gives before the twin's failure and acknowledges snapshot-and-migrate alerts
with SNAPSHOT_DONE, which makes the service drain the node (the no-op actuator logs it). It ends
with a summary: failures, how many were predicted and how early, and false alarms.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from faultcast.durations import parse_duration
from faultcast.service.alerting import PB_TO_MODE
from faultcast.sim.modes import BY_NAME, Level
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

log = logging.getLogger(__name__)

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))
TWIN_INTERVAL_S = 60.0  # one twin step per scrape: the model's cadence


@dataclass(frozen=True)
class Failure:
    """A failure ordered on cue: MODE:NODE:GPU:AT[:LEAD] as `faultcast collect --scenario` takes it."""

    mode: str
    node: int
    gpu: int
    at_s: float
    lead_s: float | None = None

    @staticmethod
    def parse(text: str) -> Failure:
        parts = text.split(":")
        if len(parts) not in (4, 5) or parts[0] not in BY_NAME:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected MODE:NODE:GPU:AT[:LEAD], MODE one of {', '.join(BY_NAME)}"
            )
        lead = parse_duration(parts[4]) if len(parts) == 5 else None
        return Failure(parts[0], int(parts[1]), int(parts[2]), parse_duration(parts[3]), lead)

    def arg(self) -> str:
        lead = f":{self.lead_s:.0f}s" if self.lead_s is not None else ""
        return f"{self.mode}:{self.node}:{self.gpu}:{self.at_s:.0f}s{lead}"


DEFAULT_FAILURES = (
    Failure("hbm_wear", 0, 3, 100 * 60.0, 45 * 60.0),
    Failure("firmware", 3, 0, 115 * 60.0),
    Failure("nvlink", 1, 5, 130 * 60.0, 50 * 60.0),
    Failure("pcie", 2, 1, 160 * 60.0, 45 * 60.0),
)


@dataclass
class Seen:
    """What the console subscriber saw: the first OPEN event of each alert, in order."""

    alerts: list[apb.Alert] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def node_name(i: int) -> str:
    return f"node-{i:04d}"


def add_parser(commands: Any) -> None:
    demo = commands.add_parser("demo", help="the end-to-end demo on the fleet twin (what `make run` runs)")
    demo.add_argument("--nodes", type=int, default=4, help="simulated nodes (8 GPUs each)")
    demo.add_argument("--speed", type=float, default=240.0, help="simulated seconds per wall-clock second")
    demo.add_argument(
        "--failure", type=Failure.parse, action="append", dest="failures", metavar="MODE:NODE:GPU:AT[:LEAD]",
        help="order a failure (repeatable); default: HBM, firmware, NVLink and PCIe failures over ~3 hours",
    )  # fmt: skip
    demo.add_argument("--model", type=Path, default=Path("out/demo-model"), help="trained here on first run")
    demo.add_argument("--out", type=Path, default=Path("out/demo"), help="logs and state of the run")
    demo.add_argument("--prometheus-port", type=int, default=9401, help="the service's /metrics")
    demo.set_defaults(handler=run_demo)


def ensure_model(model_dir: Path) -> None:
    """Train the demo model when there is none: a 32-node twin over 6 days at 200x the failure rate."""
    if (model_dir / "manifest.json").is_file():
        return
    from faultcast.model.dataset import open_dataset
    from faultcast.model.train import TrainConfig, train
    from faultcast.sim.config import FleetConfig
    from faultcast.sim.writer import simulate

    print(f"no model in {model_dir}: training one on a 32-node, 6-day fleet twin (about a minute, once)")
    with tempfile.TemporaryDirectory() as data:
        simulate(FleetConfig(nodes=32, days=6.0, seed=5, acceleration=200.0), Path(data), [])
        train(open_dataset(Path(data)), model_dir, TrainConfig(num_boost_round=80, negative_rate=0.05))


def run_demo(args: argparse.Namespace) -> int:
    from prometheus_client import start_http_server

    from faultcast.service.server import Service
    from faultcast.service.validation import Limits

    failures: list[Failure] = list(args.failures or DEFAULT_FAILURES)
    ensure_model(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    _log_to(args.out / "service.log")
    with tempfile.TemporaryDirectory(dir=args.out) as state:
        # Event time runs `speed` times faster than the wall clock: no clock-skew check.
        service = Service(args.model, Path(state), limits=Limits(max_future_s=0, max_age_s=0), grace_s=30.0)
        port = service.start("127.0.0.1:0")
        start_http_server(args.prometheus_port, registry=service.metrics.registry)
        names = [node_name(i) for i in range(args.nodes)]
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = apb_grpc.AlertsStub(channel)
        stub.RegisterJob(apb.RegisterJobRequest(job_id="demo-job", nodes=names))
        sim_start = int(time.time())
        model = service.model
        print(
            f"service on 127.0.0.1:{port}, metrics on :{args.prometheus_port}/metrics; model threshold "
            f"{model.threshold:.3f}, horizon {model.horizon_s / 60:.0f} min, trained {model.manifest.get('created_at')}"
        )
        print(f"{args.nodes} simulated nodes x 8 GPUs, {args.speed:.0f}x real time; failures ordered:")
        for f in failures:
            print(f"  {_clock(f.at_s)}  {node_name(f.node)} gpu {f.gpu}: {f.mode}")
        seen = Seen()
        stream = stub.Subscribe(apb.SubscribeRequest(job_id="demo-job"))
        listener = threading.Thread(
            target=_listen, args=(stream, stub, failures, sim_start, model.horizon_s, seen), daemon=True
        )
        listener.start()
        end_s = max(f.at_s for f in failures) + 15 * 60.0
        collectors = [_collector(i, port, sim_start, args, failures) for i in range(args.nodes)]
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        announced: set[Failure] = set()
        wall_end = time.monotonic() + end_s / args.speed + 30.0
        while not stop.is_set() and time.monotonic() < wall_end:
            now_s = service.latest_event_s - sim_start  # the service's view of simulated time
            for f in failures:
                if f not in announced and now_s >= f.at_s:
                    announced.add(f)
                    print(f"[{_clock(f.at_s)}] the twin fails {node_name(f.node)} gpu {f.gpu} ({f.mode})")
            if now_s >= end_s:
                break
            stop.wait(0.2)
        for c in collectors:
            c.terminate()
        for c in collectors:
            c.wait(timeout=30)
        stream.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave cancel untyped
        channel.close()
        service.stop()
        print(_summary(failures, seen, model.horizon_s, sim_start, end_s, args.nodes))
    return 0


def _log_to(path: Path) -> None:
    """The service logs to a file; the console is the subscriber's."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)


def _collector(
    i: int, port: int, sim_start: int, args: argparse.Namespace, failures: list[Failure]
) -> subprocess.Popen[bytes]:
    interval = TWIN_INTERVAL_S / args.speed
    command = [
        FAULTCAST, "collect", "--source", "simulated", "--sim-node", str(i), "--node", node_name(i),
        "--interval", f"{interval * 1000:.0f}ms", "--speed", f"{args.speed:g}", "--sim-start", str(sim_start),
        "--service", f"127.0.0.1:{port}", "--insecure", "--spool", str(args.out / f"spool-{i}.sqlite"),
        "--prometheus-port", "0",
    ]  # fmt: skip
    for f in failures:
        if f.node == i:
            command += ["--scenario", f.arg()]
    (args.out / f"spool-{i}.sqlite").unlink(missing_ok=True)
    log_file = (args.out / f"collector-{i}.log").open("wb")
    return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)


def _clock(sim_s: float) -> str:
    minutes = int(sim_s // 60)
    return f"sim {minutes // 60:02d}:{minutes % 60:02d}"


# An alert followed by its GPU's failure later than the horizon but within this long was early, not
# false: it took hardware out that was about to fail (the evaluation's nuisance window).
EARLY_WINDOW_S = 24 * 3600.0


def _matching(alert: apb.Alert, failures: list[Failure], sim_start: int, within_s: float) -> Failure | None:
    """The ordered failure this alert foresees: same GPU (or node), failing within `within_s`."""
    t = alert.time_unix_nano / 1e9 - sim_start
    for f in failures:
        node_level = BY_NAME[f.mode].level is Level.NODE
        same = alert.node == node_name(f.node) and (alert.gpu in (f.gpu, -1) or node_level)
        if same and 0 <= f.at_s - t <= within_s:
            return f
    return None


def _verdict(alert: apb.Alert, failures: list[Failure], sim_start: int, horizon_s: float) -> str:
    t = alert.time_unix_nano / 1e9 - sim_start
    f = _matching(alert, failures, sim_start, horizon_s)
    if f is not None:
        return f"the twin fails it in {(f.at_s - t) / 60:.0f} min"
    f = _matching(alert, failures, sim_start, EARLY_WINDOW_S)
    if f is not None:
        return f"early: the twin fails it in {(f.at_s - t) / 60:.0f} min, beyond the {horizon_s / 60:.0f}-min horizon"
    return "false alarm: no failure follows"


def _listen(
    stream: Any,
    stub: apb_grpc.AlertsStub,
    failures: list[Failure],
    sim_start: int,
    horizon_s: float,
    seen: Seen,
) -> None:
    try:
        for event in stream:
            if not event.HasField("alert"):
                continue  # the caught-up marker
            alert = event.alert
            t = alert.time_unix_nano / 1e9 - sim_start
            mode = PB_TO_MODE.get(alert.mode, "unknown")
            action = apb.RecommendedAction.Name(alert.action).removeprefix("RECOMMENDED_ACTION_")
            if alert.state == apb.ALERT_STATE_CLEARED:
                print(
                    f"[{_clock(t)}] cleared alert {alert.opened_id} on {alert.node}: {alert.cleared_reason}"
                )
                continue
            f = _matching(alert, failures, sim_start, horizon_s)
            truth = (
                f"the twin fails it in {(f.at_s - t) / 60:.0f} min"
                if f
                else "no failure follows (false alarm)"
            )
            kind = "ALERT" if alert.opened_id == alert.id else "UPDATE"
            top = ", ".join(c.feature for c in alert.top_features[:3])
            print(
                f"[{_clock(t)}] {kind} {alert.opened_id}: {alert.node} gpu {alert.gpu} {mode} risk {alert.risk:.2f}, "
                f"~{alert.time_to_failure_seconds / 60:.0f} min to failure, {action} (why: {top}) | {truth}"
            )
            if alert.opened_id == alert.id:
                with seen.lock:
                    seen.alerts.append(alert)
            if alert.action == apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE:
                # The trainer's side: snapshot at the next step boundary, then say so.
                reply = stub.Acknowledge(
                    apb.AcknowledgeRequest(
                        alert_id=alert.id, job_id="demo-job", action=apb.ACK_ACTION_SNAPSHOT_DONE, step=int(t // 60),
                        checkpoint_uri=f"file:///checkpoints/demo-job/step-{int(t // 60)}",
                    )
                )  # fmt: skip
                print(f"           trainer: snapshot done -> service: {reply.remediation}")
    except grpc.RpcError:
        return  # the demo is over


def _summary(
    failures: list[Failure],
    seen: Seen,
    horizon_s: float,
    sim_start: int,
    end_s: float,
    nodes: int,
) -> str:
    with seen.lock:
        alerts = list(seen.alerts)
    lines = ["", "summary", "-------"]
    caught = early = 0
    for f in failures:
        foreseen = [a for a in alerts if _matching(a, failures, sim_start, EARLY_WINDOW_S) == f]
        in_time = [a for a in foreseen if _matching(a, failures, sim_start, horizon_s) == f]
        leads = [(f.at_s - (a.time_unix_nano / 1e9 - sim_start)) / 60 for a in foreseen]
        if in_time:
            caught += 1
            outcome = f"predicted {max(lead for lead in leads if lead <= horizon_s / 60):.0f} min ahead"
            if max(leads) > horizon_s / 60:
                outcome += f" (first warned {max(leads):.0f} min ahead, earlier than the horizon)"
        elif foreseen:
            outcome = f"warned {max(leads):.0f} min ahead only, earlier than the horizon"
        elif BY_NAME[f.mode].predictable:
            outcome = "missed"
        else:
            outcome = "missed (no precursor: no model can see it coming)"
        lines.append(f"  {node_name(f.node)} gpu {f.gpu} {f.mode:<11} at {_clock(f.at_s)}: {outcome}")
        early += sum(1 for lead in leads if lead > horizon_s / 60)
    false_alarms = [a for a in alerts if _matching(a, failures, sim_start, EARLY_WINDOW_S) is None]
    gpu_days = nodes * 8 * end_s / 86_400.0
    lines.append(
        f"  {caught} of {len(failures)} failures predicted within the {horizon_s / 60:.0f}-min horizon; "
        f"{early} alerts came earlier than that; {len(false_alarms)} false alarms (no failure followed) over "
        f"{nodes * 8} GPUs x {end_s / 3600:.1f} simulated hours ({gpu_days:.2f} GPU-days)"
    )
    return "\n".join(lines)
