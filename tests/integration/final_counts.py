"""Issue 47's checks on a lake made from real qpidd traffic: every deleted queue's final
counts in gold, and one row per object."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from pipeline.codec.capture import read_capture
from pipeline.codec.records import ObjectSample
from pipeline.codec.seed import seeded_registry
from pipeline.lake import delta

FINAL = ("msgTotalEnqueues", "msgTotalDequeues")
MAX_GAP_NS = 300 * 10**9  # gold's max_gap_s: older objects start at their first sample


def deleted_queue_finals(capture: Path) -> dict[tuple[str, int], dict[str, int]]:
    """(dialect, create_ns) -> the counters of each deleted queue's delete record, decoded
    by the codec alone (the broker's own final figures)."""
    reg = seeded_registry()
    out: dict[tuple[str, int], dict[str, int]] = {}
    for m in read_capture(capture):
        for r in m.decode(reg).records:
            if isinstance(r, ObjectSample) and r.class_name == "queue" and r.delete_ns:
                vals = {s: int(r.values[s]) for s in FINAL if s in r.values}
                if vals:
                    out[(r.dialect, r.create_ns)] = vals
    return out


def check_final_counts(data: Path, capture: Path) -> dict[str, int]:
    """For every deleted queue of the capture: gold's last value of each final counter is
    the delete record's, and (created within ``MAX_GAP_NS`` of its first sample) its deltas
    from the creation sum to it. Returns how many queues and sums were checked."""
    finals = deleted_queue_finals(capture)
    life = delta.read_arrow(str(data / "gold" / "lifecycle_state")).to_pylist()
    ident = {(r["agent"], r["object_id"]): r for r in life if r["class_name"] == "queue"}
    rows: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in delta.read_arrow(str(data / "gold" / "statistic_rates")).to_pylist():
        lc = ident.get((r["agent"], r["object_id"]))
        if lc is not None and r["statistic"] in FINAL:
            rows[(lc["dialect"], lc["create_ns"], r["statistic"])].append(r)
    checked = sums = 0
    for (dialect, created), vals in finals.items():
        lc = next(r for r in life if r["dialect"] == dialect and r["create_ns"] == created)
        for stat, want in vals.items():
            got = sorted(rows[(dialect, created, stat)], key=lambda r: r["end_ns"])
            assert got, (dialect, lc["name"], stat, "no rate row")
            assert got[-1]["value"] == want, (dialect, lc["name"], stat, got[-1]["value"], want)
            if lc["first_seen_ns"] - created <= MAX_GAP_NS:
                assert sum(r["delta"] for r in got) == want, (dialect, lc["name"], stat)
                sums += 1
        checked += 1
    return {"queues": checked, "sums": sums}


def objects_per_identity(data: Path) -> dict[tuple[str, str, str, int], list[dict[str, Any]]]:
    """(broker, class, name, create_ns) -> its rows of gold ``object_lifecycles``: one
    object's identity whatever agent name or dialect reported it."""
    out: dict[tuple[str, str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in delta.read_arrow(str(data / "gold" / "object_lifecycles")).to_pylist():
        out[(r["broker"], r["class_name"], r["name"], r["create_ns"])].append(r)
    return out


def reporters_per_identity(data: Path) -> dict[tuple[str, str, str, int], list[str]]:
    """(broker, class, name, create_ns) -> the dialects of ``lifecycle_state`` rows (each
    agent's view) that reported it."""
    out: dict[tuple[str, str, str, int], list[str]] = defaultdict(list)
    for r in delta.read_arrow(str(data / "gold" / "lifecycle_state")).to_pylist():
        out[(r["broker"], r["class_name"], r["name"], r["create_ns"])].append(r["dialect"])
    return {k: sorted(v) for k, v in out.items()}
