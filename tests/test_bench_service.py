"""The service benchmark's smoke run: it completes and prints every figure. No timing is asserted;
the figures themselves are recorded in docs/benchmarks.md from a full run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.bench_output import NUMBER, figures, quick_run


def test_quick_run_prints_every_figure(service_model: Path) -> None:
    out = quick_run("service", service_model, timeout_s=120)

    achieved = figures(out, "achieved ingest:", "GPU-samples/s")
    assert len(achieved) == 2  # the paced phase and the unpaced one
    assert all(rate > 0 for rate in achieved)
    assert figures(out, "offered:", "GPU-samples/s") == [800.0]  # 100 nodes x 8 GPUs at 1 Hz
    assert len(figures(out, "ack round trip (generator):       p50", "ms")) == 2
    assert "sample-to-alert latency, exact:   p50" in out
    assert "sample-to-alert latency, service histogram buckets: p50" in out
    assert len(figures(out, "service CPU per 1,000 GPU-samples:", "ms")) == 3  # both phases, without gRPC
    [inproc] = figures(out, "ingest without gRPC:", "GPU-samples/s")
    assert inproc > 0

    [predict] = figures(out, "model.risk batch prediction:", "rows/s")
    assert predict > 0
    [heads] = figures(out, "all of score_pending's heads:", "rows/s")
    assert heads > 0
    ratio = re.search(rf"ingest / raw predict:\s+{NUMBER} / {NUMBER} = {NUMBER}", out)
    assert ratio is not None
    assert float(ratio.group(3)) > 0

    assert re.search(r"sustained >= 20,000 GPU-samples/s: (met|NOT met)", out)
    assert re.search(r"p99 sample-to-alert <= 100 ms at the offered load: (met|NOT met)", out)


def test_quick_run_with_step_summaries_measures_both_kinds_of_sample(service_model: Path) -> None:
    out = quick_run("service", service_model, 120, "--phases", "b", "--summary-scrapes", "60")

    plain, summarised = figures(out, "achieved ingest:", "GPU-samples/s")
    assert plain > 0
    assert summarised > 0
    # Scrapes represented: a plain GPU-sample is one scrape, a summarised one sixty.
    assert figures(out, "scrapes represented:", "scrapes/s (1 per GPU-sample)") == [plain]
    represented = figures(out, "scrapes represented:", "scrapes/s (60 per GPU-sample)")
    assert len(represented) == 2  # the phase, and the ingest without gRPC
    assert represented[0] == pytest.approx(60 * summarised, abs=60)  # both printed rounded
    assert len(figures(out, "ingest without gRPC:", "GPU-samples/s")) == 2
    ratios = re.findall(rf"(phase b-summaries|without gRPC): GPU-samples/s {NUMBER} / {NUMBER} = {NUMBER}; "
                        rf"scrapes represented/s {NUMBER} / {NUMBER} = {NUMBER}", out)  # fmt: skip
    assert [r[0] for r in ratios] == ["phase b-summaries", "without gRPC"]
    assert out.count("rejects / duplicates in window:   0 / 0") == 2  # summarised samples are all taken
