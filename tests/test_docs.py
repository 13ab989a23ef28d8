from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def test_the_metric_page_matches_the_catalogue() -> None:
    faultcast = Path(sys.executable).with_name("faultcast")
    table = subprocess.run([faultcast, "metrics"], capture_output=True, text=True, check=True).stdout
    page = (ROOT / "docs" / "metrics.md").read_text()
    assert table.strip() in page, "docs/metrics.md is stale: regenerate it with `make docs`"


def test_the_readmes_metric_counts_are_the_catalogues() -> None:
    """The README once said 66 GPU metrics where the catalogue had 67: the count is checked, not kept."""
    from faultcast.catalogue import METRICS, Scope, Source

    gpu = [m for m in METRICS if m.scope is Scope.GPU]
    counts = {source: sum(m.source is source for m in gpu) for source in Source}
    sentence = (
        f"{len(gpu)} per-GPU metrics: {counts[Source.NVML]} read through NVML, {counts[Source.DERIVED]} throttle "
        f"flags derived from them, {counts[Source.SELF]} of the collector's own"
    )
    assert sentence in " ".join((ROOT / "README.md").read_text().split())  # line breaks as spaces


def test_the_readme_five_line_integration_runs_and_survives_an_absent_service(tmp_path: Path) -> None:
    """The README's loop, as written, on a real model; the service it names does not exist here."""
    import torch

    from faultcast.client.protection import Protection

    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- five-line integration", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len([line for line in block.splitlines() if line.strip()]) == 5
    code = block.replace('"faultcast:50051"', '"127.0.0.1:1"').replace("/checkpoints/my-job", str(tmp_path))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    done: list[int] = []

    def train_step(step: int) -> None:
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        done.append(step)

    names: dict[str, Any] = {
        "model": model,
        "optimizer": optimizer,
        "train_step": train_step,
        "total_steps": 30,
    }
    exec(compile(code, "README.md", "exec"), names)  # noqa: S102  # the README's own code
    protection: Protection = names["protection"]
    protection.close()
    assert done == list(range(30))
    assert protection.guard is not None
    assert not protection.guard.connected  # nothing there: training went on unguarded


def test_the_default_counters_table_says_what_the_collector_exports_and_the_model_reads() -> None:
    """docs/metrics.md's table of dcgm-exporter's default counters, row by row, against the code."""
    from faultcast.dcgm import PARITY, Vocabulary, names
    from faultcast.model.features.engine import GPU_INPUTS
    from tests.test_dcgm_parity import DCGM_EXPORTER_TYPES, DEFAULT_COUNTERS, NOT_EXPORTED

    page = (ROOT / "docs" / "metrics.md").read_text()
    section = page.split("### dcgm-exporter's default counters", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
    assert [row[0].removeprefix("| ").strip("`") for row in rows] == list(DEFAULT_COUNTERS)
    catalogue = {n.name: n.metric for n in names(Vocabulary.CLASSIC).values()}
    parity = {field.classic for field in PARITY}
    for field, kind, exported, metric, model, _ in (
        (row[0].removeprefix("| ").strip("`"), *row[1:]) for row in rows
    ):
        assert kind == DCGM_EXPORTER_TYPES.get(
            field, "label" if field == "DCGM_FI_DRIVER_VERSION" else "gauge"
        )
        if field in catalogue:
            assert (exported, metric) == (f"`{field}`", catalogue[field]), field
            assert model == ("yes" if catalogue[field] in GPU_INPUTS else "no"), field
        else:
            assert field in parity | NOT_EXPORTED.keys(), field
            assert exported == (
                f"`{field}`" if field in parity else "a label" if "VERSION" in field else "not exported"
            )
            assert (metric, model) == ("none", "no"), field
