"""What a model can see: which of its inputs a fleet's data carries, which feature groups are blind
for want of them, how much of the model's weight those groups carry, and what to export to give it
sight.

A model fed seven of dcgm-exporter's default metrics scores quietly: not because the fleet is
healthy, but because the features that would show trouble (ECC and PCIe error rates, throttling,
NVLink, the network) have nothing to read. This report says so, in three parts:

- the inputs: every column the model's features read (catalogue columns of telemetry.parquet, the
  step summaries `*_step_min/max/mean` with `step_scrapes`, the network columns of network.parquet),
  present (some value that is not NaN) or absent;
- the feature groups: each feature's inputs come from the feature engine's own tables
  (faultcast.model.features.engine: WINDOW_GAUGES, FLAGS, RATES, NODE_RATES, NODE_GAUGES; feature_steps:
  RANGED, SHARED), matched by the name prefix the engine gives the feature; a feature sees when its
  inputs arrive (all of them for a gauge derived from two, any for a counter group such as the memory
  Xids). A feature's group is its first input's, from the input's name (thermal, power, clocks,
  throttle, memory ECC, row remap, PCIe, NVLink, Xid, NVML health, step summaries, InfiniBand, TCP,
  peer probes); features that read no exporter (presence and hardware bookkeeping) are always seen
  and are left out of the groups. Each group carries its share of the risk booster's total gain
  (LightGBM's feature importance), so the report ranks what matters;
- the fixes: for each absent input, the counters-file line of dcgm-exporter (`DCGM_FI_..., gauge,
  help.`, in the vocabulary the data uses), node_exporter's collector flag, or what only
  `faultcast collect` or a finer scrape gives.

`of_data` reports on a data directory (an import or a twin); the service builds the same view from
the samples it receives (faultcast.service.visibility_monitor) through `FeatureMap` and `view`.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from faultcast.catalogue import Metric, Scope, by_name
from faultcast.dcgm import Vocabulary, names
from faultcast.model.artifact import FaultModel
from faultcast.model.features.engine import (
    FLAGS,
    GPU_INPUTS,
    NODE_GAUGES,
    NODE_INPUTS,
    NODE_RATES,
    RATES,
    WINDOW_GAUGES,
)
from faultcast.model.features.groups import GROUPS, input_group
from faultcast.model.features.parquet_parts import ParquetParts, table_exists
from faultcast.model.features.steps import RANGED, SHARED
from faultcast.model.importers.names import NODE_EXPORTER
from faultcast.step_summary import MIN_SCRAPES, SCRAPES_COLUMN

# -- which inputs each feature reads --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Source:
    """The inputs behind the features whose names start with `key`: seen when all of `inputs` arrive
    (any of them, for a counter group); `group` names the group of features that read no input."""

    key: str
    inputs: tuple[str, ...]
    any_of: bool = False
    group: str = ""


# The engine's derived gauges and health columns, and the features that read no exporter input: the
# few relations its code states rather than its tables (tests/test_visibility.py checks every one by
# blanking inputs in a real engine).
_DERIVED: dict[str, tuple[str, ...]] = {
    "thermal_residual": ("gpu_temp", "power_usage"),
    "pcie_width_deficit": ("pcie_link_width", "pcie_link_width_max"),
    "pcie_gen_deficit": ("pcie_link_gen", "pcie_link_gen_max"),
    "unsupported_fields": ("nvml_unsupported_fields",),
    "power_limit": ("power_limit",),
}
_BOOKKEEPING: dict[str, str] = {
    "is_h100": "hardware",
    "missing_inputs": "presence",
    "missing_share": "presence",
    "sample_late_ratio": "presence",
    "frozen_now": "presence",
}


@cache
def sources() -> tuple[Source, ...]:
    """Every source of features, from the feature engine's tables."""
    out = [Source(key, inputs) for key, inputs in _DERIVED.items()]
    out += [Source(key, (), group=group) for key, group in _BOOKKEEPING.items()]
    out += [Source(g, _DERIVED.get(g, (g,))) for g in WINDOW_GAUGES if g not in _DERIVED]
    out += [Source(f, (f,)) for f in FLAGS]
    out += [Source(name, columns, any_of=True) for name, columns in RATES]
    out += [Source(f"node_{name}", columns, any_of=True) for name, columns in NODE_RATES]
    out += [Source(f"node_{g}", (g,)) for g in NODE_GAUGES]
    out += [Source(f"{m}_step_range", (f"{m}_step_min", f"{m}_step_max", SCRAPES_COLUMN)) for m in RANGED]
    out += [Source(f"{f}_step_share", (f"{f}_step_mean", SCRAPES_COLUMN)) for f in SHARED]
    keys = [s.key for s in out]
    assert len(keys) == len(set(keys)), "two feature sources share a key"
    return tuple(out)


