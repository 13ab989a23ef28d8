"""Prediction service: sustained ingest over gRPC Push streams, sample-to-alert latency, and the
LightGBM ceiling, in one run.

    .venv/bin/python bench/service.py            # 10,000 GPUs (1,250 nodes x 8), 90 s per phase
    .venv/bin/python bench/service.py --quick    # smoke run: 100 nodes, 6 s per phase
    .venv/bin/python bench/service.py --summary-scrapes 60 --phases b   # plain and summarised samples

The service (`faultcast.service.server.Service` with the model of `--model`, a temporary state
folder and `Limits(max_future_s=0, max_age_s=0)`, event time being synthetic) runs in this process
on 127.0.0.1: a `grpc.aio` server whose event loop carries every Push stream, and `--rpc-workers`
threads for the other calls. The load generator runs in other processes
(`--generators`, spawned): asyncio gRPC clients, one Push stream per node as a collector keeps,
over `--channels` HTTP/2 connections each. The samples are real twin readings: a pool of
`--pool-nodes` healthy nodes x `--pool-steps` readings 1 s apart is generated and serialized once;
every simulated node replays one pool node under its own name, event time and sequence (three
protobuf field assignments and a serialization per sample).

Phase a (paced): every node sends one sample a second at its own sub-second phase, event time
advancing 1 s per sample: the fleet's offered load. Event time is aligned to the model's grid, so
every node completes a grid step in the same second, as NTP-synchronised collectors do.
Phase b (unpaced): every node sends as fast as the service acknowledges, at most `--window`
samples unacknowledged per stream, event time advancing 1 s per sample; the nodes' event times
are spread over the grid's cadence, so one sample in 60 completes a step, from the start.

Rates are counted by the service (`faultcast_ingest_gpu_samples_total`) over each phase less its
first `--warmup` seconds. Latency is the service's own `faultcast_scoring_latency_seconds` (arrival
of the sample completing a grid step, at the scorer, to its scores and alerts done), over every
step scored from the end of the warm-up until the phase's backlog is done: quantiles interpolated
from the histogram's buckets as Prometheus does, and exact ones from every observation (recorded
by wrapping the histogram's `observe` in this process). The generator times each sample's ack.
Then the same ingest without gRPC: a second service's Push servicers driven from one thread.
The ceiling is `model.risk` on a batch of real feature rows captured from the service's scoring.
The machine's cores are shared by the service and the generator: both CPU times are reported.

Step summaries (`--summary-scrapes N`): every phase and the in-process ingest run twice, with the
plain pool and then with a pool of summarised samples, the way `faultcast collect --ship-step`
ships them: the pool's 1 s readings go through the collector's own `StepSummariser` at an N s step,
so each node sample is the last of N scrapes with every GPU carrying the summary of the N, and event
time advances N s per sample (at N = the model's cadence every sample completes a grid step, and
is scored). Reported for both: GPU-samples/s, and the scrapes they represent per second (GPU-samples
x scrapes each: 1 for a plain sample), and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import multiprocessing as mp
import os
import random
import statistics
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import numpy as np
from prometheus_client.metrics import MetricWrapperBase

from faultcast import wire
from faultcast.collector.summariser import StepSummariser
from faultcast.demo.feed import twin_snapshots
from faultcast.model.alert_content import median_ttf_s
from faultcast.model.artifact import FaultModel
from faultcast.readings import NodeSnapshot
from faultcast.service.config import ServiceConfig
from faultcast.service.metrics import LATENCY_BUCKETS_S
from faultcast.service.rpc.validation import Limits
from faultcast.service.scoring import ScoredStep
from faultcast.service.server import Service
from faultcast.sim.config import DEFAULT_START_UNIX_S, FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.v1 import telemetry_pb2 as tpb

TARGET_RATE = 20_000.0  # GPU-samples per second, sustained
TARGET_P99_S = 0.100  # sample-to-alert latency
PUSH_METHOD = "/faultcast.v1.Telemetry/Push"
DEFAULT_MODEL = Path("out/bench-model")
DRAIN_S = 30.0  # how long a stream may take to ack its last samples after a phase
OPEN_BATCH, OPEN_PAUSE_S = 50, 0.05  # streams are opened 1,000 a second
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # (grpc-stubs lags grpc.aio)


# -- the model and the sample pool -------------------------------------------------------------


def ensure_model(path: Path) -> Path:
    """The benchmark model: the demo model (faultcast.demo.model's recipe, as the service tests use
    it), trained once into `path` (about a minute here) and reused after."""
    from faultcast.demo.model import ensure_model as train_once

    train_once(path)
    return path


def make_pool(
    nodes: int, steps: int, gpus_per_node: int, seed: int, summary_scrapes: int = 0
) -> list[list[bytes]]:
    """Serialized NodeSample messages: `nodes` healthy twin nodes x `steps` readings 1 s apart; with
    `summary_scrapes`, those readings summarised by the collector's StepSummariser at that step (one
    sample per whole window of `summary_scrapes` scrapes)."""
    config = FleetConfig(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        days=1.0,
        cadence_s=1.0,
        seed=seed,
        chunk_steps=steps,
        failures=False,
    )
    pool = []
    for n in range(nodes):
        # Plain scrapes, as an NVML collector reads them: no summary (the twin's own, of one 1 s
        # step, would make the plain samples larger than today's).
        snapshots = [
            replace(s, gpus=tuple(replace(g, summary=None) for g in s.gpus))
            for s in twin_snapshots(TwinSource(config, n), config.node_name(n), steps)
        ]
        if summary_scrapes:
            snapshots = summarised(snapshots, summary_scrapes)
        pool.append([wire.to_proto(s).SerializeToString() for s in snapshots])
    return pool


def summarised(snapshots: list[NodeSnapshot], scrapes: int) -> list[NodeSnapshot]:
    """The samples a collector with `--ship-step {scrapes}s` ships from these 1 s scrapes, less the
    windows it saw only part of (the first and the last)."""
    summariser = StepSummariser(float(scrapes))
    out = [closed for s in snapshots if (closed := summariser.add(s)) is not None]
    last = summariser.flush()
    out += [last] if last is not None else []
    whole = [s for s in out if all(g.summary is not None and g.summary.scrapes == scrapes for g in s.gpus)]
    if not whole:
        raise SystemExit(f"--pool-steps must cover at least one whole window of {scrapes} scrapes")
    return whole


# -- the load generator (another process) ------------------------------------------------------


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    paced: bool
    duration_s: float
    warmup_s: float
    first_time_s: float  # event time of the nodes' first samples, before their offsets
    spread_s: float  # nodes' event-time offsets spread evenly over this many whole seconds
    window: int  # unacknowledged samples per stream (unpaced)
    channels: int  # HTTP/2 connections per generator process
    seed: int
    gpus_per_node: int
    cadence_s: float  # the model's grid
    pool: int = 0  # which pool the nodes replay: 0 plain samples, 1 summarised ones
    time_step_s: float = 1.0  # event time between a node's samples
    scrapes: int = 1  # scrapes each GPU-sample represents


@dataclass
class GenResult:
    sent: int = 0
    acked: int = 0
    acked_in_window: int = 0
    rejected: int = 0
    unacked_at_end: int = 0
    stream_errors: int = 0
    drain_timeouts: int = 0
    reopened: int = 0  # streams refused at opening and opened again
    first_error: str = ""
    connect_s: float = 0.0
    cpu_s: float = 0.0
    ack_latency_s: list[float] = field(default_factory=list)  # samples sent inside the window


def _generator_main(conn: Connection, target: str, pools: list[list[list[bytes]]], nodes: list[int]) -> None:
    """A load generator process: runs phases on command, one asyncio loop each."""
    requests = [
        [[tpb.PushRequest(sample=tpb.NodeSample.FromString(b)) for b in steps] for steps in pool]
        for pool in pools
    ]
    while True:
        message = conn.recv()
        if message is None:
            return
        spec: PhaseSpec = message
        cpu = time.process_time()
        result = asyncio.run(_phase(conn, target, requests[spec.pool], nodes, spec))
        result.cpu_s = time.process_time() - cpu
        conn.send(result)


async def _phase(
    conn: Connection, target: str, pool: list[list[tpb.PushRequest]], nodes: list[int], spec: PhaseSpec
) -> GenResult:
    loop = asyncio.get_running_loop()
    result = GenResult()
    rng = random.Random(spec.seed)
    options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel, not one shared
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(spec.channels)]
    # Any: grpc-stubs types grpc.aio's stream calls as always taking a request iterator; these
    # are driven with write() and read() instead, and send bytes serialized here.
    calls: list[Any] = [
        ch.stream_stream(PUSH_METHOD, request_serializer=None, response_deserializer=tpb.PushAck.FromString)
        for ch in channels
    ]
    ready = asyncio.Event()
    timing: dict[str, float] = {}

    async def node(i: int, position: int) -> None:
        name = f"bench-{spec.name}-{i:05d}"
        phase = rng.random()  # the collector's scrape phase within the second
        # Sample k's event time is first_time_s + k * time_step_s + offset.
        offset = int(position * spec.spread_s / len(nodes)) + phase
        samples = pool[i % len(pool)]
        sent_at: deque[float] = deque()
        window = asyncio.Semaphore(spec.window)

        def failed(exc: grpc.aio.AioRpcError, stage: str) -> None:
            result.stream_errors += 1
            if not result.first_error:
                at = loop.time() - timing.get("start", loop.time())
                result.first_error = (
                    f"{exc.code().name}: {exc.details()} ({stage}, {at:.1f} s into the phase)"
                )

        async def acks() -> None:
            while True:
                try:
                    ack: Any = await call.read()
                except grpc.aio.AioRpcError as exc:
                    failed(exc, "reading acks")
                    return
                if ack is _EOF:
                    return
                now = loop.time()
                sent = sent_at.popleft()
                result.acked += 1
                if timing["from"] <= now < timing["to"]:
                    result.acked_in_window += 1
                if timing["from"] <= sent < timing["to"]:
                    result.ack_latency_s.append(now - sent)
                result.rejected += len(ack.rejections)
                window.release()

        stage = "hello"
        hello = wire.hello(name, 1).SerializeToString()
        for attempt in range(1, 4):  # as a collector does: a refused stream is opened again
            call = calls[position % len(calls)]()
            try:
                await call.write(hello)
                break
            except grpc.aio.AioRpcError as exc:
                if attempt == 3:
                    failed(exc, stage)
                    return
                result.reopened += 1
                await asyncio.sleep(0.5 * attempt)
        try:
            reader = asyncio.create_task(acks())
            stage = "waiting for the start"
            await ready.wait()
            start, end = timing["start"], timing["end"]
            stage, k = "sending", 0
            while True:
                if spec.paced:
                    due = start + phase + k
                    if due >= end:
                        break
                    await asyncio.sleep(due - loop.time())
                else:
                    await window.acquire()
                    if loop.time() >= end:
                        break
                request = samples[k % len(samples)]
                sample = request.sample
                sample.node, sample.sequence = name, k + 1
                sample.time_unix_nano = round((spec.first_time_s + k * spec.time_step_s + offset) * 1e9)
                data = request.SerializeToString()
                sent_at.append(loop.time())
                await call.write(data)
                result.sent += 1
                k += 1
            stage = "closing"
            await call.done_writing()
            try:
                await asyncio.wait_for(reader, DRAIN_S)
            except TimeoutError:
                result.drain_timeouts += 1
                call.cancel()
        except grpc.aio.AioRpcError as exc:
            failed(exc, stage)
        result.unacked_at_end += len(sent_at)

    # Streams are opened in batches: gRPC core refuses (CANCELLED) part of a burst of new calls
    # that the server has not yet picked up past its pending-call limit (1,000 by default).
    connect = time.monotonic()
    tasks = []
    for p, i in enumerate(nodes):
        tasks.append(asyncio.create_task(node(i, p)))
        if p % OPEN_BATCH == OPEN_BATCH - 1:
            await asyncio.sleep(OPEN_PAUSE_S)
    await asyncio.sleep(OPEN_PAUSE_S)
    result.connect_s = time.monotonic() - connect
    conn.send("ready")
    start: float = await loop.run_in_executor(None, conn.recv)
    timing.update(start=start, end=start + spec.duration_s, to=start + spec.duration_s)
    timing["from"] = start + spec.warmup_s
    ready.set()
    await asyncio.gather(*tasks)
    for ch in channels:
        await ch.close(None)
    return result


# -- the service side --------------------------------------------------------------------------


class Probe:
    """Taps the running service without changing it: every scoring-latency observation (with the
    time it was made) and the feature rows of the first scored steps, for the ceiling."""

    def __init__(self, service: Service, keep_rows: int) -> None:
        self.service = service
        self.latency: list[tuple[float, float]] = []  # (monotonic time observed, seconds)
        self.rows: list[np.ndarray] = []
        self._keep = keep_rows
        self._kept = 0
        histogram = service.metrics.scoring_latency
        observe = histogram.observe

        def observe_and_keep(amount: float, exemplar: dict[str, str] | None = None) -> None:
            self.latency.append((time.monotonic(), amount))
            observe(amount, exemplar)

        setattr(histogram, "observe", observe_and_keep)  # noqa: B010 (an instance attribute, on purpose)
        score_pending = service.scorer.score_pending

        def score_and_keep() -> list[ScoredStep]:
            scored = score_pending()
            for s in scored:
                if self._kept < self._keep:
                    rows = s.features[s.present]
                    self.rows.append(rows.copy())
                    self._kept += len(rows)
            return scored

        setattr(service.scorer, "score_pending", score_and_keep)  # noqa: B010

    # Read through each metric's own collect(): the samples the registry exposes, without
    # collecting the per-GPU risk gauge's 10,000 children on every look.
    def total(self, metric: MetricWrapperBase) -> float:
        """A counter's value, summed over its labels."""
        return sum(s.value for f in metric.collect() for s in f.samples if s.name.endswith("_total"))

    def buckets(self) -> list[float]:
        """Cumulative counts of the scoring-latency histogram, one per bound and +Inf."""
        counts = {
            s.labels["le"]: s.value
            for f in self.service.metrics.scoring_latency.collect()
            for s in f.samples
            if s.name.endswith("_bucket")
        }
        return [counts[repr(float(b))] for b in LATENCY_BUCKETS_S] + [counts["+Inf"]]


