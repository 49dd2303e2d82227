"""Simulator runs in each dialect through bronze and silver: every sample equals the manifest.

``qmf sim`` writes a capture and its ground-truth manifest (every record it
published, with its message number). The capture becomes bronze (offset =
message number), the silver job decodes it, and every object sample, event
and heartbeat is compared with the manifest: values (through the registry's
slots, i.e. exactly what ``wide_view`` shows) and ns timestamps.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from pipeline.cli import main as qmf
from pipeline.codec.capture import read_capture
from pipeline.codec.layout import to_json
from pipeline.codec.schema import v2_name
from pipeline.lake import delta
from pipeline.silver import SilverSettings, bronze_rows, run_silver_batch, write_bronze

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

START_NS = 1_795_300_000_000_000_000
_U64 = (4, 8, 9)


def _value(t: int, v: Any) -> Any:
    """A silver list value in the manifest's JSON form (``pipeline.sim.manifest.jsonable``)."""
    if v is None:
        return None
    if t == 11:
        return bool(v)
    if t in _U64 and v < 0:
        return v + (1 << 64)
    if t == 12:
        return float(np.float32(v))
    if t == 10:  # AM1/AM2 ids as text; QMF v2 ids as their map, in JSON
        return json.loads(v) if v.startswith("{") else {"oid": v}
    if t in (15, 21, 22):
        return json.loads(v)
    return v


def _manifest_value(t: int, v: Any) -> Any:
    if t == 12 and v is not None:
        return float(np.float32(v))
    return v


def _silver(root: SilverSettings) -> tuple[dict[tuple[int, int], dict[str, Any]], dict[Any, Any]]:
    reg = {
        (r["package"], r["class_name"], bytes(r["schema_hash"])): r
        for r in delta.read_arrow(root.path("schema_registry")).to_pylist()
    }
    out = {}
    for r in delta.read_arrow(root.path("object_samples")).to_pylist():
        row = reg[(r["package"], r["class_name"], bytes(r["schema_hash"]))]
        values = {}
        for e in [*(row["properties"] or ()), *(row["statistics"] or ())]:
            v = r[e["slot_kind"]][e["slot"]]
            if v is not None:
                values[e["name"]] = _value(e["type_code"], v)
        out[(r["offset"], r["record_index"])] = {**r, "values": values}
    return out, reg


@pytest.mark.parametrize("dialect", ["am1", "am2", "v2"])
def test_simulator_run_equals_its_manifest(
    spark: SparkSession, tmp_path: Any, dialect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cap, man = str(tmp_path / "sim.jsonl"), str(tmp_path / "truth.jsonl")
    args = ["--dialect", dialect, "--queues", "6", "--intervals", "3", "--events", "2"]
    assert qmf(["sim", "-o", cap, "--manifest", man, *args, "--start-ns", str(START_NS)]) == 0
    capsys.readouterr()
    s = SilverSettings(bronze=str(tmp_path / "bronze"), root=str(tmp_path / "silver"))
    write_bronze(s.bronze, [bronze_rows(read_capture(cap))])
    run_silver_batch(spark, s, 0)

    # Manifest records of published messages, numbered within their message.
    rows = [json.loads(line) for line in open(man, encoding="utf-8")]
    recs = [r for r in rows if r.get("source") == "publish" and "message" in r]
    index: dict[int, int] = defaultdict(int)
    want: dict[str, dict[tuple[int, int], dict[str, Any]]] = defaultdict(dict)
    for r in recs:
        key = (r["message"], index[r["message"]])
        index[r["message"]] += 1
        want[r["kind"]][key] = r
    samples, reg = _silver(s)
    assert set(samples) == set(want["object"])
    for key, w in want["object"].items():
        g = samples[key]
        assert (g["package"], g["class_name"], bytes(g["schema_hash"]).hex()) == (
            w["package"], w["class_name"], w["schema_hash"])  # fmt: skip
        assert (g["update_ns"], g["create_ns"], g["delete_ns"]) == (
            w["update_ns"], w["create_ns"], w["delete_ns"])  # fmt: skip
        if w["delete_ns"]:
            assert g["delete_time"].timestamp() * 1e9 == pytest.approx(w["delete_ns"], abs=1000)
        row = reg[(g["package"], g["class_name"], bytes(g["schema_hash"]))]
        types = {e["name"]: e["type_code"] for e in [*row["properties"], *row["statistics"]]}
        # The manifest holds what went out: v2 maps name some statistics as qpidd does.
        stats = {e["name"] for e in row["statistics"]}
        wire = {(v2_name(n, stats) if dialect == "v2" else n): n for n in types}
        assert g["values"] == {wire[k]: _manifest_value(types[wire[k]], v)
                               for k, v in w["values"].items()}, key  # fmt: skip

    events = {(r["offset"], r["record_index"]): r for r in delta.read_arrow(s.path("events")).to_pylist()}
    assert set(events) == set(want["event"])
    for key, w in want["event"].items():
        g = events[key]
        assert (g["event_name"], g["timestamp_ns"], g["severity"]) == (
            w["class_name"], w["timestamp_ns"], w["severity"])  # fmt: skip
        assert set(json.loads(g["arguments"])) == set(w["values"])
        typed = {**dict(g["arg_ints"]), **dict(g["arg_floats"]), **dict(g["arg_texts"])}
        assert typed == {
            k: int(v) if isinstance(v, bool) else to_json(v) if isinstance(v, dict | list) else v
            for k, v in w["values"].items()
        }
    beats = {(r["offset"], r["record_index"]): r for r in delta.read_arrow(s.path("heartbeats")).to_pylist()}
    assert {k: b["timestamp_ns"] for k, b in beats.items()} == {
        k: w["timestamp_ns"] for k, w in want["heartbeat"].items()
    }
    assert delta.read_arrow(s.path("quarantine")).num_rows == 0
    assert delta.read_arrow(s.path("parked")).num_rows == 0
    assert len(samples) > 20
