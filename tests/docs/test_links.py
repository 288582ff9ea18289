"""Every link in the repository's documentation resolves to a file in the repository.

A clone carries only the repository: a link outside it (such as the design folder the project
was started from) or to a file that was moved is a dead end for its reader.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "bench").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def local_links(page: Path) -> list[str]:
    targets = [t for t in LINK.findall(page.read_text()) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    return [t.split("#")[0] for t in targets]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve_inside_the_repository(page):
    for target in local_links(page):
        resolved = (page.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{page.name}: {target} points outside the repository"
        name = str(resolved.relative_to(ROOT))
        assert resolved.exists(), f"{page.relative_to(ROOT)}: {name} does not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_the_design_folder_outside_the_clone(page):
    text = page.read_text()
    assert "../shared" not in text and "/work/" not in text, f"{page.relative_to(ROOT)} names a path outside the clone"


def test_the_readme_and_the_docs_index_link_every_docs_page():
    readme, index = (ROOT / "README.md").read_text(), (ROOT / "docs" / "README.md").read_text()
    assert "docs/README.md" in readme and "docs/contract.md" in readme
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    missing = sorted(name for name in pages if f"({name})" not in index)
    assert not missing, f"docs/README.md does not link {missing}"


#: Pages that describe the present (the journals are history: their paths are those of their session).
CURRENT = [p for p in PAGES if p.name not in {"JOURNAL.md", "NOTES-service.md"}]
PATH_IN_CODE = re.compile(r"`((?:bench|docs|kernels|service|clients|tests)/[\w/.-]+\.(?:py|sh|md|json|txt|png))`")
RESULT_FILE = re.compile(r"`([\w-]+-(?:h200|cpu)[\w-]*\.(?:json|txt|png))`")


@pytest.mark.parametrize("page", CURRENT, ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_and_result_files_named_in_code_spans_exist(page):
    text = page.read_text()
    for name in PATH_IN_CODE.findall(text):
        assert (ROOT / name).exists(), f"{page.relative_to(ROOT)} names {name}, which does not exist"
    for name in RESULT_FILE.findall(text):
        assert (ROOT / "bench" / "results" / name).exists(), (
            f"{page.relative_to(ROOT)} names result {name}, not in bench/results"
        )
