"""Telling a redelivery from a twin: the settle marker and the in-doubt ledger.

Real brokers send *twins* (the same routing key, properties and body twice:
an unchanged object published twice, identical replies); each is a delivery
and must land. A *redelivery* is the broker sending again a message whose
settlement it never saw: its first copy may already be in the landing log.
Content cannot tell them apart; two facts can:

* the broker flags a redelivery (AMQP 1.0 header ``first-acquirer`` false,
  or ``delivery-count`` > 0; RabbitMQ 3.10 sets the former);
* only a message the receiver landed but whose settlement may not have
  reached the broker can come back. Those are the *in-doubt* messages.

So each landing partition keeps, beside its segments:

``_settled``
    the offset below which every message's settlement has reached the broker
    (written by the owning receiver, a grace period after it settled a group,
    and at a clean stop once the broker confirmed the connection close);
``_indoubt/<first>-<last>.arrow``
    (offset, msg_key) of messages that were landed but in doubt when their
    receiver session ended (crash, lost connection): written when the range
    is *sealed*, by the partition's next owner or by any receiver that finds
    the partition's lock free (its owner died);
``_indoubt/claimed/<offset>``
    created by the receiver that matched a redelivery to that in-doubt
    message, whole or not at all (written aside, then hard-linked: the link
    fails when the name exists): one redelivery per first copy, even with
    several receivers competing on one queue. It holds ``<partition>:<offset> <session>``:
    where the claimant lands the flagged copy, and which receiver session
    claimed. A claimant that died before landing that copy leaves a *void*
    claim (its session is over, and the row at that position is not the
    flagged copy); the broker redelivers the message again, and the next
    receiver takes the claim over instead of landing the message as new.

A redelivered message whose key matches an unclaimed in-doubt message is a
duplicate: it lands with ``duplicate_of = "<partition>:<offset>"`` of its
first copy (kept for audit; bronze skips it). Without a match it is a new
delivery (its first copy never landed). Twins are never flagged as
redelivered, so both land; twins redelivered together match two in-doubt
copies, one each. The cost is nothing for ordinary messages and one dict
look-up plus one file creation per redelivery, however large the log: the
check never reads bronze.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

log = logging.getLogger("qmf.receiver")

MARKER = "_settled"
LEDGER_DIR = "_indoubt"
CLAIMS_DIR = "claimed"
LEDGER_RE = re.compile(r"^(\d{20})-(\d{20})\.arrow$")
LEDGER_SCHEMA = pa.schema(
    [pa.field("offset", pa.int64(), nullable=False), pa.field("msg_key", pa.string(), False)]
)
# In-doubt messages whose redelivery has not come after this long are let go.
DEFAULT_TTL_S = 30 * 86400
# A claim is written beside its final name (this prefix + the session), then linked.
PENDING_PREFIX = ".pending-"
# Receivers before atomic claims could leave an empty claim (killed between create and
# write); one this old has no live writer and is taken over.
EMPTY_CLAIM_VOID_S = 5.0
UNWRITTEN = ("", -1, "")


def read_marker(part_dir: Path) -> int | None:
    try:
        return int((part_dir / MARKER).read_text(encoding="ascii").strip())
    except FileNotFoundError:
        return None


def write_marker(part_dir: Path, offset: int) -> None:
    """Atomic replace; not fsynced: a marker lost in a machine crash is older,
    which only widens the in-doubt range."""
    tmp = part_dir / f"{MARKER}.tmp"
    tmp.write_text(f"{offset}\n", encoding="ascii")
    os.replace(tmp, part_dir / MARKER)


def _fsync_path(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal(root: Path, partition: str, start: int | None = None) -> tuple[int, int] | None:
    """Record ``[marker, end)`` of ``partition`` as in doubt; the caller holds its lock.

    ``start`` widens the range below the marker (a lost connection: the broker
    may have dropped dispositions the marker already counts).

    Returns the sealed range, or None when nothing was in doubt. A partition
    without a marker is new, or was written before markers existed: nothing
    is in doubt, and it gets one.
    """
    from receivers.landing import LandingLog

    part_dir = root / partition
    end = LandingLog(root).end_offsets().get(partition, 0)
    marker = read_marker(part_dir)
    if marker is not None and start is not None and start < marker:
        marker = max(start, LandingLog(root).start_offsets().get(partition, start))
    if marker is None or marker >= end:
        if marker != end:  # a new partition, or one from before markers: nothing in doubt
            write_marker(part_dir, end)
        return None
    rows = LandingLog(root).read(partition, marker, end)
    table = pa.table(
        {"offset": rows.column("offset"), "msg_key": rows.column("msg_key")}, schema=LEDGER_SCHEMA
    )
    ledger = part_dir / LEDGER_DIR
    ledger.mkdir(exist_ok=True)
    final = ledger / f"{marker:020d}-{end - 1:020d}.arrow"
    tmp = final.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        with ipc.new_file(f, LEDGER_SCHEMA) as w:
            w.write_table(table)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_path(ledger)
    write_marker(part_dir, end)
    log.info("partition %s: offsets %d..%d in doubt (landed, settlement unconfirmed)",
             partition, marker, end - 1)  # fmt: skip
    return marker, end


def _read_claim(path: Path) -> tuple[str, int, str] | None:
    """(partition, offset, session) where a claim's flagged copy lands; UNWRITTEN for an
    empty claim old enough that its writer is gone; None when it cannot be judged."""
    try:
        text = path.read_text(encoding="ascii")
        if not text:
            old = time.time() - path.stat().st_mtime >= EMPTY_CLAIM_VOID_S
            return UNWRITTEN if old else None
        where, session = text.split()
        part, at = where.split(":")
        return part, int(at), session
    except (OSError, ValueError):
        return None


def _try_lock(part_dir: Path) -> int | None:
    try:
        fd = os.open(part_dir / ".lock", os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class InDoubtLedger:
    """Every partition's in-doubt messages under one landing root, and their claims.

    Thread-safe (the receiver's writer thread matches, its reactor thread
    reloads). ``own`` is the caller's partition, which it seals itself.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        own: str | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        broker: str | None = None,
    ) -> None:
        self.root = Path(root)
        self.own = own
        self.broker = broker  # match only within this broker's partitions (None: all)
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._files: dict[Path, list[tuple[int, str]]] = {}
        self._by_key: dict[str, list[tuple[str, int]]] = {}
        self.session = uuid.uuid4().hex  # written into this ledger's claims

    def refresh(self) -> None:
        """Seal partitions whose owner is gone, then load every ledger file."""
        from receivers.landing import PARTITION_RE, partition_broker

        if not self.root.is_dir():
            return
        files: dict[Path, list[tuple[int, str]]] = {}
        now = time.time()
        for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
            if not entry.is_dir() or not PARTITION_RE.match(entry.name):
                continue
            part_dir = Path(entry.path)
            if self.broker is not None and partition_broker(part_dir) != self.broker:
                continue  # another broker's redelivery is never this one's first copy
            if entry.name != self.own:
                fd = _try_lock(part_dir)
                if fd is not None:  # nobody owns it: its in-doubt tail is ours to seal
                    try:
                        seal(self.root, entry.name)
                    finally:
                        os.close(fd)
            ledger = part_dir / LEDGER_DIR
            if not ledger.is_dir():
                continue
            for f in sorted(ledger.iterdir()):
                if not LEDGER_RE.match(f.name):
                    continue
                if now - f.stat().st_mtime > self.ttl_s:
                    continue
                cached = self._files.get(f)
                if cached is None:
                    t = ipc.open_file(pa.memory_map(str(f))).read_all()
                    cached = list(
                        zip(t.column("offset").to_pylist(), t.column("msg_key").to_pylist(),
                            strict=True)
                    )  # fmt: skip
                files[f] = cached
        by_key: dict[str, list[tuple[str, int]]] = {}
        for f, entries in files.items():
            partition = f.parent.parent.name
            for offset, key in entries:
                by_key.setdefault(key, []).append((partition, offset))
        with self._lock:
            self._files = files
            self._by_key = by_key

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._by_key.values())

    def _claim(self, partition: str, offset: int, at: int | None) -> bool:
        claims = self.root / partition / LEDGER_DIR / CLAIMS_DIR
        claims.mkdir(parents=True, exist_ok=True)
        path = claims / str(offset)
        where = f"{self.own}:{at}" if self.own is not None and at is not None else "-"
        # The claim appears whole or not at all: written aside, then hard-linked into place
        # (link fails if the name exists, like O_EXCL). A claimant killed between an O_EXCL
        # create and its write left an empty claim nobody could judge (CI found it).
        pending = claims / f"{PENDING_PREFIX}{self.session}"
        pending.write_bytes(f"{where} {self.session}".encode("ascii"))
        try:
            for _ in range(2):
                try:
                    os.link(pending, path)
                except FileExistsError:
                    if not self._void(path, f"{partition}:{offset}"):
                        return False
                    continue  # taken over (or voided by a competitor first): try once more
                return True
            return False
        finally:
            pending.unlink()

    def _void(self, path: Path, first: str) -> bool:
        """Set aside a claim whose claimant died before landing its flagged copy."""
        claim = _read_claim(path)
        if claim is None:
            return False  # no landing position (bare matches) or still being written: it stands
        if claim != UNWRITTEN:
            part, at, session = claim
            if session == self.session or self._may_land(part) or self._landed(part, at, first):
                return False
        try:
            os.rename(path, path.with_name(f"{path.name}.void-{self.session}"))
        except FileNotFoundError:
            pass  # another receiver set it aside first
        log.warning("claim of %s by a receiver that died before landing it: taken over", first)
        return True

    def _may_land(self, part: str) -> bool:
        """Whether the claimant of a copy landing in ``part`` may still be alive."""
        if part == self.own:
            return False  # our partition: its previous owner is gone
        fd = _try_lock(self.root / part)
        if fd is None:
            return True
        os.close(fd)
        return False

    def _landed(self, part: str, at: int, first: str) -> bool:
        """Whether ``part:at`` holds the flagged copy of ``first`` (or retention took it)."""
        from receivers.landing import LandingError, LandingLog

        log_ = LandingLog(self.root)
        if at >= log_.end_offsets().get(part, 0):
            return False
        try:
            dup = log_.read(part, at, at + 1).column("duplicate_of")[0].as_py()
        except LandingError:
            return True  # retention removed it: it landed long ago
        return bool(dup == first)

    def _match_one(self, key: str, at: int | None) -> str | None:
        with self._lock:
            candidates = list(self._by_key.get(key, ()))
        for partition, offset in candidates:
            if self._claim(partition, offset, at):
                return f"{partition}:{offset}"
        return None

    def match(
        self, keys: Sequence[str], at: Sequence[int] | None = None
    ) -> list[str | None]:
        """First copies (``partition:offset``) for redelivered keys, claimed; None if new.

        ``at``: where in this ledger's own partition each flagged copy will land
        (recorded in its claim). A key without a candidate triggers one reload
        (another receiver may have died since the last one) before it is declared new.
        """
        pos: list[int | None] = list(at) if at is not None else [None] * len(keys)
        out = [self._match_one(k, a) for k, a in zip(keys, pos, strict=True)]
        if any(o is None for o in out):
            self.refresh()
            out = [
                o if o is not None else self._match_one(k, a)
                for o, k, a in zip(out, keys, pos, strict=True)
            ]
        return out
