"""Every relative link in the README and docs/ leads somewhere: the file exists, and a
``#anchor`` names one of its headings (GitHub's slugs). Docs move (the README's reference
moved to docs/); a link left pointing at the old place fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"(?ms)^```.*?^```")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation out, spaces to dashes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = FENCE.sub("", doc.read_text())
    return {slug(h) for h in re.findall(r"(?m)^#{1,6} (.+)$", text)}


def broken_links() -> list[str]:
    broken: list[str] = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = FENCE.sub("", doc.read_text())
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(ROOT)}: {target}"
            if not file.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{where} (no heading with that anchor)")
    return broken


def test_every_relative_link_in_the_docs_resolves() -> None:
    assert broken_links() == []


def test_the_slug_rule_matches_githubs() -> None:
    assert slug("Avro with a schema registry (issue 19)") == "avro-with-a-schema-registry-issue-19"
    assert slug("pg2kafka's own sessions: no user code") == "pg2kafkas-own-sessions-no-user-code"
    assert slug("`index.on_drop_table`") == "indexon_drop_table"
