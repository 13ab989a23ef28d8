"""A world: everything about a fleet that a twin run does not fix by its size and seed, drawn from
documented priors.

The twin used to be one world, written by the same hands as the model. A `World` names every knob
that decides how hard prediction is: how often each mode strikes, what share of failures carries a
usable precursor and how loud it is, and how often healthy hardware shows the same signals
(look-alikes), plus the thermal constants. `World()` is the median world (every prior's centre);
`World.draw(seed)` draws a world from the priors (`faultcast simulate --world-seed N`);
`World.from_file(path)` reads a JSON file of overrides over the median, which is how a user describes
their own fleet ("hot racks, SBE-heavy cards"). The world is recorded in the data's manifest, with an
id that changes whenever a parameter does (leave-world-out evaluation compares ids).

Every prior's source, or the word "prior" where none exists, is in docs/failure-modes.md ("Worlds").
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from faultcast.modes import FailureMode

# Bounds a world file cannot pass: multipliers of the literature's figures, and any rate or time.
_SCALES = frozenset(
    {"failure_rate_scale", "precursor_scale", "lead_scale", "strength_median", "aborted_per_precursor",
     "thermal_resistance_scale"}
)  # fmt: skip
_MAX_SCALE = 100.0
_MAX_VALUE = 1e5


@dataclass(frozen=True, slots=True)
class Prior:
    """How a drawn world picks a parameter: uniform on [low, high], or log-uniform when `log`."""

    low: float
    high: float
    log: bool = False

    def draw(self, r: np.random.Generator) -> float:
        """One draw."""
        if self.log:
            return float(math.exp(r.uniform(math.log(self.low), math.log(self.high))))
        return float(r.uniform(self.low, self.high))


@dataclass(frozen=True, slots=True)
class World:
    """The parameters of one world; the defaults are the median world. Rates per GPU-day unless the
    name says otherwise; times in seconds. See PRIORS for the range a drawn world takes each from."""

    family: str = "faultcast-twin"
    seed: int | None = None  # the world seed it was drawn with; None for the median or a file
    # Failures.
    failure_rate_scale: float = 1.0  # multiplies every mode's Llama 3 rate
    mode_rate_scale: dict[str, float] = field(default_factory=dict)  # per mode, on top (absent: 1)
    precursor_scale: float = 1.0  # multiplies each mode's chance that a failure carries a precursor
    lead_scale: float = 1.0  # multiplies each mode's median precursor length
    strength_median: float = 1.0  # median precursor strength (per failure: lognormal, sigma 0.8)
    # Degradations that stop without a failure, per precursor-bearing failure at acceleration 1
    # (acceleration multiplies failures only: these are healthy hardware's).
    aborted_per_precursor: float = 1.0
    # Look-alikes on healthy hardware.
    sbe_heavy_share: float = 0.03  # cards with a steady correctable-error rate that never fail of it
    sbe_heavy_rate_per_min: float = 0.05  # their median rate (lognormal across cards, sigma 1)
    benign_remap_per_day: float = 0.01  # row remaps on those cards (others: 1% of it)
    pcie_trickle_share: float = 0.05  # GPUs with a background PCIe replay trickle
    pcie_trickle_per_min: float = 0.2  # its median rate
    pcie_bursts_per_day: float = 0.1
    pcie_downtrained_share: float = 0.01  # healthy GPUs whose link trained below its maximum for good
    nvlink_marginal_share: float = 0.04  # GPUs with a marginal link: background CRC errors
    nvlink_marginal_per_min: float = 1.0  # their median rate (lognormal, sigma 1.5)
    nvlink_bursts_per_day: float = 0.3
    ib_marginal_port_share: float = 0.05  # ports with a background symbol-error rate
    ib_marginal_per_min: float = 0.5
    ib_bursts_per_port_day: float = 0.05  # symbol-error bursts after reseats, firmware updates
    ib_flaps_per_port_day: float = 0.02  # the link drops and heals within a minute
    ib_congestion_per_node_day: float = 0.2  # 2-30 min of ACK timeouts, discards, peer latency
    hot_rack_share: float = 0.15
    hot_rack_c: float = 4.0
    room_cooling_events_per_rack_month: float = 0.5  # inlet up 8-20 C for 20-120 min, a rack at a time
    rack_power_brakes_per_rack_month: float = 0.5  # every GPU of the rack power-brakes for 1-10 min
    # Power brakes of seconds on healthy hardware (seen in step summaries, rarely by a step's last scrape).
    node_power_transients_per_node_day: float = 0.5  # the node's supply steps: every GPU brakes at once
    brake_blips_per_gpu_day: float = 0.2  # a lone blip on any GPU
    brake_prone_share: float = 0.01  # cards that blip for life and never fail of it
    brake_prone_per_day: float = 20.0  # their median rate (lognormal across cards, sigma 1)
    inlet_daily_c: float = 2.0  # amplitude of the daily inlet cycle
    weather_c: float = 1.5  # day-to-day inlet drift (standard deviation)
    app_xids_per_gpu_week: float = 1.0  # Xid 13/31/43 from user code, while busy
    driver_reloads_per_node_day: float = 0.05  # each resets the volatile counters
    nvml_slow_episodes_per_node_day: float = 0.3  # NVML calls 3-30x slower for 1-20 min, every GPU
    monitoring_gaps_per_node_day: float = 0.1  # no sample at all for 5-60 min
    exporter_freezes_per_node_month: float = 0.5  # the same values repeated for 30 min to 12 h
    bursty_job_share: float = 0.25  # jobs whose power swings idle<->full every few minutes
    step_power_swing: float = 0.08  # a training job's half power swing within a minute, share of the limit
    heavy_job_share: float = 0.3  # jobs that ask for more than the power limit (SW power cap)
    # Thermal physics (see sim/thermal.py).
    tau_die_s: float = 5.0  # die over cold plate
    tau_sink_s: float = 120.0  # cold plate / heatsink over inlet
    thermal_resistance_scale: float = 1.0  # the fleet's cooling: C per W relative to the datasheet figure
    # A node's own failure history (docs/fault-trace.md; TRACE_CALIBRATION sets them to a real fleet's).
    # At their defaults a world draws exactly as before they existed, and its id and manifest are unchanged.
    frailty_shape: float | None = None  # gamma shape of each node's hazard multiplier (mean 1); None: all 1
    refault_p: float = 0.0  # chance a repaired GPU or node fails again soon after it returns
    refault_days: float = 1.0  # mean delay from its return to that refault (exponential), in days
    downtime_sigma: float = 0.5  # lognormal spread of repair times around each mode's median
    downtime_scale: float = 1.0  # multiplies each mode's median repair time
    rack_bursts_per_rack_year: float = 0.0  # rack cooling events that fail several of its nodes at once
    rack_burst_node_p: float = 0.5  # the chance each node of the rack fails in one (a GPU of it overheats)

    @property
    def id(self) -> str:
        """A short hash of every parameter: two runs share it exactly when their worlds are the same."""
        text = json.dumps(self.parameters(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def parameters(self) -> dict[str, Any]:
        """Every parameter but the family and seed, JSON-ready."""
        out = asdict(self)
        out.pop("family")
        out.pop("seed")
        for name, default in _HISTORY_DEFAULTS.items():  # absent at their defaults: older ids stay put
            if out[name] == default:
                del out[name]
        return out

    def to_json(self) -> dict[str, Any]:
        """What the manifest records: family, seed, id and every parameter; World.from_json reads it."""
        return {"family": self.family, "seed": self.seed, "id": self.id, "parameters": self.parameters()}

    @staticmethod
    def from_json(data: dict[str, Any]) -> World:
        """The world of a manifest's "world" entry, or of a user's file: {"parameters": {...}} (or
        the parameters at the top level) over the median world. ValueError naming unknown keys."""
        if "parameters" in data:
            params = data["parameters"]
            extra = sorted(set(data) - {"parameters", "family", "seed", "id"})
            if extra:
                raise ValueError(f'beside "parameters", a world has only family, seed and id; got {extra}')
        else:
            params = data
        if not isinstance(params, dict):
            raise ValueError("the world's parameters are a JSON object of name: value")
        params = dict(params)
        family = params.pop("family", data.get("family", "user"))
        seed = params.pop("seed", data.get("seed"))
        params.pop("id", None)
        if not isinstance(family, str) or family == "independent":
            raise ValueError(
                f'family {family!r}: a name for your world ("independent" is the other generator\'s)'
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed {seed!r}: an integer, or absent")
        known = {f.name for f in fields(World)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"unknown world parameters {unknown}; known: {', '.join(sorted(known))}")
        world = replace(World(), family=family, seed=seed, **params)
        world.check()
        return world

    @staticmethod
    def from_file(path: Path) -> World:
        """A user's world file (JSON): parameters over the median world."""
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot read the world file: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a world file is a JSON object of parameters")
        data.setdefault("family", "user")
        try:
            return World.from_json(data)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from None

    @staticmethod
    def draw(seed: int) -> World:
        """A world drawn from PRIORS by `seed` (the same seed, the same world)."""
        r = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED_0F_3A]))
        values = {name: prior.draw(r) for name, prior in PRIORS.items()}
        # Fleets differ in what breaks most, not only in how often: each mode's rate moves on its own.
        modes = {m.value: float(math.exp(r.normal(0.0, 0.4))) for m in FailureMode}
        # Parameters added later draw from a stream of their own: a seed's earlier parameters stay put.
        later = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED_0F_3B]))
        values |= {name: prior.draw(later) for name, prior in LATER_PRIORS.items()}
        return World(family="faultcast-twin", seed=seed, mode_rate_scale=modes, **values)

    def check(self) -> None:
        """ValueError naming every parameter out of range (negative rates, shares outside [0, 1])."""
        bad = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("family", "seed", "mode_rate_scale") or (
                f.name == "frailty_shape" and value is None
            ):
                continue
            if not isinstance(value, int | float) or isinstance(value, bool):
                bad.append(f"{f.name}={value!r} (a number)")
            elif not math.isfinite(value) or value < 0:
                bad.append(f"{f.name}={value}")
            elif f.name.endswith("_share") and value > 1:
                bad.append(f"{f.name}={value} (a share is at most 1)")
            elif f.name in _SCALES and value > _MAX_SCALE:
                bad.append(f"{f.name}={value} (at most {_MAX_SCALE:g}: a multiplier, not a new physics)")
            elif value > _MAX_VALUE:
                bad.append(f"{f.name}={value} (at most {_MAX_VALUE:g})")
        scales = self.mode_rate_scale if isinstance(self.mode_rate_scale, dict) else {}
        if not isinstance(self.mode_rate_scale, dict):
            bad.append("mode_rate_scale must be an object of mode name: number")
        for mode, scale in scales.items():
            if mode not in set(FailureMode):
                bad.append(f"mode_rate_scale: unknown mode {mode!r}")
            elif isinstance(scale, bool) or not isinstance(scale, int | float):
                bad.append(f"mode_rate_scale[{mode}]={scale!r} (a number)")
            elif not (math.isfinite(scale) and 0 <= scale <= _MAX_SCALE):
                bad.append(f"mode_rate_scale[{mode}]={scale}")
        if not bad and (self.tau_die_s <= 0 or self.tau_sink_s <= 0):
            bad.append("thermal time constants must be positive")
        if not bad and (self.frailty_shape == 0 or self.refault_days <= 0):
            bad.append("frailty_shape (null for none) and refault_days must be positive")
        for name in ("refault_p", "rack_burst_node_p"):
            if not bad and getattr(self, name) > 1:
                bad.append(f"{name}={getattr(self, name)} (a chance is at most 1)")
        if bad:
            raise ValueError("world parameters out of range: " + ", ".join(bad))

    def rate_scale(self, mode: str) -> float:
        """How much this world multiplies `mode`'s base rate."""
        return self.failure_rate_scale * self.mode_rate_scale.get(mode, 1.0)


