"""Helpers for the end-to-end reliability tests: child processes, the manifest, bronze checks.

Every child (``qmf sim``, ``qmf receive``, ``spark-submit jobs/bronze.py``) runs in a
session of its own, so a SIGKILL reaches the whole tree (spark-submit's JVM, its
Python driver and workers) the way a machine crash would, and the tests can sweep
leftovers by session id instead of by name.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from pipeline.broker import config_env
from pipeline.codec.message import decode_message
from pipeline.lake import delta
from pipeline.qmfxml import default_schema
from pipeline.sim.manifest import read_manifest, record_row
from receivers.landing import LandingLog
from tests.submit import SPARK_SUBMIT

REPO = Path(__file__).resolve().parents[2]
# Fields the simulator adds to a record's row in the manifest (the rest is record_row()).
MANIFEST_EXTRA = ("interval", "message", "routing_key", "exchange", "agent_uuid", "source")


def node_env(cfg: Any) -> dict[str, str]:
    """The environment that points ``qmf`` at a test module's own node (``isolated_broker``).

    Why not the shared test node: other test files publish to its management exchange
    and start consoles there at the same time, and ``qmf run`` subscribes to all of it.
    Its summary then counted their agents' samples too (15,037 object samples for 2,953
    published, in a CI run of 2026-12-02)."""
    return {
        **{k: v for k, v in os.environ.items() if k != "QMF_BROKER_URL"},
        "PYSPARK_PYTHON": sys.executable,
        **config_env(cfg),
    }



def wait_for(cond: Callable[[], bool], timeout_s: float, what: str, step_s: float = 0.2) -> None:
    """Poll ``cond`` until true; a bounded wait, never a timing assertion."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(step_s)


def _session_members(sid: int) -> list[int]:
    """Pids whose session id is ``sid`` (children that outlived their leader too)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(entry))
    return out


class Child:
    """One child process in its own session, output to files under ``logs``."""

    def __init__(self, name: str, cmd: Sequence[str], logs: Path, env: dict[str, str] | None = None,
                 stdout_pipe: bool = False) -> None:  # fmt: skip
        self.name = name
        self.cmd = list(cmd)
        self.err_path = logs / f"{name}.stderr"
        self.out_path = logs / f"{name}.stdout"
        self._err: IO[bytes] = open(self.err_path, "wb")  # closed in reap()
        self._out: IO[bytes] = open(self.out_path, "wb")
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=self._err,
            start_new_session=True,
        )
        self.sid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def kill(self) -> int:
        """SIGKILL the whole session (a crash); returns the leader's exit status."""
        for _ in range(20):
            pids = _session_members(self.sid)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if self.proc.poll() is None:
                try:
                    self.proc.wait(1.0)
                except subprocess.TimeoutExpired:
                    pass
            time.sleep(0.05)
        rc = self.proc.wait(30)
        self._close()
        return rc

    def terminate(self, timeout_s: float) -> int:
        """SIGTERM the leader and wait (bounded); SIGKILL everything if it does not stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"{self.name} ignored SIGTERM for {timeout_s} s") from None
        rc = self.proc.returncode
        self.reap()
        return rc

    def signal_member(self, needle: str, sig: int) -> None:
        """Signal the Python process of the session that runs the script ``needle``.

        spark-submit's leader is the JVM: a SIGTERM there ends it with 143 before
        the Python driver (``jobs/bronze.py``) can stop its query; the driver's own
        SIGTERM handler is what stops the job cleanly (exit 0 through spark-submit).
        """
        for pid in _session_members(self.sid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            # The Python process itself, not the JVM whose arguments name the script too.
            if "python" in os.path.basename(argv[0]) and any(needle in a for a in argv[1:3]):
                os.kill(pid, sig)
                return
        raise AssertionError(f"no process of {self.name} runs {needle!r}")

    def stop_via(self, needle: str, timeout_s: float) -> int:
        """SIGTERM the Python process running ``needle``; wait for the leader (bounded)."""
        self.signal_member(needle, signal.SIGTERM)
        return self.wait(timeout_s)

    def wait(self, timeout_s: float) -> int:
        """Wait for a bounded child to end by itself (SIGKILL after ``timeout_s``)."""
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not finish in {timeout_s} s") from None
        self.reap()
        return rc

    def reap(self) -> None:
        """Kill what the child left behind in its session (e.g. Python workers), close logs."""
        if _session_members(self.sid):
            self.kill()
        self._close()

    def _close(self) -> None:
        for f in (self._err, self._out):
            if not f.closed:
                f.close()


@contextmanager
def children() -> Iterator[list[Child]]:
    """Every Child appended to the list is SIGKILLed (with its session) on the way out."""
    started: list[Child] = []
    try:
        yield started
    finally:
        for c in started:
            c.kill()


# ------------------------------------------------------------------------ commands


def qmf_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", *args]


def sim_seed() -> int:
    """A seed of this run's own: its agent uuid (AM1 keys ``mgmt.<uuid>.*``) is ours alone."""
    return random.SystemRandom().randrange(1 << 40)


