"""Training the booster on a Dask cluster through lightgbm.dask, for data beyond one machine.

The sampled training rows are split into partitions that Dask places on its workers; LightGBM's
own network then trains one model across them. lightgbm.dask has no early stopping, so the full
number of rounds is trained and the best iteration is chosen afterwards on the validation slice
by the same metric the single-machine path stops on (average precision).
"""

from __future__ import annotations

from typing import Any

import lightgbm as lgb
import numpy as np
from sklearn.metrics import average_precision_score


def fit_on_dask(
    client: Any,
    x: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    w_val: np.ndarray,
    params: dict[str, Any],
    rounds: int,
    *,
    partitions: int | None = None,
) -> tuple[lgb.Booster, int]:
    """(booster cut at its best iteration, best iteration) trained on the client's workers."""
    import dask.array as da
    from lightgbm.dask import DaskLGBMClassifier

    workers = len(client.scheduler_info()["workers"])
    parts = partitions or max(1, workers)
    chunk = max(1, -(-len(x) // parts))
    dx = da.from_array(x, chunks=(chunk, x.shape[1]))
    dy = da.from_array(y.astype(np.int32), chunks=chunk)
    dw = da.from_array(w, chunks=chunk)
    local = {
        k: v for k, v in params.items() if k not in {"num_threads", "deterministic", "verbose", "metric"}
    }
    model = DaskLGBMClassifier(client=client, n_estimators=rounds, verbose=-1, **local)
    model.fit(dx, dy, sample_weight=dw)
    booster = model.to_local().booster_
    best, best_score = rounds, -1.0
    for iteration in range(10, rounds + 1, 10):
        score = float(
            average_precision_score(
                y_val, booster.predict(x_val, num_iteration=iteration), sample_weight=w_val
            )
        )
        if score > best_score:
            best, best_score = iteration, score
    return lgb.Booster(model_str=booster.model_to_string(num_iteration=best)), best
