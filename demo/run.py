"""The end-to-end demo (`faultcast demo`, what `make run` runs): the whole loop on the fleet twin, at accelerated time.

Collector processes (`faultcast collect --source simulated`) each simulate one node, with failures
ordered on cue, and push their samples to a service with default limits (the twin's clock starts in
the past, so at 240x it never runs ahead of the wall clock); the service scores them with a model
(the shipped one unless told another; nothing is trained) and streams alerts; a console subscriber
plays the trainer: it prints each alert event (opened, updated, cleared) with what the twin does
next, and acknowledges each snapshot-and-migrate alert once with SNAPSHOT_DONE, which makes the
service drain the node (the no-op actuator logs it). It ends with a summary in `faultcast evaluate`'s
words (model/evaluation/outcomes.py): each failure caught (warned 5 min to 2 h ahead), late or
missed; each alert true, late, premature or false; and the false alarms per 1,000 GPU-days.
"""

from __future__ import annotations

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

from faultcast.alert_text import alert_summary
from faultcast.demo.settings import DemoSettings
from faultcast.model.evaluation.outcomes import DEFAULT_PERIODS, Outcome, PredictionPeriods
from faultcast.modes import FailureMode
from faultcast.service.alert_events import mode_of
from faultcast.sim.schedule import Scenario
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

log = logging.getLogger(__name__)

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))
TWIN_CADENCE_S = 60.0  # one twin step per scrape: the model's cadence


@dataclass
class Seen:
    """What the console subscriber saw: the OPENED event of each alert, in order, and how many events
    of each kind came."""

    alerts: list[apb.Alert] = field(default_factory=list)
    updates: int = 0
    acknowledged: set[int] = field(default_factory=set)  # alerts the trainer said SNAPSHOT_DONE to
    failed: list[apb.Alert] = field(default_factory=list)  # FAILED events: failures seen happen
    lock: threading.Lock = field(default_factory=threading.Lock)


def node_name(i: int) -> str:
    """The demo's name for twin node `i` (node-0000, ...)."""
    return f"node-{i:04d}"


def run_demo(args: DemoSettings) -> int:
    """Run the demo to its end (or SIGINT/SIGTERM) and print its summary; returns the exit code."""
    from prometheus_client import start_http_server

    from faultcast.model.artifact import ModelError
    from faultcast.model.shipped import shipped_model_dir
    from faultcast.service.config import ServiceConfig
    from faultcast.service.server import Service

    failures: list[Scenario] = list(args.failures)
    try:
        model_dir = args.model if args.model is not None else shipped_model_dir()
    except ModelError as exc:
        print(f"faultcast demo: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    _log_to(args.out / "service.log")
    with tempfile.TemporaryDirectory(dir=args.out) as state:
        # Default limits: the twin's clock starts in the past (below), so it never runs ahead.
        try:
            service = Service.open(model_dir, Path(state), ServiceConfig(grace_s=30.0))
        except ModelError as exc:
            print(f"faultcast demo: {exc}", file=sys.stderr)
            return 2
        port = service.start("127.0.0.1:0")
        metrics_port = start_http_server(args.prometheus_port, registry=service.metrics.registry)[
            0
        ].server_port
        names = [node_name(i) for i in range(args.nodes)]
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = apb_grpc.AlertsStub(channel)
        stub.RegisterJob(apb.RegisterJobRequest(job_id="demo-job", nodes=names))
        end_s = max(f.fail_s for f in failures) + 15 * 60.0
        # The simulated clock starts this far in the past (under the service's 6 h sample age) so
        # that at `speed` times real time it is still behind the wall clock when the demo ends.
        sim_start = int(time.time() - max(4 * 3600.0, end_s + 600.0))
        model = service.model
        print(
            f"service on 127.0.0.1:{port}, metrics on :{metrics_port}/metrics; model threshold "
            f"{model.threshold:.3g} (an alert holds above {model.policy.hold(model.threshold):.3g}), horizon "
            f"{model.horizon_s / 60:.0f} min, trained {model.card.created_at} "
            f"({'the shipped model' if args.model is None else model_dir})"
        )
        print(
            f"risk: the chance a GPU fails within {model.horizon_s / 60:.0f} min, at hardware's real failure "
            f"rate (failures are rare: a healthy GPU's is far below {model.threshold:.3g}); each alert says "
            "when first, then its risk as a multiple of the threshold it crossed"
        )
        periods = DEFAULT_PERIODS
        print(
            f"an alert is true when its failure comes {periods.warning_s / 60:.0f} min to "
            f"{periods.period_s / 3600:g} h after it opens; late, premature (within a day) or false otherwise"
        )
        print(f"{args.nodes} simulated nodes x 8 GPUs, {args.speed:.0f}x real time; failures ordered:")
        for f in failures:
            print(f"  {_clock(f.fail_s)}  {_where(f)}: {f.mode}")
        seen = Seen()
        stream = stub.Subscribe(apb.SubscribeRequest(job_id="demo-job"))
        listener = threading.Thread(
            target=_listen, args=(stream, stub, failures, sim_start, periods, seen), daemon=True
        )
        listener.start()
        collectors = [_collector(i, port, sim_start, args, failures) for i in range(args.nodes)]
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        announced: set[Scenario] = set()
        wall_end = time.monotonic() + end_s / args.speed + 30.0
        while not stop.is_set() and time.monotonic() < wall_end:
            now_s = service.latest_event_s - sim_start  # the service's view of simulated time
            for f in failures:
                if f not in announced and now_s >= f.fail_s:
                    announced.add(f)
                    print(f"[{_clock(f.fail_s)}] the twin fails {_where(f)} ({f.mode})")
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
        print(_summary(failures, seen, periods, sim_start, end_s, args.nodes))
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
    i: int, port: int, sim_start: int, args: DemoSettings, failures: list[Scenario]
) -> subprocess.Popen[bytes]:
    interval = TWIN_CADENCE_S / args.speed
    command = [
        FAULTCAST,
        "collect",
        "--source",
        "simulated",
        "--sim-node",
        str(i),
        "--node",
        node_name(i),
        "--interval",
        f"{interval * 1000:.0f}ms",
        "--speed",
        f"{args.speed:g}",
        "--sim-start",
        str(sim_start),
        "--service",
        f"127.0.0.1:{port}",
        "--insecure",
        "--spool",
        str(args.out / f"spool-{i}.sqlite"),
        "--prometheus-port",
        "0",
    ]
    for f in failures:
        if f.node == i:
            command += ["--scenario", f.arg()]
    (args.out / f"spool-{i}.sqlite").unlink(missing_ok=True)
    log_file = (args.out / f"collector-{i}.log").open("wb")
    return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)