def sim_agent_uuid(seed: int, dialect: str = "am1") -> str:
    """Agent 0's uuid for ``qmf sim --seed seed``, known before it publishes (for the binding)."""
    from pipeline.sim.agent import SimAgent
    from pipeline.sim.model import LoadConfig

    agent = SimAgent(0, dialect, default_schema(), LoadConfig(queues=1, connections=1), seed)
    return agent.agent_key


def receive_cmd(url: str, queue: str, landing: Path, partition: str, *extra: str) -> list[str]:
    """``qmf receive`` on a durable queue through the rabbitmq preset (``/amq/queue/NAME``)."""
    return qmf_cmd(
        "receive", "--preset", "rabbitmq", "--url", url, "--queue", queue,
        "--landing", str(landing), "--partition", partition, *extra,
    )  # fmt: skip


def bronze_cmd(landing: Path, table: Path, checkpoint: Path, *extra: str) -> list[str]:
    """``jobs/bronze.py`` through the real spark-submit, local[2] (the machine's 2 cores)."""
    return [
        SPARK_SUBMIT,
        "--master", "local[2]",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=2",
        "--driver-memory", "1g",
        str(REPO / "jobs" / "bronze.py"),
        "--landing", str(landing), "--table", str(table), "--checkpoint", str(checkpoint),
        *extra,
    ]  # fmt: skip


def unique_tag() -> str:
    return f"it{uuid.uuid4().hex[:10]}"


# ------------------------------------------------------------------------ observing


def landed_rows(root: Path) -> int:
    """Rows in the landing log (copies included): only directory listings, cheap to poll."""
    return sum(LandingLog(root).end_offsets().values())


def landed_table(root: Path) -> pa.Table:
    log = LandingLog(root)
    starts = log.start_offsets()
    parts = [log.read(p, starts[p], end) for p, end in sorted(log.end_offsets().items())]
    return pa.concat_tables(parts)


def landed_keys(root: Path) -> list[str]:
    return [str(k) for k in landed_table(root).column("msg_key").to_pylist()]


def bronze_rows(table: Path) -> int:
    """Rows bronze has committed, from the Parquet footers of the files the log lists."""
    if not delta.table_exists(table):
        return 0
    return sum(pq.ParquetFile(uri).metadata.num_rows for uri in DeltaTable(str(table)).file_uris())


def bronze_commits(table: Path) -> list[int]:
    """Batch ids of the bronze commits, in commit order (a replay adds none)."""
    return [b for _app, b, _v in delta.app_transactions(table)]


def wait_new_file(directory: Path, suffix: str, timeout_s: float) -> bool:
    """Spin (1 ms) until a new ``*suffix`` file appears in ``directory``; False on timeout.

    Used to crash a process right after it made something durable (a landing
    segment renamed into place, a Delta commit) and before it could act on it
    (settle the deliveries, write Spark's commit log): the windows where a crash
    makes copies or replays.
    """

    def names() -> set[str]:
        try:
            return {n for n in os.listdir(directory) if n.endswith(suffix)}
        except FileNotFoundError:
            return set()

    before = names()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if names() - before:
            return True
        time.sleep(0.001)
    return False


# ------------------------------------------------------------------------ the truth


def canonical(routing_key: str, rows: Iterable[dict[str, Any]]) -> str:
    """One message as text: its routing key and its records' manifest fields, in order."""
    return json.dumps([routing_key, list(rows)], sort_keys=True, separators=(",", ":"))


def manifest_messages(path: Path) -> tuple[list[str], int]:
    """Every published message of a manifest (canonical form) and the record count."""
    by_message: dict[int, tuple[str, list[dict[str, Any]]]] = {}
    records = 0
    for row in read_manifest(str(path)):
        if row.get("source") != "publish":
            continue  # lifecycle lines (create, delete, restart, request) are not records
        records += 1
        rec = {k: v for k, v in row.items() if k not in MANIFEST_EXTRA}
        by_message.setdefault(row["message"], (row["routing_key"], []))[1].append(rec)
    assert sorted(by_message) == list(range(len(by_message))), "manifest message indexes"
    return [canonical(k, rs) for _, (k, rs) in sorted(by_message.items())], records


