"""SIGKILL the silver job mid-stream, restart it from its checkpoint: no duplicate, no loss.

The job runs as its own process (``jobs/silver.py``, stream mode over bronze's
log, one bronze commit per trigger) and is killed with SIGKILL once some
micro-batches are committed; the restarted job must end with exactly the
tables a clean batch-mode run gives. The stream decodes in Spark tasks
(``--decode-on tasks``: the tasks write the files, the driver commits them) and
pairs v1 method calls in Spark tasks too (``--calls-driver-max-rows 0``): the real
capture carries random calls whose answers come in later micro-batches. Bronze,
silver and the checkpoint are on a real S3 server (``tests/s3server.py``).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from pipeline.codec.capture import read_capture
from pipeline.lake import delta
from pipeline.silver import SilverSettings, bronze_rows, run_silver_batch, write_bronze
from tests.integration.e2e import kill_after_batch, run_job_to_end

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TABLES = ("object_samples", "events", "heartbeats", "method_responses", "quarantine", "parked")


def _args(s: SilverSettings) -> list[str]:
    return ["--bronze", s.bronze, "--root", s.root, "--checkpoint", s.checkpoint,
            "--max-files-per-trigger", "1", "--timeout", "600", "--decode-on", "tasks",
            "--calls-driver-max-rows", "0"]  # fmt: skip


def _identities(s: SilverSettings, name: str) -> Counter[tuple[Any, ...]]:
    t = delta.read_arrow(s.path(name))
    cols = [c for c in ("partition", "offset", "record_index") if c in t.column_names]
    return Counter(zip(*(t.column(c).to_pylist() for c in cols), strict=True))


def test_sigkill_and_restart_write_every_row_once(
    spark: SparkSession, s3: Any, shared_dir: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bronze, silver's tables and its checkpoint on the real S3 server (the cluster's
    side of the deployment touches only the store). On a store, so that one kill test
    covers both: local tables run the same code but for ``pipeline.lake.storage``'s calls
    (tested alike on both in ``test_object_store``), and CI has 30 minutes."""
    from tests.spark.test_silver_methods import call_traffic

    msgs = list(read_capture(os.path.join(shared_dir, "samples/qpidd-capture-20s.jsonl")))
    chunks = [msgs[i : i + 144] for i in range(0, len(msgs), 144)]  # 6 micro-batches
    calls, expected = call_traffic(11, len(chunks))  # each bronze batch: traffic, then calls
    parts, first = [], 0
    for k, (chunk, more) in enumerate(zip(chunks, calls, strict=True)):
        parts.append(bronze_rows([*chunk, *more], first_offset=first, batch_id=k))
        first += len(chunk) + len(more)
    ref = SilverSettings(bronze=str(tmp_path / "ref" / "bronze"), root=str(tmp_path / "ref" / "silver"))
    write_bronze(ref.bronze, parts)
    run_silver_batch(spark, ref, 0)

    bucket = s3.make_bucket("silver-kill")
    s3.configure(spark, bucket)  # the test's own session reads the tables
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)  # the job's process, and pyarrow here
    base = f"s3a://{bucket}/lake"
    s = SilverSettings(
        bronze=f"{base}/bronze", root=f"{base}/silver", checkpoint=f"{base}/checkpoint"
    )
    write_bronze(s.bronze, parts)
    # Kill once a few micro-batches are in (but not all of them).
    done = kill_after_batch("silver.py", _args(s), tmp_path / "job1.log",
                            s.path("object_samples"), 2, 300, poll_s=0.5)  # fmt: skip
    assert done is not None and done < len(parts) - 1  # killed mid-stream
    run_job_to_end("silver.py", _args(s), tmp_path / "job2.log", 600)
    for name in TABLES:
        got = _identities(s, name)
        assert all(n == 1 for n in got.values()), name  # no duplicate
        assert got == _identities(ref, name), name  # no loss
    assert sum(_identities(s, "object_samples").values()) > 1000
    # Every call once, paired as in the one-batch run (batch ids aside).
    cols = ("call_id", "response_offset", "status", "arguments_in", "arguments_out", "raw_out")
    got, want = (
        sorted(zip(*(delta.read_arrow(x.path("method_calls")).column(c).to_pylist() for c in cols), strict=True))
        for x in (s, ref)
    )
    # the capture's own: 4 AM2 answers (seq 1017-1020) to requests it does not hold
    assert got == want and len(got) == len(expected) + 4 and len(expected) > 150
