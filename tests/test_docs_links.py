"""Every relative link in README.md and docs/**/*.md points to a file that exists, and
every `#anchor` to a heading of its target; the user guide carries no lab notes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.S | re.M)


def links(page: Path) -> list[str]:
    """Link targets of a page, code blocks and inline code left out."""
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)
    return LINK.findall(text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\*|_", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        name, n = slug(heading), 1
        while name in found:  # repeated headings get -1, -2 …
            name, n = f"{slug(heading)}-{n}", n + 1
        found.add(name)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: …
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading '#{anchor}' in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


def test_the_link_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [missing](nope.md) `[code](nope.md)`\n```\n[x](nope.md)\n```\n")
    assert links(page) == ["#title", "nope.md"]
    assert anchors(page) == {"title"}


def test_the_guide_has_no_dates_run_directories_or_issue_numbers():
    lab_notes = re.compile(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]|runs/s[0-9]+|[Ii]ssue [0-9]+")
    found = [f"{page.name}:{n}: {line.strip()}" for page in sorted((ROOT / "docs" / "guide").glob("*.md"))
             for n, line in enumerate(page.read_text().splitlines(), 1) if lab_notes.search(line)]
    assert not found, "\n".join(found)