def decoded_messages(table: pa.Table) -> tuple[list[str], int]:
    """Bronze rows decoded with the codec (canonical form) and the record count."""
    registry = default_schema().registry()
    out: list[str] = []
    records = 0
    cols = table.select(["body", "routing_key", "application_properties", "content_type",
                         "app_id"]).to_pylist()  # fmt: skip
    for r in cols:
        res = decode_message(
            r["body"], registry=registry, application_properties=r["application_properties"],
            content_type=r["content_type"], app_id=r["app_id"], routing_key=r["routing_key"],
        )  # fmt: skip
        assert not res.problems, (r["routing_key"], res.problems)
        rows = [json.loads(json.dumps(record_row(rec), sort_keys=True)) for rec in res.records]
        records += len(rows)
        out.append(canonical(r["routing_key"], rows))
    return out, records


def assert_bronze_is_the_manifest(
    table: Path, manifest: Path, summary: dict[str, Any], broker_name: str | None = None
) -> pa.Table:
    """Bronze (or its rows of ``broker_name``) holds every published message exactly once,
    with exactly its records."""
    expected, expected_records = manifest_messages(manifest)
    assert (len(expected), expected_records) == (summary["messages"], summary["records"])
    # Distinct messages have distinct contents (AM1 seq numbers, timestamps): a fair test.
    assert len(set(expected)) == len(expected)
    out = delta.read_arrow(str(table))
    if broker_name is not None:
        out = out.filter(pc.equal(out.column("broker_name"), broker_name))
    keys = out.column("msg_key").to_pylist()
    assert len(keys) == len(set(keys)), "a message is twice in bronze"
    assert out.column("subject").to_pylist() == out.column("routing_key").to_pylist()
    got, got_records = decoded_messages(out)
    missing = Counter(expected) - Counter(got)
    extra = Counter(got) - Counter(expected)
    assert not missing and not extra, (
        f"{sum(missing.values())} published messages missing from bronze, "
        f"{sum(extra.values())} not published"
    )
    assert sorted(got) == sorted(expected)
    assert (out.num_rows, got_records) == (summary["messages"], summary["records"])
    return out


def drain_to_bronze(spark: Any, landing: Path, table: Path | str, checkpoint: Path | str) -> None:
    """Run the bronze stream in-process with AvailableNow until the landing log is drained."""
    from pipeline.bronze import BronzeSettings, start_bronze

    settings = BronzeSettings(
        landing=str(landing), table=str(table), checkpoint=str(checkpoint),
        max_records_per_trigger=2_000,
    )  # fmt: skip
    query = start_bronze(spark, settings)
    try:
        assert query.awaitTermination(300)
    finally:
        query.stop()
    assert query.exception() is None


# ------------------------------------------------------------------ SIGKILL a streaming job


def stream_job(script: str, args: Sequence[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """``jobs/<script>`` as its own Python process (as the kill tests run silver and gold)."""
    cmd = [sys.executable, str(REPO / "jobs" / script), *args]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def last_batch_id(path: str) -> int | None:
    """The highest streaming batch id (app transaction) committed to a Delta table so far."""
    if not delta.table_exists(path):
        return None
    return max((b for _app, b, _v in delta.app_transactions(path)), default=None)


def kill_after_batch(
    script: str, args: Sequence[str], log_path: Path, table: str, at_least: int,
    timeout_s: float, poll_s: float = 0.3,
) -> int | None:  # fmt: skip
    """Start the job, SIGKILL it once ``table`` holds batch ``at_least`` (it must still run
    then: the kill is mid-stream); returns the last batch id committed before the kill."""
    with open(log_path, "wb") as log:
        job = stream_job(script, args, log)
        try:
            deadline = time.monotonic() + timeout_s
            done: int | None = None
            while time.monotonic() < deadline and job.poll() is None:
                time.sleep(poll_s)
                done = last_batch_id(table)
                if done is not None and done >= at_least:
                    break
            assert job.poll() is None, log_path.read_text()[-3000:]
            os.kill(job.pid, signal.SIGKILL)
        finally:
            if job.poll() is None:
                job.kill()
            job.wait()
    return done


def run_job_to_end(script: str, args: Sequence[str], log_path: Path, timeout_s: float) -> None:
    """Run the job until it exits by itself; it must exit 0 (a timed-out one is killed)."""
    with open(log_path, "wb") as log:
        job = stream_job(script, args, log)
        try:
            assert job.wait(timeout=timeout_s) == 0, log_path.read_text()[-3000:]
        finally:
            if job.poll() is None:
                job.kill()  # a timed-out run must not outlive the test
                job.wait()
