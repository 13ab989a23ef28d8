"""The two alert tiers: a threshold file's protect tier opens alerts below the move threshold that
buy protection only (SNAPSHOT_ONLY, however near the failure looks), an alert rises to MOVE once a
score reaches the move threshold and never falls back, and the tiers show in the alert, its model
info and the metrics."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from faultcast.goodput.replay import model_digest
from faultcast.model.artifact import FaultModel, ModelError, load
from faultcast.model.threshold_file import ThresholdFileError, write
from faultcast.service.alert_book import AlertBook
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.scoring import ScoredStep
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb


@pytest.fixture(scope="module")
def model(service_model: Path) -> FaultModel:
    return load(service_model)


def _step(model: FaultModel, step: int, risk: float, ttf_s: float = 300.0) -> ScoredStep:
    """Node n1, GPU 2 at `risk` (the others far below any threshold), its failure `ttf_s` away."""
    g = model.feature_config.gpus_per_node
    risks = np.full(g, 1e-6)
    risks[2] = risk
    return ScoredStep(
        "n1",
        step,
        step * 60.0,
        0.0,
        np.ones(g, dtype=bool),
        np.zeros((g, len(model.feature_names))),
        tuple(f"n1-GPU-{i}" for i in range(g)),
        risks,
        ["hbm_wear"] * g,
        np.full(g, ttf_s),
    )


def _by_tier(metrics: ServiceMetrics) -> dict[str, float | None]:
    return {
        tier: metrics.registry.get_sample_value("faultcast_alerts_by_tier", {"tier": tier})
        for tier in ("protect", "move")
    }


def test_a_protect_tier_alert_buys_protection_only_then_rises_to_move_and_never_falls(
    model: FaultModel, tmp_path: Path
) -> None:
    protect = model.threshold / 4
    tiered = dataclasses.replace(model, protect_threshold=protect)
    metrics = ServiceMetrics()
    book = AlertBook(tiered, StateStore.in_dir(tmp_path), metrics)
    weak = (protect + model.threshold) / 2  # above the protect tier, under the move tier
    strong = model.threshold + (1 - model.threshold) / 4
    events = [e for t in range(3) for e in book.observe([_step(tiered, 100 + t, weak)])]
    # The failure looks 5 minutes away, which at the move tier means migrate: a weak warning does not.
    assert [(e.kind, e.gpu, e.tier, e.action) for e in events] == [
        (apb.EVENT_KIND_OPENED, 2, apb.ALERT_TIER_PROTECT, apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY)
    ]
    opened = events[0]
    assert opened.model.protect_threshold == protect
    assert opened.model.threshold == model.threshold
    assert opened.model.hold_threshold == pytest.approx(model.policy.hold(protect))
    assert metrics.registry.get_sample_value("faultcast_alert_protect_threshold") == protect
    assert _by_tier(metrics) == {"protect": 1.0, "move": 0.0}

    (rise,) = book.observe([_step(tiered, 103, strong)])
    assert (rise.kind, rise.opened_id, rise.tier, rise.action) == (
        apb.EVENT_KIND_UPDATED,
        opened.id,
        apb.ALERT_TIER_MOVE,
        apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE,
    )
    assert _by_tier(metrics) == {"protect": 0.0, "move": 1.0}

    # Back under the move threshold (and nearer): any update keeps MOVE and the drain it asked for.
    later = book.observe([_step(tiered, 104, weak, ttf_s=30.0)])
    assert all((e.tier, e.action) == (rise.tier, rise.action) for e in later)
    cleared = []
    for t in range(tiered.policy.clear_steps):
        cleared += book.observe([_step(tiered, 105 + t, 1e-6)])
    assert [(e.kind, e.tier) for e in cleared] == [(apb.EVENT_KIND_CLEARED, apb.ALERT_TIER_MOVE)]
    assert _by_tier(metrics) == {"protect": 0.0, "move": 0.0}


def test_a_protect_tier_alert_holds_at_the_protect_tiers_hold_level(
    model: FaultModel, tmp_path: Path
) -> None:
    protect = model.threshold / 4
    tiered = dataclasses.replace(model, protect_threshold=protect)
    book = AlertBook(tiered, StateStore.in_dir(tmp_path), ServiceMetrics())
    weak = (protect + model.threshold) / 2
    holding = (tiered.policy.hold(protect) + protect) / 2  # under the protect threshold, above its hold
    events = [e for t in range(2) for e in book.observe([_step(tiered, 10 + t, weak)])]
    for t in range(2 * tiered.policy.clear_steps):
        events += book.observe([_step(tiered, 12 + t, holding)])
    assert [e.kind for e in events] == [apb.EVENT_KIND_OPENED]
    assert len(book.active()) == 1


def test_without_a_protect_tier_every_alert_opens_at_move(model: FaultModel, tmp_path: Path) -> None:
    metrics = ServiceMetrics()
    book = AlertBook(model, StateStore.in_dir(tmp_path), metrics)
    strong = model.threshold + (1 - model.threshold) / 4
    events = [e for t in range(2) for e in book.observe([_step(model, 10 + t, strong)])]
    assert [(e.kind, e.tier) for e in events] == [(apb.EVENT_KIND_OPENED, apb.ALERT_TIER_MOVE)]
    assert events[0].model.protect_threshold == 0.0
    assert metrics.registry.get_sample_value("faultcast_alert_protect_threshold") == 0.0
    # Under the threshold nothing opens, however near the failure looks.
    quiet = AlertBook(model, StateStore.in_dir(tmp_path / "quiet"), ServiceMetrics())
    assert [e for t in range(4) for e in quiet.observe([_step(model, 10 + t, model.threshold / 2)])] == []


def test_a_threshold_file_carries_the_protect_tier_and_refuses_one_not_below_the_threshold(
    service_model: Path, tmp_path: Path
) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(service_model, model_dir)
    digest = model_digest(load(model_dir))
    write(model_dir, 0.4, digest, {"why": "test"}, protect_threshold=0.1)
    served = load(model_dir)
    assert (served.threshold, served.protect_threshold, served.open_threshold) == (0.4, 0.1, 0.1)
    with pytest.raises(ThresholdFileError, match=r"below the threshold 0\.4"):
        write(model_dir, 0.4, digest, {}, protect_threshold=0.4)
    (model_dir / "threshold.json").write_text(
        f'{{"threshold": 0.4, "protect_threshold": 0.5, "model_sha256": "{digest}"}}'
    )
    with pytest.raises(ModelError, match=r"protect_threshold: must be below the threshold 0\.4"):
        load(model_dir)
    (model_dir / "threshold.json").write_text(
        f'{{"threshold": 0.4, "protect_threshold": "low", "model_sha256": "{digest}"}}'
    )
    with pytest.raises(ModelError, match="protect_threshold"):
        load(model_dir)
