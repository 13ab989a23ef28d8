"""The in-world ceiling: what is learnable on an evaluated world when the world is known.

A reference model is trained with the same recipe on other fleets of the evaluated data's world (its
parameters, other seeds). Scored on the same evaluated part of the data, its recall is the ceiling the
cross-world model is judged against: the model's recall as a share of it. Two reference rows are
measured: at its own trained threshold, and at the threshold with no more false alarms than the model
on the same period (model/evaluation/matching.py's rule; the share reads that one: the same false-alarm budget).

A reference trained on finite data is itself short of what is learnable: the ceiling is a lower bound,
and the report records how much data it had.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from faultcast.model.artifact import FaultModel
from faultcast.model.evaluation.evaluate import MODE_FLOOR, Evaluation, Scored, score_period
from faultcast.model.evaluation.intervals import (
    HIGH,
    LOW,
    RESAMPLES,
    SEED,
    NodeTallies,
    resample_weights,
    weighted_figures,
)
from faultcast.model.evaluation.matching import Candidate, Setting, matched_threshold, pick
from faultcast.model.evaluation.outcomes import ModeTally, PredictionPeriods, ScoredPeriod
from faultcast.model.evaluation.rows import (
    Measured,
    Row,
    false_alarm_figures,
    intervals,
    measure,
    pooled,
    pooled_modes,
)
from faultcast.model.evaluation.worlds import training_world_ids, world_of
from faultcast.model.features.offline import Dataset, FailureLog
from faultcast.model.manifest import TrainingData
from faultcast.modes import NODE_LEVEL_MODES

RECALL = "recall_5min_predictable"
USED = "matched"  # the row share_of_ceiling reads: the reference at the model's false alarms
OWN = "own_threshold"  # the reference at its own trained threshold
DEFINITION = (
    "an in-world reference (the same recipe trained on other fleets of the evaluated world) scored on the "
    "same evaluated part; 'matched' sets its threshold where it raises no more false alarms than the model "
    "on this period (the most not above the model's, its own threshold among the candidates); "
    "share_of_ceiling is the model's recall over the matched reference's, per mode over all failures of "
    "the mode; the reference trained on finite data, so the ceiling is a lower bound of what is learnable"
)


class CeilingError(ValueError):
    """A reference that cannot serve as the ceiling of the data (another world, or the data itself)."""


@dataclass(frozen=True)
class ReferenceCheck:
    """What the reference's card says of its training, once it passed the checks."""

    world_ids: tuple[str, ...]
    fleets_unchecked: tuple[str, ...]  # training data whose manifest could not be read (seed unknown)


def _fleet(manifest: Mapping[str, Any]) -> tuple[object, str | None]:
    """(fleet seed, world id): two runs of one generator with both equal are the same fleet."""
    world = world_of(manifest)
    return manifest.get("seed"), world.id if world is not None else None


def _training_fleets(training: TrainingData) -> tuple[set[Path], set[tuple[object, str | None]], list[str]]:
    """The training data's paths (resolved), its fleets (seed, world id) and the paths whose manifest
    could not be read. A multi-world card keeps paths, not seeds: their manifests are read from disk."""
    manifest = training.manifest
    listed = manifest.get("datasets")
    paths = [training.path, *(listed if isinstance(listed, list) else [])]
    validation = manifest.get("validation")
    if isinstance(validation, str):
        paths.append(validation)
    resolved = {Path(str(p)).resolve() for p in paths}
    if manifest.get("kind") != "worlds":
        return resolved, {_fleet(manifest)}, []
    fleets, unread = set(), []
    for path in sorted(resolved):
        try:
            fleets.add(_fleet(json.loads((path / "manifest.json").read_text())))
        except (OSError, ValueError):
            unread.append(str(path))
    return resolved, fleets, unread


