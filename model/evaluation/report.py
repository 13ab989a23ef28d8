"""Helpers for the notebooks: the held-out evaluation with the scores kept for plots, per-failure lead
times, feature contributions, precursor signals around a failure, healthy look-alikes, and the plots.

Nothing here is on the service's path; matplotlib is a development dependency. Plots are built on
`matplotlib.figure.Figure` directly, not pyplot: no backend or global figure state is touched, and
each function returns its Figure for the caller to save and show (`save_figure`).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from faultcast.catalogue import Kind, by_name
from faultcast.model.artifact import FaultModel
from faultcast.model.evaluation.evaluate import (
    WARMUP_S,
)
from faultcast.model.evaluation.outcomes import (
    DEFAULT_PERIODS,
    PredictionPeriods,
    ScoredPeriod,
    catches,
    incidents,
)
from faultcast.model.features.offline import Dataset, Step, replay
from faultcast.model.features.parquet_parts import ParquetParts
from faultcast.modes import NODE_LEVEL_MODES, FailureMode

METHODS = ("model", "logistic", "rules")
COLORS = {"model": "tab:blue", "logistic": "tab:orange", "rules": "tab:green", "model_dcgm": "tab:purple"}

# ---------------------------------------------------------------------------------------------
# Held-out evaluation


def failure_leads(
    period: ScoredPeriod,
    dataset: Dataset,
    model: FaultModel,
    threshold: float,
    method: str,
    periods: PredictionPeriods = DEFAULT_PERIODS,
) -> pd.DataFrame:
    """One row per failure in the period: when, where, which mode, and the lead of the earliest alert
    of `method` that opened within the prediction period before it (0 when none), exactly as
    `evaluate` counts it (caught when the lead reaches the minimal warning time)."""
    found = incidents(period, method, [threshold], model.policy, NODE_LEVEL_MODES)[0]
    rows = [
        {
            "time_s": c.failure.time_s,
            "node": dataset.nodes[c.failure.node],
            "gpu": c.failure.gpu,
            "mode": c.failure.mode,
            "lead_min": (c.lead_s or 0.0) / 60.0,
        }
        for c in catches(period, dataset.failures, found, periods)
    ]
    return pd.DataFrame(rows, columns=["time_s", "node", "gpu", "mode", "lead_min"])


# ---------------------------------------------------------------------------------------------
# Feature contributions


@dataclass
class _RowSample:
    """A replay sink that keeps the rows before a failure and a seeded share of the others."""

    period: ScoredPeriod
    rate: float
    rng: np.random.Generator
    features: list[np.ndarray]
    labels: list[np.ndarray]

    def __call__(self, step: Step) -> None:
        i = int(np.searchsorted(self.period.times_s, step.time_s))
        if i >= len(self.period.times_s) or self.period.times_s[i] != step.time_s:
            return  # warm-up steps before the scored period
        positive = self.period.labels[i] & step.present
        keep = positive | (step.present & (self.rng.random(len(positive)) < self.rate))
        self.features.append(step.features[keep])
        self.labels.append(positive[keep])


def held_out_rows(
    dataset: Dataset, model: FaultModel, period: ScoredPeriod, negative_rate: float = 0.02, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Feature rows of the scored period (every row before a failure, a share of the rest) and their
    labels, computed the way `score_period` computed them (same nodes, same warm-up)."""
    sink = _RowSample(period, negative_rate, np.random.default_rng(seed), [], [])
    start = float(period.times_s[0])
    replay(
        dataset,
        model.feature_config,
        sink,
        nodes=period.nodes,
        start_s=start - WARMUP_S,
        end_s=float(period.times_s[-1]) + model.feature_config.cadence_s,
    )
    width = len(model.feature_names)
    x = np.concatenate(sink.features) if sink.features else np.zeros((0, width))
    y = np.concatenate(sink.labels) if sink.labels else np.zeros(0, dtype=bool)
    return x, y


