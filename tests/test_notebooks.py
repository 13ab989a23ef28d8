"""The retraining and exploration notebooks run end to end on a small twin, in a real Jupyter kernel
running this interpreter; the committed notebooks carry no outputs.

Parameters are injected papermill-style: the overrides are appended to the cell tagged `parameters`,
so the notebook's own defaults stay in place for anything a test does not set.
"""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

from faultcast.model.artifact import load
from faultcast.model.dataset import open_dataset
from faultcast.model.train import TrainConfig, make_split
from faultcast.sim.config import FleetConfig
from faultcast.sim.writer import simulate

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
RETRAIN = NOTEBOOKS / "retrain.ipynb"
EXPLORE = NOTEBOOKS / "explore_failure_logs.ipynb"
# Small enough for a 2-core machine, large enough that the fit and validation slices hold failures.
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
    dataset = open_dataset(out)
    split = make_split(dataset, TrainConfig(seed=TWIN["SEED"]))
    failures = dataset.failures.learnable()  # training labels only these
    fit = failures.between(dataset.start_s, split.validation_start_s, split.train_nodes)
    validation = failures.between(split.validation_start_s, split.train_end_s, split.train_nodes)
    advice = "the small twin needs failures in both training slices: change its seed or size"
    assert fit, advice
    assert validation, advice
    return out


def test_retrain_notebook_trains_evaluates_and_exports(kernel: str, twin: Path, tmp_path: Path) -> None:
    """The notebook generates its own twin (DATA_DIR None): the same one as the `twin` fixture, whose
    split was checked there, since the twin is deterministic given its configuration."""
    model_dir = tmp_path / "model"
    notebook = run_notebook(
        RETRAIN, kernel, tmp_path, DATA_DIR=None, MODEL_DIR=str(model_dir), NUM_BOOST_ROUND=30, **TWIN
    )
    check_ran_cleanly(notebook)

    model = load(model_dir)
    assert model.card.train_config is not None
    assert model.card.train_config["num_boost_round"] == 30
    assert model.card.training_data is not None
    trained_on = model.card.training_data.manifest["config"]
    assert trained_on == json.loads((twin / "manifest.json").read_text())["config"]
    evaluation = json.loads((model_dir / "evaluation.json").read_text())
    for method in ("model", "logistic", "rules"):
        metrics = evaluation[method]
        assert {"recall_5min", "false_alarms_per_1000_gpu_days", "pr_auc", "recall_by_mode"} <= set(metrics)
    assert evaluation["held_out_from_training"] is True
    assert model.card.split is not None
    assert evaluation["test_nodes"] == list(model.card.split.test_nodes)
    for name in FIGURES:
        assert (model_dir / name).read_bytes().startswith(b"\x89PNG"), name
    assert (model_dir / "feature_importance.csv").read_text().startswith("feature,")
    assert images(notebook) >= len(FIGURES)


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
