"""The landing log: raw AMQP messages on disk, durable before they are settled.

Layout: ``<root>/<partition>/<first>-<last>.arrow``, one Arrow IPC file per
flush group, named by its first and last offset (20 digits, inclusive).
A segment is written to a temporary name, fsynced, renamed into place and the
directory fsynced, so a segment is either wholly there or not at all; a crash
leaves at most a ``*.tmp`` file, which the next writer removes. Offsets are
per partition, dense and monotonic from 0. Each receiver writes its own
partition, so competing consumers never share a file.

Retention never deletes the newest segment of a partition: it carries the next
offset across restarts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from pipeline.codec.v2 import AGENT_NAME_PROPERTY
from schemas.tables import DEFAULT_BROKER, LANDING

SEGMENT_RE = re.compile(r"^(\d{20})-(\d{20})\.arrow$")
PARTITION_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
# The broker a partition's messages come from (receivers.fleet), one per partition.
BROKER_FILE = ".broker"


class LandingError(Exception):
    """The landing log on disk is not in the state the caller expects."""


@dataclass(frozen=True)
class LandedMessage:
    """One AMQP message as the receiver got it; ``received_at_us`` is UTC us."""

    body: bytes
    routing_key: str | None = None
    subject: str | None = None
    message_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    app_id: str | None = None
    content_type: str | None = None
    application_properties: Mapping[str, str] = field(default_factory=dict)
    received_at_us: int = 0
    redelivered: bool = False
    duplicate_of: str | None = None

    def key(self) -> str:
        return message_key(self)


def message_key(m: LandedMessage) -> str:
    """Content hash of a message: equal for a redelivery *and* for a twin.

    It covers what the publisher set (ids, addressing, headers, body), not
    what the receiver added (receive time, offset). It is not an identity:
    real brokers send identical twins, each a delivery of its own. A
    delivery's identity is its (partition, offset); a redelivery is matched
    to its first copy by this key among in-doubt messages only
    (``receivers.indoubt``).
    """
    h = hashlib.blake2b(digest_size=16)
    for part in (m.message_id, m.correlation_id, m.routing_key, m.subject, m.content_type):
        h.update(b"\x01" if part is None else b"\x02" + part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    for k in sorted(m.application_properties):
        if k == AGENT_NAME_PROPERTY:  # added by the receiver (receivers.aliases), not sent
            continue
        h.update(k.encode("utf-8", "surrogatepass") + b"\x00")
        h.update(str(m.application_properties[k]).encode("utf-8", "surrogatepass") + b"\x00")
    h.update(b"\x03")
    h.update(m.body)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _segments(part_dir: Path) -> list[tuple[int, int, Path]]:
    out: list[tuple[int, int, Path]] = []
    if not part_dir.is_dir():
        return out
    for entry in os.scandir(part_dir):
        m = SEGMENT_RE.match(entry.name)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), Path(entry.path)))
    out.sort()
    return out


def to_table(
    partition: str, first_offset: int, msgs: Sequence[LandedMessage], broker: str = DEFAULT_BROKER
) -> pa.Table:
    """Arrow table of messages in the landing schema, offsets from ``first_offset``."""
    n = len(msgs)
    now_us = int(time.time() * 1_000_000)
    cols = {
        "partition": pa.array([partition] * n, pa.string()),
        "broker_name": pa.array([broker] * n, pa.string()),
        "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
        "msg_key": pa.array([m.key() for m in msgs], pa.string()),
        "received_at": pa.array([m.received_at_us or now_us for m in msgs], pa.int64()).cast(
            LANDING.field("received_at").type
        ),
        "routing_key": pa.array([m.routing_key for m in msgs], pa.string()),
        "subject": pa.array([m.subject for m in msgs], pa.string()),
        "message_id": pa.array([m.message_id for m in msgs], pa.string()),
        "correlation_id": pa.array([m.correlation_id for m in msgs], pa.string()),
        "reply_to": pa.array([m.reply_to for m in msgs], pa.string()),
        "app_id": pa.array([m.app_id for m in msgs], pa.string()),
        "content_type": pa.array([m.content_type for m in msgs], pa.string()),
        "application_properties": pa.array(
            [list(m.application_properties.items()) for m in msgs],
            LANDING.field("application_properties").type,
        ),
        "body": pa.array([bytes(m.body) for m in msgs], pa.binary()),
        "redelivered": pa.array([m.redelivered for m in msgs], pa.bool_()),
        "duplicate_of": pa.array([m.duplicate_of for m in msgs], pa.string()),
    }
    return pa.Table.from_pydict(cols, schema=LANDING)


def _upgrade(t: pa.Table) -> pa.Table:
    """Segments written before ``redelivered``/``duplicate_of`` existed: first copies;
    before ``broker_name``: one unnamed broker's."""
    if t.schema.names == LANDING.names:
        return t
    n = t.num_rows
    if "broker_name" not in t.schema.names:
        t = t.append_column(LANDING.field("broker_name"), pa.array([DEFAULT_BROKER] * n))
    if "redelivered" not in t.schema.names:
        t = t.append_column(LANDING.field("redelivered"), pa.array([False] * n, pa.bool_()))
    if "duplicate_of" not in t.schema.names:
        t = t.append_column(LANDING.field("duplicate_of"), pa.nulls(n, pa.string()))
    return t.select(LANDING.names).cast(LANDING)


