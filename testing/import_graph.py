"""The import graph by room: each package and subpackage a box, an arrow where one imports another.

Drawn from the source (every `import` and `from ... import`, lazy ones included) as a Mermaid
flowchart, which GitHub and most Markdown viewers render. docs/architecture.md carries the drawing
between its `<!-- import-graph -->` markers; tests/test_import_graph.py fails when the code and the
drawing part. Redraw with:

    .venv/bin/python -m faultcast.testing.import_graph --write docs/architecture.md
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Folder -> package, as pyproject.toml maps them (the repository root is the `faultcast` package).
FOLDERS = {
    "core": "faultcast",
    "collector": "faultcast.collector",
    "sim": "faultcast.sim",
    "model": "faultcast.model",
    "service": "faultcast.service",
    "client": "faultcast.client",
    "demo": "faultcast.demo",
    "goodput": "faultcast.goodput",
    "cli": "faultcast.cli",
}
PROTO = "faultcast.v1"
START, END = "<!-- import-graph -->", "<!-- /import-graph -->"


def room_of(path: Path, root: Path = ROOT) -> str:
    """The room a source file lives in: its folder, and its subpackage if it has one
    (model/features/engine.py -> "model/features"; service/server.py -> "service")."""
    parts = path.relative_to(root).parts
    if parts[0] == "core" or len(parts) == 2:
        return parts[0]
    return f"{parts[0]}/{parts[1]}"


def _rooms_by_module(root: Path) -> dict[str, str]:
    rooms = {}
    for folder, package in FOLDERS.items():
        for path in (root / folder).rglob("*.py"):
            rest = path.relative_to(root / folder).with_suffix("").parts
            module = ".".join([package, *rest]).removesuffix(".__init__")
            rooms[module] = room_of(path, root)
    return rooms


def imported_names(path: Path) -> Iterable[str]:
    """Every module `path` imports, and every `module.name` it imports from one (absolute imports;
    lazy ones inside functions included)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def edges(root: Path = ROOT) -> set[tuple[str, str]]:
    """(room, room) for every import of a module in another room; the stubs count as "proto"."""
    rooms = _rooms_by_module(root)
    found = set()
    for folder in FOLDERS:
        for path in (root / folder).rglob("*.py"):
            if path.name == "__main__.py":
                continue  # `python -m faultcast` only starts the command line
            source = room_of(path, root)
            for name in imported_names(path):
                target = "proto" if name == PROTO or name.startswith(PROTO + ".") else rooms.get(name)
                if target is not None and target != source:
                    found.add((source, target))
    return found


def _node(room: str) -> str:
    return room.replace("/", "_")


def _package(room: str) -> str:
    return room.split("/")[0]


def mermaid(root: Path = ROOT) -> str:
    """The drawing: a box per package, with its subpackages inside; an arrow from importer to
    imported, between packages (drawn once per pair) and between the rooms of one package. core and
    the stubs, which every package may import, are left out to keep the picture readable."""
    every = edges(root)
    found = {(a, b) for a, b in every if b not in {"core", "proto"} and a != "core"}
    between = sorted({(_package(a), _package(b)) for a, b in found if _package(a) != _package(b)})
    inside = sorted((a, b) for a, b in found if _package(a) == _package(b))
    rooms = sorted({a for a, _ in every} | {b for _, b in found})
    lines = ["```mermaid", "flowchart TD"]
    for package in sorted({_package(r) for r in rooms} - {"core", "proto"}):
        inner = [r for r in rooms if r.startswith(package + "/")]
        if not inner:
            lines.append(f"    {package}_pkg[{package}]")
            continue
        lines.append(f"    subgraph {package}_pkg[{package}]")
        lines.append(f"        {_node(package)}[{package} top level]")
        lines.extend(f"        {_node(r)}[{r}]" for r in inner)
        lines.append("    end")
    lines.extend(f"    {a}_pkg --> {b}_pkg" for a, b in between)
    lines.extend(f"    {_node(a)} --> {_node(b)}" for a, b in inside)
    lines.append("```")
    return "\n".join(lines)


def with_drawing(document: str, drawing: str) -> str:
    """`document` with the drawing between its markers (which must be there)."""
    head, start, rest = document.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"the document has no {START} ... {END} markers")
    return f"{head}{START}\n{drawing}\n{END}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="redraw between the markers of this Markdown file")
    args = parser.parse_args()
    if args.write is None:
        print(mermaid())
        return
    args.write.write_text(with_drawing(args.write.read_text(), mermaid()))


if __name__ == "__main__":
    main()
