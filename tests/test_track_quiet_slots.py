"""The batch tracker skips quiet slots (model/incidents.py `track`): it must give exactly the
incidents of the state machine updated on every slot at every step, as the service runs it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from faultcast.model.incidents import AlertPolicy, Incident, track
from faultcast.modes import NODE_LEVEL_MODES

GPUS = 4


def _every_slot(
    risk: np.ndarray, present: np.ndarray, modes: np.ndarray, thresholds: Sequence[float], policy: AlertPolicy
) -> list[list[Incident]]:
    """The state machine on every slot at every step: what `track` did before it skipped."""
    return track(risk, present, modes, thresholds, policy, GPUS, NODE_LEVEL_MODES, skip_quiet=False)


def _fleet(seed: int, steps: int = 600, nodes: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Low background risk with bursts (some flickering around the threshold), gaps, NaN and a mix of
    GPU- and node-level modes."""
    rng = np.random.default_rng(seed)
    width = nodes * GPUS
    risk = rng.beta(0.5, 30.0, size=(steps, width))
    for _ in range(25):
        slot, start = int(rng.integers(width)), int(rng.integers(steps - 40))
        length = int(rng.integers(2, 40))
        risk[start : start + length, slot] = rng.uniform(0.05, 0.9, size=length)
    risk[rng.random(risk.shape) < 0.01] = np.nan
    present = rng.random(risk.shape) > 0.03
    for _ in range(6):  # whole GPUs dark for a while (an open alert ends by going dark)
        slot, start = int(rng.integers(width)), int(rng.integers(steps - 10))
        present[start : start + int(rng.integers(1, 10)), slot] = False
    modes = rng.choice(np.array(["", "hbm_wear", "nvlink", "infiniband"], dtype=object), size=risk.shape)
    return risk, present, modes


def _described(found: list[list[Incident]]) -> list[list[tuple[object, ...]]]:
    return [
        [
            (i.key, i.node, i.gpu, i.opened_step, i.closed_step, i.mode, i.reason, tuple(i.slots_at_open))
            for i in these
        ]
        for these in found
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "policy", [AlertPolicy(), AlertPolicy(k=1, clear_steps=3, hold_ratio=1.0, dark_steps=1)]
)
def test_skipping_quiet_slots_gives_every_incident_of_the_full_state_machine(
    seed: int, policy: AlertPolicy
) -> None:
    risk, present, modes = _fleet(seed)
    thresholds = np.quantile(risk[present & ~np.isnan(risk)], np.linspace(0.8, 0.999, 40)).tolist()
    every = _every_slot(risk, present, modes, thresholds, policy)
    got = _described(track(risk, present, modes, thresholds, policy, GPUS, NODE_LEVEL_MODES))
    assert sum(len(these) for these in every) > 100  # the fleet alerts, at many thresholds
    assert any(i.closed_step >= 0 for these in every for i in these)  # and some alerts close
    assert any(i.node_level for these in every for i in these)  # some of them node-level
    assert got == _described(every)


def test_a_hold_level_over_the_threshold_updates_every_slot() -> None:
    # Refused by the manifest, but the batch path must not change its incidents silently.
    risk, present, modes = _fleet(3)
    policy = AlertPolicy(hold_ratio=1.5)
    thresholds = [0.1, 0.3]
    expected = _described(_every_slot(risk, present, modes, thresholds, policy))
    assert _described(track(risk, present, modes, thresholds, policy, GPUS, NODE_LEVEL_MODES)) == expected
