"""A small lakehouse made from simulated agents, in ``qmf run``'s folder layout.

``build_lake`` runs ``qmf sim`` into a capture (no broker), writes the
messages to bronze in several bronze batches (one per simulated interval
group, received times = the simulated times), decodes every bronze batch
into silver with the silver writer and derives gold in batch. Tests of what
reads the tables (notebooks, ``qmf top``, metrics, backfill, maintenance)
share it through the session fixture ``sim_lake`` in ``tests/conftest.py``;
a test that changes the tables must copy the folder first (``copy_lake``).

Layout (as ``qmf run --data ROOT`` writes it)::

    ROOT/bronze  ROOT/silver/<table>  ROOT/gold/<table>  ROOT/sim-manifest.jsonl
"""

from __future__ import annotations

import contextlib
import io
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

START_NS = 1_800_000_000_000_000_000  # 2027-01-15T08:00:00Z: fixed, so runs are identical
SIM_ARGS = ("--dialect", "am1", "--agents", "2", "--queues", "6", "--transients", "1",
            "--events", "2", "--intervals", "12", "--interval", "1", "--seed", "11",
            "--restart", "1:7", "--start-ns", str(START_NS))  # fmt: skip
BRONZE_BATCHES = 4
SPAN_US = 12_000_000  # the 12 simulated intervals of 1 s


def received_us(index: int, total: int) -> int:
    """Receive time of the index-th message: spread over the simulated span, in order
    (a capture's own received_at is the wall clock, which would make runs differ)."""
    return START_NS // 1000 + index * SPAN_US // total


@dataclass(frozen=True)
class Lake:
    """Where the tables are, and the settings that wrote them."""

    root: Path
    manifest: Path

    @property
    def bronze(self) -> Path:
        return self.root / "bronze"

    @property
    def silver(self) -> Path:
        return self.root / "silver"

    @property
    def gold(self) -> Path:
        return self.root / "gold"


def build_lake(spark: SparkSession, root: Path) -> Lake:
    """Simulate, land as bronze, decode to silver, derive gold: all in batch, deterministic."""
    from pipeline.cli import main
    from pipeline.codec.capture import read_capture
    from pipeline.gold import GoldSettings, run_gold_batch
    from pipeline.silver import SilverBatchWriter, SilverSettings, bronze_rows, write_bronze

    root.mkdir(parents=True, exist_ok=True)
    capture, manifest = root / "sim.jsonl", root / "sim-manifest.jsonl"
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["sim", "-o", str(capture), "--manifest", str(manifest), *SIM_ARGS])
    if rc != 0:
        raise RuntimeError(f"qmf sim exited {rc}")
    msgs = list(read_capture(str(capture)))
    size = -(-len(msgs) // BRONZE_BATCHES)
    batches = []
    for b in range(BRONZE_BATCHES):
        lo = b * size
        table = bronze_rows(msgs[lo : lo + size], first_offset=lo, batch_id=b)
        batches.append(table.set_column(
            table.schema.get_field_index("received_at"), "received_at",
            pa.array([received_us(lo + i, len(msgs)) for i in range(table.num_rows)],
                     pa.timestamp("us", tz="UTC")),
        ))  # fmt: skip
    lake = Lake(root=root, manifest=manifest)
    write_bronze(str(lake.bronze), batches)
    silver = SilverSettings(bronze=str(lake.bronze), root=str(lake.silver))
    writer = SilverBatchWriter(silver, app_id="qmf-silver")
    for b, table in enumerate(batches):
        writer.decode_local(table, b)
    run_gold_batch(spark, GoldSettings(silver=str(lake.silver), root=str(lake.gold)), 0,
                   app_id="qmf-gold")  # fmt: skip
    return lake


def copy_lake(lake: Lake, dest: Path) -> Lake:
    """A private copy of the lake for a test that writes to it."""
    shutil.copytree(lake.root, dest)
    return Lake(root=dest, manifest=dest / lake.manifest.name)


def stray_files(table: str | Path) -> list[str]:
    """What a table folder holds beyond the data files its log ever listed (live, or
    removed and waiting for VACUUM), the log and the lock: files no commit lists, and
    scratch folders. Empty after every batch's commit (what attempts wrote and did not
    commit went with the commit)."""
    import json
    import os
    import urllib.parse

    import pyarrow.parquet as pq

    from pipeline.lake import delta

    root = Path(table)
    listed: set[str] = set()
    for entry in (root / "_delta_log").iterdir():
        if entry.name.endswith(".json"):
            for line in entry.read_text().splitlines():
                add = json.loads(line).get("add")
                if add is not None:
                    listed.add(add["path"])
        elif entry.name.endswith(".checkpoint.parquet"):
            adds = pq.read_table(entry, columns=["add"]).column("add").to_pylist()
            listed.update(a["path"] for a in adds if a is not None)
    known = {os.path.normpath(root / urllib.parse.unquote(p)) for p in listed}
    out = []
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "_delta_log"]
        for name in names:
            full = os.path.normpath(os.path.join(dirpath, name))
            if name != delta.LOCK_FILE and not name.endswith(".crc") and full not in known:
                out.append(os.path.relpath(full, root))
    if (root / delta.SCRATCH_DIR).exists():
        out.append(delta.SCRATCH_DIR)
    return sorted(out)


def sorted_rows(table: pa.Table, drop: tuple[str, ...] = ()) -> list[dict[str, object]]:
    """The table's rows (``drop``'s columns out) in a total order, for comparing two
    tables row for row: every flat column is a sort key; a map's entries, which have no
    order (gold's ``properties`` come out of a shuffle in whatever order its tasks met
    them), are compared sorted by key. Reading through delta-rs and comparing here costs
    milliseconds where a Spark read and a DataFrame comparison cost seconds per table."""
    table = table.drop_columns([c for c in drop if c in table.column_names])
    keys = [
        (f.name, "ascending")
        for f in table.schema
        if not (pa.types.is_list(f.type) or pa.types.is_map(f.type) or pa.types.is_struct(f.type))
    ]
    maps = [f.name for f in table.schema if pa.types.is_map(f.type)]
    rows = table.sort_by(keys).to_pylist()
    for row in rows:
        for name in maps:
            if row[name] is not None:
                row[name] = sorted(row[name])
    return rows
