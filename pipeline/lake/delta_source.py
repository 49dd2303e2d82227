"""The Spark data source ``qmf-delta``: a Delta table's appends as a replayable stream.

Spark here has no delta-spark JARs, so it cannot ``readStream.format("delta")``.
``spark.readStream.format("qmf-delta").option("path", TABLE).load()`` serves
the rows of the Parquet files a Delta table adds, in commit order, the way
Delta's own streaming source does:

* the stream is a sequence of *units*: optionally the table's snapshot at the
  version current when the query first started (``startingVersion=earliest``),
  then every later commit; a unit's files are numbered ``0..n-1``;
* an offset ``{"version": v, "index": i}`` is an exclusive end: every file of
  the units before version ``v`` and the first ``i`` files of version ``v``
  were read; a position inside the starting snapshot carries
  ``"snapshot": true``. Commits are immutable, so a range always lists the
  same files and ``read()`` re-reads them identically after a restart;
* a batch's end offset also names its start (``"from"``): Spark does not log a
  first batch's start and asks ``initialOffset()`` again after a restart, so
  the end alone says which files the batch holds, for a driver reading its
  batch from the offset log (``batch_files``) and for a replay;
* adds with ``dataChange=false`` (compaction) are not data and are skipped;
  a commit that removes data stops the query unless ``ignoreDeletes``,
  ``ignoreChanges`` or ``skipChangeCommits`` says what to do (Delta's names
  and meanings).

Commits after the start are read straight from ``_delta_log/<v>.json`` (exact
and cheap); the starting snapshot comes from delta-rs (``get_add_actions``),
which also understands checkpoints. Only local tables, as in pipeline.lake.delta.

One small class per role, as in pipeline/source.py:

* ``DeltaDataSource``       name, schema (the table's), stream reader;
* ``DeltaSourceOptions``    options parsed and validated once;
* ``Position``              an offset, its JSON form and order;
* ``DataFile`` / ``FileGroup``  picklable units of work shipped to executors;
* ``DeltaLogReader``        commits and snapshots of the log, cached per process;
* ``StreamPlanner``         which files a range holds, under limits (pure over the log);
* ``DeltaStreamReader``     offsets, admission control, AvailableNow.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pipeline.runtime.streaming import offset_log_sources

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession

    from pipeline.lake.delta import CommitStamp

log = logging.getLogger(__name__)

NAME = "qmf-delta"
LOG_DIR = "_delta_log"
COMMIT_RE = re.compile(r"^(\d{20})\.json$")
DEFAULT_MAX_FILES_PER_TRIGGER = 1000  # Delta's default
DEFAULT_MAX_BYTES_PER_PARTITION = 128 * 1024 * 1024  # Spark's maxPartitionBytes
FILE_OPEN_COST_BYTES = 4 * 1024 * 1024  # Spark's openCostInBytes
ARROW_BATCH_ROWS = 10_000
ARROW_BATCH_BYTES = 64 * 1024 * 1024
TRUE_VALUES = {"true", "1", "yes", "on"}
FALSE_VALUES = {"false", "0", "no", "off"}


class DeltaSourceError(ValueError):
    """An option of the ``qmf-delta`` source is missing or invalid."""


class DeltaStreamError(RuntimeError):
    """The table's log holds something this source cannot stream (and will not skip)."""


# ---------------------------------------------------------------------------
# Options


def _parse_bool(name: str, value: str) -> bool:
    low = value.strip().lower()
    if low in TRUE_VALUES:
        return True
    if low in FALSE_VALUES:
        return False
    raise DeltaSourceError(f"option {name}={value!r}: expected true or false")


