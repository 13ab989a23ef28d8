"""A third party's stubs of another revision of the .proto files load in the same process as the
installed faultcast. Both register faultcast_api/v1/*.proto and faultcast.v1.* names;
in protobuf's default pool whichever came second failed to import ("duplicate file name"). The
installed stubs now live in a pool of their own (faultcast.v1.pool), the wire names unchanged.

The third party's stubs are generated here from a copy of the files with a field added to two
messages, with the README's protoc command; a subprocess imports them and faultcast's service and
client, in either order, starts a real service and calls it with both stubs. Server reflection
still describes the service's own API, not the third party's revision of it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_third_party_client import ROOT, _readme_protoc

SCRIPT = Path(__file__).with_name("fixtures") / "coexisting_stubs.py"
API = Path("faultcast_api") / "v1"
# The revision the third party has: one more field in a message of each file (old text, new text).
EXTRA_FIELDS = {
    "alerts.proto": (
        "message RegisterJobRequest {\n",
        "message RegisterJobRequest {\n  string team = 100;\n",
    ),
    "telemetry.proto": (
        "message GetSchemaRequest {}",
        "message GetSchemaRequest {\n  string client = 100;\n}",
    ),
}
WAIT_S = 120.0


def _in(source: Path, word: str) -> str:
    """A word of the README's protoc command, with its proto/ folder replaced by `source`."""
    if word == "proto":
        return str(source)
    return str(source / word.removeprefix("proto/")) if word.startswith("proto/") else word


@pytest.fixture(scope="module")
def their_stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("their-proto")
    (source / API).mkdir(parents=True)
    for name, (old, new) in EXTRA_FIELDS.items():
        text = (ROOT / "proto" / API / name).read_text()
        assert old in text
        (source / API / name).write_text(text.replace(old, new))
    out = tmp_path_factory.mktemp("their-gen")
    command = [_in(source, word) for word in _readme_protoc(out)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=120)
    assert "team" in (out / API / "alerts_pb2.py").read_text()
    return out


@pytest.mark.parametrize("order", ["third-party-first", "faultcast-first"])
def test_their_stubs_and_faultcast_load_together_and_call_a_real_service(
    their_stubs: Path, stub_model: Path, tmp_path: Path, order: str
) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(stub_model, model_dir)
    env = {**os.environ, "PYTHONPATH": str(their_stubs)}
    ran = subprocess.run(
        [sys.executable, str(SCRIPT), order, str(model_dir), str(tmp_path / "state")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert ran.returncode == 0, ran.stderr[-4000:]
    said = json.loads(ran.stdout.strip().splitlines()[-1])
    assert said["registered"] == {"job-coexist": ["node-coexist"]}  # their RegisterJob reached it
    assert said["head_ids"][0] == said["head_ids"][1]  # both stubs listed the same log
    assert said["schema_hash_matches"]
    assert "team" in said["their_fields"]
    assert "team" not in said["our_fields"]
    assert said["reflected_fields"] == said["our_fields"]  # the service describes its own API
    assert Path(said["stubs_from"]).is_relative_to(their_stubs.resolve())
