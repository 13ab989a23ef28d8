"""Reading the figures a benchmark prints, for the benchmarks' smoke tests."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
NUMBER = r"(-?[0-9][0-9,]*(?:\.[0-9]+)?)"


def quick_run(bench: str, model: Path, timeout_s: float, *extra: str) -> str:
    """Run `bench/<bench>.py --quick --model MODEL [EXTRA...]`; its stdout, once it exited cleanly."""
    run = subprocess.run(
        [sys.executable, str(BENCH / f"{bench}.py"), "--quick", "--model", str(model), *extra],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-12000:]
    return run.stdout


def figures(output: str, label: str, unit: str) -> list[float]:
    """Every value printed on a line that starts with `label`, as `NUMBER unit`, in order."""
    found = re.findall(rf"^\s*{re.escape(label)}\s+{NUMBER} ?{re.escape(unit)}", output, re.MULTILINE)
    return [float(v.replace(",", "")) for v in found]