def source_of(feature: str) -> Source | None:
    """The source of a feature: the longest key that is the name or a prefix of it up to a `_`."""
    best: Source | None = None
    for s in sources():
        if (feature == s.key or feature.startswith(s.key + "_")) and (
            best is None or len(s.key) > len(best.key)
        ):
            best = s
    return best


@dataclass(frozen=True)
class FeatureMap:
    """A model's features with their sources and groups, and the inputs they read, in file order (the
    GPU columns, the step summary, the node columns)."""

    names: tuple[str, ...]
    sources: tuple[Source | None, ...]
    groups: tuple[str, ...]  # per feature; "" for bookkeeping (always seen)
    inputs: tuple[str, ...]

    @staticmethod
    @cache
    def of(feature_names: tuple[str, ...]) -> FeatureMap:
        found = tuple(source_of(n) for n in feature_names)
        groups = tuple("" if s is None or not s.inputs else input_group(s.inputs[0]) for s in found)
        read = {i for s in found if s is not None for i in s.inputs}
        summary = sorted(i for i in read if input_group(i) == "step summaries" and i != SCRAPES_COLUMN)
        order = [*GPU_INPUTS, *([SCRAPES_COLUMN] if SCRAPES_COLUMN in read else []), *summary, *NODE_INPUTS]
        inputs = tuple(i for i in dict.fromkeys(order) if i in read)
        return FeatureMap(tuple(feature_names), found, groups, inputs)

    def unmatched(self) -> tuple[str, ...]:
        """Features no source names (a feature the engine added since this table was written)."""
        return tuple(n for n, s in zip(self.names, self.sources, strict=True) if s is None)

    def group_names(self) -> tuple[str, ...]:
        """The groups of the model's features, in GROUPS order."""
        have = set(self.groups)
        return tuple(g for g in (*GROUPS, "other") if g in have)

    def group_inputs(self, group: str) -> tuple[str, ...]:
        """The inputs the group's features read, in `inputs` order."""
        read = {
            i for s, g in zip(self.sources, self.groups, strict=True) if g == group and s for i in s.inputs
        }
        return tuple(i for i in self.inputs if i in read)

    def seen(self, present: Collection[str]) -> np.ndarray:
        """(features,) bool: whether each feature's inputs arrive, given the inputs `present`."""
        out = np.ones(len(self.names), dtype=bool)
        for k, s in enumerate(self.sources):
            if s is not None and s.inputs:
                have = [i in present for i in s.inputs]
                out[k] = any(have) if s.any_of else all(have)
        return out

    def index(self, group: str) -> np.ndarray:
        """The positions of the group's features."""
        return np.array([k for k, g in enumerate(self.groups) if g == group], dtype=np.int64)

    def visible_share(self, present: Collection[str]) -> dict[str, float]:
        """Per group, the share of its features whose inputs arrive (1 visible, 0 blind)."""
        seen = self.seen(present)
        return {group: float(seen[self.index(group)].mean()) for group in self.group_names()}


def importance(model: FaultModel) -> np.ndarray:
    """(features,) each feature's share of the risk booster's total gain (zeros when it has none)."""
    gain = np.asarray(model.booster.feature_importance(importance_type="gain"), dtype=np.float64)
    if len(gain) != len(model.feature_names):
        return np.zeros(len(model.feature_names))
    total = float(gain.sum())
    return gain / total if total > 0 else np.zeros_like(gain)


# -- what to export ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fix:
    """One change that adds inputs: `how` is "dcgm-exporter" (a counters-file line), "node_exporter"
    (a collector flag), "step summaries" or "faultcast collect"; `line` says exactly what."""

    how: str
    line: str
    note: str = ""


_COLLECT = "faultcast collect"
_STEPS = "step summaries"
_STEP_LINE = (
    "scrape at 10 s or faster and import with `faultcast import-prometheus --url` (it reads "
    "min/max/avg_over_time per step), "
    "or run `faultcast collect`, which ships each step's summary"
)


def _counters_line(metric: Metric, vocabulary: Vocabulary) -> str | None:
    named = names(vocabulary).get(metric.name)
    if named is None:
        return None
    return f"{named.name}, {'counter' if named.counter else 'gauge'}, {metric.help}"


