"""The project's documents: the library points to ``docs/`` (which exists), never outside the repository.

Users of the package have the repository, not the folders beside the
checkout that the protocols were first written from, so a docstring or
comment under ``jaxseg_robust/`` or ``ports/`` may not cite ``../shared/...``
(or the spec / design folders there by name), and every ``docs/...`` file a
docstring in the repository points to must exist.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY_DIRS = ("jaxseg_robust", "ports")
SOURCE_DIRS = ("jaxseg_robust", "ports", "experiments", "tests")
OUTSIDE_REFERENCES = (b"../shared", b"shared/spec", b"shared/design")
# File names of the documents outside the repository, cited without their folder.
OUTSIDE_DOCUMENT_NAMES = re.compile(
    r"prompt-attacks(\.md)?\b|perturbation-attacks(\.md)?\b|boundary-iou\.md|spec rclicks\.md|BENCHMARKING\.md")
DOCS_REFERENCE = re.compile(r"\bdocs/[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b")
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+\.md)(#[^)\s]*)?\)")
EXPECTED_PROTOCOL_DOCS = ("tetris", "breps", "grids", "rclicks", "perturbation", "boundary_iou", "boundary_ap_pq")


def _files(root: pathlib.Path, dirs, suffixes=None):
    for name in dirs:
        for path in sorted((root / name).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if suffixes is None or path.suffix in suffixes:
                yield path


def outside_references(root: pathlib.Path) -> list[str]:
    """``file: text`` for every library / ports file that cites a document outside the repository."""
    found = []
    for path in _files(root, LIBRARY_DIRS):
        data = path.read_bytes()
        for needle in OUTSIDE_REFERENCES:
            if needle in data:
                found.append(f"{path.relative_to(root)}: {needle.decode()}")
        if path.suffix == ".py":
            for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
                match = OUTSIDE_DOCUMENT_NAMES.search(line)
                if match:
                    found.append(f"{path.relative_to(root)}:{number}: {match.group(0)}")
    return found


def missing_docs(root: pathlib.Path) -> list[str]:
    """``file:line: docs/...`` for every ``docs/*.md`` a source file names that does not exist."""
    missing = []
    for path in _files(root, SOURCE_DIRS, {".py"}):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for reference in DOCS_REFERENCE.findall(line):
                if not (root / reference).is_file():
                    missing.append(f"{path.relative_to(root)}:{number}: {reference}")
    return missing


def broken_doc_links(root: pathlib.Path) -> list[str]:
    """``doc: target`` for every relative Markdown link between documents whose target does not exist."""
    broken = []
    for path in sorted((root / "docs").rglob("*.md")):
        for target, _ in MARKDOWN_LINK.findall(path.read_text(encoding="utf-8")):
            if "://" not in target and not (path.parent / target).is_file():
                broken.append(f"{path.relative_to(root)}: {target}")
    return broken


def test_library_cites_no_document_outside_the_repository():
    assert outside_references(ROOT) == []


def test_every_docs_file_named_in_the_sources_exists():
    assert missing_docs(ROOT) == []


def test_docs_links_resolve():
    assert broken_doc_links(ROOT) == []


@pytest.mark.parametrize("name", EXPECTED_PROTOCOL_DOCS)
def test_protocol_documents_are_referenced_and_exist(name):
    path = ROOT / "docs" / "protocols" / f"{name}.md"
    assert path.is_file()
    text = path.read_text(encoding="utf-8")
    assert "## " in text and len(text) > 2000, f"{path} is not a real document"
    cited = any(f"docs/protocols/{name}.md" in source.read_text(encoding="utf-8")
                for source in _files(ROOT, LIBRARY_DIRS, {".py"}))
    assert cited, f"no docstring under {LIBRARY_DIRS} points to docs/protocols/{name}.md"


def test_checks_catch_what_they_look_for(tmp_path):
    """The helpers flag a ../shared citation, a spec file name, a missing docs file and a broken link."""
    package = tmp_path / "jaxseg_robust"
    package.mkdir()
    (package / "bad.py").write_text('"""Spec: ../shared/spec/rclicks.md §5; see prompt-attacks §3."""\n'
                                    '"""And ' + 'docs/protocols/' + 'nowhere.md."""\n', encoding="utf-8")
    (tmp_path / "ports").mkdir()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("[a](protocols/missing.md#x) [b](https://example.org/x.md)\n", encoding="utf-8")
    assert outside_references(tmp_path) == [
        "jaxseg_robust/bad.py: ../shared", "jaxseg_robust/bad.py: shared/spec",
        "jaxseg_robust/bad.py:1: prompt-attacks"]
    assert missing_docs(tmp_path) == ["jaxseg_robust/bad.py:2: " + "docs/protocols/" + "nowhere.md"]
    assert broken_doc_links(tmp_path) == ["docs/" + "index.md: protocols/missing.md"]
