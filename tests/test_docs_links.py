"""Documents the repository cites are in the repository.

A comment or a page that cites a document outside the checkout (the `shared` folder beside it), or
one that does not exist (a page by a name nothing has, a markdown link to a moved page), sends a reader
nowhere. The design rules are in docs/design.md and the facts about failures in docs/failure-modes.md;
this checks every tracked text file: no path into that folder (`OUTSIDE`), every markdown link
(`](path)` and `[name]: path`) resolves inside the repository, every `docs/*.md` named resolves, and
every other `*.md` named is the name of a file in the repository.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = "../" + "shared/"  # split, so that this file does not name it
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](path) or [text](path "title")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+(\S+)", re.MULTILINE)  # [name]: path
DOCS_PAGE = re.compile(r"(?<![\w/.-])((?:\.\./)*docs/[\w./-]+?\.md)\b")
MD_NAME = re.compile(r"(?<![\w/.-])([\w.-]+\.md)\b")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:")  # https:, mailto:, file:


def _tracked_text() -> dict[str, str]:
    """Each tracked file that is present and reads as UTF-8 text, by its path from the root."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    files = {}
    for name in filter(None, listed):
        path = ROOT / name
        if not path.is_file() or path.is_symlink():
            continue  # deleted in the working tree, or a link
        try:
            files[name] = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary
    return files


@pytest.fixture(scope="module")
def tracked() -> dict[str, str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing is tracked")
    this = Path(__file__).resolve().relative_to(ROOT).as_posix()  # its own examples are made up
    return {name: text for name, text in _tracked_text().items() if name != this}


def _resolves(source: str, target: str) -> bool:
    """Whether `target` named in `source` exists in the repository, read from `source`'s folder or
    from the root."""
    target = target.split("#", 1)[0].split("?", 1)[0]
    if not target:
        return True  # an anchor on the same page
    here = (ROOT / source).parent
    for base in (here, ROOT):
        path = (base / target).resolve()
        if path.is_relative_to(ROOT) and path.exists():
            return True
    return False


def _links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) + REFERENCE.findall(text) if not SCHEME.match(t)]


def test_nothing_points_outside_the_repository(tracked: dict[str, str]) -> None:
    found = [
        f"{name}:{number}"
        for name, text in tracked.items()
        for number, line in enumerate(text.splitlines(), 1)
        if OUTSIDE in line
    ]
    assert found == [], f"cite docs/design.md or docs/failure-modes.md instead: {found}"


def test_markdown_links_resolve(tracked: dict[str, str]) -> None:
    broken = [
        f"{name}: {target}"
        for name, text in tracked.items()
        if name.endswith(".md")
        for target in _links(text)
        if not _resolves(name, target)
    ]
    assert broken == []


def test_named_documents_exist(tracked: dict[str, str]) -> None:
    names = {Path(name).name for name in tracked}
    missing = set()
    for name, text in tracked.items():
        missing |= {f"{name}: {page}" for page in DOCS_PAGE.findall(text) if not _resolves(name, page)}
        missing |= {
            f"{name}: {page}"
            for page in MD_NAME.findall(text)
            if page not in names and not _resolves(name, page)  # a page added and not yet committed
        }
    assert sorted(missing) == []


def test_the_checks_see_what_they_guard(tmp_path: Path) -> None:
    """The patterns themselves, on a made-up page."""
    page = (
        f"see [the card]({OUTSIDE}DESIGN.md), [rules](docs/design.md#layout) and [web](https://x.org/a.md)\n"
        "[ref]: ../service/alert_book.py\n"
        "cites docs/failure-modes.md and FAILURE_MODES.md\n"
    )
    assert _links(page) == [f"{OUTSIDE}DESIGN.md", "docs/design.md#layout", "../service/alert_book.py"]
    assert DOCS_PAGE.findall(page) == ["docs/design.md", "docs/failure-modes.md"]
    assert MD_NAME.findall(page) == ["FAILURE_MODES.md"]
    assert _resolves("docs/architecture.md", "../service/alert_book.py")
    assert _resolves("README.md", "docs/design.md#layout")
    assert not _resolves("README.md", f"{OUTSIDE}DESIGN.md")
