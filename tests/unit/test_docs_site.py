"""The documentation site (mkdocs.yml) holds every page of docs/, and its nav names only pages that exist.

CI builds the site with ``mkdocs build --strict`` (.ci/run), where either mistake fails the
build; this test says so in the unit tests already, without mkdocs installed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def nav_pages() -> set[str]:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text.split("\nnav:\n", 1)[1].split("\n\n", 1)[0]
    nav = re.split(r"\n[a-z_]+:", nav, maxsplit=1)[0]  # up to the next top-level key
    return set(re.findall(r"([\w/.-]+\.md)\s*$", nav, flags=re.M))


def test_every_page_is_in_the_nav_and_every_nav_page_exists():
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    listed = nav_pages()
    assert "index.md" in listed and "api/stores.md" in listed
    assert not pages - listed, f"add these pages to the nav of mkdocs.yml: {sorted(pages - listed)}"
    assert not listed - pages, f"mkdocs.yml's nav names pages docs/ does not have: {sorted(listed - pages)}"
