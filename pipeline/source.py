"""The Spark data source ``qmf``: the landing log as a replayable stream.

``spark.readStream.format("qmf").option("path", ROOT).load()`` serves every
message landed under ``ROOT`` (``receivers.landing``) in the landing schema.
Offsets are ``{partition: next offset}`` JSON, so a micro-batch is a set of
per-partition offset ranges that ``read()`` can re-read identically after a
restart: the landing log is append-only and ranges are only deleted by
retention once the query has committed past them.

One small class per role, as Spark's Python data source API asks:

* ``QmfDataSource``        name, schema, readers;
* ``QmfOptions``           options parsed and validated once (reader ``__init__``);
* ``LandingRange``         the picklable unit of work shipped to executors;
* ``QmfStreamReader``      offsets, admission control, AvailableNow, retention, lag;
* ``QmfBatchReader``       the same ranges for backfills (``spark.read``).

The readers are created in several processes (the planner, the driver-side
streaming runner, executors), so their ``__init__`` has no side effects; the
embedded receiver is started lazily by the driver-side calls only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from receivers.landing import LandingError, LandingLog
from schemas.tables import LANDING, spark_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

Offsets = dict[str, int]

NAME = "qmf"
DEFAULT_MAX_RECORDS_PER_PARTITION = 100_000  # one task per core for a 200k batch of 2 receivers
ARROW_BATCH_ROWS = 10_000
ARROW_BATCH_BYTES = 64 << 20
TRUE_VALUES = {"true", "1", "yes", "on"}
FALSE_VALUES = {"false", "0", "no", "off"}


class QmfSourceError(ValueError):
    """An option of the ``qmf`` source is missing or invalid."""


# ---------------------------------------------------------------------------
# Options


def _parse_bool(name: str, value: str) -> bool:
    low = value.strip().lower()
    if low in TRUE_VALUES:
        return True
    if low in FALSE_VALUES:
        return False
    raise QmfSourceError(f"option {name}={value!r}: expected true or false")


def _parse_positive_int(name: str, value: str, *, allow_zero: bool = False) -> int:
    try:
        n = int(value)
    except ValueError:
        raise QmfSourceError(f"option {name}={value!r}: expected an integer") from None
    if n < 0 or (n == 0 and not allow_zero):
        raise QmfSourceError(f"option {name}={value!r}: must be {'>= 0' if allow_zero else '> 0'}")
    return n


def _parse_offsets_spec(name: str, value: str) -> str | Offsets:
    """``earliest``, ``latest`` or a JSON object ``{partition: offset}``."""
    low = value.strip().lower()
    if low in ("earliest", "latest"):
        return low
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        raise QmfSourceError(
            f"option {name}={value!r}: expected earliest, latest or JSON {{partition: offset}}"
        ) from None
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in parsed.items()
    ):
        raise QmfSourceError(
            f"option {name}={value!r}: JSON must map partition names to offsets >= 0"
        )
    return {str(k): int(v) for k, v in parsed.items()}


@dataclass(frozen=True)
class QmfOptions:
    """The source's options, validated once so a typo fails at ``load()``, not mid-stream.

    ``retention`` is ``none`` (never delete) or ``committed`` (after each
    commit, delete segments wholly below the committed offset minus
    ``retentionSlack`` records). ``embeddedReceiver`` starts a receiver in the
    driver-side source process (the single-machine default); ``receiver.*``
    options are passed to it.
    """

    path: str
    max_records_per_trigger: int | None = None
    starting_offsets: str | Offsets = "earliest"
    ending_offsets: str | Offsets = "latest"
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    retention: str = "none"
    retention_slack: int = 0
    embedded_receiver: bool = False
    receiver_options: tuple[tuple[str, str], ...] = ()

    KNOWN = (
        "path",
        "maxrecordspertrigger",
        "startingoffsets",
        "endingoffsets",
        "maxrecordsperpartition",
        "retention",
        "retentionslack",
        "embeddedreceiver",
    )

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> QmfOptions:
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        unknown = sorted(k for k in opts if k not in cls.KNOWN and not k.startswith("receiver."))
        if unknown:
            raise QmfSourceError(f"unknown option(s) for source {NAME!r}: {', '.join(unknown)}")
        path = opts.get("path", "").strip()
        if not path:
            raise QmfSourceError(f"source {NAME!r} needs option path (the landing log root)")
        mrpt = opts.get("maxrecordspertrigger")
        retention = opts.get("retention", "none").strip().lower()
        if retention not in ("none", "committed"):
            raise QmfSourceError(f"option retention={retention!r}: expected none or committed")
        embedded = _parse_bool("embeddedReceiver", opts.get("embeddedreceiver", "false"))
        receiver_opts = tuple(
            sorted((k[len("receiver.") :], v) for k, v in opts.items() if k.startswith("receiver."))
        )
        return cls(
            path=path,
            max_records_per_trigger=(
                None if mrpt is None else _parse_positive_int("maxRecordsPerTrigger", mrpt)
            ),
            starting_offsets=_parse_offsets_spec(
                "startingOffsets", opts.get("startingoffsets", "earliest")
            ),
            ending_offsets=_parse_offsets_spec("endingOffsets", opts.get("endingoffsets", "latest")),
            max_records_per_partition=_parse_positive_int(
                "maxRecordsPerPartition",
                opts.get("maxrecordsperpartition", str(DEFAULT_MAX_RECORDS_PER_PARTITION)),
            ),
            retention=retention,
            retention_slack=_parse_positive_int(
                "retentionSlack", opts.get("retentionslack", "0"), allow_zero=True
            ),
            embedded_receiver=embedded,
            receiver_options=receiver_opts,
        )


# ---------------------------------------------------------------------------
# Offsets and ranges (pure functions: tested without Spark)


@dataclass(frozen=True)
class LandingRange(InputPartition):
    """Offsets ``[start, end)`` of one landing partition: what one Spark task reads.

    Only plain values, so it pickles to any executor that sees ``root``.
    """

    root: str
    partition: str
    start: int
    end: int


def resolve_offsets(spec: str | Offsets, landing: LandingLog) -> Offsets:
    """Turn ``earliest`` / ``latest`` / explicit offsets into ``{partition: offset}``."""
    if spec == "earliest":
        return landing.start_offsets()
    if spec == "latest":
        return landing.end_offsets()
    assert isinstance(spec, dict)
    return dict(spec)


def admit(start: Mapping[str, int], available: Mapping[str, int], max_rows: int | None) -> Offsets:
    """End offsets admitting at most ``max_rows`` new records, shared fairly.

    Water-filling over partitions (smallest backlog first) so that one busy
    receiver cannot starve the others; deterministic for given inputs. A
    partition missing from ``start`` starts at 0.
    """
    end: Offsets = dict(start)
    backlog = {p: max(e - start.get(p, 0), 0) for p, e in available.items()}
    take = dict(backlog)
    if max_rows is not None and sum(backlog.values()) > max_rows:
        remaining = max_rows
        order = sorted(backlog, key=lambda p: (backlog[p], p))
        for i, p in enumerate(order):
            take[p] = min(backlog[p], remaining // (len(order) - i))
            remaining -= take[p]
    for p, n in take.items():
        end[p] = start.get(p, 0) + n
    return end


def split_ranges(
    root: str, start: Mapping[str, int], end: Mapping[str, int], max_records: int
) -> list[LandingRange]:
    """One ``LandingRange`` per partition and chunk of at most ``max_records``."""
    out: list[LandingRange] = []
    for p in sorted(end):
        lo, hi = start.get(p, 0), end[p]
        while lo < hi:
            step = min(hi, lo + max_records)
            out.append(LandingRange(root, p, lo, step))
            lo = step
    return out


def lag(progress_source: Mapping[str, Any]) -> dict[str, int]:
    """Records landed but not yet processed, per partition, from a source's progress.

    Spark has no custom metrics for Python sources in 4.3; the source reports
    the log's end through ``reportLatestOffset``, which the progress shows as
    ``latestOffset`` beside ``endOffset``.
    """

    def as_dict(v: Any) -> dict[str, int]:
        if v is None:
            return {}
        return {str(k): int(x) for k, x in (json.loads(v) if isinstance(v, str) else v).items()}

    latest = as_dict(progress_source.get("latestOffset"))
    done = as_dict(progress_source.get("endOffset"))
    return {p: max(e - done.get(p, 0), 0) for p, e in sorted(latest.items())}


def read_range(rng: LandingRange, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Rows of ``rng`` as Arrow batches in exactly ``schema`` (Spark checks it).

    Deterministic: the same range always gives the same rows, or raises
    ``LandingError`` if retention already removed part of it.
    """
    table = LandingLog(rng.root).read(rng.partition, rng.start, rng.end)
    if table.num_rows != rng.end - rng.start:
        raise RuntimeError(f"{rng}: read {table.num_rows} rows, expected {rng.end - rng.start}")
    if not table.schema.equals(schema):
        table = table.select(schema.names).cast(schema)
    yield from bounded_batches(table, ARROW_BATCH_ROWS, ARROW_BATCH_BYTES)


