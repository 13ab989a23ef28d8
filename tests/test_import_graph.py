"""The drawing of the import graph in docs/architecture.md is the code's: redrawn, it is unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultcast.testing.import_graph import END, START, edges, mermaid, with_drawing

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_the_drawing_in_the_architecture_document_matches_the_code() -> None:
    document = ARCHITECTURE.read_text()
    assert with_drawing(document, mermaid()) == document, (
        "redraw: .venv/bin/python -m faultcast.testing.import_graph --write docs/architecture.md"
    )


def test_the_drawing_shows_the_rooms_of_the_architecture() -> None:
    drawing = mermaid()
    for room in (
        "model/features",
        "model/importers",
        "model/training",
        "model/evaluation",
        "service/rpc",
        "service/state",
        "service/remediation",
        "collector/nvml",
    ):
        assert f"[{room}]" in drawing, room
    # The client stands alone: it needs the stubs and the shared wording, nothing of the service.
    assert not any(source == "client" and target not in {"core", "proto"} for source, target in edges())


def test_the_graph_is_read_from_the_source(tmp_path: Path) -> None:
    (tmp_path / "model" / "features").mkdir(parents=True)
    (tmp_path / "service").mkdir()
    (tmp_path / "model" / "features" / "engine.py").write_text("x = 1\n")
    (tmp_path / "service" / "scoring.py").write_text(
        "def f():\n    from faultcast.model.features.engine import x\n    from faultcast.v1 import alerts_pb2\n"
    )
    assert edges(tmp_path) == {("service", "model/features"), ("service", "proto")}


def test_a_document_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="markers"):
        with_drawing("# no drawing here\n", "drawing")
    assert with_drawing(f"a\n{START}\nold\n{END}\nb", "new") == f"a\n{START}\nnew\n{END}\nb"
