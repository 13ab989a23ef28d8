"""`faultcast simulate --family faultcast-trace`: the twin with the InfiniteHBD trace's node history."""

from __future__ import annotations

import json
from pathlib import Path

from faultcast import cli
from faultcast.sim.world import TRACE_CALIBRATION, TRACE_FAMILY, World


def test_the_trace_family_writes_a_calibrated_world_over_the_drawn_one(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    flags = ["--nodes", "2", "--days", "0.1", "--interval", "300", "--world-seed", "7"]
    assert cli.main(["simulate", "--family", TRACE_FAMILY, *flags, "--out", str(out)]) == 0
    world = json.loads((out / "manifest.json").read_text())["world"]
    assert world["family"] == TRACE_FAMILY
    assert world["seed"] == 7
    # The drawn world's own failure rate, times the calibration's (which offsets the refaults).
    drawn = World.draw(7)
    scale = drawn.failure_rate_scale * TRACE_CALIBRATION["failure_rate_scale"]
    assert world["parameters"]["failure_rate_scale"] == scale
    for name in ("frailty_shape", "refault_p", "downtime_sigma", "downtime_scale"):
        assert world["parameters"][name] == TRACE_CALIBRATION[name], name
