"""CPU per 8-GPU scrape of NvmlSource, less the cost of the NVML calls themselves.

    .venv/bin/python bench/collector.py [--scrapes N] [--rounds R] [--gpus G] [--links L]

NvmlSource reads a FakeNvml (8 H100-like GPUs, 18 NVLink links each). The same run replays,
in a tight loop, the exact fake calls one scrape makes (recorded through a wrapper), so the
difference is the collector's own Python overhead: planning, timing, error handling, decoding
and packing. The replay loop's own iteration is charged to "NVML calls", which flatters the
collector slightly; the conservative figure adds it back (a replay of no-op calls).
The source runs as shipped (each GPU on its own worker thread, every call under the per-call
timeout) and, for comparison, with timeout=None (every call on the calling thread, no hand-off).
CPU time is the whole process's (process_time), so the worker threads' share is counted.
Rounds are interleaved so that machine noise hits all measurements alike. Last, the thread
hand-off alone (no-op jobs through the source's worker lanes): once per GPU, as shipped, and
once per NVML call, the design it replaced on paper.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from faultcast.collector.lanes import Lane, stop_lanes
from faultcast.collector.nvml.source import NvmlSource
from faultcast.testing.fake_nvml import FakeNvml

TARGET_SECONDS = 2e-3

Call = tuple[Callable[..., Any], tuple[Any, ...]]


class Recorder:
    """Stands for a FakeNvml and notes every function call while `recording` is on."""

    def __init__(self, fake: FakeNvml) -> None:
        self._fake = fake
        self.recording = False
        self.calls: list[Call] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._fake, name)
        if not name.startswith("nvml") or not callable(value) or isinstance(value, type):
            return value  # constants, structures, error classes

        def record(*args: Any) -> Any:
            if self.recording:
                self.calls.append((value, args))
            return value(*args)

        return record


def record_one_scrape(gpus: int, links: int) -> tuple[FakeNvml, list[Call]]:
    fake = FakeNvml(gpus=gpus, nvlink_links=links)
    recorder = Recorder(fake)
    source = NvmlSource(recorder)
    recorder.recording = True
    source.read()
    recorder.recording = False
    # The recording source stays open so its event set stays valid for the replayed waits.
    return fake, recorder.calls


def replayer(calls: list[Call]) -> Callable[[], None]:
    error = pynvml.NVMLError

    def replay() -> None:
        for fn, args in calls:
            try:  # noqa: SIM105  (suppress() would add a context manager per call to the NVML side)
                fn(*args)
            except error:  # the event-set drain ends on NVML_ERROR_TIMEOUT, as in a scrape
                pass

    return replay


def cpu_seconds_per_run(fn: Callable[[], object], runs: int) -> float:
    start = time.process_time()  # every thread: the source's GPU workers do most of the work
    for _ in range(runs):
        fn()
    return (time.process_time() - start) / runs


def handoff_seconds(lanes: int, jobs_per_lane: int, runs: int) -> float:
    """CPU per scrape of handing no-op jobs to worker lanes and waiting for each: the threading alone."""
    pool = [Lane(f"bench{i}") for i in range(lanes)]

    def noop() -> None:
        return None

    def scrape() -> None:
        for _ in range(jobs_per_lane):
            for lane in pool:
                lane.submit(noop, 0.0, threaded=True)
            for lane in pool:
                lane.wait_idle(None)

    cpu_seconds_per_run(scrape, max(runs // 10, 1))  # warm-up: threads started
    seconds = cpu_seconds_per_run(scrape, runs)
    stop_lanes(pool)
    return seconds


@dataclass(frozen=True, slots=True)
class Figures:
    """Medians of the interleaved rounds, in CPU seconds per scrape (wall for `wall`)."""

    calls: int  # NVML calls per scrape
    read: float
    wall: float
    read_inline: float
    calls_only: float
    loop: float
    per_gpu_handoff: float
    per_call_handoff: float


def measure(scrapes: int, rounds: int, gpus: int, links: int) -> Figures:
    """Time the shipped source, the inline source, the replayed calls and the replay loop, interleaved."""
    fake, calls = record_one_scrape(gpus, links)
    source = NvmlSource(fake)
    inline = NvmlSource(fake, timeout=None)
    replay = replayer(calls)

    def noop(*args: Any) -> None:
        return None

    loop_only = replayer([(noop, call_args) for _, call_args in calls])

    warmup = max(scrapes // 10, 50)
    for fn in (source.read, inline.read, replay, loop_only):
        cpu_seconds_per_run(fn, warmup)

    read_s: list[float] = []
    inline_s: list[float] = []
    wall_s: list[float] = []
    replay_s: list[float] = []
    loop_s: list[float] = []
    for _ in range(rounds):
        started = time.perf_counter()
        read_s.append(cpu_seconds_per_run(source.read, scrapes))
        wall_s.append((time.perf_counter() - started) / scrapes)
        inline_s.append(cpu_seconds_per_run(inline.read, scrapes))
        replay_s.append(cpu_seconds_per_run(replay, scrapes))
        loop_s.append(cpu_seconds_per_run(loop_only, scrapes))
    source.close()
    inline.close()

    median = statistics.median
    return Figures(
        calls=len(calls),
        read=median(read_s),
        wall=median(wall_s),
        read_inline=median(inline_s),
        calls_only=median(replay_s),
        loop=median(loop_s),
        per_gpu_handoff=handoff_seconds(gpus + 1, 1, scrapes),  # + the event drain's lane
        per_call_handoff=handoff_seconds(1, len(calls), max(scrapes // 100, 5)),
    )


def report(f: Figures) -> bool:
    """Print the figures; whether the conservative overhead is within the target."""
    overhead = f.read - f.calls_only
    conservative = overhead + f.loop
    ms = 1e3
    print(f"NVML calls per scrape:                          {f.calls}")
    print(f"CPU per scrape, NvmlSource.read():              {f.read * ms:.3f} ms")
    print(f"wall time per scrape, NvmlSource.read():        {f.wall * ms:.3f} ms")
    print(f"CPU per scrape, read() with timeout=None:       {f.read_inline * ms:.3f} ms")
    print(f"CPU per scrape, the fake NVML calls replayed:   {f.calls_only * ms:.3f} ms")
    print(f"CPU per scrape, replay loop alone (no-op calls): {f.loop * ms:.3f} ms")
    print(f"collector overhead (read - replayed calls):     {overhead * ms:.3f} ms")
    print(f"collector overhead, conservative (+ loop):      {conservative * ms:.3f} ms")
    print(f"overhead per NVML call (conservative):          {conservative / f.calls * 1e6:.2f} us")
    print(f"of which the per-GPU worker hand-off:           {(f.read - f.read_inline) * ms:.3f} ms")
    print(f"hand-off alone, one per GPU lane (as shipped):  {f.per_gpu_handoff * ms:.3f} ms")
    print(f"hand-off alone, one per NVML call (not used):   {f.per_call_handoff * ms:.3f} ms")
    within = conservative < TARGET_SECONDS
    print(f"target < {TARGET_SECONDS * ms:.0f} ms of overhead per scrape: {'within' if within else 'OVER'}")
    return within


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scrapes", type=int, default=2000, help="scrapes per round (default 2000)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are reported")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--links", type=int, default=18, help="NVLink links per GPU (H100 SXM: 18)")
    args = p.parse_args(argv)
    figures = measure(args.scrapes, args.rounds, args.gpus, args.links)
    print(
        f"NvmlSource over FakeNvml: {args.gpus} GPUs x {args.links} NVLink links, "
        f"{args.scrapes} scrapes x {args.rounds} rounds, CPU time (process_time), medians"
    )
    return 0 if report(figures) else 1


if __name__ == "__main__":
    raise SystemExit(main())