def _parse_positive_int(name: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise DeltaSourceError(f"option {name}={value!r}: expected an integer") from None
    if n <= 0:
        raise DeltaSourceError(f"option {name}={value!r}: must be > 0")
    return n


def _parse_starting_version(value: str) -> str | int:
    low = value.strip().lower()
    if low in ("earliest", "latest"):
        return low
    try:
        n = int(low)
    except ValueError:
        raise DeltaSourceError(
            f"option startingVersion={value!r}: expected earliest, latest or a version >= 0"
        ) from None
    if n < 0:
        raise DeltaSourceError(f"option startingVersion={value!r}: a version must be >= 0")
    return n


@dataclass(frozen=True)
class DeltaSourceOptions:
    """The source's options, validated once so a typo fails at ``load()``, not mid-stream.

    ``maxFilesPerTrigger`` defaults to 1000 like Delta's; ``0``/``none`` is not
    accepted (use ``maxFilesPerTrigger`` large instead): an unbounded first
    batch over a big table is rarely what a job wants.
    """

    path: str
    starting_version: str | int = "earliest"
    max_files_per_trigger: int = DEFAULT_MAX_FILES_PER_TRIGGER
    max_rows_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    ignore_deletes: bool = False
    ignore_changes: bool = False
    skip_change_commits: bool = False
    max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION

    KNOWN = (
        "path",
        "startingversion",
        "maxfilespertrigger",
        "maxrowspertrigger",
        "maxbytespertrigger",
        "ignoredeletes",
        "ignorechanges",
        "skipchangecommits",
        "maxbytesperpartition",
    )

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> DeltaSourceOptions:
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        unknown = sorted(k for k in opts if k not in cls.KNOWN)
        if unknown:
            raise DeltaSourceError(f"unknown option(s) for source {NAME!r}: {', '.join(unknown)}")
        path = opts.get("path", "").strip()
        if not path:
            raise DeltaSourceError(f"source {NAME!r} needs option path (the Delta table's folder)")
        if path.startswith("file://"):
            path = urllib.parse.unquote(path.removeprefix("file://"))
        elif "://" in path:
            raise DeltaSourceError(f"option path={path!r}: only local tables are supported")

        def optional_int(key: str, name: str) -> int | None:
            raw = opts.get(key)
            return None if raw is None else _parse_positive_int(name, raw)

        return cls(
            path=os.path.abspath(path),
            starting_version=_parse_starting_version(opts.get("startingversion", "earliest")),
            max_files_per_trigger=_parse_positive_int(
                "maxFilesPerTrigger",
                opts.get("maxfilespertrigger", str(DEFAULT_MAX_FILES_PER_TRIGGER)),
            ),
            max_rows_per_trigger=optional_int("maxrowspertrigger", "maxRowsPerTrigger"),
            max_bytes_per_trigger=optional_int("maxbytespertrigger", "maxBytesPerTrigger"),
            ignore_deletes=_parse_bool("ignoreDeletes", opts.get("ignoredeletes", "false")),
            ignore_changes=_parse_bool("ignoreChanges", opts.get("ignorechanges", "false")),
            skip_change_commits=_parse_bool(
                "skipChangeCommits", opts.get("skipchangecommits", "false")
            ),
            max_bytes_per_partition=_parse_positive_int(
                "maxBytesPerPartition",
                opts.get("maxbytesperpartition", str(DEFAULT_MAX_BYTES_PER_PARTITION)),
            ),
        )


# ---------------------------------------------------------------------------
# Offsets


@dataclass(frozen=True, order=True)
class Position:
    """A place in the stream: before file ``index`` of unit ``version``.

    ``snapshot`` marks the starting snapshot (all live files of ``version``),
    which comes before the commit ``version + 1``. Canonical form: a unit
    read to its end is ``(version + 1, 0)``, so an unchanged table gives back
    the same JSON and Spark plans no batch.
    """

    version: int
    index: int = 0
    snapshot: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "index": self.index}
        if self.snapshot:
            out["snapshot"] = True
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Position:
        try:
            version, index = int(value["version"]), int(value["index"])
        except (KeyError, TypeError, ValueError):
            raise DeltaStreamError(
                f"not a {NAME} offset: {dict(value)!r} (expected {{version, index}}); "
                "was the checkpoint written by another source?"
            ) from None
        return cls(version, index, bool(value.get("snapshot", False)))


def end_offset(start: Mapping[str, Any], end: Position) -> dict[str, Any]:
    """A batch's end offset: ``end`` naming the batch's start (``"from"``), or ``start``
    itself, unchanged, when nothing was admitted (Spark compares the JSON: same JSON,
    no batch)."""
    begin = Position.from_json(start)
    if end == begin:
        return dict(start)
    return {**end.to_json(), "from": begin.to_json()}


def batch_start(end: Mapping[str, Any]) -> Position | None:
    """The start a batch's end offset names (``end_offset``); None for an offset written
    before ends named their start. A source with nothing new in a batch has its start
    logged again as its end: that end names an earlier batch's start, so callers
    check ``end == start`` (the previous entry) first."""
    start = end.get("from")
    return None if not isinstance(start, Mapping) else Position.from_json(start)


# ---------------------------------------------------------------------------
# Files and the work shipped to executors