def bucket_quantile(q: float, cumulative: list[float]) -> str:
    """Prometheus's histogram_quantile over LATENCY_BUCKETS_S: linear within the bucket."""
    total = cumulative[-1]
    if total <= 0:
        return "n/a"
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in zip((*LATENCY_BUCKETS_S, float("inf")), cumulative, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return f"> {LATENCY_BUCKETS_S[-1] * 1e3:.0f} ms"
            inside = count - below
            frac = (rank - below) / inside if inside > 0 else 1.0
            return f"{(lower + frac * (bound - lower)) * 1e3:.1f} ms"
        lower, below = bound, count
    return "n/a"


def exact_quantiles(values: list[float]) -> str:
    if not values:
        return "n/a (no observations)"
    p50, p99 = np.quantile(np.asarray(values), [0.5, 0.99])
    return (
        f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {max(values) * 1e3:.1f} ms (n={len(values):,})"
    )


@dataclass
class PhaseOutcome:
    spec: PhaseSpec
    window_s: float
    gpu_samples: float
    node_samples: float
    rejects: float
    duplicates: float
    service_cpu_s: float
    generators: list[GenResult]
    buckets: list[float]
    latency: list[float]
    rates_10s: list[float]
    alerts: float

    @property
    def rate(self) -> float:
        return self.gpu_samples / self.window_s


def _wait_quiet(probe: Probe, limit_s: float = 60.0) -> None:
    """Until the service stops taking samples and scoring (the last phase's tail is done)."""
    deadline = time.monotonic() + limit_s
    last = (-1.0, -1.0)
    while time.monotonic() < deadline:
        now = (probe.total(probe.service.metrics.node_samples), float(len(probe.latency)))
        if now == last:
            return
        last = now
        time.sleep(0.5)


def run_phase(probe: Probe, pipes: list[Connection], spec: PhaseSpec) -> PhaseOutcome:
    for pipe in pipes:
        pipe.send(spec)
    for pipe in pipes:
        pipe.recv()  # "ready": streams opened
    time.sleep(1.0)  # the hellos reach the service
    start = time.monotonic() + 0.5
    for pipe in pipes:
        pipe.send(start)
    window_from, window_to = start + spec.warmup_s, start + spec.duration_s
    series: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample_rate() -> None:
        next_at = window_from
        while not stop.is_set() and next_at <= window_to + 1e-6:
            time.sleep(max(0.0, next_at - time.monotonic()))
            series.append((time.monotonic(), probe.total(probe.service.metrics.samples)))
            next_at += 10.0

    sampler = threading.Thread(target=sample_rate, daemon=True)
    time.sleep(max(0.0, window_from - time.monotonic()))

    def counters() -> dict[str, float]:
        m = probe.service.metrics
        return {
            "gpu": probe.total(m.samples),
            "node": probe.total(m.node_samples),
            "rejects": probe.total(m.rejects),
            "dup": probe.total(m.duplicates),
            "cpu": time.process_time(),
            "t": time.monotonic(),
        }

    at_from = counters()
    buckets_from = probe.buckets()
    sampler.start()
    time.sleep(max(0.0, window_to - time.monotonic()))
    at_to = counters()
    stop.set()
    sampler.join()
    results: list[GenResult] = [pipe.recv() for pipe in pipes]
    _wait_quiet(probe)
    # Latency: every grid step scored from the end of the warm-up until the phase's backlog is done.
    buckets_to = probe.buckets()
    alerts = probe.total(probe.service.metrics.alerts)
    latency = [v for t, v in probe.latency if t >= window_from]
    rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(series)]
    return PhaseOutcome(
        spec,
        window_s=at_to["t"] - at_from["t"],
        gpu_samples=at_to["gpu"] - at_from["gpu"],
        node_samples=at_to["node"] - at_from["node"],
        rejects=at_to["rejects"] - at_from["rejects"],
        duplicates=at_to["dup"] - at_from["dup"],
        service_cpu_s=at_to["cpu"] - at_from["cpu"],
        generators=results,
        buckets=[b - a for a, b in zip(buckets_from, buckets_to, strict=True)],
        latency=latency,
        rates_10s=rates,
        alerts=alerts,
    )


