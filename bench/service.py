"""Prediction service: sustained ingest over gRPC Push streams, sample-to-score latency, and the
LightGBM ceiling, in one run.

    .venv/bin/python bench/service.py                  # 10,000 GPUs (1,250 nodes x 8), 90 s per phase
    .venv/bin/python bench/service.py --quick          # smoke run: 100 nodes, a few seconds per phase

The service (`faultcast.service.server.Service`, the model of `--model`, a temporary state folder,
`Limits(max_future_s=0, max_age_s=0)` because event time is synthetic) runs in this process on
127.0.0.1; the load generator runs in other processes (`--generators`, spawned), each an asyncio
gRPC client owning a share of the nodes, one Push stream per node as a collector has, spread over
a few HTTP/2 connections. The samples are real twin readings: a pool of `--pool-nodes` nodes x
`--pool-steps` 1 s steps is generated once and serialized; every simulated node replays one pool
node with its own name, event time and sequence (three protobuf field assignments per sample).

Phase a (paced): every node sends one sample per second, at its own sub-second phase, event time
advancing 1 s per sample: the fleet's offered load. Event time is aligned to the model's grid so
that every node completes a grid step in the same second, as NTP-synchronised collectors do.
Phase b (unpaced): every node sends as fast as the service acknowledges, with at most `--window`
samples unacknowledged per stream, event time advancing 1 s per sample: the maximum sustained rate.

Rates are counted by the service (`faultcast_ingest_gpu_samples_total`) over the phase less its
first `--warmup` seconds. Latency is the service's own `faultcast_scoring_latency_seconds` (arrival
of the sample completing a grid step -> its scores and alerts done): quantiles interpolated from
the histogram's buckets as Prometheus does, and exact ones from every observation (recorded by
wrapping the histogram's `observe` in this process). The generator times each sample's ack.
The ceiling is `model.risk` on a batch of real feature rows, captured from the service's scoring.
The machine's cores are shared by the service and the generator: both CPU times are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import grpc
import grpc.aio
import numpy as np
from prometheus_client.utils import floatToGoString

from faultcast import wire
from faultcast.model.artifact import FaultModel
from faultcast.service.feed import twin_snapshots
from faultcast.service.metrics import LATENCY_BUCKETS_S
from faultcast.service.scoring import ScoredStep
from faultcast.service.server import Service
from faultcast.service.validation import Limits
from faultcast.sim.config import DEFAULT_START_UNIX_S, FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.v1 import telemetry_pb2 as tpb

TARGET_RATE = 20_000.0  # GPU-samples per second, sustained
TARGET_P99_S = 0.100  # sample-to-alert latency
PUSH_METHOD = "/faultcast.v1.Telemetry/Push"
DEFAULT_MODEL = Path("out/bench-model")
DRAIN_S = 30.0  # how long a stream may take to ack its last samples after a phase


# -- the model and the sample pool -------------------------------------------------------------


def ensure_model(path: Path) -> Path:
    """The benchmark model: the service tests' recipe (32-node twin, 6 days, 80 trees), trained once
    into `path` (about 40 s here) and reused after."""
    if (path / "manifest.json").exists():
        return path
    from faultcast.model.dataset import open_dataset
    from faultcast.model.train import TrainConfig, train
    from faultcast.sim.writer import simulate

    print(f"training the benchmark model into {path} (once, about a minute)", flush=True)
    with tempfile.TemporaryDirectory() as data:
        simulate(FleetConfig(nodes=32, days=6.0, seed=5, acceleration=200.0), Path(data), [])
        path.mkdir(parents=True, exist_ok=True)
        train(open_dataset(Path(data)), path, TrainConfig(num_boost_round=80, negative_rate=0.05))
    return path


def make_pool(nodes: int, steps: int, gpus_per_node: int, seed: int) -> list[list[bytes]]:
    """Serialized NodeSample messages: `nodes` healthy twin nodes x `steps` readings 1 s apart."""
    config = FleetConfig(nodes=nodes, gpus_per_node=gpus_per_node, days=1.0, interval_s=1.0, seed=seed,
                         chunk_steps=steps, failures=False)  # fmt: skip
    pool = []
    for n in range(nodes):
        snapshots = twin_snapshots(TwinSource(config, n), config.node_name(n), steps)
        pool.append([wire.to_proto(s).SerializeToString() for s in snapshots])
    return pool


# -- the load generator (another process) ------------------------------------------------------


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    paced: bool
    duration_s: float
    warmup_s: float
    first_time_s: float  # event time of every node's first sample, before its sub-second phase
    window: int  # unacknowledged samples per stream (unpaced)
    channels: int  # HTTP/2 connections per generator process
    seed: int
    gpus_per_node: int


@dataclass
class GenResult:
    sent: int = 0
    acked: int = 0
    acked_in_window: int = 0
    rejected: int = 0
    unacked_at_end: int = 0
    stream_errors: int = 0
    first_error: str = ""
    connect_s: float = 0.0
    cpu_s: float = 0.0
    ack_latency_s: list[float] = field(default_factory=list)  # samples sent inside the window


def _generator_main(conn: Connection, target: str, pool: list[list[bytes]], nodes: list[int]) -> None:
    """A load generator process: runs phases on command, one asyncio loop each."""
    requests = [[tpb.PushRequest(sample=tpb.NodeSample.FromString(b)) for b in steps] for steps in pool]
    while True:
        message = conn.recv()
        if message is None:
            return
        spec: PhaseSpec = message
        cpu = time.process_time()
        result = asyncio.run(_phase(conn, target, requests, nodes, spec))
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
    calls = [
        ch.stream_stream(PUSH_METHOD, request_serializer=None, response_deserializer=tpb.PushAck.FromString)
        for ch in channels
    ]
    ready = asyncio.Event()
    timing: dict[str, float] = {}

    async def node(i: int, position: int) -> None:
        name = f"bench-{spec.name}-{i:05d}"
        phase = rng.random()  # the collector's scrape phase within the second
        samples = pool[i % len(pool)]
        call = calls[position % len(calls)]()
        sent_at: deque[float] = deque()
        window = asyncio.Semaphore(spec.window)

        async def acks() -> None:
            while True:
                ack = await call.read()
                if ack is grpc.aio.EOF:
                    return
                now = loop.time()
                sent = sent_at.popleft()
                result.acked += 1
                if timing["from"] <= sent < timing["to"]:
                    result.acked_in_window += 1
                    result.ack_latency_s.append(now - sent)
                result.rejected += len(ack.rejections)  # type: ignore[union-attr]
                window.release()

        try:
            await call.write(wire.hello(name, 1).SerializeToString())
            reader = asyncio.create_task(acks())
            await ready.wait()
            start, end = timing["start"], timing["end"]
            k = 0
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
                sample.time_unix_nano = round((spec.first_time_s + k + phase) * 1e9)
                data = request.SerializeToString()
                sent_at.append(loop.time())
                await call.write(data)
                result.sent += 1
                k += 1
            await call.done_writing()
            try:
                await asyncio.wait_for(reader, DRAIN_S)
            except TimeoutError:
                call.cancel()
                result.unacked_at_end += len(sent_at)
        except grpc.aio.AioRpcError as exc:
            result.stream_errors += 1
            result.first_error = result.first_error or f"{exc.code().name}: {exc.details()}"
            result.unacked_at_end += len(sent_at)

    connect = time.monotonic()
    tasks = [asyncio.create_task(node(i, p)) for p, i in enumerate(nodes)]
    await asyncio.sleep(0)  # every stream opened and its hello queued
    result.connect_s = time.monotonic() - connect
    conn.send("ready")
    start: float = await loop.run_in_executor(None, conn.recv)
    timing.update(start=start, end=start + spec.duration_s, to=start + spec.duration_s)
    timing["from"] = start + spec.warmup_s
    ready.set()
    await asyncio.gather(*tasks)
    for ch in channels:
        await ch.close()
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

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        v = self.service.metrics.registry.get_sample_value(name, labels or {})
        return 0.0 if v is None else v

    def buckets(self) -> list[float]:
        """Cumulative counts of the scoring-latency histogram, one per bound and +Inf."""
        name = "faultcast_scoring_latency_seconds_bucket"
        return [self.value(name, {"le": floatToGoString(b)}) for b in (*LATENCY_BUCKETS_S, float("inf"))]

    def rejects(self) -> float:
        total = 0.0
        for family in self.service.metrics.registry.collect():
            if family.name == "faultcast_ingest_rejects":
                total += sum(s.value for s in family.samples if s.name.endswith("_total"))
        return total


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
    return f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {max(values) * 1e3:.1f} ms (n={len(values):,})"


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
        now = (probe.value("faultcast_ingest_node_samples_total"), float(len(probe.latency)))
        if now == last:
            return
        last = now
        time.sleep(1.0)


def run_phase(probe: Probe, pipes: list[Connection], spec: PhaseSpec, node_count: int) -> PhaseOutcome:
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
            series.append((time.monotonic(), probe.value("faultcast_ingest_gpu_samples_total")))
            next_at += 10.0

    sampler = threading.Thread(target=sample_rate, daemon=True)
    time.sleep(max(0.0, window_from - time.monotonic()))
    at_from = {
        "gpu": probe.value("faultcast_ingest_gpu_samples_total"),
        "node": probe.value("faultcast_ingest_node_samples_total"),
        "rejects": probe.rejects(),
        "dup": probe.value("faultcast_ingest_duplicates_total"),
        "cpu": time.process_time(),
        "t": time.monotonic(),
    }
    buckets_from = probe.buckets()
    sampler.start()
    time.sleep(max(0.0, window_to - time.monotonic()))
    at_to = {
        "gpu": probe.value("faultcast_ingest_gpu_samples_total"),
        "node": probe.value("faultcast_ingest_node_samples_total"),
        "rejects": probe.rejects(),
        "dup": probe.value("faultcast_ingest_duplicates_total"),
        "cpu": time.process_time(),
        "t": time.monotonic(),
    }
    buckets_to = probe.buckets()
    stop.set()
    sampler.join()
    results: list[GenResult] = [pipe.recv() for pipe in pipes]
    _wait_quiet(probe)
    alerts = sum(
        s.value
        for family in probe.service.metrics.registry.collect()
        if family.name == "faultcast_alerts"
        for s in family.samples
        if s.name.endswith("_total")
    )
    latency = [v for t, v in probe.latency if window_from <= t <= window_to + DRAIN_S]
    rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(series, series[1:], strict=False)]
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
    """What the service's `score_pending` computes per batch: risk, risk within 5/15/30 min, mode."""

    def heads(x: np.ndarray) -> object:
        return model.risk(x), model.risk_within(x), model.mode_probabilities(x)

    return heads