def _node_exporter_collector(series: str) -> str:
    """The node_exporter collector that exports a series: node_<collector>_..., netdev's as node_network_."""
    word = series.split("_")[1]
    return "netdev" if word == "network" else word


def fix_for(name: str, vocabulary: Vocabulary = Vocabulary.CLASSIC) -> Fix:
    """How to get one input: the exporter line, flag or source that carries it."""
    if input_group(name) == "step summaries":
        return Fix(_STEPS, _STEP_LINE)
    try:
        metric = by_name(name)
    except KeyError:
        return Fix(_COLLECT, f"run `{_COLLECT}` (it reads {name})")
    line = _counters_line(metric, vocabulary)
    if line is not None:
        return Fix("dcgm-exporter", line)
    if metric.scope is Scope.GPU:
        base = metric.read.split()[0]
        if metric.family == "faultcast_xid_events_total":
            xid = _counters_line(by_name("xid_last"), vocabulary)
            assert xid is not None
            return Fix(
                "dcgm-exporter",
                xid,
                "the import counts Xids by code from the last Xid's changes (a lower bound); "
                f"`{_COLLECT}` counts each event",
            )
        try:
            line = _counters_line(by_name(base), vocabulary)
        except KeyError:
            line = None
        if line is not None:
            return Fix(
                "dcgm-exporter", line, f"the import derives the {input_group(name)} inputs from its bits"
            )
        return Fix(_COLLECT, f"run `{_COLLECT}`: no dcgm-exporter field measures {name} ({metric.help})")
    series = [s for s, other in NODE_EXPORTER.items() if other.metric == name]
    if series:
        flag = f"--collector.{_node_exporter_collector(series[0])}"
        return Fix("node_exporter", flag)
    return Fix(_COLLECT, f"run `{_COLLECT}`: no standard exporter measures {name} ({metric.help})")


# -- the report ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupView:
    """One feature group: its share of the model's gain, its features seen, its inputs."""

    group: str
    importance: float  # share of the risk booster's gain, 0 to 1
    features: int
    seen: int  # features whose inputs arrive
    present: tuple[str, ...]
    absent: tuple[str, ...]

    @property
    def status(self) -> str:
        """ "visible" (every feature sees), "partial" or "blind" (none does)."""
        if self.seen == self.features:
            return "visible"
        return "blind" if self.seen == 0 else "partial"

    @property
    def visible(self) -> float:
        """The share of its features that see: faultcast_model_feature_group_visible."""
        return self.seen / self.features if self.features else 1.0


