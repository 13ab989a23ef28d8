"""A third party's client, written from proto/README.md: its stubs are generated with the README's
own protoc command into a folder of their own, and the client runs in another process with only
that folder on PYTHONPATH and no faultcast import, against a real service started here."""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import faultcast
from faultcast.catalogue import Scope, metrics_for
from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.scoring import model_version
from faultcast.service.server import Service
from faultcast.v1 import alerts_pb2 as apb

ROOT = Path(__file__).resolve().parents[1]
CLIENT = Path(__file__).with_name("fixtures") / "third_party_client.py"
JOB, NODE = "job-3p", "node-3p"
WAIT_S = 60.0


def _readme_protoc(out: Path) -> list[str]:
    """The Python protoc command of proto/README.md, its output folder replaced by `out`."""
    readme = (ROOT / "proto" / "README.md").read_text()
    block = readme.split("**Python**", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    command = block.replace("\\\n", " ").splitlines()
    (protoc,) = [line for line in command if "grpc_tools.protoc" in line]
    words = shlex.split(protoc)
    assert words[0] == "python"
    return [sys.executable, *(w.replace("=gen", f"={out}") for w in words[1:])]


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("third-party-gen")
    subprocess.run(_readme_protoc(out), cwd=ROOT, check=True, capture_output=True, timeout=120)
    assert (out / "faultcast_api" / "v1" / "alerts_pb2_grpc.py").is_file()
    return out


@pytest.fixture
def service(stub_model: Path, tmp_path: Path) -> Iterator[tuple[Service, int]]:
    model_dir = tmp_path / "model"
    shutil.copytree(stub_model, model_dir)
    service = Service.open(
        model_dir, tmp_path / "state", ServiceConfig(grace_s=3600.0), actuator=NoopActuator()
    )
    port = service.start("127.0.0.1:0")
    yield service, port
    service.stop(0)


class Client:
    """The client process; its JSON lines arrive on a queue (a reader thread, so waits time out)."""

    def __init__(self, stubs: Path, port: int) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = str(stubs)  # only the generated stubs
        self.process = subprocess.Popen(
            [sys.executable, str(CLIENT), f"127.0.0.1:{port}", JOB, NODE],
            cwd=stubs,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self, step: str) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"the client said nothing within {WAIT_S} s (waiting for {step})") from None
        if line is None:
            self.process.wait(WAIT_S)
            stderr = self.process.stderr.read() if self.process.stderr is not None else ""
            raise AssertionError(f"the client exited with {self.process.returncode} before {step}:\n{stderr}")
        said: dict[str, Any] = json.loads(line)
        assert said["step"] == step, said
        return said

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(WAIT_S)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


def test_a_client_from_the_proto_files_alone_subscribes_acknowledges_and_pushes(
    stubs: Path, service: tuple[Service, int]
) -> None:
    served, port = service
    client = Client(stubs, port)
    try:
        caught_up = client.next("caught_up")
        assert caught_up["head_id"] == served.store.alerts.last_id
        assert caught_up["model_version"] == model_version(served.model)
        assert served.store.jobs.all() == {JOB: [NODE]}
        (alert,) = served.store.alerts.append(
            [
                apb.Alert(
                    node=NODE,
                    gpu=2,
                    state=apb.ALERT_STATE_OPEN,
                    kind=apb.EVENT_KIND_OPENED,
                    risk=0.7,
                    action=apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE,
                )
            ]
        )
        received = client.next("alert")
        assert (received["id"], received["opened_id"], received["node"]) == (alert.id, alert.id, NODE)
        acknowledged = client.next("acknowledged")
        assert acknowledged["accepted"]
        assert f"drain {NODE}" in acknowledged["remediation"]
        assert [a.job_id for a in served.store.acks.of(alert.id)] == [JOB]
        listed = client.next("listed")
        assert listed == {"step": "listed", "ids": [alert.id], "head_id": served.store.alerts.last_id}
        schema = client.next("schema")
        assert schema["hash_matches"]
        assert schema["described"]
        assert schema["scopes"] == {f"SCOPE_{scope.name}": len(metrics_for(scope)) for scope in Scope}
        pushed = client.next("pushed")
        assert pushed == {"step": "pushed", "acked_through": 1, "rejections": []}
        assert served.telemetry.cursors()[(NODE, 42)] == 1
        modules = client.next("modules")
        assert client.process.wait(WAIT_S) == 0
    finally:
        client.close()
    assert not modules["faultcast_was_imported"]
    assert Path(modules["stubs_from"]).is_relative_to(stubs)
    assert modules["faultcast_from"] == faultcast.__file__  # the installed package, as here