# -- the report --------------------------------------------------------------------------------


def report_phase(out: PhaseOutcome, offered: float | None, cores: int) -> None:
    spec, gens = out.spec, out.generators
    gen_cpu = sum(g.cpu_s for g in gens)
    acked_window = sum(g.acked_in_window for g in gens)
    ack = [v for g in gens for v in g.ack_latency_s]
    title = "paced, 1 sample/s per node" if spec.paced else f"unpaced, window {spec.window} per stream"
    print(f"\nphase {spec.name} ({title}): {spec.duration_s:g} s, measured over the last {out.window_s:.1f} s")
    if offered is not None:
        print(f"  offered:                          {offered:,.0f} GPU-samples/s")
    print(f"  achieved ingest:                  {out.rate:,.0f} GPU-samples/s")
    print(f"  achieved ingest (node samples):   {out.node_samples / out.window_s:,.0f} node-samples/s")
    if out.rates_10s:
        rates = ", ".join(f"{r:,.0f}" for r in out.rates_10s)
        print(f"  ingest per 10 s window:           {rates} GPU-samples/s")
    print(f"  acked by the generator in window: {acked_window / out.window_s * spec.gpus_per_node:,.0f} GPU-samples/s")
    print(f"  scored rows (GPU grid steps):     {out.rate / 60:,.0f} rows/s at the model's 60 s cadence")
    print(f"  sample-to-alert latency, service histogram buckets: p50 {bucket_quantile(0.5, out.buckets)}, "
          f"p99 {bucket_quantile(0.99, out.buckets)} ({out.buckets[-1]:,.0f} grid steps)")  # fmt: skip
    print(f"  sample-to-alert latency, exact:   {exact_quantiles(out.latency)}")
    if ack:
        p50, p99 = np.quantile(np.asarray(ack), [0.5, 0.99])
        print(f"  ack round trip (generator):       p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms "
              f"(n={len(ack):,})")  # fmt: skip
    else:
        print("  ack round trip (generator):       n/a (no acks)")
    sent = sum(g.sent for g in gens)
    acked = sum(g.acked for g in gens)
    print(f"  samples sent / acked (whole phase): {sent:,} / {acked:,}; unacked at the end: "
          f"{sum(g.unacked_at_end for g in gens):,}; stream errors: {sum(g.stream_errors for g in gens)}"
          + (f" ({gens[0].first_error or next(g.first_error for g in gens if g.first_error)})"
             if any(g.first_error for g in gens) else ""))  # fmt: skip
    print(f"  rejects / duplicates in window:   {out.rejects:,.0f} / {out.duplicates:,.0f}; alerts raised so far: "
          f"{out.alerts:,.0f}")  # fmt: skip
    print(f"  CPU in window: service {out.service_cpu_s:.1f} s ({out.service_cpu_s / out.window_s:.0%} of a core), "
          f"load generator {gen_cpu:.1f} s over the whole phase ({gen_cpu / spec.duration_s:.0%} of a core); "
          f"{cores} cores in all")  # fmt: skip
    if out.gpu_samples:
        print(f"  service CPU per 1,000 GPU-samples: {out.service_cpu_s / out.gpu_samples * 1e6:.1f} ms")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help=f"model artifact (default: train one into {DEFAULT_MODEL})")
    p.add_argument("--nodes", type=int, default=1250)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--duration", type=float, default=90.0, help="seconds per phase (default 90)")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds of each phase not measured")
    p.add_argument("--first-step-s", type=float, default=20.0,
                   help="paced phase: seconds in until every node completes its first grid step")  # fmt: skip
    p.add_argument("--window", type=int, default=16, help="unpaced: unacknowledged samples per stream")
    p.add_argument("--generators", type=int, default=1, help="load generator processes")
    p.add_argument("--channels", type=int, default=16, help="HTTP/2 connections per generator")
    p.add_argument("--rpc-workers", type=int, default=0,
                   help="the service's gRPC worker threads (default: nodes + 32; Service.start's default "
                        "is 64, and every open Push stream holds one)")  # fmt: skip
    p.add_argument("--pool-nodes", type=int, default=8)
    p.add_argument("--pool-steps", type=int, default=600)
    p.add_argument("--rows", type=int, default=10_000, help="batch size for the LightGBM ceiling")
    p.add_argument("--phases", default="ab", help="which phases to run: a (paced), b (unpaced)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--quick", action="store_true", help="smoke run: 100 nodes, 8 s per phase")
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.duration, args.warmup, args.first_step_s = 100, 8.0, 2.0, 4.0
        args.pool_nodes, args.pool_steps, args.rows, args.channels = 2, 120, 2_000, 4
    logging.basicConfig(level=logging.ERROR)

    model_dir = args.model or ensure_model(DEFAULT_MODEL)
    cores = os.cpu_count() or 1
    t = time.perf_counter()
    pool = make_pool(args.pool_nodes, args.pool_steps, args.gpus_per_node, args.seed)
    pool_s = time.perf_counter() - t
    workers = args.rpc_workers or args.nodes + 32
    gpus = args.nodes * args.gpus_per_node

    with tempfile.TemporaryDirectory() as state:
        service = Service(model_dir, Path(state), limits=Limits(max_future_s=0, max_age_s=0))
        model = service.model
        config = model.feature_config
        if args.gpus_per_node > config.gpus_per_node:
            p.error(f"the model serves {config.gpus_per_node} GPUs per node")
        probe = Probe(service, args.rows)
        port = service.start("127.0.0.1:0", max_workers=workers)
        print(f"service bench: {gpus:,} GPUs ({args.nodes:,} nodes x {args.gpus_per_node}) pushing to "
              f"127.0.0.1:{port}; model {model_dir} ({model.booster.num_trees()} trees, "
              f"{len(model.feature_names)} features, cadence {config.cadence_s:g} s)")  # fmt: skip
        print(f"machine: {cores} CPU cores, shared by the service (this process, {workers} gRPC worker "
              f"threads) and {args.generators} load generator process(es) ({args.channels} connections "
              f"each, asyncio): the generator's CPU is taken from the service's")  # fmt: skip
        print(f"sample pool: {args.pool_nodes} twin nodes x {args.pool_steps} steps at 1 s, "
              f"{sum(len(b) for s in pool for b in s) / sum(len(s) for s in pool) / 1024:.1f} KiB per "
              f"node sample, generated in {pool_s:.1f} s")  # fmt: skip
        ctx = mp.get_context("spawn")
        pipes: list[Connection] = []
        procs = []
        target = f"127.0.0.1:{port}"
        for g in range(args.generators):
            mine, theirs = ctx.Pipe()
            share = list(range(g, args.nodes, args.generators))
            proc = ctx.Process(target=_generator_main, args=(theirs, target, pool, share), daemon=True)
            proc.start()
            pipes.append(mine)
            procs.append(proc)
        cadence = config.cadence_s
        grid = DEFAULT_START_UNIX_S // int(cadence) * int(cadence)
        outcomes: list[tuple[PhaseOutcome, float | None]] = []
        try:
            if "a" in args.phases:
                spec = PhaseSpec("a", True, args.duration, args.warmup, grid + cadence - args.first_step_s,
                                 args.window, args.channels, args.seed, args.gpus_per_node)  # fmt: skip
                outcomes.append((run_phase(probe, pipes, spec, args.nodes), float(gpus)))
            if "b" in args.phases:
                spec = PhaseSpec("b", False, args.duration, args.warmup, grid + 86_400.0, args.window,
                                 args.channels, args.seed + 1, args.gpus_per_node)  # fmt: skip
                outcomes.append((run_phase(probe, pipes, spec, args.nodes), None))
        finally:
            for pipe in pipes:
                with contextlib.suppress(OSError):
                    pipe.send(None)
            for proc in procs:
                proc.join(timeout=10)
            service.stop()

    for outcome, offered in outcomes:
        report_phase(outcome, offered, cores)

    rows = np.concatenate(probe.rows) if probe.rows else np.zeros((0, len(model.feature_names)))
    if not len(rows):
        print("\nno grid step was scored: no feature rows for the ceiling (run longer)")
        return 1
    x = np.resize(rows, (args.rows, rows.shape[1])).astype(rows.dtype)
    risk_rate = rows_per_second(model.risk, x, 7)
    heads_rate = rows_per_second(all_heads(model), x, 5)
    print(f"\nLightGBM ceiling: {args.rows:,} real feature rows ({len(rows):,} distinct, captured from the "
          f"service's scoring), {model.booster.num_trees()} trees, service stopped")  # fmt: skip
    print(f"  model.risk batch prediction:      {risk_rate:,.0f} rows/s")
    print(f"  every head the service computes:  {heads_rate:,.0f} rows/s (risk, risk_within, mode)")
    best = max(outcomes, key=lambda o: o[0].rate)[0]
    ratio = best.rate / risk_rate
    print(f"  ingest / raw predict:             {best.rate:,.0f} / {risk_rate:,.0f} = {ratio:.3f} "
          f"(phase {best.spec.name}; GPU-samples/s over rows/s)")  # fmt: skip
    print(f"  scored rows / raw predict:        {best.rate / 60:,.0f} / {risk_rate:,.0f} = "
          f"{best.rate / 60 / risk_rate:.5f} (one row per GPU per {cadence:g} s grid step)")  # fmt: skip

    print("\ntargets:")
    top = max(o.rate for o, _ in outcomes)
    print(f"  sustained >= {TARGET_RATE:,.0f} GPU-samples/s: {'met' if top >= TARGET_RATE else 'NOT met'} "
          f"({top:,.0f})")  # fmt: skip
    paced = [o for o, offered in outcomes if offered is not None]
    if paced and paced[0].latency:
        p99 = float(np.quantile(np.asarray(paced[0].latency), 0.99))
        verdict = "met" if p99 <= TARGET_P99_S else "NOT met"
        print(f"  p99 sample-to-alert <= {TARGET_P99_S * 1e3:.0f} ms at the offered load: {verdict} "
              f"({p99 * 1e3:.1f} ms)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