# -- the same ingest without gRPC ----------------------------------------------------------------


class _Feed:
    """A Push stream's request iterator, fed by hand one request ahead of the servicer."""

    def __init__(self) -> None:
        self.queue: deque[tpb.PushRequest] = deque()

    def __iter__(self) -> _Feed:
        return self

    def __next__(self) -> tpb.PushRequest:
        if not self.queue:
            raise StopIteration
        return self.queue.popleft()


@dataclass
class InProcess:
    seconds: float
    node_samples: int
    gpu_samples: float
    cpu_s: float
    latency: list[float]
    rows: list[np.ndarray]


def ingest_in_process(
    model_dir: Path,
    pool: list[list[bytes]],
    nodes: int,
    seconds: float,
    first_time_s: float,
    cadence: float,
    keep_rows: int,
    time_step_s: float = 1.0,
) -> InProcess:
    """Drive a second, started service's `TelemetryServicer.Push` directly from one thread, round
    robin over every node's stream (hello, then one sample per turn): the ingest path without
    gRPC, its threads and the load generator. Its scoring thread runs as usual."""
    requests = [[tpb.PushRequest(sample=tpb.NodeSample.FromString(b)) for b in steps] for steps in pool]
    with tempfile.TemporaryDirectory() as state:
        service = Service.open(
            model_dir, Path(state), ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0))
        )
        probe = Probe(service, keep_rows)
        service.start("127.0.0.1:0", max_threads=8)
        context: Any = None  # Push only touches the context to abort a bad hello
        feeds, streams = [], []
        for i in range(nodes):
            feed = _Feed()
            feed.queue.append(wire.hello(f"inproc-{i:05d}", 1))
            feeds.append(feed)
            streams.append(service.telemetry.Push(feed, context))
        offsets = [int(i * cadence / nodes) for i in range(nodes)]
        gpu_before = probe.total(probe.service.metrics.samples)
        cpu, start = time.process_time(), time.monotonic()
        sent, k = 0, 0
        while time.monotonic() - start < seconds:
            for i in range(nodes):
                node_pool = requests[i % len(requests)]
                request = node_pool[k % len(node_pool)]
                sample = request.sample
                sample.node, sample.sequence = f"inproc-{i:05d}", k + 1
                sample.time_unix_nano = round((first_time_s + k * time_step_s + offsets[i]) * 1e9)
                feeds[i].queue.append(tpb.PushRequest.FromString(request.SerializeToString()))
                next(streams[i])
                sent += 1
            k += 1
        elapsed, cpu = time.monotonic() - start, time.process_time() - cpu
        gpu = probe.total(probe.service.metrics.samples) - gpu_before
        service.stop()
    return InProcess(elapsed, sent, gpu, cpu, [v for _, v in probe.latency], probe.rows)


