"""docs/tables.md is generated from schemas/: it must equal what the schemas say now."""

from __future__ import annotations

from pathlib import Path

from schemas import tables
from schemas.reference import render

DOC = Path(__file__).resolve().parents[1] / "docs" / "tables.md"


def test_table_reference_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/tables.md is stale: python -m schemas.reference > docs/tables.md"
    )


def test_every_table_and_column_is_listed() -> None:
    text = render()
    for name, schema in tables.TABLES.items():
        assert f"## `{name}`" in text
        for f in schema:
            assert f"| `{f.name}` | `{f.type}` |" in text
