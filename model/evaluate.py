"""Scoring a period of data with the model and both baselines, and the held-out evaluation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from faultcast.model.artifact import FaultModel
from faultcast.model.dataset import Dataset, Labels, Step, replay
from faultcast.model.outcomes import (
    DEFAULT_PERIODS,
    PredictionPeriods,
    ScoredPeriod,
    event_metrics,
    incidents,
)
from faultcast.model.rules import RulesBaseline
from faultcast.modes import MODES_WITH_PRECURSOR, NODE_LEVEL_MODES

WARMUP_S = 6 * 3600.0  # history fed to the engine before a scored period starts (windows, baselines)
# Rows where some method's score reaches this get the model's likely mode (the tracker reads it where
# an alert opens, to tell node-level incidents from GPU ones); no threshold is chosen below it.
MODE_FLOOR = 0.01

# Metrics that dcgm-exporter's default counter set does not export: ECC totals, retired pages and
# NVLink error counters are shipped commented out; throttle reasons, Xid counts by code, NVML
# health and network counters are not there at all. Only the last Xid (DCGM_FI_DEV_XID_ERRORS) is.
DCGM_DEFAULT_MISSING: tuple[str, ...] = (
    "ecc_sbe_volatile", "ecc_dbe_volatile", "nvlink_crc_flit_errors_worst_link", "nvlink_crc_data_errors",
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
    start_s: float
    times: list[float]
    present: list[np.ndarray]
    scores: dict[str, list[np.ndarray]]
    label_rows: list[np.ndarray]
    modes: list[np.ndarray]

    def __call__(self, step: Step) -> None:
        if step.time_s < self.start_s:
            return
        rows = step.present
        for method in self.scores:
            self.scores[method].append(np.full(len(rows), np.nan))
        modes = np.full(len(rows), "", dtype=object)
        if rows.any():
            x = step.features[rows]
            risk, logistic, rules = self.model.risk(x), self.model.logistic.predict(x), self.rules.score(x)
            self.scores["model"][-1][rows] = risk
            self.scores["logistic"][-1][rows] = logistic
            self.scores["rules"][-1][rows] = rules
            near = (risk >= MODE_FLOOR) | (logistic >= MODE_FLOOR) | (rules >= 0.5)
            if near.any() and self.model.modes:
                likely = np.argmax(self.model.mode_probabilities(x[near]), axis=1)
                modes[np.nonzero(rows)[0][near]] = np.asarray(self.model.modes, dtype=object)[likely]
        self.modes.append(modes)
        positive, _, _ = self.labels.at(step.time_s, self.nodes, self.model.feature_config.gpus_per_node)
        self.times.append(step.time_s)
        self.present.append(rows.copy())
        self.label_rows.append(positive & rows)


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
        start_s,
        [],
        [],
        {"model": [], "logistic": [], "rules": []},
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
    return ScoredPeriod(
        times_s=np.asarray(sink.times),
        nodes=tuple(nodes),
        gpus_per_node=model.feature_config.gpus_per_node,
        present=np.asarray(sink.present),
        scores={m: np.asarray(v) for m, v in sink.scores.items()},
        labels=np.asarray(sink.label_rows),
        modes=np.asarray(sink.modes, dtype=object).reshape(len(sink.times), -1),
    )


def evaluate_period(
    period: ScoredPeriod,
    dataset: Dataset,
    model: FaultModel,
    periods: PredictionPeriods,
    model_threshold: float | None = None,
) -> dict[str, Any]:
    """Event-level metrics of each method at its own threshold (the rules: whenever one fires),
    every method through the model's alert policy."""
    own = model.threshold if model_threshold is None else model_threshold
    thresholds = {"model": own, "logistic": model.logistic_threshold, "rules": 0.5}
    out: dict[str, Any] = {}
    for method, threshold in thresholds.items():
        found = incidents(period, method, [threshold], model.policy, NODE_LEVEL_MODES)[0]
        metrics = event_metrics(
            period, dataset.failures, found, periods, set(MODES_WITH_PRECURSOR), period.scores[method]
        )
        out[method] = {"threshold": threshold, **metrics}
    return out


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


def held_out_report(
    dataset: Dataset, model: FaultModel, periods: PredictionPeriods = DEFAULT_PERIODS
) -> tuple[dict[str, Any], ScoredPeriod]:
    """The report `faultcast evaluate --json` writes, and the scored held-out period behind it.

    The held-out nodes and days come from the model's manifest when `dataset` is its training data;
    on other data, all nodes after the first 6 hours (the features' warm-up). `periods` (minimal
    warning time, prediction period) is recorded in the report."""
    nodes, start, same_data = held_out_part(dataset, model)
    period = score_period(dataset, model, nodes, start, dataset.end_s)
    report: dict[str, Any] = {
        "definitions": {
            **periods.to_json(),
            "false_alarms": "incidents not followed by the failure they point at within the prediction "
            "period (premature: it came within false_after_s; false: it did not)",
            "recall": "failures warned by an incident that opened at least warning_s and at most period_s "
            "before them",
        },
        "test_gpu_days": period.gpu_days,
        "test_failures": count_failures(period, dataset),
        "test_nodes": [dataset.nodes[n] for n in nodes],
        "test_start": start,
        "held_out_from_training": same_data,
        **evaluate_period(period, dataset, model, periods),
    }
    masked = score_period(dataset, model, nodes, start, dataset.end_s, masked_inputs=DCGM_DEFAULT_MISSING)
    report["model_dcgm_default_metrics"] = evaluate_period(
        masked, dataset, model, periods, model.dcgm_default_threshold
    )["model"]
    return report, period


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