# -- the ceiling -------------------------------------------------------------------------------


def rows_per_second(fn: Callable[[np.ndarray], object], x: np.ndarray, rounds: int) -> float:
    fn(x)  # warm
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return len(x) / statistics.median(times)


def all_heads(model: FaultModel) -> Callable[[np.ndarray], object]:
    """What the service's `score_pending` computes per batch: the risk, the risk within 5/15/30
    minutes (which computes the risk again), the mode and the estimated time to failure."""

    def heads(x: np.ndarray) -> object:
        risk = model.risk(x)
        return median_ttf_s(risk, model.risk_within(x), model.horizon_s), model.mode_probabilities(x)

    return heads


# -- the report --------------------------------------------------------------------------------


def report_phase(out: PhaseOutcome, offered: float | None, cores: int) -> None:
    spec, gens = out.spec, out.generators
    gen_cpu = sum(g.cpu_s for g in gens)
    acked_window = sum(g.acked_in_window for g in gens)
    ack = [v for g in gens for v in g.ack_latency_s]
    title = "paced, 1 sample/s per node" if spec.paced else f"unpaced, window {spec.window} per stream"
    if spec.scrapes > 1:
        title += f"; each sample summarises {spec.scrapes} scrapes, event time {spec.time_step_s:g} s apart"
    print(
        f"\nphase {spec.name} ({title}): {spec.duration_s:g} s, measured over the last {out.window_s:.1f} s"
    )
    if offered is not None:
        print(f"  offered:                          {offered:,.0f} GPU-samples/s")
    print(f"  achieved ingest:                  {out.rate:,.0f} GPU-samples/s")
    print(f"  achieved ingest (node samples):   {out.node_samples / out.window_s:,.0f} node-samples/s")
    print(
        f"  scrapes represented:              {out.rate * spec.scrapes:,.0f} scrapes/s "
        f"({spec.scrapes} per GPU-sample)"
    )
    if out.rates_10s:
        rates = ", ".join(f"{r:,.0f}" for r in out.rates_10s)
        print(f"  ingest per 10 s window:           {rates} GPU-samples/s")
    print(
        f"  acked by the generator in window: {acked_window / out.window_s * spec.gpus_per_node:,.0f} GPU-samples/s"
    )
    rows = out.rate * spec.time_step_s / spec.cadence_s  # a GPU's samples per grid step: cadence / step
    print(
        f"  scored rows (GPU grid steps):     {rows:,.0f} rows/s at the model's {spec.cadence_s:g} s cadence"
    )
    print(
        f"  sample-to-alert latency, service histogram buckets: p50 {bucket_quantile(0.5, out.buckets)}, "
        f"p99 {bucket_quantile(0.99, out.buckets)} ({out.buckets[-1]:,.0f} grid steps)"
    )
    print(f"  sample-to-alert latency, exact:   {exact_quantiles(out.latency)}")
    if ack:
        p50, p99 = np.quantile(np.asarray(ack), [0.5, 0.99])
        print(
            f"  ack round trip (generator):       p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms "
            f"(n={len(ack):,})"
        )
    else:
        print("  ack round trip (generator):       n/a (no acks)")
    sent = sum(g.sent for g in gens)
    acked = sum(g.acked for g in gens)
    errors = [g.first_error for g in gens if g.first_error]
    print(
        f"  samples sent / acked (whole phase): {sent:,} / {acked:,}; unacked at the end: "
        f"{sum(g.unacked_at_end for g in gens):,}"
    )
    print(
        f"  streams refused at opening and opened again: {sum(g.reopened for g in gens)}; "
        f"opening them all took {max(g.connect_s for g in gens):.1f} s"
    )
    print(
        f"  streams not closed within {DRAIN_S:.0f} s of the end: {sum(g.drain_timeouts for g in gens)}; "
        f"stream errors: {sum(g.stream_errors for g in gens)}" + (f" (first: {errors[0]})" if errors else "")
    )
    print(
        f"  rejects / duplicates in window:   {out.rejects:,.0f} / {out.duplicates:,.0f}; alerts raised so far: "
        f"{out.alerts:,.0f}"
    )
    print(
        f"  CPU in window: service {out.service_cpu_s:.1f} s ({out.service_cpu_s / out.window_s:.0%} of a core), "
        f"load generator {gen_cpu:.1f} s over the whole phase ({gen_cpu / spec.duration_s:.0%} of a core); "
        f"{cores} cores in all"
    )
    if out.gpu_samples:
        print(f"  service CPU per 1,000 GPU-samples: {out.service_cpu_s / out.gpu_samples * 1e6:.1f} ms")


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The bench's options (--quick shrinks the defaults; options given still win)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help=f"model artifact (default: train one into {DEFAULT_MODEL})")
    p.add_argument("--nodes", type=int, default=1250)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--duration", type=float, default=90.0, help="seconds per phase (default 90)")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds of each phase not measured")
    p.add_argument(
        "--first-step-s",
        type=float,
        default=20.0,
        help="paced phase: seconds in until every node completes its first grid step",
    )
    p.add_argument("--window", type=int, default=4, help="unpaced: unacknowledged samples per stream")
    p.add_argument("--generators", type=int, default=1, help="load generator processes")
    p.add_argument("--channels", type=int, default=16, help="HTTP/2 connections per generator")
    p.add_argument(
        "--rpc-workers",
        type=int,
        default=0,
        help="the service's threads for calls other than Push (default 64; Push streams share one asyncio loop)",
    )
    p.add_argument("--pool-nodes", type=int, default=8)
    p.add_argument("--pool-steps", type=int, default=600)
    p.add_argument(
        "--inproc", type=float, default=20.0, help="seconds of the same ingest without gRPC (0: skip)"
    )
    p.add_argument("--rows", type=int, default=10_000, help="batch size for the LightGBM ceiling")
    p.add_argument("--phases", default="ab", help="which phases to run: a (paced), b (unpaced)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument(
        "--summary-scrapes",
        type=int,
        default=0,
        metavar="N",
        help="also run every phase and the in-process ingest with samples that each carry step summaries "
        "of N 1 s scrapes, as `faultcast collect --ship-step Ns` ships them, and compare (0: plain only)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 100 nodes, 6 s per phase")
    if p.parse_args(argv).quick:  # smaller defaults; options given still win
        p.set_defaults(nodes=100, duration=6.0, warmup=1.5, first_step_s=3.0, pool_nodes=2, pool_steps=120,
                       rows=2_000, channels=4, inproc=2.0)  # fmt: skip  # the quick run's sizes, grouped as they read
    return p, p.parse_args(argv)


