"""`faultcast demo` (what `make run` runs): collectors, service and subscriber as separate parts, one
HBM failure on cue; it must be predicted ahead and the node drained through the actuator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))


def test_the_demo_predicts_the_ordered_failure_and_drains_the_node(
    service_model: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [FAULTCAST, "demo", "--nodes", "2", "--speed", "480", "--model", str(service_model), "--out",
         str(tmp_path / "demo"), "--prometheus-port", "0", "--failure", "hbm_wear:1:3:150m:40m"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "node-0001 gpu 3 hbm_wear" in out
    summary = out[out.index("summary") :]
    assert "node-0001 gpu 3 hbm_wear    at sim 02:30: predicted" in summary, out[-3000:]
    assert "1 of 1 failures predicted" in summary
    assert "noop: drain node-0001 and requeue job demo-job" in out
    assert (tmp_path / "demo" / "collector-0.log").is_file()