# The node-history parameters, with World's defaults for them (today's twin: one hazard for all, no
# refaults): left out of a world's parameters at those defaults.
HISTORY_PARAMETERS = (
    "frailty_shape",
    "refault_p",
    "refault_days",
    "downtime_sigma",
    "downtime_scale",
    "rack_bursts_per_rack_year",
    "rack_burst_node_p",
)
_HISTORY_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(World) if f.name in HISTORY_PARAMETERS}

TRACE_FAMILY = "faultcast-trace"
TRACE_CALIBRATION: dict[str, float] = {
    "frailty_shape": 1.5,
    "refault_p": 0.27,
    "refault_days": 1.0,
    "downtime_sigma": 1.9,
    "downtime_scale": 1.8,
    "failure_rate_scale": 0.81,
}
"""The node history that reproduces StepFun's InfiniteHBD fault trace on 400 nodes over 348 days
(docs/fault-trace.md, bench/trace_calibration.py): its share of faults on the most-faulted tenth of the
servers, its recurrence within 7 days, its repair quartiles and its count of faults. failure_rate_scale
offsets the refaults (a fault in 0.27 brings another): with it the fleet fails 1.53 times a node-year."""


TRACE_BURSTS: dict[str, float] = {"rack_bursts_per_rack_year": 0.12, "rack_burst_node_p": 0.5}
"""Rack bursts like the trace's hardware ones (12 faults within a minute of another, the largest nine fans
at once), on 4-node racks: 11 events over 400 servers and 348 days, each failing about two nodes.
trace_calibrated(bursts=True) adds them; without, the calibration is the one first published."""


