"""What `faultcast demo` takes, with its defaults: kept apart from the demo itself (faultcast.demo.run,
which loads the service and LightGBM) so the command line can show them without loading either."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from faultcast.sim.schedule import Scenario

# HBM, firmware, NVLink and PCIe failures over about four simulated hours, each precursor starting
# after the first hour: a GPU's own baselines (feature_relative) need an hour of readings, so a
# service that has just started sees its first hour with part of its features missing. Failures on cue have
# textbook precursors (Scenario's default strength, 3; the twin's own range from about 0.2 to 5), so
# the loop is visible in a short run; how the model does on the twin's typical, quiet and missing
# precursors is what `bash bench/model_run.sh` and `bench/leave_world_out.sh` measure (README).
DEFAULT_FAILURES = (
    Scenario("hbm_wear", 0, 3, 160 * 60.0, 45 * 60.0),
    Scenario("firmware", 3, 0, 175 * 60.0),
    Scenario("nvlink", 1, 5, 190 * 60.0, 50 * 60.0),
    Scenario("pcie", 2, 1, 220 * 60.0, 45 * 60.0),
)


@dataclass(frozen=True)
class DemoSettings:
    """The fleet, its pace, the failures on cue and where things go."""

    nodes: int = 4  # simulated nodes, 8 GPUs each
    speed: float = 240.0  # simulated seconds per wall-clock second
    failures: tuple[Scenario, ...] = DEFAULT_FAILURES
    model: Path | None = None  # None: the shipped model (faultcast.model.shipped)
    out: Path = Path("out/demo")  # logs and state of the run
    prometheus_port: int = 9401  # the service's /metrics (0: any free port, printed)
