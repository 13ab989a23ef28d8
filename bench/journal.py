"""What restart-exact scoring costs: the sample journal on the ingest path, a node's saved state, and
the replay at start.

    .venv/bin/python bench/journal.py --model DIR [--nodes 100 --samples 60 --rounds 5]

Ingest: the service's own telemetry servicer (validation, the scorer, the journal) driven from one
thread, as bench/service.py's in-process phase does, over `--nodes` twin nodes sending one sample a
step (what `faultcast collect` ships by default) for `--samples` steps each; the same samples with
the journal's write skipped, and with neither the journal nor the periodic saves (a save every
10^9 steps), in alternating rounds, so every side sees the same machine. Reported: microseconds per
node sample each way, and the ratios. Saved states: the bytes and milliseconds of
saving every node at the end. Replay: a second service on the same state directory, with them (the
usual case after a stop: nothing to replay) and with them dropped (every sample the journal still
holds is replayed: the worst case of a start): samples replayed per second.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from faultcast import wire
from faultcast.demo.feed import twin_snapshots
from faultcast.model.artifact import load
from faultcast.readings import NodeSnapshot
from faultcast.service.config import ServiceConfig
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.service.state.sample_journal import SampleJournal
from faultcast.service.state.store import StateStore
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.v1 import telemetry_pb2 as tpb

CONFIG = ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0))


def _samples(nodes: int, steps: int) -> list[tpb.PushRequest]:
    """Every node's samples, interleaved step by step, as PushRequests (the wire's work included)."""
    fleet = FleetConfig(nodes=8, days=1.0, seed=5, acceleration=1.0)
    pool = [list(twin_snapshots(TwinSource(fleet, n), f"pool-{n}", steps)) for n in range(8)]
    out = []
    for step in range(steps):
        for node in range(nodes):
            snapshot: NodeSnapshot = replace(pool[node % 8][step], node=f"node-{node:05d}", sequence=step + 1)
            out.append(tpb.PushRequest(sample=wire.to_proto(snapshot)))
    return out


def _service(model: Path, state: Path, config: ServiceConfig = CONFIG) -> Service:
    return Service(load(model), StateStore.in_dir(state), config, model_dir=model)


def _ingest(service: Service, requests: list[tpb.PushRequest]) -> float:
    """Seconds to take every sample (and score every step completed), one thread."""
    started = time.perf_counter()
    for request in requests:
        node = request.sample.node
        service.telemetry.take((node, 1), request)
        if request.sample.sequence % 10 == 0:
            service.score_now()
    service.score_now()
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--samples", type=int, default=60, help="samples per node (one a step)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds with and without the journal")
    args = p.parse_args()
    requests = _samples(args.nodes, args.samples)
    n = len(requests)
    sides = ("journal and saves", "saves only", "neither")
    timings: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for side in sides if round_ % 2 == 0 else sides[::-1]:
                config = CONFIG if side != "neither" else replace(CONFIG, checkpoint_steps=10**9)
                service = _service(args.model, Path(scratch) / f"{side}-{round_}".replace(" ", "-"), config)
                if side != "journal and saves":
                    service.journal.append = lambda snapshot: 1  # type: ignore[method-assign]
                timings[side].append(_ingest(service, requests))
                service.store.close()
        for side, seconds in timings.items():
            per = [s / n * 1e6 for s in seconds]
            print(
                f"ingest, {side:17s}: {statistics.median(per):7.1f} us per node sample "
                f"(median of {args.rounds}; {min(per):.1f}-{max(per):.1f}), {n} samples of {args.nodes} nodes"
            )
        base = statistics.median(timings["neither"])
        for side in sides[:2]:
            print(f"ratio {side} / neither: {statistics.median(timings[side]) / base:.3f}")

        state = Path(scratch) / "replay"
        service = _service(args.model, state)
        _ingest(service, requests)
        journal_bytes = sum(f.stat().st_size for f in (state / "journal").iterdir())
        kept = sum(1 for _ in SampleJournal(state / "journal").entries())
        started = time.perf_counter()
        with service._scoring:
            service._save_states(service.scorer.nodes())
        save_s = time.perf_counter() - started
        saved = service.store.scoring.load()
        blob = statistics.median(len(s.state) for s in saved)
        print(
            f"journal: {journal_bytes / kept:.0f} bytes per node sample ({kept} of {n} still held: the "
            f"segments every saved state covers are gone); saved states: {len(saved)} nodes in "
            f"{save_s * 1e3:.0f} ms ({save_s / len(saved) * 1e3:.2f} ms and {blob / 1024:.0f} KiB a node)"
        )
        service.store.close()
        for label, keep_states in (
            ("every node saved at the end", True),
            ("the saved states dropped", False),
        ):
            if not keep_states:
                store = StateStore.in_dir(state)
                store.scoring.clear()
                store.close()
            again = _service(args.model, state)
            started = time.perf_counter()
            replayed = again.recover()
            took = time.perf_counter() - started
            again.store.close()
            rate = f"{replayed / took:,.0f} samples/s" if replayed else "nothing to replay"
            print(f"start with {label}: {took:.2f} s, {replayed} journalled samples replayed ({rate})")
            assert SampleJournal(state / "journal").segments()  # the journal was there to replay


if __name__ == "__main__":
    main()
