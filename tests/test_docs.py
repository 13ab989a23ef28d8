from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_metric_page_matches_the_catalogue() -> None:
    faultcast = Path(sys.executable).with_name("faultcast")
    table = subprocess.run([faultcast, "metrics"], capture_output=True, text=True, check=True).stdout
    page = (ROOT / "docs" / "metrics.md").read_text()
    assert table.strip() in page, "docs/metrics.md is stale: regenerate it with `make docs`"
