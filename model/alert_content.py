"""What an alert says, built in one place for `faultcast score` and the service: the likely failure
mode, the risk, when the failure is expected (a range, from the model's time buckets), the features
that pushed the risk up, and the recommended action.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from faultcast.actions import Action
from faultcast.model.artifact import TTF_BUCKETS_S, FaultModel
from faultcast.modes import MODES_WITH_PRECURSOR

# Modes whose failure takes a whole node (NODE_LEVEL_MODES) get one alert per node (gpu -1); only
# modes with a precursor get a time to failure.
TTF_QUANTILES = (0.1, 0.5, 0.9)


@dataclass(frozen=True, slots=True)
class ActionPolicy:
    """Which action an alert recommends. Every alert is above the model's threshold, which meets
    the false-alarm budget. Snapshot and migrate when the failure looks near (median time to failure
    within `migrate_within_s`) or likely (`migrate_risk`); before that, snapshot only: a checkpoint
    is cheap and bounds what a failure can cost, while draining waits for more certainty. Watch when
    the most likely mode has no precursors (a firmware fault): no snapshot schedule can be aimed
    at it. An open alert's action only ever escalates (an update event)."""

    migrate_within_s: float = 1200.0
    migrate_risk: float = 0.3

    def action(self, mode: str, risk: float, ttf_s: float, move_at: float = 0.0) -> Action:
        """The action for an alert of `mode` at `risk`, failing in `ttf_s`: watch a mode without a precursor,
        migrate when it comes soon or is likely, else snapshot only. Under `move_at` (the move tier's
        threshold, when a lower protect tier opened the alert) never migrate: a weak warning buys
        protection only."""
        if mode not in MODES_WITH_PRECURSOR:
            return Action.WATCH
        if risk < move_at:
            return Action.SNAPSHOT_ONLY
        if ttf_s <= self.migrate_within_s or risk >= self.migrate_risk:
            return Action.SNAPSHOT_AND_MIGRATE
        return Action.SNAPSHOT_ONLY


DEFAULT_ACTIONS = ActionPolicy()


def ttf_edges(horizon_s: float) -> np.ndarray:
    """The time buckets' edges in seconds: 0, 5 and 15 minutes, and the model's horizon (the last
    bucket of the time-to-failure head reaches to it, whatever the horizon was)."""
    edges = np.concatenate([[0.0], np.asarray(TTF_BUCKETS_S[:-1]), [horizon_s]])
    return np.asarray(np.minimum(edges, horizon_s))


def ttf_quantiles(
    risk: np.ndarray, within: np.ndarray, horizon_s: float, quantiles: tuple[float, ...] = TTF_QUANTILES
) -> np.ndarray:
    """(rows, quantiles) seconds in [0, horizon]: quantiles of the time to failure given that one
    comes within the horizon, from the risks within each time bucket (rows, buckets), interpolated
    linearly inside the bucket where the conditional probability crosses each quantile. NaN where
    the risk is NaN."""
    edges = ttf_edges(horizon_s)
    cond = np.clip(within / np.maximum(risk, 1e-12)[:, None], 0.0, 1.0)
    cond = np.maximum.accumulate(np.concatenate([np.zeros((len(risk), 1)), cond], axis=1), axis=1)
    cond[:, -1] = 1.0  # given a failure within the horizon, it has come by its end
    rows = np.arange(len(risk))
    out = np.empty((len(risk), len(quantiles)))
    for j, q in enumerate(quantiles):
        i = np.maximum(np.argmax(cond >= q, axis=1), 1)
        lo, hi = cond[rows, i - 1], cond[rows, i]
        frac = np.where(hi > lo, (q - lo) / np.where(hi > lo, hi - lo, 1.0), 1.0)
        out[:, j] = edges[i - 1] + np.clip(frac, 0.0, 1.0) * (edges[i] - edges[i - 1])
    out[np.isnan(risk)] = np.nan
    return out


