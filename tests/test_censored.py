"""Hours nobody can label (a node drained on a prediction that nothing settled, censored.csv) neither
train nor count as healthy: the sampler leaves their rows out, positive or not, and keeps every other;
evaluation and validation judge an alert opened inside one neither false nor a catch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from faultcast.model.evaluation.outcomes import (
    PredictionPeriods,
    ScoredPeriod,
    catches,
    choose_threshold,
    events,
    incidents,
    is_censored,
    metrics_of,
    mode_tallies,
    predictable_counts,
)
from faultcast.model.features.offline import (
    Censored,
    DataError,
    Failure,
    FailureLog,
    Labels,
    Step,
    read_censored,
)
from faultcast.model.incidents import AlertPolicy
from faultcast.model.training.train import _Sampler
from faultcast.modes import NODE_LEVEL_MODES

HORIZON, G = 1800.0, 4
T = 1_780_000_000.0
NODES = ("node-a", "node-b")


def _kept(censored: Censored | None, time_s: float) -> tuple[list[int], list[bool]]:
    """The slots a sampler keeping every row keeps at `time_s`, and their labels."""
    log = FailureLog.of([Failure(T + 600.0, node=1, gpu=2, mode="nvlink", precursor_s=3000.0)])
    sampler = _Sampler(Labels(HORIZON, log.learnable()), (0, 1), G, rate=1.0, seed=0, censored=censored)
    features = np.arange(2 * G, dtype=np.float64)[:, None]
    sampler(Step(0, time_s, np.ones(2 * G, dtype=bool), features))
    rows = sampler.rows.stack()
    if not len(rows["label"]):
        return [], []
    return rows["features"][:, 0].astype(int).tolist(), rows["label"].astype(bool).tolist()


def test_censored_spans_leave_their_rows_out(tmp_path: Path) -> None:
    path = tmp_path / "censored.csv"
    path.write_text(
        "start,end,node,gpu,alert_id,why\n"
        "2026-05-28T20:00:00Z,2026-05-28T22:00:00Z,node-a,,7,drained on the prediction\n"  # the whole node
        "2026-05-28T20:00:00Z,2026-05-28T22:00:00Z,node-b,2,8,drained on the prediction\n"
        "2026-05-28T20:00:00Z,2026-05-28T22:00:00Z,node-z,1,9,a node this data lacks\n"
    )
    censored = read_censored(path, NODES)
    assert censored.node.tolist() == [0, 1]
    inside = 1_780_000_000.0  # 2026-05-28T20:26:40Z
    slots, labels = _kept(censored, inside)
    assert slots == [4, 5, 7]  # node-a's four GPUs and node-b's GPU 2 (a positive, unknown) left out
    assert labels == [False, False, False]
    every, plain = _kept(None, inside)
    assert every == list(range(2 * G))
    assert plain == [s == 6 for s in every]
    after, _ = _kept(censored, 1_780_000_000.0 + 3 * 3600.0)  # past the span: every row again
    assert after == list(range(2 * G))
    assert read_censored(tmp_path / "absent.csv", NODES).node.size == 0


def test_a_bad_censored_row_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "censored.csv"
    path.write_text("start,end,node,gpu,alert_id,why\n2026-05-28T20:00:00Z,yesterday,node-a,,7,x\n")
    with pytest.raises(DataError, match=r"censored\.csv:2"):
        read_censored(path, NODES)


# -- evaluation and validation: an alert inside a censored span is neither false nor a catch ----------

POLICY = AlertPolicy(k=2, clear_steps=10)
PERIODS = PredictionPeriods()
MINUTE = 60.0
# Node 0 fails at minute 200 and node 1 at 600, each after a 30-minute precursor; node 2 and 3 never do.
LOG = FailureLog.of(
    [Failure(200 * MINUTE, 0, 0, "hbm_wear", 1800.0), Failure(600 * MINUTE, 1, 0, "pcie", 1800.0)]
)


def _period(censored: Censored) -> ScoredPeriod:
    """Four one-GPU nodes over 1,000 minutes; an alert 30 minutes before each failure, one on node 2 at
    minute 500 and one on node 3 at minute 300 that no failure follows."""
    score = np.zeros((1000, 4))
    for node, start in ((0, 170), (1, 570), (2, 500), (3, 300)):
        score[start : start + 20, node] = 0.9
    present = np.ones_like(score, dtype=bool)
    modes = np.full(score.shape, "hbm_wear", dtype=object)
    return ScoredPeriod(
        np.arange(1000) * MINUTE, (0, 1, 2, 3), 1, present, {"model": score}, ~present, modes, censored
    )


def _spans(*spans: tuple[int, int, float, float]) -> Censored:
    node, gpu, start, end = (np.asarray(c) for c in zip(*spans, strict=True))
    return Censored(node.astype(np.int64), gpu.astype(np.int64), start.astype(float), end.astype(float))


def test_an_alert_in_a_censored_span_is_neither_a_false_alarm_nor_a_catch() -> None:
    # Node 2 drained (the whole node) around its alert, node 1's GPU 0 around its own.
    drained = _spans((2, -1, 470 * MINUTE, 560 * MINUTE), (1, 0, 540 * MINUTE, 640 * MINUTE))
    plain, censored = _period(Censored.none()), _period(drained)
    (found,) = incidents(plain, "model", [0.5], POLICY, NODE_LEVEL_MODES)
    assert len(found) == 4
    before = metrics_of(plain, events(plain, LOG, found, PERIODS), PERIODS, plain.scores["model"])
    after = metrics_of(censored, events(censored, LOG, found, PERIODS), PERIODS, censored.scores["model"])
    assert (before["false_alarms"], before["failures_caught"], before["censored_alerts"]) == (2, 2, 0)
    assert (after["false_alarms"], after["failures_caught"], after["censored_alerts"]) == (1, 1, 2)
    assert after["alerts"] == 2  # the two judged: node 0's true alarm and node 3's false one
    assert {i.node: is_censored(i, censored) for i in found} == {0: False, 1: True, 2: True, 3: False}
    # Choosing a threshold at a budget of one false alarm: the censored alert no longer uses it up.
    budget = 1000.0 / plain.gpu_days
    strict, _ = choose_threshold(plain, LOG, "model", POLICY, NODE_LEVEL_MODES, budget, PERIODS)
    eased, _ = choose_threshold(censored, LOG, "model", POLICY, NODE_LEVEL_MODES, budget, PERIODS)
    assert strict > 0.9 >= eased


# -- validation recall on a log that does not say which failures carried a precursor -----------------


def test_a_log_that_does_not_say_counts_the_modes_that_can_warn() -> None:
    unknown = FailureLog.of(
        [Failure(200 * MINUTE, 0, 0, "hbm_wear"), Failure(600 * MINUTE, 1, 0, "firmware")]
    )  # a real fleet's log: no precursor_s; firmware faults strike without one (the mode catalogue)
    period = _period(Censored.none())
    (found,) = incidents(period, "model", [0.5], POLICY, NODE_LEVEL_MODES)
    caught = catches(period, unknown, found, PERIODS)
    assert predictable_counts(caught, PERIODS.warning_s) == (0, 0, 2)  # evaluation: unknown, said so
    assert predictable_counts(caught, PERIODS.warning_s, by_mode=True) == (1, 1, 0)
    tallies = mode_tallies(caught, PERIODS.warning_s, by_mode=True)
    assert tallies["hbm_wear"].recall == 1.0
    assert tallies["firmware"].predictable == 0
    # Where the log says, its word stands (a precursor-less hbm_wear failure is not predictable).
    said = FailureLog.of([Failure(200 * MINUTE, 0, 0, "hbm_wear", 0.0)])
    assert predictable_counts(catches(period, said, found, PERIODS), PERIODS.warning_s, by_mode=True)[0] == 0
