"""The table reference (docs/tables.md), generated from the schemas declared here.

    python -m schemas.reference > docs/tables.md

A test compares the file with ``render()``, so the reference cannot go stale.
Each table's description is the comment block above its declaration; a
column's note is the comment on its ``pa.field`` line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import ModuleType

import pyarrow as pa

from pipeline.lake.retention import DEFAULTS as RETENTION
from schemas import gold, silver, tables

MODULES: tuple[ModuleType, ...] = (tables, silver, gold)
LAYERS = {"landing": "landing log", "bronze": "bronze", "content_quarantine": "codec"}
_FIELD_NOTE = re.compile(r'pa\.field\("([^"]+)".*#\s*(.+)$')


def _source(module: ModuleType) -> list[str]:
    assert module.__file__ is not None
    return Path(module.__file__).read_text(encoding="utf-8").splitlines()


def _declaration(name: str, schema: pa.Schema) -> tuple[ModuleType, str] | None:
    for module in MODULES:
        for attr, value in vars(module).items():
            if value is schema and attr.isupper():
                return module, attr
    return None


def _description(lines: list[str], const: str) -> str:
    for i, line in enumerate(lines):
        if line.startswith(f"{const} = ") or line.startswith(f"{const}: "):
            comments: list[str] = []
            j = i - 1
            while j >= 0 and lines[j].startswith("#"):
                comments.insert(0, lines[j].lstrip("# ").rstrip())
                j -= 1
            return " ".join(c for c in comments if c)
    return ""


def _notes(lines: list[str]) -> dict[str, str]:
    notes: dict[str, str] = {}
    for line in lines:
        m = _FIELD_NOTE.search(line)
        if m and m.group(1) not in notes:
            notes[m.group(1)] = m.group(2).strip()
    return notes


def _layer(name: str, module: ModuleType) -> str:
    if name in LAYERS:
        return LAYERS[name]
    return {silver: "silver", gold: "gold"}.get(module, "")


def render() -> str:
    out = [
        "# Table reference",
        "",
        "Generated from `schemas/` by `python -m schemas.reference > docs/tables.md`;",
        "`tests/test_table_reference.py` fails when this file is stale. Arrow types;",
        "Spark's follow (`schemas.tables.spark_schema`). Timestamps are UTC microseconds;",
        "QMF's own nanosecond times are int64 `*_ns` columns.",
        "",
    ]
    # Layer by layer in declaration order, whatever order the modules were imported in
    # (they add themselves to tables.TABLES on import).
    layered = set(silver.SILVER_TABLES) | set(gold.GOLD_TABLES)
    ordered = {k: v for k, v in tables.TABLES.items() if k not in layered}
    ordered.update(silver.SILVER_TABLES)
    ordered.update(gold.GOLD_TABLES)
    for name, schema in ordered.items():
        found = _declaration(name, schema)
        module, const = found if found is not None else (tables, "")
        lines = _source(module)
        notes = _notes(lines)
        for other in MODULES:  # fields declared in shared lists of another module
            for k, v in _notes(_source(other)).items():
                notes.setdefault(k, v)
        out += [f"## `{name}` ({_layer(name, module)})", ""]
        desc = _description(lines, const) if const else ""
        if desc:
            out += [desc, ""]
        if name in RETENTION:
            column, keep = RETENTION[name]
            out += [f"Rows are kept {keep.replace('d', ' days')} by `{column}` unless configured otherwise "
                    "(`pipeline/lake/retention.py`, docs/maintenance.md).", ""]
        out += ["| column | type | nullable | note |", "|---|---|---|---|"]
        for f in schema:
            out.append(f"| `{f.name}` | `{f.type}` | {'yes' if f.nullable else 'no'} | "
                       f"{notes.get(f.name, '')} |")  # fmt: skip
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
