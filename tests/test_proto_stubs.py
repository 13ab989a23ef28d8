"""The committed gRPC/protobuf stubs must be what the pinned generator makes of the .proto files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUBS = ROOT / "proto" / "faultcast" / "v1"


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), str(tmp_path)], check=True, capture_output=True
    )
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "faultcast" / "v1").iterdir()}
    committed = {p.name: p.read_bytes() for p in STUBS.glob("*_pb2*.py*")}
    assert sorted(fresh) == sorted(committed), "stub files differ; run `make proto`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale stubs {stale}: run `make proto` and commit the result"
    assert len(fresh) == 8  # telemetry and alerts: _pb2.py, _pb2.pyi, _pb2_grpc.py, _pb2_grpc.pyi