def feature_importance(model: FaultModel, features: np.ndarray, labels: np.ndarray) -> pd.DataFrame:
    """Per feature: mean |contribution| to the raw score (SHAP-style, LightGBM's pred_contrib) over
    the rows before a failure and over all sampled rows, and the split gain, largest first."""
    contrib = np.abs(np.asarray(model.booster.predict(features, pred_contrib=True))[:, :-1])
    if contrib.shape[0] == 0:
        contrib = np.zeros((0, len(model.feature_names)))
    positive = contrib[labels] if labels.any() else np.zeros((1, contrib.shape[1]))
    everything = contrib if len(contrib) else np.zeros((1, contrib.shape[1]))
    gain = np.asarray(model.booster.feature_importance(importance_type="gain"), dtype=np.float64)
    table = pd.DataFrame(
        {
            "mean_abs_contribution_before_failure": positive.mean(axis=0),
            "mean_abs_contribution_all_rows": everything.mean(axis=0),
            "gain_share": gain / max(float(gain.sum()), 1e-12),
        },
        index=pd.Index(model.feature_names, name="feature"),
    )
    return table.sort_values("mean_abs_contribution_before_failure", ascending=False)


# ---------------------------------------------------------------------------------------------
# Plots of the evaluation


def save_figure(fig: Figure, path: Path) -> Path:
    """Write the figure as a PNG; returns the path, for IPython.display.Image(filename=...)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def to_png(fig: Figure) -> bytes:
    """The figure as PNG bytes, for IPython.display.Image(data=...)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def plot_pr_curves(period: ScoredPeriod, report: Mapping[str, Any]) -> Figure:
    """Precision against recall on the held-out rows (a row is positive when a failure of its GPU or
    node comes within the horizon), with each method's operating point at its alert threshold."""
    from sklearn.metrics import precision_recall_curve

    labels = period.labels[period.present]
    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.subplots()
    for method in METHODS:
        scores = np.nan_to_num(period.scores[method][period.present], nan=0.0)
        if not labels.any():
            continue
        precision, recall, _ = precision_recall_curve(labels, scores)
        auc = report[method]["pr_auc"]
        ax.step(recall, precision, where="post", color=COLORS[method], label=f"{method} (PR-AUC {auc:.3f})")
        alerting = scores >= report[method]["threshold"]
        if alerting.any():
            ax.plot(labels[alerting].sum() / labels.sum(), labels[alerting].mean(), "o", color=COLORS[method])
    ax.axhline(labels.mean() if len(labels) else 0.0, color="grey", lw=0.8, ls=":", label="base rate")
    title = f"Held-out rows: {int(labels.sum()):,} positive of {len(labels):,} (dots: alert thresholds)"
    ax.set(xlabel="recall (rows)", ylabel="precision (rows)", xlim=(0, 1), ylim=(0, 1.02), title=title)
    ax.legend(loc="upper right", fontsize=8)
    return fig


def plot_lead_times(
    leads: Mapping[str, pd.DataFrame], periods: PredictionPeriods = DEFAULT_PERIODS
) -> Figure:
    """Histogram of how long before each held-out failure the first alert within the prediction
    period came, per method."""
    fig = Figure(figsize=(6.5, 4))
    ax = fig.subplots()
    warning = periods.warning_s / 60.0
    bins = [float(b) for b in np.arange(0.0, periods.period_s / 60.0 + 5.0, 5.0)]
    for method, frame in leads.items():
        caught = frame["lead_min"][frame["lead_min"] >= warning]
        label = f"{method}: {len(caught)} of {len(frame)} caught >= {warning:.0f} min"
        ax.hist(
            frame["lead_min"][frame["lead_min"] > 0],
            bins=bins,
            histtype="step",
            lw=2,
            color=COLORS.get(method),
            label=label,
        )
    ax.axvline(warning, color="grey", ls="--", lw=1, label=f"{warning:.0f} minutes (minimal warning time)")
    ax.set(
        xlabel="lead time of the first alert (minutes)",
        ylabel="failures",
        title="Lead times, held-out failures",
    )
    ax.legend(fontsize=8)
    return fig