def bounded_batches(table: pa.Table, max_rows: int, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """``table`` in batches of at most ``max_rows`` rows and about ``max_bytes`` of bodies.

    Bodies of real traffic reach ~100 KB: 10,000 of them in one batch would be
    a gigabyte handed to the JVM at once, and combining a partition's segments
    into one array overflows Arrow's 2 GiB binary offsets. A body larger than
    ``max_bytes`` travels alone.
    """
    n = table.num_rows
    if n == 0:
        return
    sizes = pc.binary_length(table.column("body")).to_numpy(zero_copy_only=False)
    cum = np.cumsum(sizes.astype(np.int64))
    start = 0
    while start < n:
        before = int(cum[start - 1]) if start else 0
        by_bytes = int(np.searchsorted(cum, before + max_bytes, side="right"))
        end = min(n, start + max_rows, max(by_bytes, start + 1))
        yield from table.slice(start, end - start).combine_chunks().to_batches()
        start = end


def arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


# ---------------------------------------------------------------------------
# Embedded receiver


class _Receiver(Protocol):
    def stop(self) -> None: ...


def start_embedded_receiver(root: str, options: Mapping[str, str]) -> _Receiver:
    """Start a receiver landing into ``root`` in this process (driver side).

    Imported lazily: executors and the batch reader never need proton.
    """
    from receivers.receiver import start_embedded

    receiver: _Receiver = start_embedded(root, dict(options))
    return receiver


# ---------------------------------------------------------------------------
# Readers


class QmfStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of landing-log offset ranges.

    ``latestOffset(start, limit)`` takes a ``ReadLimit`` (admission control,
    ``limit.max_rows``); the ``SupportsTriggerAvailableNow`` mixin makes
    ``availableNow`` honour it too instead of reading everything in one batch.
    """

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        self.opts = QmfOptions.parse(options)
        self.schema = schema
        self.arrow_schema = arrow_schema(schema)
        self._target: Offsets | None = None
        self._receiver: _Receiver | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a copy of the reader: never ship a live receiver.
        state = dict(self.__dict__)
        state["_receiver"] = None
        return state

    @property
    def landing(self) -> LandingLog:
        return LandingLog(self.opts.path)

    def _ensure_receiver(self) -> None:
        if self.opts.embedded_receiver and self._receiver is None:
            self._receiver = start_embedded_receiver(
                self.opts.path, dict(self.opts.receiver_options)
            )

    def _available(self) -> Offsets:
        """The log's end, capped at the AvailableNow target if one was set."""
        ends = self.landing.end_offsets()
        if self._target is None:
            return ends
        return {p: min(e, self._target[p]) for p, e in ends.items() if p in self._target}

    def initialOffset(self) -> dict[str, int]:
        self._ensure_receiver()
        return resolve_offsets(self.opts.starting_offsets, self.landing)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_records_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.landing.end_offsets()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        self._ensure_receiver()
        ends = self.landing.end_offsets()
        behind = {p: (int(o), ends.get(p, 0)) for p, o in start.items() if int(o) > ends.get(p, 0)}
        if behind:
            # The log was reset or restored from an older copy: refuse to
            # wait silently for offsets that will mean other messages.
            raise LandingError(
                f"landing log {self.opts.path} is behind the query's offsets "
                f"(partition: (query, log)) {behind}"
            )
        available = self._available()
        first = self.landing.start_offsets()
        # A partition new to this query starts at its first offset on disk.
        begin = {p: int(start[p]) if p in start else first.get(p, 0) for p in available}
        begin.update({p: int(o) for p, o in start.items()})
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = admit(begin, available, max_rows)
        # Keep partitions absent from start out until they have admitted rows,
        # so "no new data" returns start unchanged.
        return {p: o for p, o in end.items() if p in start or o > begin[p]}

    def reportLatestOffset(self) -> dict[str, int]:
        return self.landing.end_offsets()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[LandingRange]:
        first = self.landing.start_offsets()
        begin = {p: int(start[p]) if p in start else first.get(p, 0) for p in end}
        return split_ranges(self.opts.path, begin, end, self.opts.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LandingRange)
        return read_range(partition, self.arrow_schema)

    def commit(self, end: dict[str, int]) -> None:
        if self.opts.retention != "committed":
            return
        landing = self.landing
        for p, off in sorted(end.items()):
            removed = landing.delete_before(p, int(off) - self.opts.retention_slack)
            if removed:
                log.info("retention: removed %d segment(s) of %s below %d", removed, p, off)

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.stop()
            self._receiver = None


class QmfBatchReader(DataSourceReader):
    """A fixed offset range (default: everything on disk), for backfills and checks."""

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        self.opts = QmfOptions.parse(options)
        self.schema = schema
        self.arrow_schema = arrow_schema(schema)

    def partitions(self) -> Sequence[InputPartition]:
        landing = LandingLog(self.opts.path)
        start = resolve_offsets(self.opts.starting_offsets, landing)
        end = resolve_offsets(self.opts.ending_offsets, landing)
        first = landing.start_offsets()
        begin = {p: start.get(p, first.get(p, 0)) for p in end}
        ranges = split_ranges(self.opts.path, begin, end, self.opts.max_records_per_partition)
        # Spark wants a list; an empty one would become a None partition.
        return list(ranges) or [LandingRange(self.opts.path, "", 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LandingRange)
        if partition.end <= partition.start:
            return iter(())
        return read_range(partition, self.arrow_schema)


class QmfDataSource(DataSource):
    """``format("qmf")``: raw AMQP messages from the landing log, in ``schemas.tables.LANDING``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        QmfOptions.parse(self.options)  # fail at load(), not in the first batch
        return spark_schema(LANDING)

    def reader(self, schema: StructType) -> DataSourceReader:
        return QmfBatchReader(schema, self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return QmfStreamReader(schema, self.options)


def register(spark: SparkSession) -> None:
    """Make ``format("qmf")`` available in this session (idempotent)."""
    spark.dataSource.register(QmfDataSource)
