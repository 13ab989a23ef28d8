"""Fault to FAILED at the trainer: how long after a failure a job's guard hears of it, per kind of evidence.

    .venv/bin/python bench/failure_detection.py --model DIR          # 8 trials of each kind
    .venv/bin/python bench/failure_detection.py --trials 3 --quick   # smoke run

A real service (`Service`, NoopActuator, a temporary state folder) on 127.0.0.1:0, and a real Guard
subscribed for the node, in this process. The clock starts when the fault is made and stops when the
guard's `on_failure` is called with the FAILED event.

- xid: a real collector (`NodeCollector` over `NvmlSource`, NVML faked at the pynvml boundary) scraping
  every `--interval` seconds (1 s) and shipping one sample per `--ship-step` window (60 s, the default
  of `faultcast collect`) through a real Shipper; each trial injects Xid 79 on the next GPU at a random
  moment of the scrape period. The collector ships its window so far at once; the service compares it
  with the sample before and publishes.
- killed: a real `faultcast collect --source simulated` process, killed with SIGKILL once its stream is
  open (the kernel resets its connection); the service waits `--silence-grace` for it to come back.
- hung: the same process stopped with SIGSTOP (no reset, no answer to keepalive pings: a node that lost
  power or hung); the service drops the stream once a keepalive ping goes unanswered for `--keepalive`
  (pings every `--keepalive`), then waits the grace.
- report: a second guard of the job calls ReportFailure (a dead rank).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from faultcast.client.guard import Guard
from faultcast.collector.agent import NodeCollector
from faultcast.collector.nvml.source import NvmlSource
from faultcast.collector.shipper import Shipper
from faultcast.collector.spool import Spool
from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.server import Service
from faultcast.testing.fake_nvml import FakeNvml
from faultcast.v1 import alerts_pb2 as apb

WAIT_S = 60.0
FAULTCAST = str(Path(sys.executable).parent / "faultcast")


class Heard:
    """The FAILED events a guard was told of, with when (time.monotonic())."""

    def __init__(self) -> None:
        self.events: list[tuple[float, apb.Alert]] = []
        self.changed = threading.Condition()

    def __call__(self, alert: apb.Alert) -> None:
        with self.changed:
            self.events.append((time.monotonic(), alert))
            self.changed.notify_all()

    def wait(self, match: Callable[[apb.Alert], bool]) -> tuple[float, apb.Alert]:
        with self.changed:
            found: list[tuple[float, apb.Alert]] = []

            def seen() -> bool:
                found[:] = [e for e in self.events if match(e[1])]
                return bool(found)

            if not self.changed.wait_for(seen, WAIT_S):
                raise TimeoutError("no FAILED event within the wait")
            return found[0]


def _guard(target: str, job: str, node: str, heard: Heard, register: bool = True) -> Guard:
    guard = Guard(target, job, [node], register=register, on_failure=heard).start()
    if not guard.wait_caught_up(WAIT_S):
        raise TimeoutError("the guard did not subscribe")
    return guard


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out")
        time.sleep(0.005)


def _on_gpu(gpu: int) -> Callable[[apb.Alert], bool]:
    return lambda alert: alert.gpu == gpu


def _streaming(service: Service, node: str) -> Callable[[], bool]:
    return lambda: service.failure_watch.streams_open(node) == 1


def xid_trials(service: Service, target: str, args: argparse.Namespace, folder: Path) -> list[float]:
    node, heard = "bench-xid", Heard()
    gpus = service.model.feature_config.gpus_per_node
    guard = _guard(target, "job-xid", node, heard)
    fake = FakeNvml(gpus=gpus)
    spool = Spool(folder / "xid.sqlite")
    collector = NodeCollector(node, [NvmlSource(fake)], spool=spool, ship_step_s=args.ship_step)
    shipper = Shipper(target, spool, node)
    shipper.start()
    stop = threading.Event()
    scraping = threading.Thread(target=collector.run, args=(args.interval,), kwargs={"stop": stop})
    scraping.start()
    rng = random.Random(7)
    out = []
    try:
        print(f"xid: waiting for the first {args.ship_step:.0f} s window to reach the service", flush=True)
        _until(lambda: spool.acked_through >= 1)
        for trial in range(min(args.trials, gpus)):
            time.sleep(rng.uniform(0, args.interval))  # a fault at any moment of the scrape period
            fault = time.monotonic()
            fake.inject_xid(trial, 79)
            heard_at, event = heard.wait(_on_gpu(trial))
            out.append(heard_at - fault)
            print(f"  xid 79 on gpu {trial}: {heard_at - fault:.3f} s ({event.failure.detail})", flush=True)
    finally:
        stop.set()
        scraping.join()
        shipper.close()
        guard.close()
        collector.close()
        spool.close()
    return out


def silence_trials(
    service: Service, target: str, args: argparse.Namespace, folder: Path, how: signal.Signals
) -> list[float]:
    out = []
    for trial in range(args.trials):
        node, heard = f"bench-{how.name.lower()}-{trial}", Heard()
        guard = _guard(target, f"job-{node}", node, heard)
        collector = subprocess.Popen(
            [
                FAULTCAST,
                "collect",
                "--source",
                "simulated",
                "--node",
                node,
                "--gpus",
                "1",
                "--service",
                target,
                "--insecure",
                "--no-prometheus",
                "--spool",
                str(folder / f"{node}.sqlite"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _until(_streaming(service, node))
            fault = time.monotonic()
            os.kill(collector.pid, how)
            heard_at, event = heard.wait(lambda a: a.failure.evidence == apb.FAILURE_EVIDENCE_NODE_SILENT)
            out.append(heard_at - fault)
            print(f"  {how.name} {node}: {heard_at - fault:.3f} s ({event.failure.detail})", flush=True)
        finally:
            collector.kill()
            collector.wait()
            guard.close()
    return out


def report_trials(target: str, args: argparse.Namespace) -> list[float]:
    out = []
    for trial in range(args.trials):
        node, heard = f"bench-report-{trial}", Heard()
        reporter = _guard(target, f"job-report-{trial}", node, Heard())
        listener = _guard(target, f"job-report-{trial}", node, heard, register=False)
        try:
            fault = time.monotonic()
            reporter.report_failure(apb.TRAINER_FAILURE_DEAD_RANK, rank=trial)
            heard_at, _ = heard.wait(lambda a: True)
            out.append(heard_at - fault)
            print(f"  report {node}: {heard_at - fault:.3f} s", flush=True)
        finally:
            reporter.close()
            listener.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", type=Path, help="model artifact (default: train the demo model, about a minute)"
    )
    p.add_argument("--trials", type=int, default=8, help="trials of each kind (xid: at most one per GPU)")
    p.add_argument("--interval", type=float, default=1.0, help="the collector's scrape interval")
    p.add_argument("--ship-step", type=float, default=60.0, help="the collector's window (--ship-step)")
    defaults = ServiceConfig()
    p.add_argument("--silence-grace", type=float, default=defaults.silence_grace_s)
    p.add_argument("--keepalive", type=float, default=defaults.keepalive_s)
    p.add_argument("--quick", action="store_true", help="a 10 s window instead of 60 s (the xid warm-up)")
    args = p.parse_args()
    if args.quick:
        args.ship_step = 10.0
    folder = Path(tempfile.mkdtemp(prefix="faultcast-detect-"))
    try:
        model = args.model
        if model is None:
            from faultcast.demo.model import train_demo_model

            print("training the demo model (about a minute)", flush=True)
            model = train_demo_model(folder / "model", folder / "data")
        config = ServiceConfig(grace_s=3600.0, silence_grace_s=args.silence_grace, keepalive_s=args.keepalive)
        service = Service.open(model, folder / "state", config, actuator=NoopActuator())
        target = f"127.0.0.1:{service.start('127.0.0.1:0')}"
        try:
            results = {
                "xid (collector, fake NVML)": xid_trials(service, target, args, folder),
                "killed (SIGKILL of collect)": silence_trials(service, target, args, folder, signal.SIGKILL),
                "hung (SIGSTOP of collect)": silence_trials(service, target, args, folder, signal.SIGSTOP),
                "report (ReportFailure)": report_trials(target, args),
            }
        finally:
            service.stop(0)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"\nfault to FAILED at the trainer: scrapes every {args.interval:g} s, {args.ship_step:g} s windows, "
        f"silence grace {args.silence_grace:g} s, keepalive {args.keepalive:g} s"
    )
    print(f"{'evidence':30} {'trials':>6} {'median s':>9} {'max s':>7}")
    for name, seconds in results.items():
        print(f"{name:30} {len(seconds):>6} {statistics.median(seconds):>9.3f} {max(seconds):>7.3f}")


if __name__ == "__main__":
    main()
