"""`qmf decode` on the real capture: summary JSON and record output files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from tests.codec.summary_ref import with_final_samples


def test_decode_summary_matches_the_reference(
    shared_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")
    assert main(["decode", "--input", path, "--summary"]) == 0
    got = json.loads(capsys.readouterr().out)
    with open(os.path.join(shared_dir, "samples", "qpidd-capture-20s.summary.json")) as f:
        expected = json.load(f)
    expected.pop("by_routing_key_pattern")
    # seeded with qpid's XML (the default): the wire's 45 schemas equal the seed's
    assert got.pop("schemas") == {
        "seed": "xml",
        "seeded_classes_used_as_is": 4,
        "classes_from_wire": 45,
        "wire_differs_from_seed": [],
    }
    origins = got.pop("v1_schema_origin_by_class")
    assert {o for c in origins.values() for o in c} == {"wire"}
    assert got == with_final_samples(expected)


def test_decode_output_jsonl_and_parquet(shared_dir: str, tmp_path: Path) -> None:
    path = os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")
    out = tmp_path / "records.jsonl"
    assert main(["decode", "--input", path, "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2087
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    assert kinds["object"] == 320 + 575 + 37 + 604 + 96
    assert kinds["event"] == 144 + 142
    first_obj = next(r for r in rows if r["kind"] == "object" and r["dialect"] == "AM2")
    assert set(first_obj) >= {
        "update_ns",
        "flags",
        "epoch",
        "broker_bank",
        "agent_bank",
        "object_num",
        "values",
    }
    pq_path = tmp_path / "records.parquet"
    assert main(["decode", "--input", path, "--output", str(pq_path)]) == 0
    table = pq.read_table(pq_path)
    assert table.num_rows == 2087
    assert table.column("kind").to_pylist().count("object") == kinds["object"]


def test_decode_missing_input_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decode", "--input", str(tmp_path / "nope.jsonl"), "--summary"]) == 2
    assert "qmf decode:" in capsys.readouterr().err


def test_decode_schemas_from_a_file_and_bad_seeds(
    shared_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")
    xml = os.path.join(shared_dir, "spec", "schema", "qpid-management-schema.xml")
    assert main(["decode", "--input", path, "--summary", "--schemas", xml]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["decode_problems"] == 0
    assert got["schemas"]["seed"] == xml and got["schemas"]["classes_from_wire"] == 45
    assert got["schemas"]["wire_differs_from_seed"] == []
    assert main(["decode", "--input", path, "--summary", "--schemas", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["schemas"]["seeded_classes_used_as_is"] == 0
    assert main(["decode", "--input", path, "--schemas", str(tmp_path / "no.xml")]) == 2
    assert "--schemas" in capsys.readouterr().err
