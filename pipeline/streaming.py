"""Running a streaming query to its end: the loop every job (bronze, silver, gold) shares."""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

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
    path = os.path.join(checkpoint, "offsets", str(batch_id))
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return None
    sources = [ln.strip() for ln in lines[2:]]
    if not sources or any(s in ("", "-") for s in sources):
        return None
    return sources


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
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        log.error("%s query failed: %s", name, query.exception())
        return 1
    if available_now and not finished:
        log.error("%s: AvailableNow run stopped before its input was drained (timeout or stop)",
                  name)  # fmt: skip
        return 2
    return 0