@dataclass(frozen=True)
class Visibility:
    """The report: groups by importance (largest first), and the fixes for what is absent."""

    source: str
    groups: tuple[GroupView, ...]
    fixes: tuple[tuple[Fix, tuple[str, ...], tuple[str, ...]], ...]  # (fix, inputs, groups), by importance
    bookkeeping_features: int
    bookkeeping_importance: float
    vocabulary: Vocabulary = Vocabulary.CLASSIC
    derived: Mapping[str, str] = field(default_factory=dict)  # input -> what the import derived it from

    def blind(self) -> tuple[str, ...]:
        """The blind groups, most important first."""
        return tuple(g.group for g in self.groups if g.status == "blind")

    def partial(self) -> tuple[str, ...]:
        return tuple(g.group for g in self.groups if g.status == "partial")

    def unseen_importance(self) -> float:
        """The share of the model's gain in features that cannot see."""
        return float(sum(g.importance * (1.0 - g.visible) for g in self.groups))

    def lines(self, how: str) -> list[str]:
        """The fixes of one kind, most important first, each once."""
        return [f.line for f, _, _ in self.fixes if f.how == how]

    def to_json(self) -> dict[str, Any]:
        """Every figure as plain JSON."""
        present = [i for g in self.groups for i in g.present]
        absent = [i for g in self.groups for i in g.absent]
        return {
            "source": self.source,
            "blind_groups": list(self.blind()),
            "partial_groups": list(self.partial()),
            "unseen_importance": round(self.unseen_importance(), 6),
            "groups": [
                {
                    "group": g.group,
                    "status": g.status,
                    "visible": round(g.visible, 6),
                    "importance": round(g.importance, 6),
                    "features": g.features,
                    "features_seen": g.seen,
                    "inputs_present": list(g.present),
                    "inputs_absent": list(g.absent),
                }
                for g in self.groups
            ],
            "inputs": {"present": list(dict.fromkeys(present)), "absent": list(dict.fromkeys(absent))},
            "derived": dict(self.derived),
            "fixes": [
                {"how": f.how, "line": f.line, "note": f.note, "inputs": list(inputs), "groups": list(groups)}
                for f, inputs, groups in self.fixes
            ],
            "dcgm_exporter_lines": self.lines("dcgm-exporter"),
            "node_exporter_flags": self.lines("node_exporter"),
            "vocabulary": self.vocabulary.value,
            "bookkeeping": {
                "features": self.bookkeeping_features,
                "importance": round(self.bookkeeping_importance, 6),
            },
        }

    def render(self) -> str:
        """The report for the console."""
        blind, partial = self.blind(), self.partial()
        lines = [
            f"what the model can see in {self.source}: {len(blind)} of {len(self.groups)} feature groups blind, "
            f"{len(partial)} partly; features that cannot see carry {self.unseen_importance():.0%} of the "
            "model's gain"
        ]
        lines.append(f"  {'group':15s} {'gain':>6s}  {'seen':>7s}  inputs absent")
        for g in self.groups:
            seen = {"visible": "all", "blind": "BLIND"}.get(g.status, f"{g.seen}/{g.features}")
            missing = ", ".join(g.absent) if g.absent else "-"
            if len(missing) > 70:
                missing = f"{', '.join(g.absent[:3])} and {len(g.absent) - 3} more"
            lines.append(f"  {g.group:15s} {g.importance:6.1%}  {seen:>7s}  {missing}")
        lines.append(
            f"  ({self.bookkeeping_features} presence and hardware features read no exporter: "
            f"{self.bookkeeping_importance:.1%} of the gain)"
        )
        for name, origin in self.derived.items():
            lines.append(f"  {name}: derived from {origin}")
        if not self.fixes:
            lines.append("every input the model reads is there")
            return "\n".join(lines)
        lines.append("to give it sight:")
        dcgm = [f for f, _, _ in self.fixes if f.how == "dcgm-exporter"]
        if dcgm:
            lines.append(
                "  dcgm-exporter: add to its counters file (etc/default-counters.csv, or the file its -f names):"
            )
            for f in dcgm:
                if f.note:  # a comment line of its own: the lines copy into the file as they are
                    lines.append(f"    # {f.note}")
                lines.append(f"    {f.line}")
        node = [(f, inputs) for f, inputs, _ in self.fixes if f.how == "node_exporter"]
        if node:
            lines.append(
                "  node_exporter: enable the collectors (on by default unless --collector.disable-defaults):"
            )
            for f, inputs in node:
                lines.append(f"    {f.line}  ({', '.join(inputs)})")
        for f, _, _ in self.fixes:
            if f.how == _STEPS:
                lines.append(f"  step summaries: {f.line}")
        collect = [(f, inputs, groups) for f, inputs, groups in self.fixes if f.how == _COLLECT]
        if collect:
            by_group: dict[str, list[str]] = {}
            for _, inputs, groups in collect:
                for group in groups:
                    by_group.setdefault(group, []).extend(i for i in inputs if input_group(i) == group)
            shown = "; ".join(f"{g} ({', '.join(dict.fromkeys(i))})" for g, i in by_group.items())
            lines.append(f"  only `{_COLLECT}` measures: {shown}")
        return "\n".join(lines)


def view(
    model: FaultModel,
    present: Collection[str],
    *,
    source: str,
    vocabulary: Vocabulary = Vocabulary.CLASSIC,
    derived: Mapping[str, str] | None = None,
) -> Visibility:
    """The report for a model given the inputs `present` (names from `FeatureMap.inputs`)."""
    fmap = FeatureMap.of(tuple(model.feature_names))
    weight = importance(model)
    seen = fmap.seen(present)
    groups: list[GroupView] = []
    for group in fmap.group_names():
        index = fmap.index(group)
        inputs = fmap.group_inputs(group)
        groups.append(
            GroupView(
                group,
                float(weight[index].sum()),
                len(index),
                int(seen[index].sum()),
                tuple(i for i in inputs if i in present),
                tuple(i for i in inputs if i not in present),
            )
        )
    groups.sort(key=lambda g: (-g.importance, GROUPS.index(g.group) if g.group in GROUPS else len(GROUPS)))
    rank = {g.group: k for k, g in enumerate(groups)}
    # One entry per line to add (the throttle flags share one field, the InfiniBand counters one flag).
    fixes: dict[tuple[str, str], tuple[Fix, list[str], list[str]]] = {}
    for g in groups:
        for name in g.absent:
            fix = fix_for(name, vocabulary)
            _, found, fixed = fixes.setdefault((fix.how, fix.line), (fix, [], []))
            found.append(name)
            if g.group not in fixed:
                fixed.append(g.group)
    ordered = sorted(fixes.values(), key=lambda item: min(rank[g] for g in item[2]))
    bookkeeping = [k for k, g in enumerate(fmap.groups) if g == ""]
    return Visibility(
        source,
        tuple(groups),
        tuple((f, tuple(inputs), tuple(fixed)) for f, inputs, fixed in ordered),
        len(bookkeeping),
        float(weight[bookkeeping].sum()),
        vocabulary,
        dict(derived or {}),
    )


