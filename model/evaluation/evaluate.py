"""Scoring a period of data with the model and both baselines, and the held-out evaluation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from faultcast.model.artifact import FaultModel
from faultcast.model.evaluation.intervals import RESAMPLES, SEED, NodeTallies
from faultcast.model.evaluation.matching import (
    MARGIN,
    Setting,
    matched_scale,
    matched_threshold,
    rules_setting,
)
from faultcast.model.evaluation.outcomes import DEFAULT_PERIODS, PredictionPeriods, ScoredPeriod
from faultcast.model.evaluation.rows import Measured, Row, false_alarm_figures, intervals, measure, pooled
from faultcast.model.evaluation.rules import RulesBaseline
from faultcast.model.evaluation.worlds import check_world
from faultcast.model.features.offline import Dataset, Labels, Step, replay
from faultcast.model.incidents import Incident
from faultcast.modes import NODE_LEVEL_MODES

WARMUP_S = 6 * 3600.0  # history fed to the engine before a scored period starts (windows, baselines)
# Rows where some method's score reaches this get the model's likely mode (the tracker reads it where
# an alert opens, to tell node-level incidents from GPU ones); no threshold is chosen below it. Low:
# the model's risk is the probability at the real failure rate, a few in a million per GPU and
# half hour before any sign, so an alert's risk may well be under a percent.
MODE_FLOOR = 1e-4
# The logistic baseline's floor, in its own units: it is not calibrated to the real failure rate.
LOGISTIC_FLOOR = 0.01
_BATCH_STEPS = 64  # steps scored in one call of each head: LightGBM's cost per call is not per row

# Metrics that dcgm-exporter's default counter set does not export: ECC totals, retired pages and
# NVLink error counters are shipped commented out; throttle reasons, Xid counts by code, NVML
# health and network counters are not there at all. Only the last Xid (DCGM_FI_DEV_XID_ERRORS) is.
DCGM_DEFAULT_MISSING: tuple[str, ...] = (
    "ecc_sbe_volatile", "ecc_dbe_volatile", "nvlink_crc_flit_errors", "nvlink_crc_data_errors",
    "nvlink_replay_errors", "nvlink_recovery_errors", "throttle_hw_slowdown", "throttle_sw_thermal",
    "throttle_hw_thermal", "throttle_hw_power_brake", "throttle_sw_power_cap", "row_remap_pending",
    "nvml_call_seconds", "nvml_failed_calls", "nvml_unsupported_fields", "pcie_link_width", "pcie_link_gen",
    *(f"xid_{c}_events" for c in (13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120)),
    "ib_symbol_error", "ib_link_error_recovery", "ib_port_rcv_errors", "ib_local_ack_timeout_err",
    "ib_link_downed", "ib_port_xmit_discards", "tcp_retrans_segs", "peer_rtt_p99_seconds", "peer_loss_ratio",
    "ib_port_state",
)  # fmt: skip  # names packed, not one per line


@dataclass
class _Collector:
    """A sink that scores every present row of the period with every method."""

    model: FaultModel
    rules: RulesBaseline
    labels: Labels
    nodes: tuple[int, ...]
    gpus_per_node: int  # the data's
    start_s: float
    times: list[float]
    present: list[np.ndarray]
    scores: dict[str, list[np.ndarray]]
    label_rows: list[np.ndarray]
    modes: list[np.ndarray]

    pending: list[np.ndarray] = field(default_factory=list)  # present rows of steps not yet scored

    def __call__(self, step: Step) -> None:
        if step.time_s < self.start_s:
            return
        rows = step.present
        for method in self.scores:
            self.scores[method].append(np.full(len(rows), np.nan))
        self.modes.append(np.full(len(rows), "", dtype=object))
        self.pending.append(step.features[rows])
        positive, _, _ = self.labels.at(step.time_s, self.nodes, self.gpus_per_node)
        self.times.append(step.time_s)
        self.present.append(rows.copy())
        self.label_rows.append(positive & rows)
        if len(self.pending) >= _BATCH_STEPS:
            self.flush()

    def flush(self) -> None:
        """Score the pending steps in one call per head and fill in their rows."""
        if not self.pending:
            return
        count, first = len(self.pending), len(self.times) - len(self.pending)
        sizes = [len(x) for x in self.pending]
        x = np.concatenate(self.pending)
        self.pending = []
        if len(x) == 0:
            return
        risk, logistic, rules = self.model.risk(x), self.model.logistic.predict(x), self.rules.score(x)
        margin = self.rules.margin(x)  # the rules at every scale (matching)
        modes = np.full(len(x), "", dtype=object)
        near = (risk >= MODE_FLOOR) | (logistic >= LOGISTIC_FLOOR) | (rules >= 0.5)
        if near.any() and self.model.modes:
            likely = np.argmax(self.model.mode_probabilities(x[near]), axis=1)
            modes[near] = np.asarray(self.model.modes, dtype=object)[likely]
        bounds = np.cumsum([0, *sizes])
        for k in range(count):
            i = first + k
            rows, lo, hi = self.present[i], bounds[k], bounds[k + 1]
            self.scores["model"][i][rows] = risk[lo:hi]
            self.scores["logistic"][i][rows] = logistic[lo:hi]
            self.scores["rules"][i][rows] = rules[lo:hi]
            self.scores[MARGIN][i][rows] = margin[lo:hi]
            self.modes[i][rows] = modes[lo:hi]


def score_period(
    dataset: Dataset,
    model: FaultModel,
    nodes: Sequence[int],
    start_s: float,
    end_s: float,
    masked_inputs: Sequence[str] = (),
) -> ScoredPeriod:
    """Model, logistic and rules scores for every present row of `nodes` in [start_s, end_s)."""
    sink = _Collector(
        model,
        RulesBaseline(model.feature_names),
        Labels(model.horizon_s, dataset.failures),
        tuple(nodes),
        dataset.gpus_per_node,
        start_s,
        [],
        [],
        {"model": [], "logistic": [], "rules": [], MARGIN: []},
        [],
        [],
    )
    replay(
        dataset,
        model.feature_config,
        sink,
        nodes=nodes,
        start_s=start_s - WARMUP_S,
        end_s=end_s,
        masked_inputs=masked_inputs,
    )
    sink.flush()
    return ScoredPeriod(
        times_s=np.asarray(sink.times),
        nodes=tuple(nodes),
        gpus_per_node=dataset.gpus_per_node,
        present=np.asarray(sink.present),
        scores={m: np.asarray(v) for m, v in sink.scores.items()},
        labels=np.asarray(sink.label_rows),
        modes=np.asarray(sink.modes, dtype=object).reshape(len(sink.times), -1),
        censored=dataset.censored,
    )


def count_failures(period: ScoredPeriod, dataset: Dataset) -> int:
    """How many failures of the log fall within the period, on its nodes."""
    return len(dataset.failures.between(float(period.times_s[0]), float(period.times_s[-1]), period.nodes))


def held_out_part(dataset: Dataset, model: FaultModel) -> tuple[list[int], float, bool]:
    """(nodes, start, is the model's training data): the part of `dataset` the model never trained
    on. On its own training data, the split's test nodes and days; on other data, every node after
    the features' warm-up."""
    split, trained = model.card.split, model.card.training_data
    trained_on = trained.manifest.get("config") if trained is not None else None
    # Both sides read with today's key names (faultcast.schemas.current_data_manifest).
    if split is not None and trained_on == dataset.manifest.get("config"):
        return [dataset.node_index(n) for n in split.test_nodes], split.test_start_unix_s, True
    return list(range(len(dataset.nodes))), dataset.start_s + WARMUP_S, False


@dataclass(frozen=True)
class Scored:
    """A dataset's evaluated part, scored on every input and on dcgm-exporter's defaults only."""

    dataset: Dataset
    period: ScoredPeriod
    masked: ScoredPeriod
    start_s: float  # where the scored part starts (after the warm-up)
    same_data: bool  # the model's training data: its held-out nodes and days

    def of(self, row: Row) -> ScoredPeriod:
        """The scored period a row reads."""
        return self.masked if row.masked else self.period


def score_dataset(dataset: Dataset, model: FaultModel) -> Scored:
    """Score the part of `dataset` the model never trained on (held_out_part), twice."""
    nodes, start, same_data = held_out_part(dataset, model)
    period = score_period(dataset, model, nodes, start, dataset.end_s)
    masked = score_period(dataset, model, nodes, start, dataset.end_s, masked_inputs=DCGM_DEFAULT_MISSING)
    return Scored(dataset, period, masked, start, same_data)


# The rows of a report, in the table's order: each baseline as shipped, then matched to the model.
ROW_ORDER = ("model", "model_dcgm_default_metrics", "logistic", "logistic_matched", "rules", "rules_matched")


def own_rows(model: FaultModel) -> list[Row]:
    """Each method at its own threshold (the rules as shipped), keyed as reports always were."""
    policy = model.policy
    return [
        Row("model", "model", Setting("model", model.threshold, policy)),
        Row(
            "model_dcgm_default_metrics",
            "model, dcgm-exporter defaults only (its own threshold)",
            Setting("model", model.dcgm_default_threshold, policy),
            masked=True,
        ),
        Row(
            "logistic",
            "logistic regression (own threshold)",
            Setting("logistic", model.logistic_threshold, policy),
        ),
        Row(
            "rules", "rules, DCGM + NVSentinel (as shipped)", rules_setting(1.0, policy), about={"scale": 1.0}
        ),
    ]


def matched_rows(
    scored: Scored, model: FaultModel, target: int, periods: PredictionPeriods
) -> list[tuple[Row, list[Incident]]]:
    """Logistic regression and the rules at the model's false alarms on the same period (see
    model/evaluation/matching.py), with the incidents each raised there."""
    period, failures, policy = scored.period, scored.dataset.failures, model.policy
    rate = 1000.0 * target / max(period.gpu_days, 1e-9)
    logistic, within = matched_threshold(
        period, failures, "logistic", target, policy, NODE_LEVEL_MODES, periods, floor=LOGISTIC_FLOOR
    )
    about = {"matched_to_false_alarms_per_1000_gpu_days": rate}
    out = [
        (
            Row(
                "logistic_matched",
                "logistic regression, matched to the model's false alarms",
                Setting("logistic", logistic.setting, policy),
                about={**about, "within_target": within},
            ),
            logistic.found,
        )
    ]
    rules, within = matched_scale(period, failures, target, policy, NODE_LEVEL_MODES, periods)
    out.append(
        (
            Row(
                "rules_matched",
                "rules, thresholds scaled to the model's false-alarm rate",
                rules_setting(rules.setting, policy),
                about={**about, "scale": rules.setting, "within_target": within},
            ),
            rules.found,
        )
    )
    return out


def _row_json(row: Row, measured: Measured, resamples: int, seed: int) -> dict[str, Any]:
    # The rules at any scale are a 0/1 score alerting at 0.5, as shipped.
    threshold = 0.5 if row.setting.method == MARGIN else row.setting.threshold
    return {
        "threshold": threshold,
        **row.about,
        **measured.metrics,
        **intervals(measured.tallies, resamples, seed),
    }


def _source(dataset: Dataset) -> dict[str, Any]:
    """Where figures came from: the data's path, kind and acceleration (null where it does not say)."""
    manifest = dataset.manifest
    return {
        "path": str(dataset.path),
        "kind": manifest.get("kind"),
        "acceleration": manifest.get("acceleration"),
    }


def false_alarm_report(
    data: Sequence[Scored],
    rows: Sequence[Row],
    periods: PredictionPeriods = DEFAULT_PERIODS,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict[str, Any]:
    """Every row's false alarms on `data` (typically a twin at acceleration 1: failures as rare as in a
    real fleet), pooled over the datasets, at the rows' own settings."""
    methods = {}
    for row in rows:
        parts = [measure(row, scored.of(row), scored.dataset.failures, periods).tallies for scored in data]
        methods[row.key] = {
            "label": row.label,
            **false_alarm_figures(NodeTallies.concat(parts), resamples, seed),
        }
    return {"data": [_source(scored.dataset) for scored in data], "methods": methods}


@dataclass(frozen=True)
class Evaluation:
    """One dataset's report, the scored period behind it, and each row's measurement (for pooling)."""

    report: dict[str, Any]
    period: ScoredPeriod
    rows: dict[str, Measured]


def evaluate(
    scored: Scored,
    model: FaultModel,
    periods: PredictionPeriods = DEFAULT_PERIODS,
    false_alarm_data: Sequence[Scored] = (),
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Evaluation:
    """Every row on a scored dataset: recall, leads, false alarms and precision with intervals; and
    each row's false alarms on `false_alarm_data` when given."""
    dataset, period = scored.dataset, scored.period
    training = model.card.training_data
    world = check_world(
        dataset.manifest, training.manifest if training is not None else None, scored.same_data
    )
    rows = own_rows(model)
    measured = {row.key: measure(row, scored.of(row), dataset.failures, periods) for row in rows}
    target = int(measured["model"].metrics["false_alarms"])
    for row, found in matched_rows(scored, model, target, periods):
        rows.append(row)
        measured[row.key] = measure(row, period, dataset.failures, periods, found)
    rows.sort(key=lambda row: ROW_ORDER.index(row.key))
    source = _source(dataset)
    report: dict[str, Any] = {
        "definitions": _definitions(periods, resamples, seed),
        "world": world.to_json(),
        "data": source,
        "test_gpu_days": period.gpu_days,
        "test_failures": count_failures(period, dataset),
        "test_nodes": [dataset.nodes[n] for n in period.nodes],
        "test_start": scored.start_s,
        "held_out_from_training": scored.same_data,
        **{
            row.key: {"label": row.label, **_row_json(row, measured[row.key], resamples, seed)}
            for row in rows
        },
        "false_alarm_data": (
            false_alarm_report(false_alarm_data, rows, periods, resamples, seed) if false_alarm_data else None
        ),
        "sources": {
            "recall": source,
            "alert_precision": source,
            "false_alarms": source,
            "false_alarm_data": [_source(s.dataset) for s in false_alarm_data],
        },
        "notes": report_notes(measured["model"].metrics, source, bool(false_alarm_data)),
    }
    return Evaluation(report, period, measured)


def _definitions(periods: PredictionPeriods, resamples: int, seed: int) -> dict[str, Any]:
    return {
        **periods.to_json(),
        "false_alarms": "incidents not followed by the failure they point at within the prediction "
        "period (premature: it came within false_after_s; false: it did not)",
        "recall": "failures warned by an incident that opened at least warning_s and at most period_s "
        "before them",
        "recall_5min_predictable": "over the failures the failure log says carried a precursor "
        "(precursor_s > 0); null when the log does not say for some failure",
        "ci95": f"percentile 95% intervals of {resamples} bootstrap resamples of the nodes (seed {seed})",
        "matched": "logistic regression's threshold and the rules' scale chosen on this period for the most "
        "false alarms not above the model's there (its own threshold's)",
    }


PRECURSOR_UNKNOWN = "the failure log does not record which failures carried a precursor"


def report_notes(model: dict[str, Any], source: dict[str, Any], measured_apart: bool) -> list[str]:
    """What a reader must know before trusting the table."""
    notes = []
    unknown, failures = model["failures_precursor_unknown"], model["failures"]
    if unknown:
        notes.append(
            f"{PRECURSOR_UNKNOWN} ({unknown} of {failures} failures): recall over predictable failures is "
            "unknown, not guessed from the mode's name"
        )
    acceleration = source["acceleration"]
    if isinstance(acceleration, int | float) and acceleration > 1:
        measured = "alert precision" if measured_apart else "false alarms and alert precision"
        notes.append(
            f"{measured} measured on data at acceleration {acceleration:g}: failures are that much more "
            "frequent than in a fleet, so an alert is more often followed by one"
            + (
                ""
                if measured_apart
                else "; --false-alarm-data measures false alarms on data at acceleration 1"
            )
        )
    notes.append(
        "the matched rows' settings were chosen on the evaluated period itself, which favours those baselines"
    )
    return notes


def held_out_report(
    dataset: Dataset,
    model: FaultModel,
    periods: PredictionPeriods = DEFAULT_PERIODS,
    false_alarm_data: Sequence[Dataset] = (),
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[dict[str, Any], ScoredPeriod]:
    """The report `faultcast evaluate --json` writes for one dataset, and the scored period behind it.

    The part scored is the one the model never trained on: on its training data, the held-out nodes
    and days of its manifest; on other data (another world: leave-world-out), every node after the
    first 6 hours (the features' warm-up). `periods` (minimal warning time, prediction period) is
    recorded in the report; false alarms are also measured on each of `false_alarm_data`."""
    apart = [score_dataset(d, model) for d in false_alarm_data]
    done = evaluate(score_dataset(dataset, model), model, periods, apart, resamples, seed)
    return done.report, done.period


def pooled_report(
    evaluations: Sequence[Evaluation], resamples: int = RESAMPLES, seed: int = SEED
) -> dict[str, Any]:
    """Several datasets' rows as one: counts summed, intervals over the nodes of every dataset. A
    matched row sums each dataset's own match."""
    keys = [key for key in ROW_ORDER if key in evaluations[0].rows]
    return {
        "data": [e.report["data"] for e in evaluations],
        "test_gpu_days": sum(e.report["test_gpu_days"] for e in evaluations),
        "test_failures": sum(e.report["test_failures"] for e in evaluations),
        "unseen_world": [e.report["world"]["unseen_world"] for e in evaluations],
        **{
            key: {
                "label": evaluations[0].report[key]["label"],
                **pooled([e.rows[key] for e in evaluations], resamples, seed),
            }
            for key in keys
        },
    }


def json_safe(value: Any) -> Any:
    """NaN becomes null (strict JSON has no NaN); numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