def median_ttf_s(risk: np.ndarray, within: np.ndarray, horizon_s: float) -> np.ndarray:
    """The median time to failure given one within the horizon (the scorer's per-row estimate)."""
    return ttf_quantiles(risk, within, horizon_s, (0.5,))[:, 0]


@dataclass(frozen=True, slots=True, eq=False)  # arrays: `==` would compare element by element
class Heads:
    """What the model's heads say of some rows: the risk, the risk within each time bucket, the time
    to failure's quantiles and each mode's probability. Read once by whoever scores the rows (the
    service's scorer, for rows near an alert) and handed to `describe`, which then runs no head again."""

    risk: np.ndarray  # (rows,)
    within: np.ndarray  # (rows, buckets): risk of failing within each bucket of ttf_edges
    ttf_s: np.ndarray  # (rows, len(TTF_QUANTILES)): p10, p50, p90 seconds
    mode_probabilities: np.ndarray  # (rows, modes)

    def row(self, i: int) -> Heads:
        """Row `i` alone, as one-row arrays."""
        return Heads(
            self.risk[i : i + 1],
            self.within[i : i + 1],
            self.ttf_s[i : i + 1],
            self.mode_probabilities[i : i + 1],
        )


def read_heads(model: FaultModel, rows: np.ndarray, risk: np.ndarray | None = None) -> Heads:
    """Run the model's heads over feature rows (rows, features); `risk`: the rows' risk when already
    known, else computed."""
    risk = model.risk(rows) if risk is None else np.asarray(risk, dtype=np.float64)
    within = model.risk_within(rows, risk)
    return Heads(risk, within, ttf_quantiles(risk, within, model.horizon_s), model.mode_probabilities(rows))


@dataclass(frozen=True, slots=True)
class AlertContent:
    """What an alert says about one scored row."""

    mode: str
    mode_probability: float
    risk: float
    risk_within: tuple[float, ...]  # risk of failing within each bucket of ttf_edges (5, 15 min, horizon)
    ttf_s: tuple[float, float, float] | None  # p10, p50, p90; None when the mode has no precursor
    top_features: tuple[tuple[str, float, float], ...]  # (feature, value, contribution to the raw score)
    action: Action


def describe(
    model: FaultModel,
    rows: np.ndarray,
    *,
    risk: np.ndarray | None = None,
    heads: Heads | None = None,
    top: int = 5,
    actions: ActionPolicy = DEFAULT_ACTIONS,
    move_at: float = 0.0,
) -> list[AlertContent]:
    """The content of an alert for each feature row (rows, features); `heads`: what the model's heads
    said of these rows when already read (`read_heads`), else read here; `risk`: the rows' risk when
    already known (the scorer's) and `heads` is not given, else computed; `move_at`: the move tier's
    threshold (see ActionPolicy.action). With `heads`, only the features' contributions are computed."""
    if len(rows) == 0:
        return []
    heads = read_heads(model, rows, risk) if heads is None else heads
    contributions = model.contributions(rows, top=top)
    probabilities = heads.mode_probabilities
    out = []
    for i in range(len(rows)):
        likely = int(np.argmax(probabilities[i])) if probabilities.shape[1] else -1
        mode = model.modes[likely] if likely >= 0 else "unknown"
        ttf = tuple(float(v) for v in heads.ttf_s[i]) if mode in MODES_WITH_PRECURSOR else None
        p50 = ttf[1] if ttf is not None else float("inf")
        risk_i = float(heads.risk[i])
        out.append(
            AlertContent(
                mode=mode,
                mode_probability=float(probabilities[i, likely]) if likely >= 0 else float("nan"),
                risk=risk_i,
                risk_within=tuple(float(v) for v in heads.within[i]),
                ttf_s=ttf,  # type: ignore[arg-type]  # three quantiles by construction
                top_features=tuple(contributions[i]),
                action=actions.action(mode, risk_i, p50, move_at),
            )
        )
    return out