def plot_recall_by_mode(report: Mapping[str, Any]) -> Figure:
    """Recall at >= 5 minutes' lead per failure mode, one bar per method."""
    methods = {m: report[m] for m in METHODS}
    if "model_dcgm_default_metrics" in report:
        methods["model_dcgm"] = report["model_dcgm_default_metrics"]
    modes = sorted({mode for m in methods.values() for mode in m["recall_by_mode"]})
    fig = Figure(figsize=(max(6.0, 1.1 * len(modes) + 2), 4))
    ax = fig.subplots()
    width = 0.8 / len(methods)
    for k, (name, metrics) in enumerate(methods.items()):
        values = [metrics["recall_by_mode"].get(mode, np.nan) for mode in modes]
        ax.bar(np.arange(len(modes)) + k * width, values, width, color=COLORS[name], label=name)
    ax.set_xticks(np.arange(len(modes)) + 0.4 - width / 2, modes, rotation=30, ha="right")
    ax.set(ylim=(0, 1.05), ylabel="recall at >= 5 min lead", title="Recall per failure mode (held out)")
    ax.legend(fontsize=8, ncols=2)
    return fig


def plot_feature_importance(table: pd.DataFrame, top: int = 20) -> Figure:
    """The top features by mean |contribution| before failures, and by split gain."""
    fig = Figure(figsize=(12, max(4.0, 0.28 * top + 1)))
    axes = fig.subplots(1, 2)
    for ax, column, title in (
        (
            axes[0],
            "mean_abs_contribution_before_failure",
            "mean |contribution| to the raw score, before failures",
        ),
        (axes[1], "gain_share", "share of split gain"),
    ):
        best = table[column].sort_values(ascending=False).head(top)[::-1]
        ax.barh(list(best.index), best.to_numpy(), color="tab:blue")
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Failure logs and precursor signals

# The catalogue metrics each mode moves before it fails (docs/failure-modes.md, "The modes").
# `sample_missing` is derived: 1 where the GPU's sample did not arrive.
PRECURSORS: dict[str, tuple[str, ...]] = {
    "hbm_wear": ("ecc_sbe_aggregate", "remapped_rows_correctable", "row_remap_pending", "xid_92_events"),
    "cooling": ("gpu_temp", "power_usage", "sm_clock", "throttle_sw_thermal", "throttle_hw_thermal"),
    "power": ("power_usage", "throttle_hw_power_brake", "throttle_hw_slowdown", "sm_clock"),
    "nvlink": (
        "nvlink_crc_flit_errors_worst_link",
        "nvlink_crc_data_errors",
        "nvlink_replay_errors",
        "nvlink_recovery_errors",
    ),
    "pcie": ("pcie_replay", "pcie_link_width", "pcie_link_gen"),
    "infiniband": (
        "ib_symbol_error",
        "ib_link_error_recovery",
        "ib_port_rcv_errors",
        "peer_rtt_p99_seconds",
        "peer_loss_ratio",
        "tcp_retrans_segs",
    ),
    "detachment": ("nvml_call_seconds", "nvml_failed_calls", "sample_missing"),
    "firmware": ("gpu_temp", "power_usage", "xid_119_events", "xid_120_events"),
    "gpu_sram": ("ecc_sbe_volatile", "xid_94_events", "xid_95_events"),
    "silent_data_corruption": ("gpu_temp", "power_usage", "gpu_util"),
    # Node-level modes plot the node's network row (signals_around with gpu None).
    "host": ("tcp_retrans_segs", "peer_rtt_p99_seconds", "sample_missing"),
    "software": ("ib_port_xmit_data", "tcp_out_segs", "tcp_retrans_segs"),
    "nccl_timeout": ("peer_rtt_p99_seconds", "peer_loss_ratio", "tcp_retrans_segs"),
}
if set(PRECURSORS) != {m.value for m in FailureMode}:
    raise RuntimeError("model/evaluation/report.py: every failure mode needs the signals to plot around it")


def is_cumulative(metric: str) -> bool:
    """Plotted as an increase per minute: counters, and the worst link's counter value."""
    if metric == "sample_missing":
        return False
    return by_name(metric).kind is Kind.COUNTER or metric.endswith("_worst_link")


