"""Imports point one way, from vocabulary to tools (docs/architecture.md, "Layers"):

    core  <-  collector, sim (physics only), model  <-  service  <-  demo, goodput  <-  cli
    client  <-  proto only;  testing (doubles and harnesses)  <-  tests and bench only

Inside a package, its subpackages are layered too (SUBPACKAGES below), and no module imports its way
back to itself (no cycles).

Each folder's modules may import only the layers listed for it below; the simulator is a data source
like any fleet, so collector, model and service never import it (the demo, goodput and the command
line, which runs the twin for `collect --source simulated`, may). Checked on the source (every `import` and
`from ... import`, lazy ones inside functions included), not on what happens to be loaded.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from faultcast.testing.import_graph import imported_names

ROOT = Path(__file__).resolve().parent.parent
PROTO = "faultcast.v1"
# Folder -> its package, and the packages it may import besides itself and the standard library.
CORE = "faultcast"
ALLOWED: dict[str, tuple[str, set[str]]] = {
    "core": (CORE, {PROTO}),
    "collector": ("faultcast.collector", {CORE, PROTO}),
    "sim": ("faultcast.sim", {CORE}),
    "model": ("faultcast.model", {CORE}),
    "service": ("faultcast.service", {CORE, PROTO, "faultcast.model"}),
    "client": ("faultcast.client", {PROTO}),
    "demo": ("faultcast.demo", {CORE, PROTO, "faultcast.model", "faultcast.service", "faultcast.sim"}),
    "goodput": (
        "faultcast.goodput",
        {CORE, PROTO, "faultcast.model", "faultcast.service", "faultcast.sim", "faultcast.demo"},
    ),
    # Doubles and harnesses for tests and benches: may use anything; nothing above imports it.
    "testing": (
        "faultcast.testing",
        {
            CORE,
            PROTO,
            "faultcast.client",
            "faultcast.collector",
            "faultcast.model",
            "faultcast.service",
            "faultcast.sim",
            "faultcast.demo",
        },
    ),
    "cli": (
        "faultcast.cli",
        {
            CORE,
            PROTO,
            "faultcast.collector",
            "faultcast.model",
            "faultcast.service",
            "faultcast.sim",
            "faultcast.demo",
            "faultcast.goodput",
        },
    ),
}
PACKAGES = sorted({package for package, _ in ALLOWED.values()} | {PROTO}, key=len, reverse=True)
# Leaves of the standard library alone that every layer may import, the client included (which
# otherwise needs only the stubs): so that one wording is shared, not copied.
SHARED_LEAVES = {
    "faultcast.alert_text": "how an alert reads to a person: the client's log lines, the demo and "
    "`faultcast score` word it alike",
    "faultcast.actions": "the recommended actions' table (rank, snapshot, node moved): the model "
    "chooses, the service escalates and drains, the client snapshots by the same one",
}
# `python -m faultcast` must live in the top package's folder, yet it only starts the command line.
ENTRY_POINTS = {ROOT / "core" / "__main__.py": {"faultcast.cli"}}


def _imported(path: Path) -> set[str]:
    """The faultcast modules (and names in them) that `path` imports."""
    return {n for n in _all_imports(path) if n == CORE or n.startswith(CORE + ".")}


def _all_imports(path: Path) -> set[str]:
    """Every module `path` imports, and every `module.name` it imports from one."""
    return set(imported_names(path))


def _package_of(module: str) -> str:
    """The layer a faultcast module belongs to: the longest known package that prefixes it."""
    for package in PACKAGES:
        if module == package or module.startswith(package + "."):
            return package
    return CORE


def _violations(folder: str) -> list[str]:
    own, allowed = ALLOWED[folder]
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        permitted = {own, *allowed, *ENTRY_POINTS.get(path, set())}
        for module in sorted(_imported(path)):
            if module in SHARED_LEAVES or module.rpartition(".")[0] in SHARED_LEAVES:
                continue
            if _package_of(module) not in permitted:
                found.append(f"{path.relative_to(ROOT)} imports {module}")
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_imports_point_from_vocabulary_to_tools(folder: str) -> None:
    assert _violations(folder) == []


@pytest.mark.parametrize("leaf", sorted(SHARED_LEAVES))
def test_a_shared_leaf_imports_the_standard_library_alone(leaf: str) -> None:
    path = ROOT / "core" / f"{leaf.rpartition('.')[2]}.py"
    outside = {n.split(".")[0] for n in _all_imports(path)} - set(sys.stdlib_module_names) - {"__future__"}
    assert outside == set()


def test_imports_are_absolute() -> None:
    """A relative import (`from ..sim import x`) would slip past the direction check above."""
    relative = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for folder in sorted(ALLOWED)
        for path in sorted((ROOT / folder).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert relative == []


def test_the_check_sees_a_wrong_way_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself: a model module importing the simulator, lazily, is found."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "bad.py").write_text("def f():\n    from faultcast.sim.modes import MODES\n")
    (tmp_path / "model" / "good.py").write_text("from faultcast.catalogue import METRICS\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert _violations("model") == [
        "model/bad.py imports faultcast.sim.modes",
        "model/bad.py imports faultcast.sim.modes.MODES",
    ]


def test_every_package_folder_is_checked() -> None:
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench", "examples"}
    assert folders <= set(ALLOWED) | {"proto"}, folders - set(ALLOWED)


def test_only_the_command_line_parses_arguments() -> None:
    """The library is usable from Python without the CLI: argparse is imported in cli/ alone."""
    users = [
        str(path.relative_to(ROOT))
        for folder in sorted(set(ALLOWED) - {"cli", "testing"})  # testing/jobs: scripts with arguments
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "argparse" in {name.split(".")[0] for name in _all_imports(path)}
    ]
    assert users == []


# Inside a package: its subpackages, lowest first. A module of one may import its own subpackage, lower
# ones and the package's top-level modules (the shared vocabulary: the model artifact, the metrics),
# never a higher subpackage; the wiring modules (WIRING) are imported by no subpackage.
SUBPACKAGES: dict[str, tuple[str, ...]] = {
    "model": ("features", "importers", "evaluation", "training"),
    "service": ("state", "archive", "remediation", "rpc"),
    "collector": ("nvml",),
}
WIRING = {"faultcast.service.server"}


def _subpackage_violations(folder: str) -> list[str]:
    package, order = ALLOWED[folder][0], SUBPACKAGES[folder]
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        parts = path.relative_to(ROOT / folder).parts
        if len(parts) == 1:
            continue  # a top-level module: the package's face and wiring
        rank = order.index(parts[0])
        for module in sorted(_imported(path)):
            if not module.startswith(package + "."):
                continue
            if module in WIRING or module.rpartition(".")[0] in WIRING:
                found.append(f"{path.relative_to(ROOT)} imports the wiring {module}")
                continue
            first = module[len(package) + 1 :].split(".")[0]
            if first in order and order.index(first) > rank:
                found.append(f"{path.relative_to(ROOT)} ({parts[0]}) imports {module} ({first})")
    return found


@pytest.mark.parametrize("folder", sorted(SUBPACKAGES))
def test_subpackages_import_their_own_and_lower_ones(folder: str) -> None:
    assert _subpackage_violations(folder) == []


def test_every_subpackage_is_layered() -> None:
    for folder, order in SUBPACKAGES.items():
        found = {p.parent.name for p in (ROOT / folder).glob("*/__init__.py")}
        assert found == set(order), (folder, found ^ set(order))
    unlayered = {
        p.parent.relative_to(ROOT).as_posix()
        for folder in set(ALLOWED) - set(SUBPACKAGES)
        for p in (ROOT / folder).glob("*/__init__.py")
    }
    # Folders of their own that are not layers: the simulator's independent generator, the scripts
    # the harnesses launch, the frozen reference features.
    assert unlayered <= {"sim/independent", "testing/jobs", "testing/reference_features"}, unlayered


def test_the_subpackage_check_sees_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "model" / "features").mkdir(parents=True)
    (tmp_path / "model" / "features" / "bad.py").write_text(
        "from faultcast.model.training.train import train\nfrom faultcast.model.artifact import FaultModel\n"
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert _subpackage_violations("model") == [
        "model/features/bad.py (features) imports faultcast.model.training.train (training)",
        "model/features/bad.py (features) imports faultcast.model.training.train.train (training)",
    ]


def _module_of(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    package = ALLOWED[folder][0]
    return ".".join([package, *rest]).removesuffix(".__init__")


def _module_graph() -> dict[str, set[str]]:
    """Module -> the faultcast modules it imports (`from m import name`: m, and m.name where that is a
    module). A module's own packages are left out: their `__init__` is the face that gathers it."""
    paths = {
        _module_of(path): path
        for folder in ALLOWED
        for path in (ROOT / folder).rglob("*.py")
        if ENTRY_POINTS.get(path) is None
    }
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        ancestors = {module.rsplit(".", n)[0] for n in range(module.count(".") + 1)}
        graph[module] = {name for name in _imported(path) if name in paths} - ancestors
    return graph


def test_no_module_imports_its_way_back_to_itself() -> None:
    assert _cycles(_module_graph()) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_the_cycle_check_sees_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "a.py").write_text("from faultcast.model.b import x\n")
    (tmp_path / "model" / "b.py").write_text("def f():\n    from faultcast.model import a\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    graph = _module_graph()
    assert graph["faultcast.model.a"] == {"faultcast.model.b"}
    assert graph["faultcast.model.b"] == {"faultcast.model.a"}
    assert _cycles(graph) == [["faultcast.model.a", "faultcast.model.b", "faultcast.model.a"]]