def print_setup(
    args: argparse.Namespace,
    model_dir: Path,
    model: FaultModel,
    port: int,
    pools: list[list[list[bytes]]],
    pool_s: float,
) -> None:
    """What is measured, on what machine, with which samples."""
    pool = pools[0]
    config = model.feature_config
    gpus = args.nodes * args.gpus_per_node
    workers = args.rpc_workers or 64
    print(
        f"service bench: {gpus:,} GPUs ({args.nodes:,} nodes x {args.gpus_per_node}) pushing to "
        f"127.0.0.1:{port}; model {model_dir} ({model.booster.num_trees()} trees, "
        f"{len(model.feature_names)} features, cadence {config.cadence_s:g} s)"
    )
    print(
        f"machine: {os.cpu_count() or 1} CPU cores, shared by the service (this process: Push on one asyncio "
        f"loop, {workers} threads for the other calls) and {args.generators} load generator process(es) "
        f"({args.channels} connections each, asyncio): the generator's CPU is taken from the service's"
    )
    print(
        f"sample pool: {args.pool_nodes} twin nodes x {args.pool_steps} steps at 1 s, "
        f"{sum(len(b) for s in pool for b in s) / sum(len(s) for s in pool) / 1024:.1f} KiB per "
        f"node sample, generated in {pool_s:.1f} s"
    )
    if len(pools) > 1:
        summaries = pools[1]
        print(
            f"summarised pool: the same readings through the collector's StepSummariser at "
            f"{args.summary_scrapes} s: {sum(len(s) for s in summaries)} samples, "
            f"{_kib(summaries):.1f} KiB per node sample (plain {_kib(pool):.1f})"
        )


