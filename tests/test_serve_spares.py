"""`faultcast serve --spares`: the flags build the provider the service is given (cli/serve.py
make_spares), and flags that cannot work together stop the service before it starts, saying why."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultcast.cli import build_parser
from faultcast.cli.serve import make_spares
from faultcast.service.remediation.spares.kubernetes import KubernetesSpares
from faultcast.service.remediation.spares.prescheduler import SpareRequest
from faultcast.service.remediation.spares.slurm import SlurmSpares
from faultcast.service.remediation.spares.webhook import WebhookSpares
from tests.k8s_fake import FakeApiServer, node, pod

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))


def spares_for(*flags: str) -> object:
    args = build_parser().parse_args(["serve", "--model", "m", "--state-dir", "s", *flags])
    return make_spares(args)


def test_no_spares_unless_asked() -> None:
    assert spares_for() is None
    assert spares_for("--actuator", "slurm", "--spares", "none") is None


def test_slurm_spares_take_their_settings_and_the_binaries_beside_scontrol() -> None:
    spares = spares_for(
        "--actuator", "slurm", "--scontrol", "/opt/slurm/bin/scontrol", "--spares", "slurm",
        "--spare-partition", "hot", "--spare-reservation", "spares", "--spare-export", "PATH,HOME",
    )  # fmt: skip  # flag and value side by side

    assert isinstance(spares, SlurmSpares)
    assert (spares.partition, spares.reservation, spares.export) == ("hot", "spares", "PATH,HOME")
    assert spares.commands.binary("sbatch") == "/opt/slurm/bin/sbatch"


def test_slurm_spares_default_to_the_jobs_partition_and_the_path() -> None:
    spares = spares_for("--actuator", "slurm", "--spares", "slurm")

    assert isinstance(spares, SlurmSpares)
    assert (spares.partition, spares.reservation, spares.export) == ("", "", "NONE")
    assert spares.commands.binary("sbatch") == "sbatch"


@pytest.mark.parametrize(
    ("flags", "url"),
    [
        (["--actuator", "webhook", "--webhook-url", "http://hooks.example/drain"], "http://hooks.example/drain"),
        (
            ["--actuator", "webhook", "--webhook-url", "http://hooks.example/drain",
             "--spare-webhook-url", "https://hooks.example/spares"],
            "https://hooks.example/spares",
        ),
        (["--actuator", "slurm", "--spare-webhook-url", "http://hooks.example/spares"], "http://hooks.example/spares"),
    ],
)  # fmt: skip  # flag and value side by side
def test_webhook_spares_post_to_their_url_or_the_actuators(flags: list[str], url: str) -> None:
    spares = spares_for("--spares", "webhook", *flags)

    assert isinstance(spares, WebhookSpares)
    assert spares.url == url


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[tuple[FakeApiServer, Path]]:
    fake = FakeApiServer()
    fake.add_node(node("node-1"))
    fake.add_pod(pod("train", "a-0", "node-1", {"faultcast.io/job": "job-a"}))
    fake.start()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": fake.url}}],
        "users": [{"name": "faultcast", "user": {"token": "s3cret"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "faultcast"}}],
        "current-context": "fake",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))  # JSON is YAML
    yield fake, path
    fake.stop()


@pytest.mark.parametrize("allow_owned", [False, True])
def test_kubernetes_spares_use_the_actuators_kubeconfig(
    kubeconfig: tuple[FakeApiServer, Path], allow_owned: bool
) -> None:
    fake, path = kubeconfig
    owned = ["--spare-allow-owned"] if allow_owned else []

    spares = spares_for(
        "--actuator", "kubernetes", "--kubeconfig", str(path), "--spares", "kubernetes", *owned
    )

    assert isinstance(spares, KubernetesSpares)
    assert spares.allow_owned is allow_owned
    client = spares.core.api_client
    try:
        request = SpareRequest(alert_id=7, job_id="job-a", node="node-1", gpu=0, mode="hbm_wear", risk=0.9)
        assert spares.prepare(request).ok
    finally:
        client.close()
    assert {r.authorization for r in fake.requests} == {"Bearer s3cret"}
    assert [r.path for r in fake.seen("POST")] == ["/api/v1/namespaces/train/pods"]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--spares", "slurm"], "--spares slurm needs --actuator slurm or webhook"),
        (["--spares", "slurm", "--actuator", "kubernetes"], "which --actuator kubernetes does not"),
        (["--spares", "kubernetes", "--actuator", "slurm"],
         "--spares kubernetes needs --actuator kubernetes or webhook"),
        (["--spares", "webhook"], "which --actuator noop does not"),
        (["--spares", "webhook", "--actuator", "slurm"],
         "--spares webhook needs --spare-webhook-url (or --webhook-url)"),
        (["--spare-partition", "hot"], "--spare-partition is for --spares slurm, not --spares none"),
        (["--spares", "webhook", "--actuator", "webhook", "--webhook-url", "http://h/", "--spare-reservation", "r"],
         "--spare-reservation is for --spares slurm, not --spares webhook"),
        (["--spares", "slurm", "--actuator", "slurm", "--spare-webhook-url", "http://h/"],
         "--spare-webhook-url is for --spares webhook"),
        (["--spares", "slurm", "--actuator", "slurm", "--spare-allow-owned"],
         "--spare-allow-owned is for --spares kubernetes"),
        (["--spares", "slurm", "--actuator", "slurm", "--spare-export", " "], "--spare-export needs a value"),
        (["--spares", "slurm", "--actuator", "slurm", "--spare-partition", "hot;rm"],
         "--spares slurm: spare partition 'hot;rm' is not a Slurm name"),
        (["--spares", "webhook", "--actuator", "slurm", "--spare-webhook-url", "file:///etc/passwd"],
         "--spares webhook: webhook URL must be http(s)"),
    ],
)  # fmt: skip  # flag and value side by side
def test_flags_that_cannot_work_together_exit_saying_why(flags: list[str], says: str) -> None:
    with pytest.raises(SystemExit) as exited:
        spares_for(*flags)

    assert says in str(exited.value)


def test_kubernetes_spares_without_credentials_exit_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a cluster

    with pytest.raises(SystemExit) as exited:
        spares_for("--actuator", "kubernetes", "--spares", "kubernetes")

    assert "no Kubernetes credentials" in str(exited.value)
    assert "--kubeconfig" in str(exited.value)


@pytest.mark.slow  # a `faultcast` process
def test_serve_refuses_spares_nothing_would_end_the_old_job_for(tmp_path: Path) -> None:
    """Refused before the model is read (there is none here) or anything starts."""
    done = subprocess.run(
        [FAULTCAST, "serve", "--model", str(tmp_path / "no-model"), "--state-dir", str(tmp_path / "state"),
         "--insecure", "--spares", "slurm"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip  # flag and value side by side

    assert done.returncode != 0
    assert "--spares slurm needs --actuator slurm or webhook" in done.stderr
    assert not (tmp_path / "state").exists()