def _clock(sim_s: float) -> str:
    minutes = int(sim_s // 60)
    return f"sim {minutes // 60:02d}:{minutes % 60:02d}"


def _where(f: Scenario) -> str:
    """The failure's node, and its GPU unless the whole node fails."""
    return node_name(f.node) if f.gpu is None else f"{node_name(f.node)} gpu {f.gpu}"


def _credited(alert: apb.Alert, f: Scenario) -> bool:
    """Whether failure `f` is where the alert's evidence pointed: its GPU, or its node for a
    node-level alert and a node-level failure (the rule of model/evaluation/outcomes.py)."""
    return alert.node == node_name(f.node) and alert.gpu == (-1 if f.gpu is None else f.gpu)


def _judge(
    alert: apb.Alert, failures: list[Scenario], sim_start: int, periods: PredictionPeriods
) -> tuple[Outcome, Scenario | None, float]:
    """The alert's outcome by the first failure it credits after it opened, that failure, and the
    lead in seconds."""
    t = alert.time_unix_nano / 1e9 - sim_start
    following = sorted((f for f in failures if _credited(alert, f) and f.fail_s >= t), key=lambda f: f.fail_s)
    f = following[0] if following and following[0].fail_s - t <= periods.false_after_s else None
    lead = None if f is None else f.fail_s - t
    return periods.outcome(lead), f, float("nan") if lead is None else lead


def _verdict(
    alert: apb.Alert, failures: list[Scenario], sim_start: int, periods: PredictionPeriods, opened: bool
) -> str:
    """What the twin does next; an alert's outcome is judged from when it opened, so updates only say
    how far the failure is."""
    outcome, f, lead = _judge(alert, failures, sim_start, periods)
    if f is None:
        return "false alarm so far: no failure of it follows"
    if not opened:
        return f"the twin fails it in {lead / 60:.0f} min"
    words = {
        Outcome.TRUE: "true",
        Outcome.LATE: f"late (under {periods.warning_s / 60:.0f} min)",
        Outcome.PREMATURE: f"premature (beyond {periods.period_s / 3600:g} h)",
    }[outcome]
    return f"{words}: the twin fails it in {lead / 60:.0f} min"


def _listen(
    stream: Any,
    stub: apb_grpc.AlertsStub,
    failures: list[Scenario],
    sim_start: int,
    periods: PredictionPeriods,
    seen: Seen,
) -> None:
    try:
        for event in stream:
            if not event.HasField("alert"):
                continue  # the caught-up marker
            alert = event.alert
            t = alert.time_unix_nano / 1e9 - sim_start
            mode = mode_of(alert)
            where = f"{alert.node} gpu {alert.gpu}" if alert.gpu >= 0 else f"{alert.node} (node)"
            if alert.kind == apb.EVENT_KIND_CLEARED:
                print(f"[{_clock(t)}] CLEARED {alert.opened_id}: {where}: {alert.cleared_reason}")
                continue
            if alert.kind == apb.EVENT_KIND_FAILED:
                foreseen = ", ".join(map(str, alert.failure.foreseen_by))
                print(
                    f"[{_clock(t)}] FAILED {alert.id}: {where} {mode}: {alert.failure.detail} "
                    f"({f'foreseen by alert {foreseen}' if foreseen else 'not foreseen'})"
                )
                with seen.lock:
                    seen.failed.append(alert)
                continue
            action = apb.RecommendedAction.Name(alert.action).removeprefix("RECOMMENDED_ACTION_")
            top = ", ".join(c.feature for c in alert.top_features[:3])
            kind = "ALERT" if alert.kind == apb.EVENT_KIND_OPENED else "UPDATE"
            # When first, then the risk against its threshold (faultcast.alert_text): a risk of 0.03
            # reads as 3% until it says it stands twice the threshold.
            print(
                f"[{_clock(t)}] {kind} {alert.opened_id}: {where} {mode}: {alert_summary(alert)}, {action} "
                f"(why: {top}) | {_verdict(alert, failures, sim_start, periods, kind == 'ALERT')}"
            )
            with seen.lock:
                if alert.kind == apb.EVENT_KIND_OPENED:
                    seen.alerts.append(alert)
                else:
                    seen.updates += 1
                first_ack = alert.opened_id not in seen.acknowledged
                migrate = alert.action == apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
                if migrate and first_ack:
                    seen.acknowledged.add(alert.opened_id)
            if migrate and first_ack:
                # The trainer's side: snapshot at the next step boundary, then say so, once per alert.
                reply = stub.Acknowledge(
                    apb.AcknowledgeRequest(
                        alert_id=alert.opened_id,
                        job_id="demo-job",
                        action=apb.ACK_ACTION_SNAPSHOT_DONE,
                        step=int(t // 60),
                        checkpoint_uri=f"file:///checkpoints/demo-job/step-{int(t // 60)}",
                    )
                )
                print(f"           trainer: snapshot done -> service: {reply.remediation}")
    except grpc.RpcError:
        return  # the demo is over


def _summary(
    failures: list[Scenario],
    seen: Seen,
    periods: PredictionPeriods,
    sim_start: int,
    end_s: float,
    nodes: int,
) -> str:
    with seen.lock:
        alerts, updates, failed = list(seen.alerts), seen.updates, list(seen.failed)
    lines = ["", "summary", "-------"]
    warning, period = periods.warning_s / 60, periods.period_s / 60
    caught = 0
    for f in failures:
        leads = [f.fail_s - (a.time_unix_nano / 1e9 - sim_start) for a in alerts if _credited(a, f)]
        within = [lead for lead in leads if 0 <= lead <= periods.period_s]
        if within and max(within) >= periods.warning_s:
            caught += 1
            outcome = f"predicted {max(within) / 60:.0f} min ahead"
        elif within:
            outcome = f"late: warned only {max(within) / 60:.1f} min ahead (under {warning:.0f} min)"
        elif any(lead > periods.period_s for lead in leads):
            outcome = f"missed: the only alert came more than {period:.0f} min before (premature)"
        elif FailureMode(f.mode).has_precursor:
            outcome = "missed"
        else:
            outcome = "missed (no precursor: no model can see it coming)"
        lines.append(f"  {_where(f)} {f.mode:<11} at {_clock(f.fail_s)}: {outcome}")
    judged = [_judge(a, failures, sim_start, periods)[0] for a in alerts]
    count = {o: judged.count(o) for o in Outcome}
    gpu_days = nodes * 8 * end_s / 86_400.0
    false_alarms = count[Outcome.PREMATURE] + count[Outcome.FALSE]
    lines.append(
        f"  {caught} of {len(failures)} failures predicted {warning:.0f} min to {period:.0f} min ahead; "
        f"{len(alerts)} alerts ({updates} updates): {count[Outcome.TRUE]} true, {count[Outcome.LATE]} late, "
        f"{count[Outcome.PREMATURE]} premature, {count[Outcome.FALSE]} false; {false_alarms} false alarms "
        f"(premature + false) over {nodes * 8} GPUs x {end_s / 3600:.1f} simulated hours ({gpu_days:.2f} GPU-days)"
    )
    foreseen = sum(bool(a.failure.foreseen_by) for a in failed)
    lines.append(
        f"  {len(failed)} failures seen as they happened (FAILED events: a critical Xid, a GPU lost), "
        f"{foreseen} of them with an alert open"
    )
    return "\n".join(lines)