def _kib(pool: list[list[bytes]]) -> float:
    return sum(len(b) for s in pool for b in s) / sum(len(s) for s in pool) / 1024


def start_generators(
    args: argparse.Namespace, target: str, pools: list[list[list[bytes]]]
) -> tuple[list[Connection], list[mp.process.BaseProcess]]:
    """The load generator processes, each with its share of the nodes; their pipes and processes."""
    ctx = mp.get_context("spawn")
    pipes: list[Connection] = []
    procs: list[mp.process.BaseProcess] = []
    for g in range(args.generators):
        mine, theirs = ctx.Pipe()
        share = list(range(g, args.nodes, args.generators))
        proc = ctx.Process(target=_generator_main, args=(theirs, target, pools, share), daemon=True)
        proc.start()
        pipes.append(mine)
        procs.append(proc)
    return pipes, procs


def stop_generators(pipes: list[Connection], procs: list[mp.process.BaseProcess]) -> None:
    for pipe in pipes:
        with contextlib.suppress(OSError):
            pipe.send(None)
    for proc in procs:
        proc.join(timeout=10)


def run_phases(
    args: argparse.Namespace,
    probe: Probe,
    pipes: list[Connection],
    grid: int,
    cadence: float,
    summary_scrapes: int = 0,
) -> list[tuple[PhaseOutcome, float | None]]:
    """Phase a (paced: every node completes a step at once) and b (unpaced, new nodes a day on),
    as --phases asks; each outcome with the load offered (GPU-samples/s, None when unpaced). With
    `summary_scrapes`, the phases of summarised samples (pool 1, new nodes, event time that many
    seconds a sample)."""
    outcomes: list[tuple[PhaseOutcome, float | None]] = []
    summarising = summary_scrapes > 1
    spec_a = PhaseSpec(
        name="a-summaries" if summarising else "a",
        paced=True,
        duration_s=args.duration,
        warmup_s=args.warmup,
        first_time_s=grid + cadence - args.first_step_s,  # every node completes a step then
        spread_s=0.0,
        window=args.window,
        channels=args.channels,
        seed=args.seed,
        gpus_per_node=args.gpus_per_node,
        cadence_s=cadence,
        pool=1 if summarising else 0,
        time_step_s=float(summary_scrapes) if summarising else 1.0,
        scrapes=summary_scrapes if summarising else 1,
    )
    if "a" in args.phases:
        outcomes.append((run_phase(probe, pipes, spec_a), float(args.nodes * args.gpus_per_node)))
    if "b" in args.phases:
        # New nodes a day on, their event times spread over the grid.
        spec_b = replace(
            spec_a,
            name="b-summaries" if summarising else "b",
            paced=False,
            first_time_s=grid + 86_400.0,
            spread_s=cadence,
            seed=args.seed + 1,
        )
        outcomes.append((run_phase(probe, pipes, spec_b), None))
    return outcomes