def check_not_trained_on(dataset: Dataset, training: TrainingData, reference: Path) -> list[str]:
    """CeilingError when the reference trained on `dataset` itself (its path, or a fleet of the same
    seed and world); returns the training paths it could not check by seed."""
    paths, fleets, unread = _training_fleets(training)
    if dataset.path.resolve() in paths:
        raise CeilingError(
            f"the reference {reference} trained on {dataset.path} itself: a ceiling is judged "
            "on a fleet its reference never saw"
        )
    seed, world = _fleet(dataset.manifest)
    if seed is not None and world is not None and (seed, world) in fleets:
        raise CeilingError(
            f"the reference {reference} trained on a fleet of seed {seed} in world {world}, the fleet of "
            f"{dataset.path}: a ceiling is judged on a fleet its reference never saw"
        )
    return unread


def check_reference(
    dataset: Dataset, training: TrainingData | None, reference: Path, false_alarm_data: Sequence[Dataset] = ()
) -> ReferenceCheck:
    """The reference must have trained on the world of `dataset` (its id among the card's training
    worlds) and not on `dataset` itself, nor on the false-alarm data of its world that will measure its
    false alarms; CeilingError saying why otherwise."""
    if training is None:
        raise CeilingError(
            f"the reference {reference} does not record its training data: its world is unknown"
        )
    evaluated = world_of(dataset.manifest)
    if evaluated is None or evaluated.id is None:
        raise CeilingError(
            f"{dataset.path} names no world (its manifest has no world id): an in-world reference cannot be "
            "checked against it"
        )
    ids = training_world_ids(training.manifest)
    if evaluated.id not in ids:
        trained = ", ".join(ids) or "no named world"
        raise CeilingError(
            f"the reference {reference} trained on {trained}, not on world {evaluated.id} of {dataset.path}: "
            "the ceiling is the same recipe trained on the evaluated world"
        )
    unread = check_not_trained_on(dataset, training, reference)
    for other in false_alarm_data:
        world = world_of(other.manifest)
        if world is not None and world.id in ids:
            check_not_trained_on(other, training, reference)
    return ReferenceCheck(ids, tuple(unread))


def _row_json(row: Row, measured: Measured, resamples: int, seed: int) -> dict[str, Any]:
    return {
        "label": row.label,
        "threshold": row.setting.threshold,
        **row.about,
        **measured.metrics,
        **intervals(measured.tallies, resamples, seed),
    }


def _share(model: float, ceiling: float) -> float | None:
    """model / ceiling; None where the ceiling is 0 or either is unknown."""
    if not (math.isfinite(model) and math.isfinite(ceiling)) or ceiling <= 0:
        return None
    return model / ceiling


def _share_interval(
    model: NodeTallies, ceiling: NodeTallies, resamples: int, seed: int
) -> list[float] | None:
    """The share's percentile 95% interval, the two rows resampled together by node (the same nodes)."""
    if model.nodes == 0 or model.nodes != ceiling.nodes:
        return None
    weights = resample_weights(model.nodes, resamples, seed)
    ours, best = weighted_figures(model, weights)[RECALL], weighted_figures(ceiling, weights)[RECALL]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(best > 0, ours / np.where(best > 0, best, 1.0), np.nan)
    finite = ratio[np.isfinite(ratio)]
    if not finite.size:
        return None
    return [float(np.percentile(finite, LOW)), float(np.percentile(finite, HIGH))]


def by_mode(model: Mapping[str, ModeTally], ceiling: Mapping[str, ModeTally]) -> dict[str, Any]:
    """Per failure mode: its failures, those with a precursor, how many of those the model and the
    ceiling caught, both recalls of them and the share (the overall share's terms, mode by mode)."""
    out = {}
    for mode in sorted({*model, *ceiling}):
        ours, best = model.get(mode, ModeTally()), ceiling.get(mode, ModeTally())
        out[mode] = {
            "failures": max(ours.failures, best.failures),  # the same failures on both sides
            "predictable": None if ours.unknown else max(ours.predictable, best.predictable),
            "model_caught": ours.predictable_caught,
            "ceiling_caught": best.predictable_caught,
            "model_recall": ours.recall,
            "ceiling_recall": best.recall,
            "share_of_ceiling": _share(ours.recall, best.recall),
        }
    return out


