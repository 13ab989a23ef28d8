"""Reading the figures a benchmark prints, for the benchmarks' smoke tests."""

from __future__ import annotations

import re

NUMBER = r"(-?[0-9][0-9,]*(?:\.[0-9]+)?)"


def figures(output: str, label: str, unit: str) -> list[float]:
    """Every value printed on a line that starts with `label`, as `NUMBER unit`, in order."""
    found = re.findall(rf"^\s*{re.escape(label)}\s+{NUMBER} ?{re.escape(unit)}", output, re.MULTILINE)
    return [float(v.replace(",", "")) for v in found]
