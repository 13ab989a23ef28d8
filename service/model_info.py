"""What a subscriber is told about the model serving: its version, horizon and alert policy
(the CaughtUp marker of a subscription carries it; alerts carry the same message)."""

from __future__ import annotations

from faultcast.model.artifact import FaultModel
from faultcast.service.scoring import model_version
from faultcast.v1 import alerts_pb2 as apb


def model_info(model: FaultModel) -> apb.ModelInfo:
    """The ModelInfo message describing `model` and the policy its alerts open and clear under."""
    return apb.ModelInfo(
        version=model_version(model),
        horizon_seconds=model.horizon_s,
        threshold=model.threshold,
        hold_threshold=model.policy.hold(model.open_threshold),
        open_after_scores=model.policy.k,
        clear_after_scores=model.policy.clear_steps,
        cadence_seconds=model.feature_config.cadence_s,
        protect_threshold=model.protect_threshold or 0.0,
    )