def trace_calibrated(base: World | None = None, bursts: bool = False) -> World:
    """`base` (the median world when None) with TRACE_CALIBRATION's node history, family faultcast-trace;
    its failure_rate_scale is multiplied by the calibration's, so a drawn world keeps its own rate's spread."""
    world = base if base is not None else World()
    c = TRACE_CALIBRATION
    return replace(
        world,
        family=TRACE_FAMILY,
        frailty_shape=c["frailty_shape"],
        refault_p=c["refault_p"],
        refault_days=c["refault_days"],
        downtime_sigma=c["downtime_sigma"],
        downtime_scale=c["downtime_scale"],
        failure_rate_scale=world.failure_rate_scale * c["failure_rate_scale"],
        rack_bursts_per_rack_year=TRACE_BURSTS["rack_bursts_per_rack_year"] if bursts else 0.0,
        rack_burst_node_p=TRACE_BURSTS["rack_burst_node_p"] if bursts else world.rack_burst_node_p,
    )


PRIORS: dict[str, Prior] = {
    "failure_rate_scale": Prior(0.5, 2.0, log=True),
    "precursor_scale": Prior(0.4, 1.4),
    "lead_scale": Prior(0.5, 2.0, log=True),
    "strength_median": Prior(0.5, 1.5, log=True),
    "aborted_per_precursor": Prior(0.3, 2.0),
    "sbe_heavy_share": Prior(0.01, 0.08),
    "sbe_heavy_rate_per_min": Prior(0.01, 0.3, log=True),
    "benign_remap_per_day": Prior(0.002, 0.05, log=True),
    "pcie_trickle_share": Prior(0.01, 0.15),
    "pcie_trickle_per_min": Prior(0.05, 1.0, log=True),
    "pcie_bursts_per_day": Prior(0.02, 0.5, log=True),
    "pcie_downtrained_share": Prior(0.0, 0.03),
    "nvlink_marginal_share": Prior(0.01, 0.1),
    "nvlink_marginal_per_min": Prior(0.2, 5.0, log=True),
    "nvlink_bursts_per_day": Prior(0.05, 1.0, log=True),
    "ib_marginal_port_share": Prior(0.01, 0.15),
    "ib_marginal_per_min": Prior(0.1, 3.0, log=True),
    "ib_bursts_per_port_day": Prior(0.01, 0.2, log=True),
    "ib_flaps_per_port_day": Prior(0.005, 0.1, log=True),
    "ib_congestion_per_node_day": Prior(0.05, 1.0, log=True),
    "hot_rack_share": Prior(0.0, 0.3),
    "hot_rack_c": Prior(2.0, 8.0),
    "room_cooling_events_per_rack_month": Prior(0.1, 2.0, log=True),
    "rack_power_brakes_per_rack_month": Prior(0.1, 2.0, log=True),
    "inlet_daily_c": Prior(1.0, 4.0),
    "weather_c": Prior(0.5, 3.0),
    "app_xids_per_gpu_week": Prior(0.3, 3.0, log=True),
    "driver_reloads_per_node_day": Prior(1 / 60, 1 / 7, log=True),
    "nvml_slow_episodes_per_node_day": Prior(0.05, 1.0, log=True),
    "monitoring_gaps_per_node_day": Prior(0.02, 0.5, log=True),
    "exporter_freezes_per_node_month": Prior(0.1, 2.0, log=True),
    "bursty_job_share": Prior(0.05, 0.5),
    "heavy_job_share": Prior(0.1, 0.6),
    "tau_die_s": Prior(2.0, 15.0, log=True),
    "tau_sink_s": Prior(30.0, 300.0, log=True),
    "thermal_resistance_scale": Prior(0.85, 1.2),
}
"""The range a drawn world takes each scalar parameter from (the median world sits inside each)."""
LATER_PRIORS: dict[str, Prior] = {
    "node_power_transients_per_node_day": Prior(0.05, 5.0, log=True),
    "brake_blips_per_gpu_day": Prior(0.02, 2.0, log=True),
    "brake_prone_share": Prior(0.0, 0.04),
    "brake_prone_per_day": Prior(3.0, 100.0, log=True),
    "step_power_swing": Prior(0.02, 0.25, log=True),
}
"""Like PRIORS, for the parameters of the step summaries (December 2026), drawn after the others."""
