"""`faultcast calibrate`'s report never overwrites what makes up the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faultcast.cli.app import main


@pytest.mark.parametrize("name", ["calibration.json", "manifest.json", "threshold.json", "model.txt"])
def test_a_report_aimed_at_a_model_file_is_refused_before_anything_is_written(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    files = {"model.txt": "a", "calibration.json": "b", "logistic.json": "c"}
    for file, text in files.items():
        (model / file).write_text(text)
    (model / "manifest.json").write_text(json.dumps({"files": {f: "0" * 64 for f in files}}))
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    code = main(
        ["calibrate", "--model", str(model), "--data", str(tmp_path / "nowhere"), "--json", str(model / name)]
    )
    assert code == 2
    assert f"would overwrite the model's {name}" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before


def test_a_report_beside_the_model_under_its_own_name_is_not_refused_for_that(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.json").write_text(json.dumps({"files": {"model.txt": "0" * 64}}))
    # Refused later, for the missing data, not for the report's path.
    code = main(
        [
            "calibrate",
            "--model",
            str(model),
            "--data",
            str(tmp_path / "nowhere"),
            "--json",
            str(model / "calibrate.json"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "would overwrite" not in err
    assert "calibrate:" in err
    assert not (model / "calibrate.json").exists()


def test_a_fleet_of_four_gpu_nodes_calibrates_a_model_trained_on_eight(
    service_model: Path, tmp_path: Path
) -> None:
    """The history's node size is the data's: a model trained on 8-GPU nodes calibrates on 4-GPU
    ones (it failed reshaping the scores to the model's node size)."""
    from faultcast.model.training.calibrate import calibrate
    from faultcast.sim.config import FleetConfig
    from faultcast.sim.writer import simulate

    data = tmp_path / "four"
    simulate(FleetConfig(nodes=14, gpus_per_node=4, days=1.25, seed=8, acceleration=1.0), data)
    result = calibrate(service_model, data)
    # 14 nodes x 4 GPUs over the day after the 6 h warm-up, less the twin's gaps in reporting.
    assert 0.9 * 56.0 < result.to_json()["history"]["gpu_days"] <= 56.0
