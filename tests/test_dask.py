"""Retraining on a Dask cluster: a real LocalCluster, LightGBM's own network across its workers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import distributed
import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from faultcast.model.artifact import load
from faultcast.model.evaluation.world_pass import map_worlds
from faultcast.model.features.engine import FeatureConfig
from faultcast.model.features.offline import open_dataset
from faultcast.model.training.distributed import fit_on_dask
from faultcast.model.training.train import TrainConfig, _world_rows, train
from faultcast.sim.config import FleetConfig
from faultcast.sim.writer import simulate


@pytest.fixture(scope="module")
def client() -> Iterator[object]:
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def test_a_booster_trains_across_two_workers(client: object) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 6))
    y = (x[:, 0] + 0.5 * x[:, 1] + rng.normal(scale=0.5, size=4000)) > 1.5
    w = np.ones(len(y))
    params = {"objective": "binary", "learning_rate": 0.1, "num_leaves": 15, "min_data_in_leaf": 20}
    booster, best = fit_on_dask(
        client, x[:3000], y[:3000], w[:3000], x[3000:], y[3000:], w[3000:], params, 60
    )
    assert 10 <= best <= 60
    assert booster.num_trees() == best
    assert average_precision_score(y[3000:], booster.predict(x[3000:])) > 0.8


def test_faultcast_train_on_dask_writes_a_loadable_model(client: object, tmp_path: Path) -> None:
    # A twin of this seed whose fit and validation slices both hold failures (8 nodes x 2 days do not):
    # the features and the thresholds are computed here, step by step; only the booster is on Dask.
    simulate(FleetConfig(nodes=6, days=3.0, seed=5, acceleration=1000.0), tmp_path / "data")
    model = train(open_dataset(tmp_path / "data"), tmp_path / "model", TrainConfig(num_boost_round=40),
                  dask_client=client)  # fmt: skip
    assert model.card.metrics is not None
    assert model.card.metrics.trained_on == "dask"
    loaded = load(tmp_path / "model")
    x = np.zeros((2, len(loaded.feature_names)))
    assert loaded.risk(x).shape == (2,)


def test_each_worlds_replay_runs_on_the_cluster_with_the_same_rows(client: object, tmp_path: Path) -> None:
    """The per-world pass (`faultcast train --dask-scheduler`): each world's rows built on a worker are
    the rows built here, in the order of the worlds."""
    datasets = []
    for seed in (6, 7):
        simulate(FleetConfig(nodes=2, days=1.0, seed=seed, acceleration=1000.0), tmp_path / f"w{seed}")
        datasets.append(open_dataset(tmp_path / f"w{seed}"))
    features = FeatureConfig(cadence_s=datasets[0].cadence_s)
    config = TrainConfig(negative_rate=0.05)
    calls = [(d, features, config, k) for k, d in enumerate(datasets)]
    here = map_worlds(_world_rows, calls)
    there = map_worlds(_world_rows, calls, client=client)
    assert [len(rows["label"]) for rows, _ in here] == [len(rows["label"]) for rows, _ in there]
    for (a, _), (b, _) in zip(here, there, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    assert any(rows["label"].any() for rows, _ in here)