def _summary(model: Measured, used: Measured, own: Measured, resamples: int, seed: int) -> dict[str, Any]:
    """share_of_ceiling and the per-mode rows of the model against the ceiling's row `used`."""
    modes = by_mode(model.by_mode, used.by_mode)
    return {
        "share_of_ceiling": {
            "row": USED,
            RECALL: _share(model.metrics[RECALL], used.metrics[RECALL]),
            "ci95": _share_interval(model.tallies, used.tallies, resamples, seed),
            OWN: _share(model.metrics[RECALL], own.metrics[RECALL]),
            "by_mode": {mode: m["share_of_ceiling"] for mode, m in modes.items()},
        },
        "by_mode": modes,
    }


@dataclass(frozen=True)
class Ceiling:
    """One dataset's ceiling block, and the measurements the pooled ceiling sums."""

    report: dict[str, Any]
    used: Measured  # the matched row
    own: Measured
    model: Measured  # the main model's row on the same period


def _rows(
    reference: FaultModel, period: ScoredPeriod, failures: FailureLog, target: int, periods: PredictionPeriods
) -> tuple[tuple[Row, Measured], tuple[Row, Measured]]:
    """The reference at its own threshold, and matched to `target` false alarms (with its own threshold
    among the candidates: where that raises exactly the model's, no grid point is needed)."""
    policy = reference.policy
    own = Row(
        OWN,
        "in-world ceiling, reference at its own threshold",
        Setting("model", reference.threshold, policy),
    )
    found = own.found(period)
    own_measured = measure(own, period, failures, periods, found)
    grid, _ = matched_threshold(
        period, failures, "model", target, policy, NODE_LEVEL_MODES, periods, floor=MODE_FLOOR
    )
    alone = Candidate(reference.threshold, found, int(own_measured.metrics["false_alarms"]))
    best, within = pick([grid, alone], target)
    rate = 1000.0 * target / max(period.gpu_days, 1e-9)
    matched = Row(
        USED,
        "in-world ceiling, matched to the model's false alarms",
        Setting("model", best.setting, policy),
        about={"matched_to_false_alarms_per_1000_gpu_days": rate, "within_target": within},
    )
    return (own, own_measured), (matched, measure(matched, period, failures, periods, best.found))


def _reference_json(reference: FaultModel, where: Path, check: ReferenceCheck) -> dict[str, Any]:
    card, training = reference.card, reference.card.training_data
    manifest = training.manifest if training is not None else {}
    listed = manifest.get("datasets")
    metrics = card.metrics
    return {
        "model": str(where),
        "training_worlds": list(check.world_ids),
        "only_the_evaluated_world": len(check.world_ids) == 1,
        "training_data": [str(p) for p in listed]
        if isinstance(listed, list)
        else [training.path if training else ""],
        "training_gpu_days": manifest.get("gpu_days"),
        "training_rows": metrics.training_rows if metrics is not None else None,
        "training_positives": metrics.training_positives if metrics is not None else None,
        "threshold": reference.threshold,
        "threshold_from_file": reference.threshold_choice is not None,
        "fleets_unchecked": list(check.fleets_unchecked),
    }


def score_like(
    scored: Scored, reference: FaultModel, done: Mapping[Path, ScoredPeriod] | None = None
) -> ScoredPeriod:
    """The reference's scores on exactly the part `scored` covers (its nodes and start), every input;
    from `done` (keyed by the data's resolved path) where it was scored already (model/evaluation/score_jobs.py)."""
    if done is not None and scored.dataset.path.resolve() in done:
        return done[scored.dataset.path.resolve()]
    return score_period(scored.dataset, reference, scored.period.nodes, scored.start_s, scored.dataset.end_s)


def _apart(
    data: Sequence[Scored],
    reference: FaultModel,
    where: Path,
    world_ids: Sequence[str],
    rows: Sequence[Row],
    periods: PredictionPeriods,
    resamples: int,
    seed: int,
    done: Mapping[Path, ScoredPeriod] | None = None,
) -> dict[str, Any] | None:
    """The reference's false alarms on the false-alarm data of its own world(s), at each row's setting."""
    mine, skipped = [], []
    for scored in data:
        world = world_of(scored.dataset.manifest)
        if world is None or world.id not in world_ids:
            skipped.append(str(scored.dataset.path))
            continue
        mine.append((scored.dataset, score_like(scored, reference, done)))
    if not mine:
        return None
    methods = {}
    for row in rows:
        parts = [measure(row, period, d.failures, periods).tallies for d, period in mine]
        methods[row.key] = {
            "label": row.label,
            **false_alarm_figures(NodeTallies.concat(parts), resamples, seed),
        }
    return {"data": [str(d.path) for d, _ in mine], "skipped_other_worlds": skipped, "methods": methods}


