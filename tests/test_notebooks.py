"""Notebooks run top to bottom against a real bronze table written by the Delta layer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from pipeline.codec.message import encode_message
from receivers.landing import LandedMessage, to_table
from schemas.tables import BRONZE

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _code(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def test_bronze_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.codec.records import Heartbeat

    msgs = []
    for i in range(3):
        hb = Heartbeat(dialect="AM1", opcode="h", seq=0, timestamp_ns=1_000_000_000 * (i + 1))
        body = encode_message([hb])
        assert isinstance(body, bytes)
        msgs.append(LandedMessage(body=body, routing_key=f"mgmt.agent{i}.heartbeat"))
    landed = to_table("p0", 0, msgs)
    landed = landed.drop_columns(["duplicate_of"])  # bronze keeps first copies only
    table = landed.append_column("batch_id", pa.array([0] * 3, pa.int64())).cast(BRONZE)
    write_deltalake(str(tmp_path / "bronze"), table)

    monkeypatch.setenv("QMF_DATA", str(tmp_path))
    scope: dict[str, Any] = {}
    exec(compile(_code(NOTEBOOKS / "bronze.ipynb"), "bronze.ipynb", "exec"), scope)
    assert scope["bronze"].shape[0] == 3
    assert dict(scope["by_opcode"]) == {"h": 3}
    assert scope["problems"] == 0
    assert os.environ["QMF_DATA"] == str(tmp_path)