# -- a data directory ----------------------------------------------------------------------------


def _with_data(path: Path, wanted: Sequence[str]) -> set[str]:
    """The columns of `wanted` in a table (a parquet file or a directory of them) that hold a value other
    than NaN or null: the row groups' statistics where the writer kept them (no data read), the column
    chunk where it did not."""
    if not table_exists(path):
        return set()
    parquet = ParquetParts(path)
    position = {parquet.schema.column(j).name: j for j in range(len(parquet.schema))}
    out: set[str] = set()
    for name in wanted:
        j = position.get(name)
        if j is None:
            continue
        for group in range(parquet.num_row_groups):
            chunk = parquet.row_group(group).column(j)
            stats = chunk.statistics if chunk.is_stats_set else None
            if stats is not None:
                # Arrow leaves NaN and null out of the minimum and maximum: none means no value.
                if stats.has_min_max and (name != SCRAPES_COLUMN or float(stats.max) >= MIN_SCRAPES):
                    out.add(name)
                    break
                continue
            values = parquet.read_row_group(group, columns=[name]).column(0).to_numpy(zero_copy_only=False)
            values = np.asarray(values, dtype=np.float64)
            if name == SCRAPES_COLUMN:
                if (np.nan_to_num(values) >= MIN_SCRAPES).any():
                    out.add(name)
                    break
            elif np.isfinite(values).any():
                out.add(name)
                break
    return out


def present_inputs(data_dir: Path, inputs: Sequence[str]) -> set[str]:
    """Those of `inputs` with data in a data directory: telemetry.parquet for GPU columns and the step
    summary (`step_scrapes` counts when a step summarises MIN_SCRAPES scrapes or more; the summary's
    columns only with it), network.parquet for node columns."""
    node = set(NODE_INPUTS)
    gpu = [i for i in inputs if i not in node]
    out = _with_data(data_dir / "telemetry.parquet", gpu)
    if SCRAPES_COLUMN not in out:
        out = {i for i in out if input_group(i) != "step summaries"}
    out |= _with_data(data_dir / "network.parquet", [i for i in inputs if i in node])
    return out


def _manifest(data_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((data_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def vocabulary_of(manifest: Mapping[str, Any]) -> Vocabulary:
    """DCGM 4.6's canonical names when an import read series under them (and none under the classic
    ones), else the classic names of dcgm-exporter's default counters file."""
    mapped = manifest.get("mapped")
    if not isinstance(mapped, Mapping):
        return Vocabulary.CLASSIC
    series = {s for by_series in mapped.values() if isinstance(by_series, Mapping) for s in by_series}
    canonical = {n.name for n in names(Vocabulary.CANONICAL).values()}
    classic = {n.name for n in names(Vocabulary.CLASSIC).values()}
    if series & (canonical - classic) and not series & (classic - canonical):
        return Vocabulary.CANONICAL
    return Vocabulary.CLASSIC


def of_data(model: FaultModel | Path, data_dir: Path) -> Visibility:
    """The report for a model (a loaded one, or a `faultcast train` directory) on a data directory."""
    if isinstance(model, Path):
        from faultcast.model.artifact import load

        model = load(model)
    fmap = FeatureMap.of(tuple(model.feature_names))
    manifest = _manifest(data_dir)
    present = present_inputs(data_dir, fmap.inputs)
    derived_entries = manifest.get("derived")
    entries = derived_entries if isinstance(derived_entries, Mapping) else {}
    derived = {
        name: str(entries[name].get("from", ""))
        for name in fmap.inputs
        if name in present and isinstance(entries.get(name), Mapping)
    }
    # One line for the Xid counters the import derives alike.
    merged: dict[str, str] = {}
    for origin in dict.fromkeys(derived.values()):
        inputs = [n for n, o in derived.items() if o == origin]
        merged[inputs[0] if len(inputs) == 1 else f"{inputs[0]} (and {len(inputs) - 1} more)"] = origin
    return view(model, present, source=str(data_dir), vocabulary=vocabulary_of(manifest), derived=merged)