def report_in_process(
    args: argparse.Namespace,
    model_dir: Path,
    pool: list[list[bytes]],
    grid: int,
    cadence: float,
    summary_scrapes: int = 0,
) -> InProcess:
    """The same ingest without gRPC, printed (with summarised samples when `summary_scrapes`)."""
    step = float(summary_scrapes) if summary_scrapes > 1 else 1.0
    inproc = ingest_in_process(
        model_dir, pool, args.nodes, args.inproc, grid + 2 * 86_400.0, cadence, args.rows, step
    )
    what = f", each sample summarising {summary_scrapes} scrapes" if summary_scrapes > 1 else ""
    print(
        f"\nthe same ingest without gRPC{what}: {args.nodes:,} nodes' Push servicers driven round robin "
        f"from one thread, {inproc.seconds:.1f} s, scoring thread running"
    )
    print(
        f"  ingest without gRPC:              {inproc.gpu_samples / inproc.seconds:,.0f} GPU-samples/s "
        f"({inproc.node_samples / inproc.seconds:,.0f} node-samples/s)"
    )
    print(
        f"  service CPU per 1,000 GPU-samples: {inproc.cpu_s / max(inproc.gpu_samples, 1) * 1e6:.1f} ms "
        f"({inproc.cpu_s / inproc.seconds:.0%} of a core)"
    )
    if summary_scrapes > 1:
        print(
            f"  scrapes represented:              {inproc.gpu_samples / inproc.seconds * summary_scrapes:,.0f} "
            f"scrapes/s ({summary_scrapes} per GPU-sample)"
        )
    print(f"  sample-to-alert latency, exact:   {exact_quantiles(inproc.latency)}")
    return inproc


def report_summaries(
    scrapes: int,
    outcomes: list[tuple[PhaseOutcome, float | None]],
    inproc: list[InProcess],
) -> None:
    """Plain samples against summarised ones, phase by phase: GPU-samples/s, the scrapes they
    represent per second, and the ratios."""
    print(f"\nstep summaries of {scrapes} scrapes a sample against plain samples (summarised / plain):")
    plain = {o.spec.name: o.rate for o, _ in outcomes if o.spec.pool == 0}
    rows = [
        (f"phase {o.spec.name}", plain[o.spec.name.split("-")[0]], o.rate)
        for o, _ in outcomes
        if o.spec.pool == 1 and o.spec.name.split("-")[0] in plain
    ]
    if len(inproc) == 2:
        rates = [i.gpu_samples / i.seconds for i in inproc]
        rows.append(("without gRPC", rates[0], rates[1]))
    for label, base, rate in rows:
        print(
            f"  {label}: GPU-samples/s {rate:,.0f} / {base:,.0f} = {rate / base:.2f}; "
            f"scrapes represented/s {rate * scrapes:,.0f} / {base:,.0f} = {rate * scrapes / base:.1f}"
        )


