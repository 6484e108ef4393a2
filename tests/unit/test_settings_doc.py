"""The settings reference in each service's doc is generated from its model: a setting
added, removed or changed without the doc following fails here (and one without a
docstring too)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from shared.settings import Section
from shared.settings_doc import BEGIN, END, render, replace_block, rows, stale_docs, undocumented


def test_every_service_doc_matches_its_settings_model() -> None:
    problems = stale_docs()
    assert problems == [], "\n".join(problems) + "\nrun: python -m shared.settings_doc --write"


class _Inner(Section):
    """An inner section."""

    size: int = Field(default=4, ge=1)
    """How many."""
    secret: str | None = None


class _Model(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    inner: _Inner = _Inner()
    names: list[str] = Field(default_factory=lambda: ["a|b"])
    """Names; a `|` stays in its cell."""


def test_a_setting_without_a_docstring_is_named_and_cells_are_escaped() -> None:
    assert undocumented(_Model) == ["inner.secret"]
    text = render(_Model, "X_")
    assert "| `inner.size` | integer | `4` | How many. |" in text
    assert '| `names` | list of string | `["a\\|b"]` | Names; a `\\|` stays in its cell. |' in text
    assert "#### `inner`\n\nAn inner section." in text


class _Outer(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    inner: _Inner = _Inner()
    tuned: _Inner = _Inner(size=9)
    """A section whose default sets one of its settings."""


def test_a_section_default_of_its_own_is_what_the_reference_shows() -> None:
    shown = {r.key: r.default for r in rows(_Outer)}
    assert (shown["inner.size"], shown["tuned.size"], shown["tuned.secret"]) == (
        "`4`",
        "`9`",
        "unset",
    )


def test_a_doc_without_markers_is_refused_with_their_text(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no settings markers"):
        replace_block("# doc\n", "table", "docs/x.md")
    doc = f"intro\n{BEGIN}\nold\n{END}\noutro\n"
    assert replace_block(doc, "new\n", "docs/x.md") == f"intro\n{BEGIN}\n\nnew\n\n{END}\noutro\n"