def partition_broker(part_dir: str | os.PathLike[str]) -> str | None:
    """The broker a partition belongs to: its broker file, else ``default`` for a
    partition landed before fleets, else None (a new partition)."""
    d = Path(part_dir)
    try:
        return (d / BROKER_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return DEFAULT_BROKER if _segments(d) else None


# The receiver holding a partition says whether it is connected (``ReceiverStatus``).
RECEIVER_FILE = ".receiver"


@dataclass(frozen=True)
class ReceiverStatus:
    """What a partition's receiver last said: connected or not since ``since_ns``, its
    process, the broker address (host:port, never credentials) and why it is not connected
    (``stopped`` after a clean stop)."""

    partition: str
    broker_name: str
    connected: bool
    since_ns: int
    pid: int
    address: str | None = None
    reason: str | None = None

    @property
    def stopped(self) -> bool:
        return self.reason == "stopped"

    def process_alive(self) -> bool:
        """Whether its process still runs (on this host; a killed receiver wrote nothing)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def write_receiver_status(
    part_dir: str | os.PathLike[str], connected: bool, address: str | None = None,
    reason: str | None = None,
) -> None:  # fmt: skip
    """Replace the partition's receiver status (written, then renamed into place)."""
    d = Path(part_dir)
    body = {"connected": connected, "since_ns": time.time_ns(), "pid": os.getpid(),
            "address": address, "reason": reason}  # fmt: skip
    tmp = d / f"{RECEIVER_FILE}.tmp"
    tmp.write_text(json.dumps(body), encoding="utf-8")
    os.replace(tmp, d / RECEIVER_FILE)


def receiver_statuses(root: str | os.PathLike[str]) -> list[ReceiverStatus]:
    """Every partition's receiver status under a landing root (partitions whose receiver
    never said anything are left out), by partition."""
    out: list[ReceiverStatus] = []
    base = Path(root)
    if not base.is_dir():
        return out
    for d in sorted(p for p in base.iterdir() if p.is_dir()):
        try:
            raw = json.loads((d / RECEIVER_FILE).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            continue
        out.append(ReceiverStatus(
            d.name, partition_broker(d) or DEFAULT_BROKER, bool(raw.get("connected")),
            int(raw.get("since_ns", 0)), int(raw.get("pid", 0)), raw.get("address"),
            raw.get("reason"),
        ))  # fmt: skip
    return out


class LandingWriter:
    """Appends flush groups of messages to one partition; each append is durable on return.

    A partition holds one broker's messages: ``broker`` is written beside its segments
    the first time, and a writer for another broker is refused."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        partition: str,
        *,
        fsync: bool = True,
        broker: str = DEFAULT_BROKER,
    ) -> None:
        if not PARTITION_RE.match(partition):
            raise ValueError(f"partition name {partition!r} must match {PARTITION_RE.pattern}")
        self.partition = partition
        self.broker = broker
        self.dir = Path(root) / partition
        self.dir.mkdir(parents=True, exist_ok=True)
        owner = partition_broker(self.dir)
        if owner is not None and owner != broker:
            raise LandingError(
                f"landing partition {partition!r} holds broker {owner!r}'s messages, not "
                f"{broker!r}'s: give this broker a partition of its own"
            )
        if not (self.dir / BROKER_FILE).exists():
            tmp = self.dir / f"{BROKER_FILE}.tmp"
            tmp.write_text(broker + "\n", encoding="utf-8")
            os.replace(tmp, self.dir / BROKER_FILE)
        self._fsync = fsync
        for stale in self.dir.glob("*.tmp"):
            stale.unlink()
        segs = _segments(self.dir)
        self.next_offset = segs[-1][1] + 1 if segs else 0

    def append(self, msgs: Sequence[LandedMessage]) -> tuple[int, int]:
        """Write ``msgs`` as one segment; returns its (first, last) offsets."""
        if not msgs:
            raise ValueError("append needs at least one message")
        first = self.next_offset
        last = first + len(msgs) - 1
        table = to_table(self.partition, first, msgs, self.broker)
        final = self.dir / f"{first:020d}-{last:020d}.arrow"
        tmp = final.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            with ipc.new_file(f, LANDING) as w:
                w.write_table(table)
            f.flush()
            if self._fsync:
                os.fsync(f.fileno())
        os.replace(tmp, final)
        if self._fsync:
            _fsync_dir(self.dir)
        self.next_offset = last + 1
        return first, last


class LandingLog:
    """Read side of the landing log: offsets, deterministic range reads, retention."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def partitions(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            e.name for e in os.scandir(self.root) if e.is_dir() and PARTITION_RE.match(e.name)
        )

    def end_offsets(self) -> dict[str, int]:
        """Next offset to be written, per partition (exclusive end of what is durable)."""
        out: dict[str, int] = {}
        for p in self.partitions():
            segs = _segments(self.root / p)
            if segs:
                out[p] = segs[-1][1] + 1
        return out

    def start_offsets(self) -> dict[str, int]:
        """First offset still on disk, per partition (after retention)."""
        out: dict[str, int] = {}
        for p in self.partitions():
            segs = _segments(self.root / p)
            if segs:
                out[p] = segs[0][0]
        return out

    def read(self, partition: str, start: int, end: int) -> pa.Table:
        """Rows with ``start <= offset < end``; raises if any of them is gone."""
        tables: list[pa.Table] = []
        expected = start
        for first, last, path in _segments(self.root / partition):
            if last < start or first >= end:
                continue
            if first > expected:
                raise LandingError(
                    f"offsets {expected}..{first - 1} of partition {partition!r} are not on disk"
                )
            t = _upgrade(ipc.open_file(pa.memory_map(str(path))).read_all())
            lo = max(start - first, 0)
            hi = min(end, last + 1) - first
            tables.append(t.slice(lo, hi - lo))
            expected = last + 1
        if expected < end and start < end:
            raise LandingError(
                f"offsets {expected}..{end - 1} of partition {partition!r} are not on disk"
            )
        if not tables:
            return LANDING.empty_table()
        return pa.concat_tables(tables)

    def iter_batches(self, offsets: Mapping[str, tuple[int, int]]) -> Iterable[pa.RecordBatch]:
        for p, (s, e) in sorted(offsets.items()):
            if e > s:
                yield from self.read(p, s, e).to_batches()

    def delete_before(self, partition: str, offset: int) -> int:
        """Remove segments wholly below ``offset`` (never the newest); returns how many.

        Never at or past the partition's settle marker either: messages there
        may still be sealed as in doubt (``receivers.indoubt``), which reads them.
        """
        from receivers.indoubt import read_marker

        marker = read_marker(self.root / partition)
        if marker is not None:
            offset = min(offset, marker)
        segs = _segments(self.root / partition)
        removed = 0
        for _first, last, path in segs[:-1]:
            if last < offset:
                path.unlink()
                removed += 1
        return removed
