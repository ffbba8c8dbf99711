"""The README and docs/ hold together: every relative link reaches a file in the repository (and, with `#anchor`, a
heading of that file, slugged as GitHub does), and the README stays a front door of at most 200 lines.

Plain text reading only, no import of the engine: this runs in well under a second.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200

FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+).+?\1", re.DOTALL)
# [text](target) and ![alt](target); the text may span lines. A target may carry a "title" after a space.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def without_code(text: str) -> str:
    """The text with fenced blocks and inline code blanked: a `[x](y)` there is an example, not a link."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub(lambda m: " " * len(m.group(0)), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without Markdown markup, lower-cased, with everything but letters,
    digits, marks, spaces, hyphens and underscores removed, and each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays, its target goes
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = text.strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file; repeated headings get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(document: Path) -> list[str]:
    """`document: target (why)` for every relative link in document that does not resolve."""
    broken = []
    for match in LINK.finditer(without_code(document.read_text(encoding="utf-8"))):
        target = match.group(1)
        if not target or SCHEME.match(target):
            continue  # web and mail links are not checked here
        file_part, _, anchor = target.partition("#")
        resolved = (document.parent / unquote(file_part)).resolve() if file_part else document
        where = f"{document.relative_to(ROOT)}: {target}"
        if not resolved.is_relative_to(ROOT):
            broken.append(f"{where} (outside the repository: a fresh clone has no {resolved})")
        elif not resolved.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and (resolved.suffix != ".md" or unquote(anchor).lower() not in anchors(resolved)):
            broken.append(f"{where} (no heading #{anchor} in {resolved.relative_to(ROOT)})")
    return broken


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = [line for document in documents() for line in broken_links(document)]
    assert broken == [], "broken links:\n" + "\n".join(broken)


def test_the_readme_is_at_most_200_lines():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES} (move detail to docs/)"


def test_the_checker_finds_a_broken_file_and_a_broken_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A `cell`'s detail × 2\n\n## Same\n\n## Same\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md#a-cells-detail--2) [ok](docs/a.md#same-1) ![img](docs/a.md) [web](https://x.y)\n"
                    "[gone](docs/b.md) [bad anchor](docs/a.md#nope) [self](#nope) [out](../x.md)\n"
                    "`[code](not/checked.md)`\n```\n[fenced](not/checked.md)\n```\n", encoding="utf-8")
    assert broken_links(page) == [
        "README.md: docs/b.md (no such file)",
        "README.md: docs/a.md#nope (no heading #nope in docs/a.md)",
        "README.md: #nope (no heading #nope in README.md)",
        f"README.md: ../x.md (outside the repository: a fresh clone has no {tmp_path.parent / 'x.md'})",
    ]
