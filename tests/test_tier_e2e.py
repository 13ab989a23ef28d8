"""The protect tier end to end: a real service serving a threshold file with a protect tier, fed the
twin's HBM precursor over gRPC, opens a PROTECT alert before the move threshold is reached; a real
2-rank torchrun job (CPU, gloo) whose guard hears it replicates its state to its buddy at every
agreement while the warning lasts (and a job on other nodes does not); fed on, the alert rises to
MOVE and asks for the move."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faultcast.goodput.replay import model_digest
from faultcast.model.artifact import load
from faultcast.model.threshold_file import write
from faultcast.service.config import ServiceConfig
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.testing.twin_feed import LAST, QUIET, Feed
from faultcast.v1 import alerts_pb2 as apb

JOB = Path(__file__).parent / "fixtures" / "replica_job.py"
WAIT_S = 240.0


@pytest.fixture
def service(service_model: Path, tmp_path: Path) -> Iterator[tuple[Service, str]]:
    """The service with a protect tier at a third of the move threshold (threshold.json)."""
    model_dir = tmp_path / "model"
    shutil.copytree(service_model, model_dir)
    trained = load(model_dir)
    write(model_dir, trained.threshold, model_digest(trained), {"test": "tiers"}, trained.threshold / 3)
    running = Service.open(
        model_dir,
        tmp_path / "state",
        ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0), grace_s=3600.0),
    )
    port = running.start("127.0.0.1:0")
    yield running, f"127.0.0.1:{port}"
    running.stop(0)


def _job(tmp_path: Path, name: str, target: str, prefix: str) -> list[dict[str, Any]]:
    """The replica job on nodes <prefix>0 and <prefix>1: replicas every 1,000 steps (never, in its 12),
    an agreement every 2 steps, and a warning's replica at each agreement (no minute to wait)."""
    out = tmp_path / name
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(JOB),
        "--out", str(out), "--root", str(tmp_path / f"{name}-memory"), "--steps", "12", "--every", "1000",
        "--protection", str(tmp_path / f"{name}-snapshots"), "--target", target, "--node-prefix", prefix,
        "--agree-every", "2", "--protect-replica-s", "0",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]


def _by_tier(service: Service, tier: str) -> float | None:
    return service.metrics.registry.get_sample_value("faultcast_alerts_by_tier", {"tier": tier})


def test_a_weak_warning_buys_replicas_while_it_lasts_and_a_strong_one_moves_the_job(
    service: tuple[Service, str], tmp_path: Path
) -> None:
    running, target = service
    feed = Feed(running, target, "w0")
    feed.until(QUIET)
    assert running.book.active() == []
    (opened,) = feed.until_alert(bool)
    move = running.model.threshold
    assert (opened.kind, opened.tier, opened.action) == (
        apb.EVENT_KIND_OPENED,
        apb.ALERT_TIER_PROTECT,
        apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY,
    )
    assert running.model.protect_threshold is not None
    assert running.model.protect_threshold <= opened.risk < move
    assert opened.model.protect_threshold == running.model.protect_threshold
    assert (_by_tier(running, "protect"), _by_tier(running, "move")) == (1.0, 0.0)

    warned = _job(tmp_path, "warned", target, "w")
    # Both ranks replicate at every agreement (steps 2 to 12), though replica_every is 1,000.
    assert [r["protect_replicas"] for r in warned] == [[2, 4, 6, 8, 10, 12]] * 2
    assert [r["made"] for r in warned] == [6, 6]
    calm = _job(tmp_path, "calm", target, "q")  # the same job on nodes with no alert
    assert [(r["protect_replicas"], r["made"]) for r in calm] == [([], 0), ([], 0)]

    events = feed.until_alert(lambda active: any(a.tier == apb.ALERT_TIER_MOVE for a in active))
    rise = next(e for e in events if e.tier == apb.ALERT_TIER_MOVE)
    assert (rise.kind, rise.opened_id) == (apb.EVENT_KIND_UPDATED, opened.id)
    assert rise.risk >= move
    assert (_by_tier(running, "protect"), _by_tier(running, "move")) == (0.0, 1.0)
    # The move tier's own policy decides the action from here (migrate once the failure looks near).
    feed.until(LAST)
    (latest,) = running.book.active()
    assert (latest.tier, latest.action) == (apb.ALERT_TIER_MOVE, apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE)