@dataclass(frozen=True)
class DataFile:
    """One Parquet file of the table: where it is, what the log says about it.

    ``rows`` is the log's ``numRecords`` when the add carries stats (only used
    for admission control, never for correctness).
    """

    path: str  # local, absolute, decoded
    size: int
    rows: int | None
    partition_values: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class FileGroup(InputPartition):
    """The files one Spark task reads, in order. Plain values only, so it pickles."""

    files: tuple[DataFile, ...]


@dataclass
class Commit:
    """What one commit file says, reduced to what streaming needs."""

    version: int
    adds: list[DataFile] = field(default_factory=list)  # dataChange=true, in log order
    data_removes: int = 0  # remove actions with dataChange=true
    compaction_adds: int = 0  # add actions with dataChange=false (skipped)
    schema_json: str | None = None  # metaData.schemaString, when the commit has one
    protocol: dict[str, Any] | None = None
    operation: str = ""
    deletion_vectors: int = 0


def local_file(root: str, delta_path: str) -> str:
    """An add/remove ``path`` (URI-encoded, relative or absolute) as a local path."""
    if "://" in delta_path:
        parsed = urllib.parse.urlparse(delta_path)
        if parsed.scheme != "file":
            raise DeltaStreamError(f"only local files are supported, not {delta_path}")
        return urllib.parse.unquote(parsed.path)
    decoded = urllib.parse.unquote(delta_path)
    return decoded if decoded.startswith("/") else os.path.join(root, decoded)


def _partition_text(value: Any) -> str | None:
    """A typed partition value (from delta-rs) back to the log's string form."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


def _rows_from_stats(stats: Any) -> int | None:
    if not isinstance(stats, str) or not stats:
        return None
    try:
        n = json.loads(stats).get("numRecords")
    except (json.JSONDecodeError, AttributeError):
        return None
    return int(n) if isinstance(n, int) and not isinstance(n, bool) else None


def parse_commit(root: str, version: int, lines: Sequence[str]) -> Commit:
    """The streaming-relevant content of commit ``version``'s JSON lines."""
    commit = Commit(version)
    for line in lines:
        if not line.strip():
            continue
        action = json.loads(line)
        if "add" in action:
            add = action["add"]
            if add.get("deletionVector"):
                commit.deletion_vectors += 1
            if not add.get("dataChange", True):
                commit.compaction_adds += 1
                continue
            pv = add.get("partitionValues") or {}
            commit.adds.append(
                DataFile(
                    path=local_file(root, add["path"]),
                    size=int(add.get("size", 0)),
                    rows=_rows_from_stats(add.get("stats")),
                    partition_values=tuple(sorted((str(k), v) for k, v in pv.items())),
                )
            )
        elif "remove" in action:
            if action["remove"].get("dataChange", True):
                commit.data_removes += 1
        elif "metaData" in action:
            commit.schema_json = action["metaData"].get("schemaString")
        elif "protocol" in action:
            commit.protocol = action["protocol"]
        elif "commitInfo" in action:
            info = action["commitInfo"]
            op = str(info.get("operation", ""))
            custom = info.get("qmf.operation")
            commit.operation = f"{op}/{custom}" if custom else op
    return commit


# ---------------------------------------------------------------------------
# The log


