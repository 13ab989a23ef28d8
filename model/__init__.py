"""Streaming features and the failure-prediction model.

What a user loads, trains and imports data with is importable from here (`from faultcast.model import
load, train`). Each name loads its module on first use (PEP 562): the service and the command line
import parts of this package (the feature groups, the alert content) whose callers must not pay for
LightGBM, scikit-learn and pandas on import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faultcast.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from faultcast.model.artifact import FaultModel, ModelError, load, save
    from faultcast.model.features.engine import FeatureConfig, FeatureEngine
    from faultcast.model.features.offline import open_dataset
    from faultcast.model.importers.prometheus import fetch_prometheus, import_prometheus
    from faultcast.model.training.train import TrainConfig, train

__all__ = [
    "FaultModel",
    "FeatureConfig",
    "FeatureEngine",
    "ModelError",
    "TrainConfig",
    "fetch_prometheus",
    "import_prometheus",
    "load",
    "open_dataset",
    "save",
    "train",
]

# Each public name's module.
_HOME = {
    "FaultModel": "faultcast.model.artifact",
    "ModelError": "faultcast.model.artifact",
    "load": "faultcast.model.artifact",
    "save": "faultcast.model.artifact",
    "FeatureConfig": "faultcast.model.features.engine",
    "FeatureEngine": "faultcast.model.features.engine",
    "open_dataset": "faultcast.model.features.offline",
    "fetch_prometheus": "faultcast.model.importers.prometheus",
    "import_prometheus": "faultcast.model.importers.prometheus",
    "TrainConfig": "faultcast.model.training.train",
    "train": "faultcast.model.training.train",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals())
