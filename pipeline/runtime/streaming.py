"""Running a streaming query to its end: the loop every job (bronze, silver, gold) shares."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pipeline import SetupError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery

    from pipeline.lake.maintain import JobMaintenance

log = logging.getLogger(__name__)

_PY_ERROR = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception)): (.+)$")


def query_error(exc: object) -> str:
    """A failed query's cause on one line, for a command's last words.

    Spark wraps an error raised in Python (a source, a foreachBatch writer) in
    its own message with the Python traceback and a dump of the query; the
    last ``SomeError: message`` line of that traceback is what the user needs
    (e.g. the embedded receiver's refused login). Spark has logged the whole
    text already.
    """
    text = str(exc).split("=== Streaming Query ===")[0]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        m = _PY_ERROR.match(line)
        if m:
            return f"{m.group(1)}: {m.group(2)}"
    return lines[0] if lines else repr(exc)


def offset_log_sources(checkpoint: str, batch_id: int) -> list[str] | None:
    """The end offset of each source of micro-batch ``batch_id``, as Spark logged it.

    ``<checkpoint>/offsets/<id>``: line 1 is the version, line 2 the batch
    metadata, then one JSON line per source in the order of the query's plan
    (a union: left first). Spark writes the entry before it runs the batch
    and re-runs the same entry after a crash, so it is exactly the batch the
    ``foreachBatch`` DataFrame holds. None: no entry (never written, or
    purged), or a source without an offset (``-``).
    """
    from pipeline.lake import storage

    try:
        lines = storage.read_text(storage.join(checkpoint, "offsets", str(batch_id))).splitlines()
    except FileNotFoundError:
        return None
    sources = [ln.strip() for ln in lines[2:]]
    if not sources or any(s in ("", "-") for s in sources):
        return None
    return sources


def last_offsets(checkpoint: str) -> tuple[int, list[str]] | None:
    """The newest entry of the checkpoint's offset log: its batch id and source offsets."""
    from pipeline.lake import storage

    names = [os.path.basename(f) for f in storage.list_files(storage.join(checkpoint, "offsets"))]
    ids = [int(n) for n in names if n.isdigit()]
    for batch_id in sorted(ids, reverse=True):
        sources = offset_log_sources(checkpoint, batch_id)
        if sources is not None:
            return batch_id, sources
    return None


class OldCheckpointError(SetupError):
    """A checkpoint of a previous release that this release's stream cannot resume
    (a ``SetupError``: ``qmf`` prints it on one line)."""


def refuse_old_checkpoint(checkpoint: str, job: str, tables: Sequence[str]) -> None:
    """Stop before Spark fails obscurely on a checkpoint whose offsets are the previous
    release's ``qmf-delta`` source's (``{"version", "index"}``), not Delta's source's.

    ``tables``: the names of the query's sources, in the offset log's order. The
    message says where each source stopped and how to go on exactly once: a new
    checkpoint with ``--starting-version`` per table (the jobs' app id comes from
    the checkpoint, so the new query must start where the old one ended).
    """
    if not checkpoint:
        return
    last = last_offsets(checkpoint)
    if last is None:
        return
    batch_id, sources = last
    ends: list[tuple[str, int, int]] = []
    for name, text in zip(tables, sources, strict=False):
        try:
            end = json.loads(text)
        except json.JSONDecodeError:
            return
        if not isinstance(end, dict) or "reservoirVersion" in end or "version" not in end:
            return
        ends.append((name, int(end["version"]), int(end.get("index", 0))))
    inside = [f"{n} (inside version {v})" for n, v, i in ends if i > 0]
    how = (
        "let the previous release finish its stream first (availableNow to the end) "
        f"so it stops between versions: now it stopped in {', '.join(inside)}"
        if inside
        else "move it aside and start with a new checkpoint and "
        + " ".join(f"--starting-version {n}={v}" for n, v, _ in ends)
        + " (the first version it has not read)"
    )
    raise OldCheckpointError(
        f"{job}: checkpoint {checkpoint} holds the offsets of the previous release's "
        f"qmf-delta source (batch {batch_id}); Delta's streaming source cannot resume "
        f"them: {how}"
    )


def trigger_kwargs(trigger: str) -> dict[str, bool | str]:
    """``availableNow`` -> ``{"availableNow": True}``; ``processingTime=5 seconds`` -> that."""
    if trigger == "availableNow":
        return {"availableNow": True}
    name, sep, value = trigger.partition("=")
    if name == "processingTime" and sep and value.strip():
        return {"processingTime": value.strip()}
    raise ValueError(f"trigger {trigger!r}: expected availableNow or processingTime=<interval>")


# How long a stop waits for the batch in flight before it cancels it (seconds).
STOP_GRACE_S = 60.0


class StopGate:
    """A ``foreachBatch`` function wrapped so that a stop lands between batches.

    Why: ``StreamingQuery.stop()`` during a batch cancels its Spark jobs. Exactly
    once holds (the batch is replayed and our writers skip what they committed),
    but the batch's work is lost, and with a Python ``foreachBatch`` Spark's stream
    thread then runs a regex over the long py4j traceback, which overflowed the
    thread's stack (``java.lang.StackOverflowError``: the thread dies without its
    clean-up, e.g. the sources' ``stop``). Spark has no "stop after this batch";
    so ``stop_query`` asks the gate, and the gate stops the query from another
    thread as soon as the batch in flight has returned.
    """

    def __init__(self, fn: Callable[[DataFrame, int], Any]) -> None:
        self.fn = fn
        self.query: StreamingQuery | None = None
        self.in_batch = False
        self.stopped_between = False  # the gate, not a cancel, stopped the query
        self._requested = False
        self._lock = threading.Lock()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        with self._lock:
            self.in_batch = True
        try:
            self.fn(df, batch_id)
        finally:
            with self._lock:
                self.in_batch = False
                requested = self._requested
        if requested and self.query is not None:
            # stop() waits for this thread's caller (Spark's stream thread): not here.
            self.stopped_between = True
            threading.Thread(target=self.query.stop, name="qmf-stop", daemon=True).start()

    def bind(self, query: StreamingQuery) -> StreamingQuery:
        """Remember the started query (``stop_query`` finds the gate by its id)."""
        self.query = query
        _GATES[str(query.id)] = self
        return query

    def busy(self) -> bool:
        """A batch is in the wrapped function now."""
        with self._lock:
            return self.in_batch

    def request_stop(self) -> bool:
        """Ask for a stop at the end of the batch in flight; False when none is in flight."""
        with self._lock:
            self._requested = True
            return self.in_batch


_GATES: dict[str, StopGate] = {}


class CheckpointInUse(RuntimeError):
    """Another process runs a query on this checkpoint."""


CHECKPOINT_LOCK = "qmf-query.lock"


class CheckpointLocks:
    """Exclusive locks on the checkpoints of this process's running queries.

    Two queries on one checkpoint would both write its offset log. Spark's own
    check is a rename that refuses to overwrite, at the next batch's offsets;
    ``pipeline.spark`` writes the logs through the FileSystem API, whose rename
    overwrites, so this lock is the check, and it comes at start. A checkpoint
    folder's lock is ``<checkpoint>/qmf-query.lock`` under ``fcntl.flock``: the
    kernel drops it when the process dies, however it dies. It is held while the
    query that took it runs (a thread waits for the query's end); a query started
    again on the same checkpoint by this process takes the held lock over. A
    remote checkpoint (a URI other than ``file:``) is not locked here.
    """

    def __init__(self) -> None:
        self._held: dict[str, tuple[int, object]] = {}  # folder -> (fd, owning query)
        self._mutex = threading.Lock()

    @staticmethod
    def folder(checkpoint: str) -> str | None:
        if "://" in checkpoint and not checkpoint.startswith("file:"):
            return None
        return os.path.abspath(checkpoint.removeprefix("file://").removeprefix("file:"))

    def acquire(self, checkpoint: str) -> str | None:
        """Lock ``checkpoint`` (its folder, or None when not local) or raise ``CheckpointInUse``."""
        import fcntl

        folder = self.folder(checkpoint)
        if folder is None:
            return None
        with self._mutex:
            if folder in self._held:
                return folder
            os.makedirs(folder, exist_ok=True)
            fd = os.open(os.path.join(folder, CHECKPOINT_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise CheckpointInUse(
                    f"checkpoint {folder} is in use: another process runs a query on it "
                    f"(it holds {CHECKPOINT_LOCK} there); stop that one first, or give "
                    "this job a checkpoint of its own"
                ) from None
            self._held[folder] = (fd, None)
            return folder

    def own(self, folder: str | None, query: StreamingQuery | None) -> None:
        """``query`` (None: its start failed) owns the lock now; released when it ends."""
        if folder is None:
            return
        if query is None:  # a lock this start took is dropped; an earlier query's is kept
            self._release(folder, None)
            return
        try:  # released meanwhile by the end of the query this one restarts
            self.acquire(folder)
        except CheckpointInUse as e:
            log.warning("query %s runs without its checkpoint lock: %s", query.id, e)
            return
        with self._mutex:
            if folder not in self._held:
                return
            self._held[folder] = (self._held[folder][0], query)
        threading.Thread(
            target=self._release_after, args=(folder, query), name="qmf-checkpoint-lock",
            daemon=True,
        ).start()  # fmt: skip

    def _release_after(self, folder: str, query: StreamingQuery) -> None:
        try:
            query.awaitTermination()
        except Exception:  # a failed or stopped query ended all the same
            pass
        self._release(folder, query)

    def _release(self, folder: str, query: object) -> None:
        with self._mutex:
            held = self._held.get(folder)
            if held is None or held[1] is not query:
                return  # taken over by a query started again on the same checkpoint
            del self._held[folder]
        os.close(held[0])  # closing the only descriptor drops the flock

    def held(self) -> list[str]:
        with self._mutex:
            return sorted(self._held)


CHECKPOINTS = CheckpointLocks()


def start_gated(
    stream: DataFrame,
    fn: Callable[[DataFrame, int], Any],
    *,
    name: str,
    checkpoint: str,
    trigger: str,
    maintenance: JobMaintenance | None = None,
    tables: Callable[[], Sequence[str]] | None = None,
) -> StreamingQuery:
    """Start ``stream`` with ``fn`` as its ``foreachBatch``, behind a ``StopGate``,
    its checkpoint locked while it runs (``CheckpointLocks``). ``maintenance``: the
    job's own ``tables`` are maintained between its batches (``BetweenBatches``).

    Every job starts its query here, so that ``stop_query`` can land its stop
    between batches.
    """
    if maintenance is not None:
        if tables is None:
            raise ValueError("maintenance needs the job's tables")
        fn = maintenance.around(fn, tables)
    folder = CHECKPOINTS.acquire(checkpoint)
    gate = StopGate(fn)
    query = None
    try:
        query = gate.bind(
            stream.writeStream.queryName(name)
            .foreachBatch(gate)
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger_kwargs(trigger))  # type: ignore[arg-type]
            .start()
        )
    finally:
        CHECKPOINTS.own(folder, query)
    return query


def stop_query(query: StreamingQuery, grace_s: float = STOP_GRACE_S) -> bool:
    """Stop ``query`` between batches: at once when it is idle, else when the batch in
    flight returns (``StopGate``), cancelling it only after ``grace_s``.

    True when no batch was cancelled (as far as can be seen: a batch starting in the
    instant between the idle check and ``stop()`` is cancelled; it is replayed).
    A query started without a gate is stopped at once.
    """
    return stop_queries([query], grace_s)[0]


def stop_queries(queries: Sequence[StreamingQuery], grace_s: float = STOP_GRACE_S) -> list[bool]:
    """``stop_query`` for several queries at once: every gate is asked first, then all
    are awaited against one deadline, so the whole stop takes at most ``grace_s``
    (not ``grace_s`` per query). One flag per query, as ``stop_query`` returns.
    """
    from pyspark.errors import StreamingQueryException

    deadline = time.monotonic() + grace_s
    result = [True] * len(queries)
    waiting: dict[int, tuple[StopGate, bool]] = {}
    for i, query in enumerate(queries):
        gate = _GATES.pop(str(query.id), None)
        if gate is None or not query.isActive:
            if query.isActive:
                query.stop()
            result[i] = gate is not None
        else:
            waiting[i] = (gate, gate.request_stop())
    while waiting:
        for i, (_gate, in_batch) in list(waiting.items()):
            query = queries[i]
            if not query.isActive:
                del waiting[i]
            elif not in_batch and not query.status["isTriggerActive"]:
                query.stop()  # idle: no batch in flight
                del waiting[i]
        if not waiting:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            for i in waiting:
                log.warning("%s: the batch in flight did not end within %.0f s: cancelled",
                            queries[i].name, grace_s)  # fmt: skip
                queries[i].stop()
                result[i] = False
            break
        first = queries[next(iter(waiting))]
        try:
            first.awaitTermination(poll_s(left))  # type: ignore[arg-type]
        except StreamingQueryException:
            pass  # it failed meanwhile: the caller reads query.exception()
        waiting = {i: (gate, gate.busy()) for i, (gate, _) in waiting.items()}
    return result


def poll_s(left: float) -> float:
    """How long ``stop_queries`` waits on a query before looking again: at most 0.1 s and
    what is left of the grace, but one whole millisecond at least, since pyspark passes
    whole milliseconds and Spark refuses 0 ("Timeout has to be positive"), which a grace
    with under a millisecond left gave."""
    return max(0.001, min(0.1, left))


def await_query(
    query: StreamingQuery,
    name: str,
    *,
    available_now: bool,
    timeout_s: float | None,
    stop: threading.Event | None = None,
) -> int:
    """Wait until AvailableNow drained the input, ``timeout_s`` passed, or ``stop`` is set.

    The query is stopped on the way out. Returns 0 when the run ended as
    intended, 2 when an AvailableNow run did not finish (timeout or stop),
    1 when the query failed.
    """
    from pyspark.errors import StreamingQueryException

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    finished = False
    try:
        while not finished and not (stop is not None and stop.is_set()):
            step = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if step <= 0:
                break
            finished = bool(query.awaitTermination(step))  # type: ignore[arg-type]
    except StreamingQueryException as exc:
        log.error("%s query failed: %s", name, exc)
        return 1
    finally:
        stop_query(query)
    if query.exception() is not None:
        log.error("%s query failed: %s", name, query.exception())
        return 1
    if available_now and not finished:
        log.error("%s: AvailableNow run stopped before its input was drained (timeout or stop)",
                  name)  # fmt: skip
        return 2
    return 0