def read_failures(data_dir: Path) -> pd.DataFrame:
    """failures.csv with parsed timestamps and unix seconds (time_s); gpu is <NA> for node-level failures."""
    dtypes: dict[str, str] = {"gpu": "Int64", "xid": "Int64", "node": "str"}
    frame = pd.read_csv(data_dir / "failures.csv", dtype=dtypes)
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True)
    frame["time_s"] = (frame["timestamp"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
    return frame


def read_telemetry(
    data_dir: Path, columns: Sequence[str], nodes: Sequence[str] | None = None, network: bool = False
) -> pd.DataFrame:
    """Some columns of telemetry.parquet (or network.parquet), for some nodes; either may be a directory of
    Parquet files (model/features/parquet_parts.py)."""
    keys = ["timestamp", "node"] if network else ["timestamp", "node", "gpu", "uuid"]
    name = "network.parquet" if network else "telemetry.parquet"
    filters = [("node", "in", list(nodes))] if nodes is not None else None
    table = ParquetParts(data_dir / name).read([*keys, *columns], filters)
    frame: pd.DataFrame = table.to_pandas()
    for key in ("node", "uuid"):
        if key in frame:
            frame[key] = frame[key].astype(str)
    return frame


def signals_around(
    data_dir: Path,
    node: str,
    gpu: int | None,
    moment: pd.Timestamp,
    metrics: Sequence[str],
    before_min: float,
    after_min: float,
    cadence_s: float,
) -> pd.DataFrame:
    """The metrics of one GPU (or, with gpu None, one node's network) on the sampling grid around
    `moment`, indexed by minutes relative to it. Counters become increases per minute (NaN across a
    reset or a replacement); steps without a sample are NaN, and `sample_missing` marks them."""
    real = [m for m in metrics if m != "sample_missing"]
    frame = read_telemetry(data_dir, real, [node], network=gpu is None)
    if gpu is not None:
        frame = frame[frame["gpu"] == gpu]
    step = pd.Timedelta(seconds=cadence_s)
    lo, hi = moment - pd.Timedelta(minutes=before_min), moment + pd.Timedelta(minutes=after_min)
    frame = frame[(frame["timestamp"] >= lo - step) & (frame["timestamp"] <= hi)]
    frame = frame.drop_duplicates("timestamp", keep="last").set_index("timestamp").sort_index()
    offsets_s = np.arange(-int(before_min * 60 / cadence_s), int(after_min * 60 / cadence_s) + 1) * cadence_s
    grid = pd.DatetimeIndex(moment + pd.to_timedelta(offsets_s, unit="s"))

    def on_grid(series: pd.Series) -> pd.Series:
        return series.reindex(grid, method="nearest", tolerance=step / 2)

    out = pd.DataFrame(index=grid)
    for metric in real:
        series = frame[metric].astype(np.float64)
        if is_cumulative(metric):
            minutes = series.index.to_series().diff().dt.total_seconds() / 60.0
            series = series.diff() / minutes
            series = series.where(series >= 0)
        out[metric] = on_grid(series)
    if "sample_missing" in metrics:
        arrived = on_grid(pd.Series(1.0, index=frame.index))
        out["sample_missing"] = arrived.isna().astype(np.float64)
    out.index = pd.Index(offsets_s / 60.0, name="minutes")
    return out


def pick_examples(failures: pd.DataFrame, start: pd.Timestamp, before_min: float) -> pd.DataFrame:
    """One failure per mode: the first with `before_min` of data before it and no earlier failure of
    the same GPU or node in that span (so its precursor is not cut short by a repair)."""
    span = pd.Timedelta(minutes=before_min)
    chosen = []
    for _, group in failures.groupby("mode", sort=False):
        best = group.index[0]
        for index, row in group.iterrows():
            earlier = failures[
                (failures["node"] == row["node"])
                & (failures["timestamp"] < row["timestamp"])
                & (failures["timestamp"] >= row["timestamp"] - span)
            ]
            if row["timestamp"] - span >= start and earlier.empty:
                best = index
                break
        chosen.append(best)
    return failures.loc[chosen].reset_index(drop=True)


def healthy_neighbour(
    failures: pd.DataFrame,
    nodes: Sequence[str],
    gpus_per_node: int,
    node: str,
    gpu: int | None,
    moment: pd.Timestamp,
    before_min: float,
    after_min: float,
) -> tuple[str, int | None] | None:
    """Another GPU of the same node (for a node-level failure, another node) with no failure from
    `before_min` before `moment` to `after_min` after it; None when there is none."""
    lo, hi = moment - pd.Timedelta(minutes=before_min), moment + pd.Timedelta(minutes=after_min)
    busy = failures[(failures["timestamp"] >= lo) & (failures["timestamp"] <= hi)]
    if gpu is None:
        for other in nodes:
            if other != node and not (busy["node"] == other).any():
                return other, None
        return None
    here = busy[busy["node"] == node]
    if here["gpu"].isna().any():
        return None
    taken = {int(g) for g in here["gpu"]}
    for offset in range(1, gpus_per_node):
        other_gpu = (gpu + offset) % gpus_per_node
        if other_gpu not in taken:
            return node, other_gpu
    return None


def rate_per_hour(
    data_dir: Path,
    node: str,
    gpu: int,
    counter: str,
    origin: pd.Timestamp,
    start: pd.Timestamp | None = None,
    end: pd.Timestamp | None = None,
    uuid: str | None = None,
) -> pd.Series:
    """A counter's increase over the trailing hour on one GPU, indexed by hours since `origin`."""
    frame = read_telemetry(data_dir, [counter], [node])
    keep = frame["gpu"] == gpu
    if uuid is not None:
        keep &= frame["uuid"] == uuid
    if start is not None:
        keep &= frame["timestamp"] >= start
    if end is not None:
        keep &= frame["timestamp"] <= end
    series = (
        frame[keep].drop_duplicates("timestamp", keep="last").set_index("timestamp")[counter].sort_index()
    )
    increase = series.astype(np.float64).diff()
    hourly = increase.where(increase >= 0).rolling("60min").sum()
    hourly.index = pd.Index((pd.DatetimeIndex(hourly.index) - origin).total_seconds() / 3600.0, name="hours")
    return hourly


def plot_signals(
    failing: pd.DataFrame,
    neighbour: pd.DataFrame | None,
    title: str,
    neighbour_label: str = "healthy neighbour",
    label: str = "failing",
    event: str = "the failure",
) -> Figure:
    """One panel per metric: the failing unit against a healthy neighbour, the event at minute 0."""
    metrics = list(failing.columns)
    fig = Figure(figsize=(8, 1.6 * len(metrics) + 0.6))
    axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        ax.plot(failing.index, failing[metric], color="tab:red", lw=1.6, label=label)
        if neighbour is not None and metric in neighbour:
            ax.plot(
                neighbour.index, neighbour[metric], color="dimgrey", lw=0.9, alpha=0.8, label=neighbour_label
            )
        ax.axvline(0.0, color="black", ls="--", lw=0.8)
        unit = "/min" if metric != "sample_missing" and is_cumulative(metric) else ""
        ax.set_ylabel(f"{metric}{unit}", fontsize=7, rotation=0, ha="right", va="center")
        ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel(f"minutes relative to {event}")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_failure_overview(failures: pd.DataFrame, nodes: Sequence[str]) -> Figure:
    """Failures per mode, per node (stacked by mode) and over time (one row per node)."""
    modes = [m.value for m in FailureMode]
    colors = {mode: matplotlib.colormaps["tab20"](i % 20) for i, mode in enumerate(modes)}
    fig = Figure(figsize=(10, 10))
    axes = fig.subplots(3, 1, gridspec_kw={"height_ratios": [1, 1, 1.4]})
    counts = failures["mode"].value_counts().reindex(modes, fill_value=0)
    axes[0].bar(counts.index, counts.to_numpy(), color=[colors[m] for m in counts.index])
    axes[0].set(ylabel="failures", title="Failures per mode")
    axes[0].tick_params(axis="x", labelrotation=20)
    per_node = pd.crosstab(failures["node"], failures["mode"]).reindex(index=list(nodes), fill_value=0)
    bottom = np.zeros(len(per_node))
    for mode in modes:
        if mode in per_node:
            axes[1].bar(
                range(len(per_node)), per_node[mode].to_numpy(), bottom=bottom, color=colors[mode], label=mode
            )
            bottom += per_node[mode].to_numpy()
    axes[1].set(ylabel="failures", xlabel="node", title="Failures per node")
    axes[1].legend(fontsize=7, ncols=4)
    index = {name: i for i, name in enumerate(nodes)}
    for name, group in failures.groupby("mode"):
        label = str(name)
        level = label in NODE_LEVEL_MODES
        axes[2].scatter(
            group["timestamp"],
            group["node"].map(index),
            s=30 if level else 14,
            marker="s" if level else "o",
            color=colors.get(label, "black"),
            label=label,
        )
    axes[2].set(ylabel="node", title="Timeline (squares: node-level failures)")
    axes[2].legend(fontsize=7, ncols=4)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Healthy look-alikes


def _gpu_failed(failures: pd.DataFrame, mode: str | None = None) -> set[tuple[str, int]]:
    chosen = failures if mode is None else failures[failures["mode"] == mode]
    chosen = chosen[chosen["gpu"].notna()]
    return {(str(n), int(g)) for n, g in zip(chosen["node"], chosen["gpu"], strict=True)}


def steady_sbe_gpus(data_dir: Path, failures: pd.DataFrame, nodes: Sequence[str]) -> pd.DataFrame:
    """GPUs (by UUID) with a low, steady correctable-error rate over their life and no HBM failure:
    the confounder an SBE threshold trips on. Rate in errors per minute, most first."""
    frame = read_telemetry(data_dir, ["ecc_sbe_aggregate"], nodes)
    life = (
        frame.groupby(["node", "gpu", "uuid"], observed=True)
        .agg(
            first=("timestamp", "min"),
            last=("timestamp", "max"),
            sbe_first=("ecc_sbe_aggregate", "min"),
            sbe_last=("ecc_sbe_aggregate", "max"),
        )
        .reset_index()
    )
    minutes = (life["last"] - life["first"]).dt.total_seconds() / 60.0
    life["sbe_per_min"] = (life["sbe_last"] - life["sbe_first"]) / minutes.where(minutes > 0)
    hbm = _gpu_failed(failures, "hbm_wear")
    healthy = np.array([(str(n), int(g)) not in hbm for n, g in zip(life["node"], life["gpu"], strict=True)])
    steady = life[healthy & (life["sbe_per_min"] > 0) & (life["sbe_per_min"] < 0.2)]
    return steady.sort_values("sbe_per_min", ascending=False).reset_index(drop=True)


def bursts(
    data_dir: Path,
    failures: pd.DataFrame,
    nodes: Sequence[str],
    counter: str,
    quiet_min: float = 120.0,
    network: bool = False,
    min_increase: float = 1.0,
) -> pd.DataFrame:
    """Steps where `counter` rises by at least `min_increase` on a GPU (with `network`, on a node)
    with no failure of that GPU or its node within `quiet_min` before or after: bursts that nothing
    follows. Largest first."""
    frame = read_telemetry(data_dir, [counter], nodes, network=network).sort_values("timestamp")
    if network:
        frame["gpu"] = -1
    keys = ["node"] if network else ["node", "gpu", "uuid"]
    frame["increase"] = frame.groupby(keys, observed=True)[counter].diff()
    jumps = frame[(frame["increase"] > 0) & (frame["increase"] >= min_increase)][
        ["timestamp", "node", "gpu", "increase"]
    ].reset_index(drop=True)
    near = jumps.reset_index().merge(
        failures[["node", "gpu", "timestamp"]], on="node", suffixes=("", "_failure")
    )
    same_unit = near["gpu_failure"].isna() | (near["gpu_failure"] == near["gpu"]) | (near["gpu"] < 0)
    close = (near["timestamp_failure"] - near["timestamp"]).abs() < pd.Timedelta(minutes=quiet_min)
    followed = set(near.loc[(same_unit & close).to_numpy(dtype=bool, na_value=False), "index"])
    alone = jumps[~jumps.index.isin(followed)]
    return alone.sort_values("increase", ascending=False).reset_index(drop=True)


def plot_panels(
    series: Mapping[str, pd.Series],
    title: str,
    ylabel: str,
    threshold: float | None = None,
    threshold_label: str = "",
) -> Figure:
    """Side-by-side panels, one series each, on a shared y axis, with an optional threshold line."""
    fig = Figure(figsize=(5 * max(1, len(series)), 3.4))
    axes = fig.subplots(1, max(1, len(series)), sharey=True, squeeze=False)[0]
    for ax, (name, values) in zip(axes, series.items(), strict=False):
        ax.plot(values.index, values.to_numpy(), lw=1)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(str(values.index.name or ""), fontsize=8)
        ax.tick_params(labelsize=7)
        if threshold is not None:
            ax.axhline(threshold, color="tab:red", ls="--", lw=1, label=threshold_label)
            ax.legend(fontsize=7)
    axes[0].set_ylabel(ylabel, fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
