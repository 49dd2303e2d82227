"""Spark's and the JVM's own output in a log file; our own warnings on the terminal.

A person running ``qmf run`` can act on our messages (the broker refused us, a
schema never came) but not on Spark's (``WARN Utils: Your hostname ... resolves to
a loopback address``, ``Failed to cancel job group``, the JVM's ``Using incubator
modules``). So when ``pipeline.spark.get_spark`` launches the JVM with a log file,
log4j2 writes there (a File appender) and the JVM process's stdout and stderr are
that file too: whatever it prints before log4j starts, uncaught Java stack traces,
and the output of the Python processes Spark starts (the Python streaming source's
runner, which holds the embedded receiver, and the UDF workers).

Our own code in those Python processes still has something to say to the person:
``child_logging()`` (called there) writes its records to stderr with ``MARKER`` at
the start of every line, and a ``LogTail`` in the driver follows the file and
copies the marked lines, marker removed, to the terminal. Everything stays in the
file; only ours reaches the terminal. The driver's own logging is ours too:
``terminal_logging()`` sends our loggers to the terminal and everything else
(pyspark, py4j) to the file.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

# Set in the environment of the JVM (and so of the Python processes it starts) when
# its output goes to a log file: child_logging() then marks our records there.
CHILD_ENV = "QMF_SPARK_CHILD_LOG"
MARKER = "[qmf] "
# Our loggers: the pipeline's modules, the receivers, and the receiver's "qmf.*" names.
OUR_LOGGERS = ("pipeline", "receivers", "schemas", "qmf")
LINE_FORMAT = "%(levelname)s %(name)s: %(message)s"

_tail: LogTail | None = None


class MarkedFormatter(logging.Formatter):
    """Every line of a record (its traceback too) starts with ``MARKER``."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(MARKER + line for line in super().format(record).splitlines())


def _our_handler(handler: logging.Handler) -> None:
    """Attach ``handler`` to our loggers (only them: pyspark's and py4j's stay out)."""
    for name in OUR_LOGGERS:
        logger = logging.getLogger(name)
        if not any(getattr(h, "_qmf", False) for h in logger.handlers):
            handler._qmf = True  # type: ignore[attr-defined]
            logger.addHandler(handler)


def child_logging() -> bool:
    """In a Python process Spark started for a JVM whose output goes to a log file:
    our WARNING and ERROR records go to stderr marked for the driver's ``LogTail``.
    Does nothing elsewhere (a spark-submit job keeps Python's defaults); idempotent.
    Returns whether it installed the handler."""
    if os.environ.get(CHILD_ENV) != "1":
        return False
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(MarkedFormatter(LINE_FORMAT))
    _our_handler(handler)
    return True


def terminal_logging(log_file: Path | None) -> None:
    """The driver of ``qmf run``: our loggers' WARNING and ERROR records to the terminal
    (stderr, as it is when they are emitted: a live progress display moves them above
    its line), everyone else's to ``log_file`` (py4j and pyspark talk about Spark)."""

    class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
        def emit(self, record: logging.LogRecord) -> None:
            self.stream = sys.stderr  # the current one, not the one at set-up
            super().emit(record)

    handler = _Stderr(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(LINE_FORMAT))
    _our_handler(handler)
    for name in OUR_LOGGERS:
        logging.getLogger(name).propagate = log_file is not None  # the file gets ours too
    root = logging.getLogger()
    if log_file is not None and not any(isinstance(h, logging.FileHandler) for h in root.handlers):
        fh = logging.FileHandler(log_file, encoding="utf-8")
        fh.setLevel(logging.WARNING)
        fh.setFormatter(logging.Formatter("%(asctime)s " + LINE_FORMAT))
        root.addHandler(fh)


class LogTail:
    """Follows a log file from its current end; lines starting with ``MARKER`` go to
    ``emit`` without it (default: the current ``sys.stderr``). Reading the file
    instead of a pipe means the JVM never waits for us to read its output."""

    def __init__(
        self, path: Path, emit: Callable[[str], None] | None = None, poll_s: float = 0.25
    ) -> None:
        self.path = path
        self._emit = emit
        self.poll_s = poll_s
        self._fh: IO[bytes] = open(path, "rb")  # closed by stop()
        self._fh.seek(0, os.SEEK_END)
        self._partial = b""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qmf-spark-log", daemon=True)

    def start(self) -> LogTail:
        self._thread.start()
        return self

    def _write(self, text: str) -> None:
        if self._emit is not None:
            self._emit(text)
        else:
            sys.stderr.write(text)
            sys.stderr.flush()

    def poll(self) -> int:
        """Forward the marked lines written since the last poll; how many."""
        with self._lock:
            chunk = self._fh.read()
            if not chunk:
                return 0
            lines = (self._partial + chunk).split(b"\n")
            self._partial = lines.pop()
            marker = MARKER.encode()
            out = [ln[len(marker) :] for ln in lines if ln.startswith(marker)]
            if out:
                self._write(b"".join(ln + b"\n" for ln in out).decode("utf-8", "replace"))
            return len(out)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except (OSError, ValueError):
                return

    def stop(self) -> None:
        """Forward what is left and stop following."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.poll_s + 1)
        try:
            self.poll()
        finally:
            self._fh.close()


def log4j2_config(level: str, log_file: Path | None = None) -> str:
    """A log4j2 configuration: everything at ``level`` and above to ``log_file``, or to
    the JVM's stderr without one (spark-submit jobs, test sessions)."""
    if log_file is None:
        appender = "type = Console\nappender.out.target = SYSTEM_ERR"
    else:
        name = str(log_file).replace("\\", "\\\\")
        appender = f"type = File\nappender.out.fileName = {name}\nappender.out.append = true"
    return f"""\
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
appender.out.name = out
appender.out.{appender}
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
"""


def open_log(log_file: Path, app_name: str) -> IO[bytes]:
    """The log file, created with its folder, opened for appending (the JVM's stdout
    and stderr), a first line saying whose it is."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    fh = open(log_file, "ab")  # handed to the JVM, closed after its launch
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    fh.write(f"# {app_name} (pid {os.getpid()}): Spark's and the JVM's output, {stamp}\n".encode())
    fh.flush()
    return fh


def follow(log_file: Path) -> LogTail:
    """Start forwarding the marked lines of ``log_file`` (one follower per process)."""
    global _tail
    if _tail is not None:
        _tail.stop()
    _tail = LogTail(log_file).start()
    return _tail


def flush() -> None:
    """Forward what the followed log holds now (before a closing summary is printed)."""
    if _tail is not None:
        _tail.poll()


def last_lines(log_file: Path, n: int = 5) -> list[str]:
    """The last ``n`` lines of the log that are not our header or marked records: what the
    JVM said when it failed to start (``Error: Could not create the Java Virtual Machine``)."""
    try:
        with open(log_file, "rb") as fh:
            fh.seek(max(0, os.path.getsize(log_file) - 65_536))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("# ", MARKER))]
    return lines[-n:]


def report_start_failure(prog: str, exc: BaseException, log_file: Path) -> None:
    """On stderr: the JVM did not start, in pyspark's words and then the JVM's own (the
    last lines of its output, which went to ``log_file``), and where the rest is."""
    print(f"{prog}: Spark did not start: {exc}", file=sys.stderr)
    for line in last_lines(log_file):
        print(f"  {line}", file=sys.stderr)
    print(f"  (Spark's and the JVM's output: {log_file})", file=sys.stderr)
