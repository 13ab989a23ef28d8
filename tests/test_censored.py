"""Hours nobody can label (a node drained on a prediction that nothing settled, censored.csv) neither
train nor count as healthy: the sampler leaves their rows out, positive or not, and keeps every other."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from faultcast.model.features.offline import (
    Censored,
    DataError,
    Failure,
    FailureLog,
    Labels,
    Step,
    read_censored,
)
from faultcast.model.training.train import _Sampler

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