def report_ceiling(model: FaultModel, rows: np.ndarray, batch: int) -> float:
    """LightGBM's own speed on a batch of real feature rows, head by head; returns model.risk's rate."""
    x = np.resize(rows, (batch, rows.shape[1])).astype(rows.dtype)
    risk_rate = rows_per_second(model.risk, x, 7)
    heads_rate = rows_per_second(all_heads(model), x, 5)
    print(
        f"\nLightGBM ceiling: a batch of {batch:,} real feature rows (from {len(rows):,} captured from the "
        f"services' scoring), {model.booster.num_trees()} trees, services stopped, median of rounds"
    )
    print(f"  model.risk batch prediction:      {risk_rate:,.0f} rows/s")
    within_rate = rows_per_second(model.risk_within, x, 5)
    mode_rate = rows_per_second(model.mode_probabilities, x, 5)
    risk, within = model.risk(x), model.risk_within(x)
    ttf_rate = rows_per_second(lambda _: median_ttf_s(risk, within, model.horizon_s), x, 5)
    print(
        f"  model.risk_within (time heads):   {within_rate:,.0f} rows/s "
        f"({model.ttf_booster.num_trees() if model.ttf_booster else 0} trees, with the risk again)"
    )
    print(
        f"  model.mode_probabilities:         {mode_rate:,.0f} rows/s "
        f"({model.mode_booster.num_trees() if model.mode_booster else 0} trees)"
    )
    print(f"  median_ttf_s (a Python loop):     {ttf_rate:,.0f} rows/s")
    print(f"  all of score_pending's heads:     {heads_rate:,.0f} rows/s")
    return risk_rate


def report_ratios(
    outcomes: list[tuple[PhaseOutcome, float | None]], risk_rate: float, cadence: float
) -> None:
    """The best plain phase's ingest against the raw predict rate."""
    best = max((o for o in outcomes if o[0].spec.pool == 0), key=lambda o: o[0].rate)[0]
    ratio = best.rate / risk_rate
    print(
        f"  ingest / raw predict:             {best.rate:,.0f} / {risk_rate:,.0f} = {ratio:.3f} "
        f"(phase {best.spec.name}; GPU-samples/s over rows/s)"
    )
    print(
        f"  scored rows / raw predict:        {best.rate / cadence:,.0f} / {risk_rate:,.0f} = "
        f"{best.rate / cadence / risk_rate:.5f} (one row per GPU per {cadence:g} s grid step)"
    )


def report_targets(outcomes: list[tuple[PhaseOutcome, float | None]]) -> None:
    """Whether the sustained rate and the paced phase's p99 latency meet the targets."""
    print("\ntargets (plain samples):")
    outcomes = [(o, offered) for o, offered in outcomes if o.spec.pool == 0]
    top = max(o.rate for o, _ in outcomes)
    print(
        f"  sustained >= {TARGET_RATE:,.0f} GPU-samples/s: {'met' if top >= TARGET_RATE else 'NOT met'} "
        f"({top:,.0f})"
    )
    paced = [o for o, offered in outcomes if offered is not None]
    if paced and paced[0].latency:
        p99 = float(np.quantile(np.asarray(paced[0].latency), 0.99))
        verdict = "met" if p99 <= TARGET_P99_S else "NOT met"
        print(
            f"  p99 sample-to-alert <= {TARGET_P99_S * 1e3:.0f} ms at the offered load: {verdict} "
            f"({p99 * 1e3:.1f} ms)"
        )


def main(argv: list[str] | None = None) -> int:
    p, args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR)

    model_dir = args.model or ensure_model(DEFAULT_MODEL)
    cores = os.cpu_count() or 1
    t = time.perf_counter()
    pools = [make_pool(args.pool_nodes, args.pool_steps, args.gpus_per_node, args.seed)]
    if args.summary_scrapes > 1:
        pools.append(
            make_pool(args.pool_nodes, args.pool_steps, args.gpus_per_node, args.seed, args.summary_scrapes)
        )
    pool = pools[0]
    pool_s = time.perf_counter() - t

    with tempfile.TemporaryDirectory() as state:
        service = Service.open(
            model_dir, Path(state), ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0))
        )
        model = service.model
        cadence = model.feature_config.cadence_s
        if args.gpus_per_node > model.feature_config.gpus_per_node:
            p.error(f"the model serves {model.feature_config.gpus_per_node} GPUs per node")
        probe = Probe(service, args.rows)
        port = service.start("127.0.0.1:0", max_threads=args.rpc_workers or 64)
        print_setup(args, model_dir, model, port, pools, pool_s)
        pipes, procs = start_generators(args, f"127.0.0.1:{port}", pools)
        grid = DEFAULT_START_UNIX_S // int(cadence) * int(cadence)
        try:
            outcomes = run_phases(args, probe, pipes, grid, cadence)
            if len(pools) > 1:
                outcomes += run_phases(args, probe, pipes, grid, cadence, args.summary_scrapes)
        finally:
            stop_generators(pipes, procs)
            service.stop()

    for outcome, offered in outcomes:
        report_phase(outcome, offered, cores)

    captured = list(probe.rows)
    inprocs: list[InProcess] = []
    if args.inproc > 0:
        inprocs.append(report_in_process(args, model_dir, pool, grid, cadence))
        if len(pools) > 1:
            inprocs.append(report_in_process(args, model_dir, pools[1], grid, cadence, args.summary_scrapes))
        captured += [r for i in inprocs for r in i.rows]
    if len(pools) > 1:
        report_summaries(args.summary_scrapes, outcomes, inprocs)
    rows = np.concatenate(captured) if captured else np.zeros((0, len(model.feature_names)))
    if not len(rows):
        print("\nno grid step was scored: no feature rows for the ceiling (run longer)")
        return 1
    risk_rate = report_ceiling(model, rows, args.rows)
    if not outcomes:
        return 0
    report_ratios(outcomes, risk_rate, cadence)
    report_targets(outcomes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
