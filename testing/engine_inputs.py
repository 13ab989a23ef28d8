"""Random inputs for the feature engine, with everything real telemetry throws at it: NaN gaps, sparse
exports, counter resets, frozen exporters, absent GPUs and nodes, infinities, step summaries of too few
scrapes, replaced GPUs and runs of empty steps. Shared by tests/test_features_speed.py (the fast engine
against the frozen reference) and bench/feature_path.py (the engine's ms a step)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from faultcast.model.features.engine import GPU_INPUTS, NODE_INPUTS, RATES
from faultcast.model.features.steps import WIDTH
from faultcast.step_summary import MIN_SCRAPES

_COL = {name: i for i, name in enumerate(GPU_INPUTS)}
_COUNTERS = np.array([_COL[c] for _, cs in RATES for c in cs])
_GAUGES = np.array([i for i in range(len(GPU_INPUTS)) if i not in set(_COUNTERS.tolist())])


@dataclass(frozen=True)
class EngineStep:
    """One step's call: `update(step, gpu, node, is_h100, summary)`, after `reset_slots(reset)` and, when
    `skip` > 0, after `skip(step - skip, skip)`."""

    step: int
    gpu: np.ndarray
    node: np.ndarray
    is_h100: np.ndarray
    summary: np.ndarray | None
    reset: np.ndarray
    skip: int


def engine_steps(
    seed: int, nodes: int, gpus: int, steps: int, *, messy: bool = True, summaries: bool = True
) -> Iterator[EngineStep]:
    """`steps` steps of `nodes` x `gpus` GPUs. messy=False: every GPU and node read every step (the
    bench's steady state)."""
    rng = np.random.default_rng(seed)
    n = nodes * gpus
    gauges = rng.uniform(20.0, 500.0, (n, len(_GAUGES)))
    counters = np.zeros((n, len(_COUNTERS)))
    node_counters = np.zeros((nodes, len(NODE_INPUTS)))
    is_h100 = (rng.random(n) < 0.5).astype(np.float64)
    absent = rng.random(n) < (0.05 if messy else 0.0)  # GPUs that never report
    sparse = rng.random(n) < (0.1 if messy else 0.0)  # exported every `every` steps
    every = rng.integers(2, 12, n)
    frozen_until = np.full(n, -1)
    frozen_rows = np.zeros((n, len(GPU_INPUTS)))
    flags = [_COL[c] for c in GPU_INPUTS if c.startswith(("throttle_", "row_remap_"))]
    k = 0
    while k < steps:
        skip = 0
        if messy and rng.random() < 0.01:
            skip = int(rng.integers(1, 90))  # a silence of the whole fleet (skipped online)
        k += skip
        gauges += rng.normal(0.0, 2.0, gauges.shape)
        counters += rng.poisson(0.3, counters.shape) * (rng.random(counters.shape) < 0.3)
        node_counters += rng.poisson(0.5, node_counters.shape)
        gpu = np.empty((n, len(GPU_INPUTS)))
        gpu[:, _GAUGES] = np.round(gauges, 1)
        gpu[:, _COUNTERS] = counters
        gpu[:, flags] = rng.random((n, len(flags))) < 0.05
        gpu[:, _COL["pcie_link_width"]] = np.where(rng.random(n) < 0.02, 8.0, 16.0)
        gpu[:, _COL["pcie_link_width_max"]] = 16.0
        node = node_counters.copy()
        node[:, -3:] = rng.uniform(0.0, 1.0, (nodes, 3))
        reset = np.zeros(0, dtype=np.int64)
        if messy:
            resets = rng.random(counters.shape) < 0.002  # driver reloads: counters restart from zero
            counters[resets] = 0.0
            gpu[rng.random(gpu.shape) < 0.03] = np.nan  # single readings lost
            gpu[rng.random(n) < 0.03] = np.nan  # whole samples lost
            gpu[absent] = np.nan
            gpu[sparse & (k % every != 0)] = np.nan
            node[rng.random(node.shape) < 0.05] = np.nan
            node[rng.random(nodes) < 0.02] = np.nan
            gpu[rng.random(gpu.shape) < 0.001] = np.inf
            start = (rng.random(n) < 0.003) & (frozen_until < k)
            frozen_until[start] = k + rng.integers(5, 120, int(start.sum()))
            frozen_rows[start] = gpu[start]
            held = frozen_until >= k
            gpu[held] = frozen_rows[held]  # a frozen exporter: the same values again and again
            if rng.random() < 0.02:
                reset = np.sort(rng.choice(n, int(rng.integers(1, 4)), replace=False))
        summary = _summary(rng, n, gpu, messy) if summaries else None
        yield EngineStep(k, gpu, node, is_h100.copy(), summary, reset, skip)
        k += 1


def _summary(rng: np.random.Generator, n: int, gpu: np.ndarray, messy: bool) -> np.ndarray:
    out = np.full((n, WIDTH), np.nan)
    out[:, 0] = np.where(rng.random(n) < (0.2 if messy else 0.0), rng.integers(0, MIN_SCRAPES, n), 6.0)
    out[:, 1:] = rng.uniform(0.0, 400.0, (n, WIDTH - 1))
    if messy:
        out[rng.random(out.shape) < 0.05] = np.nan
        out[:, 0] = np.nan_to_num(out[:, 0])
        out[np.isnan(gpu).all(axis=1), 0] = 0.0
    return out
