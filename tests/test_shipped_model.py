"""The shipped model: where it lives, its content digest (the same for the same training on the same
data, whatever the run's time or paths), the commands that use it without --model, and
`faultcast model-digest` that tells a reproduction from another model."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from faultcast.cli.app import main
from faultcast.model.artifact import load
from faultcast.model.digest import DigestError, content_digest
from faultcast.model.features.offline import open_dataset
from faultcast.model.shipped import DIGEST_FILE, shipped_digest, shipped_model_dir
from faultcast.model.training.train import TrainConfig, train
from faultcast.sim.config import FleetConfig
from faultcast.sim.world import World
from faultcast.sim.writer import simulate

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))
# Two small worlds at 1000x (the first trains, the last validates), as the shipped recipe's many.
WORLDS = {3: 1.5, 4: 1.0}
CONFIG = TrainConfig(num_boost_round=10, negative_rate=0.05)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = []
    for seed, days in WORLDS.items():
        path = tmp_path_factory.mktemp(f"world{seed}")
        simulate(
            FleetConfig(nodes=4, days=days, seed=seed, acceleration=1000.0, world=World.draw(seed)), path
        )
        out.append(path)
    return out


@pytest.fixture(scope="module")
def trained(worlds: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model")
    train([open_dataset(p) for p in worlds], out, CONFIG)
    return out


@pytest.mark.slow  # two trainings on two twin worlds
def test_the_same_training_on_the_same_data_gives_the_same_digest(
    worlds: list[Path], trained: Path, tmp_path: Path
) -> None:
    # The same worlds elsewhere, their rows kept in a cache: another run of the same recipe, at another
    # time, in another checkout. (--jobs is left out of the digest too; two processes gave the same
    # digest when tried, at twice this test's time.)
    moved = [shutil.copytree(p, tmp_path / "data" / f"w{i}") for i, p in enumerate(worlds)]
    again = tmp_path / "again"
    config = replace(CONFIG, rows_cache=str(tmp_path / "rows"))
    train([open_dataset(p) for p in moved], again, config)
    first, second = (json.loads((m / "manifest.json").read_text()) for m in (trained, again))
    assert first["training_data"]["path"] != second["training_data"]["path"]  # else the paths prove nothing
    assert content_digest(again) == content_digest(trained)


@pytest.mark.slow  # trains on two twin worlds (the module's fixture)
def test_a_changed_content_file_changes_the_digest_and_a_changed_time_does_not(
    trained: Path, tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(trained, tmp_path / "copy"))
    digest = content_digest(copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest |= {"created_at": "2030-01-01T00:00:00+00:00", "git_revision": "0" * 40}
    manifest["timings_s"]["total_s"] += 100.0
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    assert content_digest(copy) == digest
    (copy / DIGEST_FILE).write_text("anything\n")  # not part of the model
    assert content_digest(copy) == digest

    booster = copy / "model.txt"
    booster.write_text(booster.read_text().replace("[seed: 0]", "[seed: 1]"))
    assert content_digest(copy) != digest  # even with the manifest's checksum left as it was

    shutil.copy(trained / "model.txt", booster)
    assert content_digest(copy) == digest
    manifest["threshold"] *= 1.01
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    assert content_digest(copy) != digest


def test_a_directory_without_a_model_has_no_digest(tmp_path: Path) -> None:
    with pytest.raises(DigestError, match=r"manifest\.json is missing"):
        content_digest(tmp_path)


def test_the_shipped_model_is_installed_loads_and_carries_its_digest() -> None:
    where = shipped_model_dir()
    assert load(where).card.features.names  # the install's copy loads with this faultcast's features
    assert shipped_digest() == content_digest(where)
    assert (where / DIGEST_FILE).read_text().count("\n") == 1  # one line


def test_model_digest_prints_the_digest_and_checks_it_against_the_shipped_one(
    stub_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model-digest"]) == 0
    assert capsys.readouterr().out.strip() == shipped_digest()
    assert main(["model-digest", str(shipped_model_dir()), "--check"]) == 0
    assert "same" in capsys.readouterr().out
    assert main(["model-digest", str(stub_model), "--check"]) == 1
    out = capsys.readouterr().out
    assert content_digest(stub_model) in out
    assert shipped_digest() in out
    assert "DIFFERENT" in out


def test_evaluate_without_model_evaluates_the_shipped_model(tmp_path: Path) -> None:
    data = tmp_path / "data"
    simulate(FleetConfig(nodes=2, days=0.5, seed=11, acceleration=1000.0), data)
    written = tmp_path / "evaluation.json"
    assert main(["evaluate", "--data", str(data), "--resamples", "5", "--json", str(written)]) == 0
    report = json.loads(written.read_text())
    shipped = load(shipped_model_dir())
    assert report["model"]["threshold"] == pytest.approx(shipped.threshold)


@pytest.mark.slow  # starts a `faultcast serve` process
def test_serve_without_model_serves_the_shipped_model(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    argv = [FAULTCAST, "serve", "--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0", "--insecure",
            "--no-prometheus", "--port-file", str(port_file)]  # fmt: skip
    with (tmp_path / "serve.log").open("w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60.0
            # The port file is the process's only sign that it serves: polled, as tests/serve_process.py does.
            while not (port_file.is_file() and port_file.read_text().strip()):
                assert process.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "faultcast serve did not start within 60 s"
                time.sleep(0.02)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert f"(model {shipped_model_dir()}, state in" in (tmp_path / "serve.log").read_text()


@pytest.mark.parametrize("command", ["serve", "evaluate", "goodput", "demo"])
def test_the_help_says_the_shipped_model_is_the_default(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    entry = text.split("--model MODEL ", 1)[1]
    assert entry.split(")", 1)[0].endswith("default: the shipped model")


def test_goodput_refuses_to_write_a_threshold_into_the_shipped_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["goodput", "--apply", "--cache", str(tmp_path / "cache")]) == 2
    assert "copy the shipped model" in capsys.readouterr().err
    assert not (shipped_model_dir() / "threshold.json").exists()
