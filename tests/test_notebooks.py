"""The retraining and exploration notebooks run end to end on a small twin, in a real Jupyter kernel
running this interpreter; the committed notebooks carry no outputs.

Parameters are injected papermill-style: the overrides are appended to the cell tagged `parameters`,
so the notebook's own defaults stay in place for anything a test does not set.
"""

from __future__ import annotations

import ast
import csv
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import numpy as np
import pyarrow.parquet as pq
import pytest
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

from faultcast.catalogue import Scope, by_name, metrics_for
from faultcast.model.artifact import load
from faultcast.model.features.offline import open_dataset, unix_seconds
from faultcast.model.threshold_file import read as read_threshold_file
from faultcast.service.label_seed import service_labels
from faultcast.sim.config import FleetConfig
from faultcast.sim.schedule import Scenario
from faultcast.sim.writer import simulate

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
RETRAIN = NOTEBOOKS / "retrain.ipynb"
EXPLORE = NOTEBOOKS / "explore_failure_logs.ipynb"
# Small enough for a 2-core machine: worlds of 12 nodes over one day (18 hours after the features'
# warm-up) sampled every 5 minutes (the features' windows are in time: the cost is per step, the
# nodes come cheap); at 1,000x the failure rate each holds a few failures with a precursor after the
# warm-up (training world 2: 3, validation world 4: 8, the unseen world 11: 5), enough to train and
# validate on. The unlabelled history is 1.25 days of 12 nodes: 96 healthy GPU-days, over the 50
# calibrate needs.
TRAINING_WORLDS = (2, 4)
TEST_WORLD = 11
RETRAIN_TWINS: dict[str, Any] = {
    "WORLD_SEEDS": TRAINING_WORLDS, "TEST_WORLD_SEED": TEST_WORLD, "INDEPENDENT_SEED": 3, "NODES": 12,
    "DAYS": 1.0, "ACCELERATION": 1000, "INTERVAL_S": 300, "HISTORY_DAYS": 1.25, "NUM_BOOST_ROUND": 30,
    "CEILING_FLEETS": 2, "LOOP_DAYS": 3.0, "LOOP_HOLDOUT": "1d", "LOOP_PRIOR_WEIGHT": 0.5,
}  # fmt: skip
# The exploration notebook's twin.
TWIN = {"NODES": 8, "DAYS": 3, "ACCELERATION": 400, "SEED": 0}
FIGURES = ("pr_curve.png", "lead_times.png", "recall_by_mode.png", "feature_contributions.png")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `python3` kernelspec that runs this interpreter (the venv's), found before any user- or
    system-wide one; Jupyter's runtime, IPython's profile and the kernel's temporary files in a
    temporary directory."""
    root = tmp_path_factory.mktemp("jupyter")
    write_kernel_spec(root / "kernels" / "python3")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JUPYTER_PATH", str(root))
        env.setenv("JUPYTER_RUNTIME_DIR", str(root / "runtime"))
        env.setenv("IPYTHONDIR", str(root / "ipython"))
        (root / "tmp").mkdir()
        env.setenv("TMPDIR", str(root / "tmp"))  # where the notebooks' generated twins go
        env.setenv("MPLBACKEND", "Agg")
        # LightGBM's OpenMP threads spin while they wait; on a busy 2-core machine that makes
        # training several times slower. Passive waiting changes no result.
        env.setenv("OMP_WAIT_POLICY", "PASSIVE")
        spec = KernelSpecManager().get_kernel_spec("python3")
        assert spec.argv[0] == sys.executable
        yield "python3"


def read_notebook(path: Path) -> nbformat.NotebookNode:
    # nbformat.read carries no annotations.
    notebook: nbformat.NotebookNode = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    return notebook


def parameter_names(source: str) -> set[str]:
    return {
        target.id
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def run_notebook(path: Path, kernel: str, cwd: Path, **parameters: Any) -> nbformat.NotebookNode:
    notebook = read_notebook(path)
    cells = [c for c in notebook.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"{path.name}: expected one cell tagged 'parameters', found {len(cells)}"
    unknown = set(parameters) - parameter_names(cells[0].source)
    assert not unknown, f"{path.name} has no parameters {sorted(unknown)}"
    injected = "\n".join(f"{name} = {value!r}" for name, value in parameters.items())
    cells[0].source += f"\n\n# injected by tests/test_notebooks.py\n{injected}\n"
    client = NotebookClient(
        notebook, timeout=600, kernel_name=kernel, resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()
    return notebook


def outputs(notebook: nbformat.NotebookNode) -> list[dict[str, Any]]:
    return [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]


def check_ran_cleanly(notebook: nbformat.NotebookNode) -> None:
    everything = outputs(notebook)
    errors = [o for o in everything if o["output_type"] == "error"]
    assert not errors, "\n".join(f"{o['ename']}: {o['evalue']}" for o in errors)
    stdout = "".join(o["text"] for o in everything if o["output_type"] == "stream" and o["name"] == "stdout")
    assert f"python: {sys.executable}" in stdout, "the kernel is not this interpreter"
    assert all(cell.execution_count is not None for cell in notebook.cells if cell.cell_type == "code")


def images(notebook: nbformat.NotebookNode) -> int:
    return sum("image/png" in o.get("data", {}) for o in outputs(notebook))


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("twin")
    simulate(
        FleetConfig(
            nodes=TWIN["NODES"], days=TWIN["DAYS"], acceleration=TWIN["ACCELERATION"], seed=TWIN["SEED"]
        ),
        out,
    )
    return out


@dataclass(frozen=True)
class Fleet:
    """What an operator hands the notebook: a Prometheus export, a kernel log, a GPU map, Slurm events."""

    export: Path
    kernel_log: Path
    gpu_map: Path
    slurm_events: Path
    failure: dict[str, str]  # the failure behind the Xid line: node, gpu, mode, timestamp


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    """A small fleet as the notebook meets a real one: its GPUs' history as a Prometheus range-query
    answer under dcgm-exporter's names and labels (from a 2-node twin at the notebook's cadence with
    an HBM failure on cue and no other), the driver's Xid 48 line for that failure in the node's
    kernel log (RFC 3339 stamps, as rsyslog writes them), nvidia-smi's GPU map, and a Slurm capture
    whose only event is planned maintenance."""
    root = tmp_path_factory.mktemp("fleet")
    twin = root / "twin"
    cadence = RETRAIN_TWINS["INTERVAL_S"]
    simulate(
        FleetConfig(nodes=2, days=0.35, cadence_s=cadence, seed=5, acceleration=0.0),
        twin,
        [Scenario("hbm_wear", 1, 3, 7 * 3600.0, strength=3.0)],
    )
    with (twin / "failures.csv").open(newline="") as handle:
        (failure,) = csv.DictReader(handle)
    frame = pq.read_table(twin / "telemetry.parquet").to_pandas()
    frame["time_s"] = unix_seconds(frame["timestamp"])
    series = []
    for metric in (m for m in metrics_for(Scope.GPU) if m.dcgm is not None):
        spec = by_name(metric.name)
        for (node, gpu), rows in frame.groupby(["node", "gpu"], observed=True):
            labels = {"__name__": spec.prometheus_name, "gpu": str(gpu), "Hostname": str(node), "job": "dcgm"}
            if spec.family_label is not None:
                labels[spec.family_label[0]] = spec.family_label[1]
            values = rows[metric.name].to_numpy(np.float64)
            keep = np.isfinite(values)
            at = rows["time_s"].to_numpy()[keep]
            samples = [[float(t), repr(float(v))] for t, v in zip(at, values[keep], strict=True)]
            if samples:
                series.append({"metric": labels, "values": samples})
    export = root / "export.json"
    export.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": series}}))
    kernel_log = root / "kern.log"
    stamp = failure["timestamp"].replace("Z", "+00:00")
    kernel_log.write_text(
        f"{stamp} {failure['node']} kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=77, name=python, "
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.\n"
    )
    gpu_map = root / "gpus.csv"
    gpu_map.write_text(f"index, pci.bus_id\n{failure['gpu']}, 00000000:3B:00.0\n")
    events = root / "events.txt"
    events.write_text(
        "NodeName|TimeStart|TimeEnd|State|Reason|User\n"
        f"{failure['node']}|2026-01-05T08:00:00|Unknown|DRAIN|planned maintenance|root(0)\n"
    )
    return Fleet(export, kernel_log, gpu_map, events, failure)


def test_retrain_notebook_trains_across_worlds_evaluates_calibrates_and_exports(
    kernel: str, fleet: Fleet, tmp_path: Path
) -> None:
    """A failure log from driver-format Xid lines and a Slurm capture; the fleet's own failure log
    built the same way and its Prometheus export imported with it; training across drawn worlds
    (the last validating); leave-world-out evaluation on an unseen world and the independent family
    with false alarms at acceleration 1, and on the imported fleet; the unseen world's in-world
    ceiling from a reference trained on other fleets of it; calibration on unlabelled history
    applied beside the model; and a model the service loads."""
    model_dir, work = tmp_path / "model", tmp_path / "work"
    notebook = run_notebook(
        RETRAIN, kernel, tmp_path, MODEL_DIR=str(model_dir), WORK_DIR=str(work),
        KERNEL_LOGS=[str(fleet.kernel_log)], GPU_MAPS=[f"{fleet.failure['node']}={fleet.gpu_map}"],
        SLURM_EVENTS=str(fleet.slurm_events), PROMETHEUS_EXPORT=str(fleet.export), **RETRAIN_TWINS,
    )  # fmt: skip
    check_ran_cleanly(notebook)
    stdout = "".join(o["text"] for o in outputs(notebook) if o["output_type"] == "stream")

    # The failure log the notebook built with `faultcast failures` from the lines it wrote: the flood of
    # Xid 79 is one failure on the GPU the map names, the DBE another; the application Xid, the
    # informational one and the planned drain are not failures; Slurm's Xid 79 drain is node-level.
    assert "$ faultcast failures --kernel-log" in stdout
    with (work / "failure-log-demo" / "failures.csv").open(newline="") as handle:
        demo = [(r["node"], r["gpu"], r["mode"], r["xid"]) for r in csv.DictReader(handle)]
    assert demo == [
        ("gpu-07", "3", "detachment", "79"), ("gpu-07", "6", "hbm_wear", "48"), ("gpu-08", "", "detachment", "79"),
    ]  # fmt: skip

    model = load(model_dir)
    assert model.card.train_config is not None
    assert model.card.train_config["num_boost_round"] == RETRAIN_TWINS["NUM_BOOST_ROUND"]
    assert model.card.training_data is not None
    assert model.card.split is None  # several worlds: no node/time split, the last world validated
    trained_on = model.card.training_data.manifest
    worlds = trained_on["worlds"]
    assert isinstance(worlds, list)
    assert [w["seed"] for w in worlds] == list(TRAINING_WORLDS)
    assert str(trained_on["validation"]).endswith(f"world{TRAINING_WORLDS[-1]}")  # the last validated
    for name in ("reference.json", "recall_curve.json"):
        assert (model_dir / name).is_file(), name

    evaluation = json.loads((model_dir / "evaluation.json").read_text())
    reports = evaluation["datasets"]
    assert [r["world"]["family"] for r in reports] == ["faultcast-twin", "independent", None]
    assert reports[0]["world"]["seed"] == TEST_WORLD
    for r in reports[:2]:
        assert r["world"]["unseen_world"] is True
        assert r["world"]["evaluation"].startswith("leave-world-out")
        assert r["held_out_from_training"] is False
        for method in ("model", "logistic", "logistic_matched", "rules", "rules_matched"):
            assert {"recall_5min", "false_alarms_per_1000_gpu_days", "recall_by_mode"} <= set(r[method])
        calm = r["false_alarm_data"]
        assert [d["acceleration"] for d in calm["data"]] == [1]
        assert "false_alarms" in calm["methods"]["model"]
    assert evaluation["pooled"]["unseen_world"] == [True, True, None]
    # The unseen world's in-world ceiling: a reference trained on CEILING_FLEETS other fleets of world
    # TEST_WORLD alone, held to the model's false alarms on the same fleet, and the model's share of it.
    ceiling = reports[0]["ceiling"]
    fleets = [str(work / f"world{TEST_WORLD}-fleet{seed}") for seed in (1001, 1002)]
    assert ceiling["reference"]["training_data"] == fleets
    assert ceiling["reference"]["only_the_evaluated_world"] is True
    assert ceiling["matched"]["false_alarms"] <= reports[0]["model"]["false_alarms"]
    share = ceiling["share_of_ceiling"]["recall_5min_predictable"]
    recalls = (reports[0]["model"]["recall_5min_predictable"], ceiling["recall_5min_predictable"])
    assert share is None if recalls[1] == 0 else share == pytest.approx(recalls[0] / recalls[1])
    assert ceiling["by_mode"]
    assert all(
        m["model_caught"] <= m["failures"] and m["ceiling_caught"] <= m["failures"]
        for m in ceiling["by_mode"].values()
    )
    assert "in-world ceiling" in stdout
    assert "of the in-world ceiling" in stdout
    # The imported fleet, with its one failure from the kernel log (the planned drain is not one).
    imported = reports[2]
    assert imported["data"]["path"] == str(work / "fleet")
    assert imported["test_failures"] == 1
    with (work / "fleet" / "failures.csv").open(newline="") as handle:
        (logged,) = csv.DictReader(handle)
    assert (logged["node"], logged["gpu"], logged["mode"]) == (
        fleet.failure["node"], fleet.failure["gpu"], fleet.failure["mode"],
    )  # fmt: skip
    assert "leave-world-out" in stdout

    # calibrate --apply: threshold.json beside the model, from the unlabelled history, served on load.
    calibration = json.loads((model_dir / "calibrate.json").read_text())
    assert calibration["history"]["labelled"] is False
    assert calibration["drift"]["psi_by_group"]
    chosen = read_threshold_file(model_dir, model.card.files["model.txt"])
    assert chosen is not None
    assert chosen.threshold == calibration["threshold"] == model.threshold
    assert chosen.basis["source"] == "faultcast calibrate"

    for name in FIGURES:
        assert (model_dir / name).read_bytes().startswith(b"\x89PNG"), name
    assert (model_dir / "feature_importance.csv").read_text().startswith("feature,")
    assert images(notebook) >= len(FIGURES)

    # The loop on a fleet's own data: a stand-in state directory (an independent-family fleet archived,
    # its failures labelled as the service would), the label log exported in the training format and
    # a challenger retrained on the archive with the training worlds as its prior.
    state, fleet_days = work / "state", work / "fleet-independent4"
    assert (state / "archive" / "manifest.json").is_file()
    with (work / "fleet-labels" / "failures.csv").open(newline="") as handle:
        exported = list(csv.DictReader(handle))
    assert exported
    assert len(exported) == len(service_labels(fleet_days / "failures.csv"))
    assert "$ faultcast retrain --state-dir" in stdout
    challenger = load(work / "challenger")
    assert challenger.card.train_config is not None
    # The card records each dataset's weight: the prior worlds', then the fleet's fit and holdout days.
    weights = challenger.card.train_config["world_weights"]
    assert weights == ",".join(["0.5"] * len(TRAINING_WORLDS) + ["1", "1"])
    assert "$ faultcast models promote" in stdout


def test_explore_notebook_plots_failures_and_precursors(kernel: str, twin: Path, tmp_path: Path) -> None:
    notebook = run_notebook(EXPLORE, kernel, tmp_path, DATA_DIR=str(twin))
    check_ran_cleanly(notebook)
    modes = set(open_dataset(twin).failures.mode.tolist())
    # The overview, one precursor figure per mode that failed, then the look-alikes.
    assert images(notebook) >= 1 + len(modes)


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_committed_notebooks_have_no_outputs(path: Path) -> None:
    notebook = read_notebook(path)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    assert all(cell.outputs == [] for cell in code), f"{path.name}: clear the outputs before committing"
    assert all(cell.execution_count is None for cell in code), f"{path.name}: clear the execution counts"
    assert sum("parameters" in cell.metadata.get("tags", []) for cell in code) == 1