class DeltaLogReader:
    """Commits and snapshots of one table's log, cached in this process.

    Commit files never change once written (delta-rs commits by atomic
    put-if-absent), so parsed commits are cached until the stream has moved
    past them (``forget_before``).
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.log_dir = os.path.join(root, LOG_DIR)
        self._commits: dict[int, Commit] = {}
        self._snapshot: tuple[int, list[DataFile]] | None = None
        self._latest: int | None = None

    def exists(self) -> bool:
        return os.path.isdir(self.log_dir)

    def commit_path(self, version: int) -> str:
        return os.path.join(self.log_dir, f"{version:020d}.json")

    def latest_version(self) -> int | None:
        """The newest committed version (None while the table does not exist)."""
        if not self.exists():
            return None
        if self._latest is None:
            versions = [
                int(m.group(1)) for n in os.listdir(self.log_dir) if (m := COMMIT_RE.match(n))
            ]
            if not versions:
                return None
            self._latest = max(versions)
        while os.path.exists(self.commit_path(self._latest + 1)):
            self._latest += 1
        return self._latest

    def commit(self, version: int) -> Commit | None:
        """Commit ``version``, or None if it is not written yet.

        A commit that should be there (a later one exists) but is gone was
        removed by log retention: that is an error, never a silent gap.
        """
        cached = self._commits.get(version)
        if cached is not None:
            return cached
        try:
            with open(self.commit_path(version), encoding="utf-8") as fh:
                lines = fh.readlines()
        except FileNotFoundError:
            latest = self.latest_version()
            if latest is not None and latest > version:
                raise DeltaStreamError(
                    f"commit {version} of {self.root} is no longer in the log (log retention "
                    f"removed it; the table is at version {latest}): the stream cannot go on "
                    "from its checkpoint; start a new query (new checkpoint)"
                ) from None
            return None
        parsed = parse_commit(self.root, version, lines)
        self._commits[version] = parsed
        return parsed

    def forget_before(self, version: int) -> None:
        for v in [v for v in self._commits if v < version]:
            del self._commits[v]

    def table(self, version: int | None = None) -> DeltaTable:
        from deltalake import DeltaTable

        from pipeline.lake.delta import check_protocol

        dt = DeltaTable(self.root, version=version)
        check_protocol(dt, write=False)
        return dt

    def snapshot(self, version: int) -> list[DataFile]:
        """All live files of ``version``, ordered by (modification time, path) like Delta.

        Kept for the process too (``_SNAPSHOTS``, one version per table), checked by the
        stamp of the version's commit file: readers made per micro-batch
        (``range_files``) of a batch inside a starting snapshot then list it once, not
        once per batch (26 ms a batch for gold's two silver tables of 24 commits)."""
        if self._snapshot is not None and self._snapshot[0] == version:
            return self._snapshot[1]
        from pipeline.lake.delta import commit_stamp

        stamp = commit_stamp(self.root, version)
        with _SNAPSHOTS_LOCK:
            kept = _SNAPSHOTS.get(self.root)
        if stamp is not None and kept is not None and kept[0] == stamp:
            self._snapshot = (version, kept[1])
            return kept[1]
        dt = self.table(version)
        adds = pa.table(dt.get_add_actions(flatten=True))
        parts = list(dt.metadata().partition_columns)
        cols = {c: adds.column(f"partition.{c}").to_pylist() for c in parts}
        rows = (
            adds.column("num_records").to_pylist()
            if "num_records" in adds.column_names
            else [None] * adds.num_rows
        )
        keyed: list[tuple[int, str, DataFile]] = []
        for i, (p, size, mtime) in enumerate(
            zip(
                adds.column("path").to_pylist(),
                adds.column("size_bytes").to_pylist(),
                adds.column("modification_time").to_pylist(),
                strict=True,
            )
        ):
            pv = tuple(sorted((c, _partition_text(cols[c][i])) for c in parts))
            n = rows[i]
            keyed.append(
                (
                    int(mtime),
                    p,
                    DataFile(
                        local_file(self.root, p), int(size), None if n is None else int(n), pv
                    ),
                )
            )
        files = [f for _, _, f in sorted(keyed, key=lambda k: (k[0], k[1]))]
        self._snapshot = (version, files)
        if stamp is not None:
            with _SNAPSHOTS_LOCK:
                _SNAPSHOTS[self.root] = (stamp, files)
        return files


# The latest snapshot listed of each table in this process (``DeltaLogReader.snapshot``):
# root -> (the stamp of that version's commit file, its files). A table deleted and made
# again at the same path writes new commit files, whose stamps differ.
_SNAPSHOTS: dict[str, tuple[CommitStamp, list[DataFile]]] = {}
_SNAPSHOTS_LOCK = threading.Lock()


# ---------------------------------------------------------------------------
# Admission


@dataclass(frozen=True)
class Limits:
    """What one micro-batch may admit (None: no bound). At least one file always goes."""

    files: int | None = None
    rows: int | None = None
    bytes: int | None = None


def file_rows(f: DataFile) -> int:
    """Rows of a file for admission: the log's numRecords, else the Parquet footer's
    row count (always written, unlike column statistics)."""
    if f.rows is not None:
        return f.rows
    return int(pq.ParquetFile(f.path).metadata.num_rows)


def _schema_text(schema_json: str) -> str:
    """A Delta schemaString in Spark's simpleString form (names and types, no nullability)."""
    from deltalake import Schema

    from schemas.tables import spark_schema

    arrow = pa.schema(Schema.from_json(schema_json).to_arrow())
    return spark_schema(arrow).simpleString()


class StreamPlanner:
    """Walks the units after a position: the files to read, under limits and a target.

    Pure over a ``DeltaLogReader`` and the options; the stream reader keeps
    one per process.
    """

    def __init__(self, log: DeltaLogReader, opts: DeltaSourceOptions, schema: StructType) -> None:
        self.log = log
        self.opts = opts
        self.schema_text = schema.simpleString()
        self._verdicts: dict[int, list[DataFile]] = {}

    def forget_before(self, version: int) -> None:
        self.log.forget_before(version)
        for v in [v for v in self._verdicts if v < version]:
            del self._verdicts[v]

    def commit_files(self, commit: Commit) -> list[DataFile]:
        """The files of a commit that the stream reads (checked once per commit)."""
        known = self._verdicts.get(commit.version)
        if known is None:
            known = self._verdicts[commit.version] = self._check_commit(commit)
        return known

    def _check_commit(self, commit: Commit) -> list[DataFile]:
        """The files of a commit that the stream reads, or an error saying why not."""
        where = f"version {commit.version} of {self.log.root}"
        if commit.schema_json is not None and _schema_text(commit.schema_json) != self.schema_text:
            raise DeltaStreamError(
                f"{where} changes the table schema to {_schema_text(commit.schema_json)} "
                f"(the query reads {self.schema_text}); restart the query with a new checkpoint"
            )
        if commit.protocol is not None:
            self.log.table(commit.version)  # check_protocol: refuses unreadable features
        if commit.deletion_vectors:
            raise DeltaStreamError(f"{where} uses deletion vectors, which this source cannot read")
        if not commit.data_removes:
            return commit.adds
        if self.opts.skip_change_commits:
            return []
        if commit.adds and self.opts.ignore_changes:
            return commit.adds
        if not commit.adds and (self.opts.ignore_deletes or self.opts.ignore_changes):
            return []
        raise DeltaStreamError(
            f"{where} ({commit.operation or 'unknown operation'}) removes data: "
            f"{commit.data_removes} file(s) removed, {len(commit.adds)} added. This source "
            "streams appends; set ignoreDeletes (skip commits that only remove), "
            "ignoreChanges (also re-read the files such commits add: rows may come twice) "
            "or skipChangeCommits (skip such commits entirely)"
        )

    def units(self, start: Position, last: int) -> Iterator[tuple[Position, list[DataFile]]]:
        """(unit start, its files) from ``start``'s unit on, up to commit ``last``."""
        if start.snapshot:
            yield Position(start.version, 0, True), self.log.snapshot(start.version)
            first = start.version + 1
        else:
            first = start.version
        v = first
        while v <= last:
            commit = self.log.commit(v)
            if commit is None:
                return
            yield Position(v), self.commit_files(commit)
            v += 1

    def files_between(self, begin: Position, stop: Position) -> list[DataFile]:
        """The files of ``[begin, stop)``, in order: what a micro-batch between the two reads."""
        files: list[DataFile] = []
        # An end at (v, 0) takes nothing of commit v: do not even look at it.
        last = stop.version if stop.index or stop.snapshot else stop.version - 1
        for unit, unit_files in self.units(begin, last):
            key = (unit.version, unit.snapshot)
            lo = begin.index if key == (begin.version, begin.snapshot) else 0
            if key == (stop.version, stop.snapshot):
                files.extend(unit_files[lo : stop.index])
                break
            files.extend(unit_files[lo:])
        return files

    def walk(self, start: Position, last: int, limits: Limits) -> tuple[Position, list[DataFile]]:
        """The end position and files admitted from ``start``, up to commit ``last``.

        A commit the stream must not read (removes data, schema change...)
        ends the batch before it: what comes earlier is still delivered, and
        the error is raised once that commit is the next thing to read.
        """
        end = start
        taken: list[DataFile] = []
        rows = size = 0
        units = self.units(start, last)
        while limits.files is None or len(taken) < limits.files:
            try:
                unit, files = next(units)
            except StopIteration:
                break
            except DeltaStreamError:
                if taken:
                    break
                raise
            first = start.index if unit == Position(start.version, 0, start.snapshot) else 0
            for i in range(first, len(files)):
                f = files[i]
                n = file_rows(f) if limits.rows is not None else 0
                if taken and (
                    (limits.files is not None and len(taken) + 1 > limits.files)
                    or (limits.bytes is not None and size + f.size > limits.bytes)
                    or (limits.rows is not None and rows + n > limits.rows)
                ):
                    return end, taken
                taken.append(f)
                size += f.size
                rows += n
                if i + 1 < len(files):
                    end = Position(unit.version, i + 1, unit.snapshot)
                else:
                    end = Position(unit.version + 1, 0)
        return end, taken


def range_files(
    path: str,
    schema: StructType,
    start: Mapping[str, Any],
    end: Mapping[str, Any],
    options: Mapping[str, str] | None = None,
) -> list[DataFile]:
    """The files a micro-batch of this source over ``[start, end)`` holds: the same
    planner and options as the stream reader's ``partitions()``."""
    opts = DeltaSourceOptions.parse({**(options or {}), "path": path})
    planner = StreamPlanner(DeltaLogReader(opts.path), opts, schema)
    return planner.files_between(Position.from_json(start), Position.from_json(end))


def read_files(files: Sequence[DataFile], schema: StructType, columns: Sequence[str]) -> pa.Table:
    """``files`` read with pyarrow in this process, projected on ``columns``."""
    full = arrow_schema(schema)
    wanted = pa.schema([full.field(c) for c in columns])
    batches = [b for f in files for b in read_file(f, wanted)]
    return pa.Table.from_batches(batches, schema=wanted)


def read_range(
    path: str,
    schema: StructType,
    start: Mapping[str, Any],
    end: Mapping[str, Any],
    columns: Sequence[str],
    options: Mapping[str, str] | None = None,
) -> pa.Table:
    """What a micro-batch of this source over ``[start, end)`` holds, read in this process.

    The same files as the stream reader's ``partitions()`` (``range_files``), read
    with pyarrow and projected on ``columns``: a ``foreachBatch`` function that
    only needs the batch on the driver reads it from the offset log's positions
    without Spark's task, its Arrow-to-row conversion and its collect
    (docs/DESIGN.md, Gold).
    """
    return read_files(range_files(path, schema, start, end, options), schema, columns)


def batch_files(
    checkpoint: str,
    batch_id: int,
    reads: Sequence[tuple[str, StructType]],
    options: Mapping[str, str] | None = None,
) -> list[list[DataFile]] | None:
    """The files of micro-batch ``batch_id`` of a query over ``qmf-delta`` sources.

    ``reads``: (table path, schema) per source, in the order of the query's
    offset log. Each source's files from the batch's start (the ``"from"`` its
    end offset names: ``end_offset``) to its end (``range_files``); none for a
    source whose end equals the previous entry's (nothing new from it in this
    batch, its start logged again). So a first batch is known too and a backlog is never collected through the JVM (a
    1,000,000-sample first batch ran Spark's 2 GB driver heap out, and the
    query then hung). An end written before ends named their start falls back
    to the previous batch's entry, or for a first batch that ends inside a
    starting snapshot, to that snapshot's beginning. None when the batch cannot
    be known: no checkpoint, a missing entry, or such an older first batch.
    """
    if not checkpoint:
        return None
    ends = offset_log_sources(checkpoint, batch_id)
    if ends is None or len(ends) != len(reads):
        return None
    before = offset_log_sources(checkpoint, batch_id - 1) if batch_id > 0 else None
    if before is not None and len(before) != len(reads):
        before = None
    out: list[list[DataFile]] = []
    for i, ((path, schema), text) in enumerate(zip(reads, ends, strict=True)):
        end = json.loads(text)
        previous = None if before is None else json.loads(before[i])
        if end == previous:
            out.append([])  # this source had nothing new: Spark logged its start again
            continue
        named = batch_start(end)
        if named is not None:
            start = named.to_json()
        elif previous is not None:
            start = previous
        else:
            snap = _snapshot_starts([text]) if batch_id == 0 else None
            if snap is None:
                return None
            start = json.loads(snap[0])
        out.append(range_files(path, schema, start, end, options))
    return out


def read_batch(
    checkpoint: str,
    batch_id: int,
    reads: Sequence[tuple[str, StructType, Sequence[str]]],
    options: Mapping[str, str] | None = None,
) -> list[pa.Table] | None:
    """Micro-batch ``batch_id`` of a query over ``qmf-delta`` sources, read in this process
    (``batch_files``, then each source's files projected on its columns); None when
    the batch's files cannot be known."""
    files = batch_files(checkpoint, batch_id, [(p, s) for p, s, _ in reads], options)
    if files is None:
        return None
    return [
        read_files(fs, schema, columns)
        for fs, (_p, schema, columns) in zip(files, reads, strict=True)
    ]


def _snapshot_starts(ends: Sequence[str] | None) -> list[str] | None:
    """A first batch's start per source, when every end lies in a starting snapshot."""
    if ends is None:
        return None
    starts = []
    for e in ends:
        pos = Position.from_json(json.loads(e))
        if not pos.snapshot:
            return None
        starts.append(json.dumps(Position(pos.version, 0, True).to_json()))
    return starts


def group_files(files: Sequence[DataFile], max_bytes: int) -> list[FileGroup]:
    """Consecutive files packed into tasks of about ``max_bytes`` (each file counts at
    least Spark's 4 MB open cost, unless ``max_bytes`` is smaller, so small
    limits give one file per task)."""
    open_cost = min(FILE_OPEN_COST_BYTES, max_bytes)
    groups: list[FileGroup] = []
    current: list[DataFile] = []
    weight = 0
    for f in files:
        w = max(f.size, open_cost)
        if current and weight + w > max_bytes:
            groups.append(FileGroup(tuple(current)))
            current, weight = [], 0
        current.append(f)
        weight += w
    if current:
        groups.append(FileGroup(tuple(current)))
    return groups


# ---------------------------------------------------------------------------
# Reading files (executors)


def _batch_rows(meta: pq.FileMetaData) -> int:
    """Rows per Arrow batch: about ARROW_BATCH_BYTES of data, at most ARROW_BATCH_ROWS."""
    if meta.num_rows == 0:
        return ARROW_BATCH_ROWS
    total = sum(int(meta.row_group(i).total_byte_size) for i in range(meta.num_row_groups))
    per_row = max(total // int(meta.num_rows), 1)
    return max(1, min(ARROW_BATCH_ROWS, ARROW_BATCH_BYTES // per_row))


def read_file(
    f: DataFile, schema: pa.Schema, row_groups: Sequence[int] | None = None
) -> Iterator[pa.RecordBatch]:
    """Rows of one data file (or of some of its row groups) in exactly ``schema`` (Spark
    checks it); partition columns come from the log's partition values, columns a
    file lacks (added later) are null."""
    try:
        pf = pq.ParquetFile(f.path)
    except FileNotFoundError:
        raise DeltaStreamError(
            f"data file {f.path} listed by the log is gone (vacuumed?)"
        ) from None
    pvalues = dict(f.partition_values)
    in_file = set(pf.schema_arrow.names)
    columns = [n for n in schema.names if n not in pvalues and n in in_file]
    produced = 0
    groups = None if row_groups is None else list(row_groups)
    batches = pf.iter_batches(
        batch_size=_batch_rows(pf.metadata), columns=columns, row_groups=groups
    )
    for batch in batches:
        arrays: list[pa.Array] = []
        for fld in schema:
            if fld.name in pvalues:
                raw = pvalues[fld.name]
                value = raw or None  # Delta: an empty partition value is null, any type
                arrays.append(pa.array([value] * batch.num_rows, pa.string()).cast(fld.type))
            elif fld.name in in_file:
                arrays.append(batch.column(fld.name).cast(fld.type))
            else:
                arrays.append(pa.nulls(batch.num_rows, fld.type))
        produced += batch.num_rows
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
    expected = (
        pf.metadata.num_rows
        if groups is None
        else sum(pf.metadata.row_group(i).num_rows for i in groups)
    )
    if produced != expected:
        raise DeltaStreamError(
            f"{f.path}: read {produced} rows, the footer says {expected}"
        )


def arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


# ---------------------------------------------------------------------------
# Readers


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of Delta files, in commit order.

    ``latestOffset(start, limit)`` takes a ``ReadLimit``; ``ReadAllAvailable``
    (Trigger.Once) lifts every limit, any other limit is combined with the
    configured ones. The ``SupportsTriggerAvailableNow`` mixin makes
    ``availableNow`` honour them too and stop at the version current when
    the query started.
    """

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        self.opts = DeltaSourceOptions.parse(options)
        self.schema = schema
        self.arrow_schema = arrow_schema(schema)
        self._log: DeltaLogReader | None = None
        self._planner: StreamPlanner | None = None
        self._target: int | None = None
        self._target_set = False
        self._checked_schema = False
        self._initial: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors only need options and schemas, not the driver's caches.
        state = dict(self.__dict__)
        state["_log"] = None
        state["_planner"] = None
        return state

    @property
    def log(self) -> DeltaLogReader:
        if self._log is None:
            self._log = DeltaLogReader(self.opts.path)
        return self._log

    def planner(self) -> StreamPlanner:
        if self._planner is None:
            self._planner = StreamPlanner(self.log, self.opts, self.schema)
        return self._planner

    def _check_schema(self) -> None:
        """Once the table exists, its schema must be the query's (a user-given
        schema for a table that did not exist at ``load()`` included)."""
        if self._checked_schema:
            return
        from pipeline.lake.delta import table_schema
        from schemas.tables import spark_schema

        table = spark_schema(table_schema(self.log.table())).simpleString()
        if table != self.schema.simpleString():
            raise DeltaStreamError(
                f"table {self.opts.path} has schema {table}, the query reads "
                f"{self.schema.simpleString()}"
            )
        self._checked_schema = True

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts; the same answer every time in this process.

        Spark asks again when it runs the first batch (that batch's start is
        not in the offset log): a snapshot of a newer version there (a commit
        or a compaction landed in between) would be read together with the
        commits the batch's end already covers, rows read twice.
        """
        if self._initial is None:
            self._initial = self._initial_offset()
        return self._initial

    def _initial_offset(self) -> dict[str, Any]:
        latest = self.log.latest_version()
        start = self.opts.starting_version
        if latest is None:
            # No table yet: everything it will ever hold comes as commits from 0.
            return Position(start if isinstance(start, int) else 0).to_json()
        self._check_schema()
        if start == "latest":
            return Position(latest + 1).to_json()
        if isinstance(start, int):
            if start > latest:
                raise DeltaStreamError(
                    f"startingVersion={start} is beyond the latest version {latest} "
                    f"of {self.opts.path}"
                )
            return Position(start).to_json()
        if not self.log.snapshot(latest):
            return Position(latest + 1).to_json()
        return Position(latest, 0, True).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.opts.max_files_per_trigger)

    def _limits(self, limit: ReadLimit) -> Limits:
        if isinstance(limit, ReadAllAvailable):
            return Limits()
        files = self.opts.max_files_per_trigger
        rows = self.opts.max_rows_per_trigger
        size = self.opts.max_bytes_per_trigger
        if isinstance(limit, ReadMaxFiles):
            files = min(files, limit.max_files)
        elif isinstance(limit, ReadMaxRows):
            rows = limit.max_rows if rows is None else min(rows, limit.max_rows)
        elif isinstance(limit, ReadMaxBytes):
            size = limit.max_bytes if size is None else min(size, limit.max_bytes)
        return Limits(files=files, rows=rows, bytes=size)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.log.latest_version()
        self._target_set = True

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = Position.from_json(start)
        latest = self.log.latest_version()
        if latest is None:
            return dict(start)  # the table does not exist yet: wait for it
        self._check_schema()
        last = latest
        if self._target_set:
            last = -1 if self._target is None else min(latest, self._target)
        self.planner().forget_before(begin.version)
        end, _files = self.planner().walk(begin, last, self._limits(limit))
        return end_offset(start, end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        latest = self.log.latest_version()
        return None if latest is None else Position(latest + 1).to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[FileGroup]:
        """The batch's files, from the start its end names: a first batch replayed after
        a restart gets a new ``initialOffset()`` (a newer snapshot) as ``start``."""
        if end == start:
            return []  # nothing new from this source (the batch is another source's)
        begin = batch_start(end) or Position.from_json(start)
        files = self.planner().files_between(begin, Position.from_json(end))
        return group_files(files, self.opts.max_bytes_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FileGroup)
        for f in partition.files:
            yield from read_file(f, self.arrow_schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the table is not ours to clean up."""


class DeltaDataSource(DataSource):
    """``format("qmf-delta")``: the appends of a Delta table, in the table's schema."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        from pipeline.lake.delta import table_exists, table_schema
        from schemas.tables import spark_schema

        opts = DeltaSourceOptions.parse(self.options)  # fail at load(), not in the first batch
        if not table_exists(opts.path):
            raise DeltaSourceError(
                f"Delta table {opts.path} does not exist (yet); to wait for it, give the "
                "schema: spark.readStream.format('qmf-delta').schema(...)"
            )
        return spark_schema(table_schema(DeltaLogReader(opts.path).table()))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DeltaStreamReader(schema, self.options)


def register(spark: SparkSession) -> None:
    """Make ``format("qmf-delta")`` available in this session (idempotent)."""
    spark.dataSource.register(DeltaDataSource)
