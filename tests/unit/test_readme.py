"""The README is a front page (at most 300 lines) and docs/ holds the rest; no relative link in them leads nowhere.

Links are markdown's inline ones, `[text](target)`, outside code blocks and code spans; a target with a scheme
(https:, mailto:) is not ours to check. The file a link names must exist; an anchor (`#...`) into one of these pages
must name one of its headings, as GitHub spells heading anchors.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_README_LINES = 300
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", flags=re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def link_targets(text: str) -> list[str]:
    """The inline link targets of ``text`` that are not URLs, code blocks and spans left out."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return [target for target in LINK.findall(prose) if not SCHEME.match(target)]


def relative_links(text: str) -> list[str]:
    """The paths ``text`` links to (anchors dropped; a bare anchor is no path)."""
    return [path for target in link_targets(text) if (path := target.split("#", 1)[0])]


def anchors(text: str) -> set[str]:
    """The heading anchors GitHub gives a page: lowercased, punctuation dropped, spaces as hyphens, -1 on a repeat."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCE.sub("", text), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_the_readme_is_a_front_page_of_at_most_300_lines():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move the detail to a page under docs/"


def test_the_docs_folder_has_an_index_and_the_readme_links_every_page():
    readme = set(relative_links((ROOT / "README.md").read_text()))
    pages = {f"docs/{page.name}" for page in PAGES[1:]}
    assert "docs/README.md" in pages
    assert pages <= readme, f"pages the README does not link: {sorted(pages - readme)}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_that_exists(page: Path):
    missing = [link for link in relative_links(page.read_text()) if not (page.parent / link).exists()]
    assert missing == [], f"{page.relative_to(ROOT)} links to what does not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_anchor_into_these_pages_names_a_heading(page: Path):
    wrong = []
    for target in link_targets(page.read_text()):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if anchor and linked in PAGES and anchor not in anchors(linked.read_text()):
            wrong.append(target)
    assert wrong == [], f"{page.relative_to(ROOT)} links to headings that do not exist: {wrong}"


def test_anchors_are_spelt_as_github_spells_them():
    text = "# The sandbox\n## Deploy, verify, promote\n### The watch (`metrics: vllm`)\n## Notes\n## Notes\n"
    assert anchors(text) == {"the-sandbox", "deploy-verify-promote", "the-watch-metrics-vllm", "notes", "notes-1"}


def test_links_are_found_and_anchors_and_code_ignored():
    text = (
        "[a](docs/using.md#the-flows) and [b](https://example.com) ![c](img/x.png) [d](#local)\n"
        "`[e](in-a-span.md)`\n```\n[f](in-a-block.md)\n```\n"
    )
    assert relative_links(text) == ["docs/using.md", "img/x.png"]