def measure_ceiling(
    scored: Scored,
    evaluation: Evaluation,
    reference: FaultModel,
    where: Path,
    periods: PredictionPeriods,
    false_alarm_data: Sequence[Scored] = (),
    resamples: int = RESAMPLES,
    seed: int = SEED,
    done: Mapping[Path, ScoredPeriod] | None = None,
) -> Ceiling:
    """The ceiling block of one evaluated dataset (`evaluation` is the model's on `scored`), the
    reference model loaded from `where`; CeilingError when it cannot serve (check_reference). `done`:
    the reference's scorings made beforehand, by the data's resolved path (the rest are made here)."""
    apart_data = [s.dataset for s in false_alarm_data]
    check = check_reference(scored.dataset, reference.card.training_data, where, apart_data)
    period, failures = score_like(scored, reference, done), scored.dataset.failures
    model = evaluation.rows["model"]
    target = int(model.metrics["false_alarms"])
    (own_row, own), (matched_row, used) = _rows(reference, period, failures, target, periods)
    apart = _apart(
        false_alarm_data,
        reference,
        where,
        check.world_ids,
        (own_row, matched_row),
        periods,
        resamples,
        seed,
        done,
    )
    used_json = _row_json(matched_row, used, resamples, seed)
    report = {
        "definition": DEFINITION,
        "reference": _reference_json(reference, where, check),
        RECALL: used.metrics[RECALL],
        "ci95": {RECALL: used_json["ci95"][RECALL]},
        "false_alarms_per_1000_gpu_days": used.metrics["false_alarms_per_1000_gpu_days"],
        "false_alarms_apart_per_1000_gpu_days": (
            apart["methods"][USED]["false_alarms_per_1000_gpu_days"] if apart is not None else None
        ),
        **_summary(model, used, own, resamples, seed),
        OWN: _row_json(own_row, own, resamples, seed),
        USED: used_json,
        "false_alarm_data": apart,
    }
    return Ceiling(report, used, own, model)


def _pool(parts: Sequence[Measured], resamples: int, seed: int) -> Measured:
    """Several datasets' measurements of a row as one: pooled figures, tallies side by side, modes summed."""
    tallies = NodeTallies.concat([p.tallies for p in parts])
    return Measured(pooled(parts, resamples, seed), tallies, pooled_modes(parts))


def pooled_ceiling(
    ceilings: Sequence[Ceiling],
    data: Sequence[str],
    every_dataset: bool,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict[str, Any]:
    """The ceiling over the datasets that have a reference (`data`, in their order) as one (each
    dataset's own match summed), the model pooled over the same datasets, and its share of the
    ceiling; `pooled_report`'s "ceiling". `every_dataset`: whether those are all the evaluated ones
    (else the pooled table's other rows cover more data than these)."""
    model = _pool([c.model for c in ceilings], resamples, seed)
    used = _pool([c.used for c in ceilings], resamples, seed)
    own = _pool([c.own for c in ceilings], resamples, seed)
    return {
        "definition": DEFINITION,
        "data": list(data),
        "every_dataset": every_dataset,
        "model": {"label": "model, over the datasets with a reference", **model.metrics},
        RECALL: used.metrics[RECALL],
        "ci95": {RECALL: used.metrics["ci95"][RECALL]},
        "false_alarms_per_1000_gpu_days": used.metrics["false_alarms_per_1000_gpu_days"],
        **_summary(model, used, own, resamples, seed),
        OWN: {"label": "in-world ceiling, reference at its own threshold", **own.metrics},
        USED: {
            "label": "in-world ceiling, matched to the model's false alarms (each dataset's own match)",
            **used.metrics,
        },
    }
