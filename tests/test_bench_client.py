"""The trainer client benchmark's smoke run: a real 2-rank torchrun job against a real service
completes and prints every figure, and the figures agree with each other. No timing is asserted;
the figures themselves are recorded in docs/benchmarks.md from a full run."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.bench_output import NUMBER, figures, quick_run

QUICK_STEPS, AGREE_EVERY = 40, 10  # --quick: 1 round, two guarded blocks of 20 steps


def test_quick_run_prints_every_figure(service_model: Path) -> None:
    out = quick_run("client", service_model, timeout_s=400)

    [plain] = figures(out, "mean step time, plain:", "ms")
    [guarded] = figures(out, "mean step time, guarded:", "ms")
    assert plain > 0
    assert guarded > 0
    [ratio] = figures(out, "overhead (guarded-plain)/plain:", "%")
    assert math.isfinite(ratio)
    assert f"{QUICK_STEPS} steps per mode" in out

    # step_end is timed on both ranks, once per guarded step; the agreement runs every 10th.
    step_end = re.findall(r"step_end per call, rank (\d).*mean (\S+) ms.*\(n=(\d+)\)", out)
    assert [(rank, int(n)) for rank, _, n in step_end] == [("0", QUICK_STEPS), ("1", QUICK_STEPS)]
    agreement = re.findall(r"agreement all-reduce, rank \d:\s+\S+ ms per call \((\d+) calls", out)
    assert [int(c) for c in agreement] == [QUICK_STEPS // AGREE_EVERY] * 2
    per_step = re.findall(rf"per-step overhead, rank \d \(step_end total / steps\): {NUMBER} ms", out)
    means = [float(mean) for _, mean, _ in step_end]
    # Every guarded step calls step_end once: its total over the steps is its mean per call.
    assert [float(v) for v in per_step] == pytest.approx(means, abs=0.002)
    assert figures(out, "snapshots during these blocks:", "") == [0.0]
    probe = re.findall(
        r"the same all-reduce back to back, ranks in step, rank \d: \S+ ms per call \((\d+) calls", out
    )
    assert probe == ["100", "100"]
    cpu = re.findall(rf"CPU per step, rank \d.*plain {NUMBER} ms, guarded {NUMBER} ms", out)
    assert len(cpu) == 2
    assert all(float(v) > 0 for pair in cpu for v in pair)

    # One trial: its alert asks for a snapshot, the job takes exactly one and the alert clears.
    counts = re.search(r"snapshots: (\d+); alerts asking for one: (\d+); trials: (\d+)", out)
    assert counts is not None, out
    assert [int(v) for v in counts.groups()] == [1, 1, 1]
    assert "cleared: gpu dark" in out
    assert re.search(r"snapshot at step \d+: noop: drain \S+ and requeue job bench-client", out)
    for label in ("service emitted -> snapshot began:", "bench received -> snapshot began:"):
        [delay] = figures(out, label, "ms")
        assert math.isfinite(delay)
    [guard] = figures(out, "guard received -> snapshot began:", "ms")
    assert guard >= 0
    # It waited for the next agreement step at most: a property of the hook, not of the machine.
    [interval] = figures(out, "agreement step before -> snapshot:", "ms")
    assert interval > 0
    assert "every snapshot began within one agreement interval of the guard's alert: yes" in out
    assert re.search(r"step time while alerts were driven \(no snapshot\): mean .*\(n=\d+\)", out)

    assert re.search(r"per-step overhead <= 1% of a 100 ms step: (met|NOT met)", out)
    assert re.search(r"guard received -> snapshot began <= agree_every x mean step: (met|NOT met)", out)
