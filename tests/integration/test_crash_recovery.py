"""Issue 5, "Must show": crashes everywhere, and bronze still holds every message once.

``qmf sim`` (AM1, batched records) publishes >= 50,000 records to the shared
broker; a durable queue bound to the simulated agent's keys buffers them;
``qmf receive`` (a child process, rabbitmq preset ``/amq/queue/NAME``) lands
them and is SIGKILLed at 5 seeded random points and restarted on the same
partition; ``jobs/bronze.py`` runs through the real spark-submit and is
SIGKILLed twice (its whole process tree) and restarted from its checkpoint.
Afterwards bronze is compared with the simulator's manifest: message count,
record count, and every message decoded by the codec equal to its records.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline import broker as qmf_broker
from tests.integration.e2e import (
    Child,
    assert_bronze_is_the_manifest,
    bronze_cmd,
    bronze_commits,
    bronze_rows,
    children,
    landed_keys,
    landed_rows,
    qmf_cmd,
    receive_cmd,
    sim_agent_uuid,
    sim_seed,
    unique_tag,
    wait_for,
    wait_new_file,
)
from tests.submit import spark_submit_env

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

KILL_SEED = 5  # the kill points are reproducible; the sim seed is per run (own routing keys)
INTERVALS = 34  # 1000 queues, batch 10: ~53,000 records in ~5,700 messages
SIM_RATE = 70.0  # messages/s: the run lasts ~85 s, so the receiver's crashes land inside it
# Bronze admits at most this many messages per 2 s trigger (~150/s, about twice the
# sim's rate): each of its restarts leaves it behind by some 20 s of traffic, which it
# cannot make up before its next kill, so both kills come mid-stream however slow the
# machine and whether or not the sim still runs.
BRONZE_MAX_PER_TRIGGER = 300
EXPECTED_MESSAGES = 5_000  # a lower bound of the run's messages: kill points are placed below it


@pytest.mark.timeout(900)
def test_sigkill_receiver_5_times_and_bronze_twice_exactly_once(
    broker: Any, tmp_path: Path
) -> None:
    rng = random.Random(KILL_SEED)
    # Receiver kills: 5 points in the landed-row count, spread over the run.
    receiver_kills = sorted(
        rng.sample(range(EXPECTED_MESSAGES // 20, EXPECTED_MESSAGES * 9 // 10), 5)
    )
    # ... kills 1 and 3 the instant a new segment is on disk (landed, maybe not yet settled:
    # the broker redelivers, the log holds copies); the others a random 0-1.5 s after the
    # count was reached: while landing, settling or waiting.
    receiver_delays = [rng.uniform(0, 1.5) for _ in receiver_kills]
    after_segment = {1, 3}
    # Bronze kills: each incarnation is killed once it committed a batch of its own (so the
    # next one restarts from a checkpoint in mid-stream): the first the instant its next
    # Delta commit is on disk (before Spark's commit log has the batch: the restart replays
    # it and the app transaction skips it), the second a random 0-4 s later (reading,
    # writing Parquet or committing).
    bronze_delays = [0.0, rng.uniform(0, 4)]
    after_commit = {0}
    seed = sim_seed()
    agent = sim_agent_uuid(seed)
    tag = unique_tag()
    queue = f"qmf-e2e-{tag}"
    qmf_broker.declare_queue(queue, [("qpid.management", f"mgmt.{agent}.#")])
    landing, table, ck = tmp_path / "landing", tmp_path / "bronze", tmp_path / "ck"
    logs = tmp_path / "logs"
    logs.mkdir()
    manifest = tmp_path / "manifest.jsonl"
    recv_args = receive_cmd(
        broker.url, queue, landing, "r0", "--credit", "500", "--flush-count", "200",
        "--flush-ms", "300",
    )  # fmt: skip
    # Retention off: the test reads the whole landing log afterwards (copies included).
    job_args = bronze_cmd(
        landing, table, ck, "--trigger", "processingTime=2 seconds",
        "--max-records-per-trigger", str(BRONZE_MAX_PER_TRIGGER), "--retention", "none",
    )  # fmt: skip
    sim_args = qmf_cmd(
        "sim", "--url", broker.url, "--dialect", "am1", "--seed", str(seed),
        "--first-bank", str(10_000 + seed % 100_000), "--no-broker-key",
        "--queues", "1000", "--connections", "10", "--intervals", str(INTERVALS),
        "--batch", "10", "--rate", str(SIM_RATE), "--manifest", str(manifest),
    )  # fmt: skip
    env = spark_submit_env()
    try:
        with children() as procs:

            def start(name: str, cmd: list[str], **kw: Any) -> Child:
                c = Child(name, cmd, logs, **kw)
                procs.append(c)
                return c

            job = start("bronze-0", job_args, env=env)
            receiver = start("receiver-0", recv_args)
            wait_ready(receiver)
            sim = start("sim", sim_args)

            # The run: crash the receiver and the job at their points until both are done.
            r_done = j_done = 0
            job_base = 0  # bronze rows when the current job incarnation started
            at_bronze_kills: list[tuple[int, bool]] = []  # (bronze rows, sim still running)

            def receiver_due() -> bool:
                return (
                    r_done < len(receiver_kills) and landed_rows(landing) >= receiver_kills[r_done]
                )

            def job_due() -> bool:
                return j_done < len(bronze_delays) and bronze_rows(table) > job_base

            while r_done < len(receiver_kills) or j_done < len(bronze_delays):

                def next_event(r: Child = receiver, j: Child = job) -> bool:
                    return receiver_due() or job_due() or not (r.alive() and j.alive())

                wait_for(next_event, 300, "the next crash point")
                for c in (receiver, job):
                    assert c.alive(), f"{c.name} died: {c.stderr()[-3000:]}"
                if receiver_due():
                    if r_done in after_segment:
                        assert wait_new_file(landing / "r0", ".arrow", 60), "no segment landed"
                    else:
                        time.sleep(receiver_delays[r_done])
                    assert sim.alive(), "a receiver crash must come while the simulator publishes"
                    assert receiver.kill() == -signal.SIGKILL
                    r_done += 1
                    receiver = start(f"receiver-{r_done}", recv_args)
                    wait_ready(receiver)
                if job_due():
                    if j_done in after_commit:
                        assert wait_new_file(table / "_delta_log", ".json", 240), "no commit"
                    else:
                        time.sleep(bronze_delays[j_done])
                    assert job.kill() == -signal.SIGKILL
                    job_base = bronze_rows(table)
                    at_bronze_kills.append((job_base, sim.alive()))
                    j_done += 1
                    job = start(f"bronze-{j_done}", job_args, env=env)

            assert sim.wait(300) == 0, sim.stderr()[-3000:]
            summary = json.loads(sim.stdout().strip().splitlines()[-1])
            assert summary["records"] >= 50_000 and summary["messages"] > EXPECTED_MESSAGES
            # Both job crashes came mid-stream: bronze still lacked part of the run.
            assert all(rows < summary["messages"] for rows, _ in at_bronze_kills), at_bronze_kills

            # Drain: the queue empties, the landing log holds every message (copies too).
            wait_for(lambda: qmf_broker.queue_depths().get(queue) == 0, 120, "an empty queue",
                     step_s=1.0)  # fmt: skip
            wait_for(lambda: len(set(landed_keys(landing))) >= summary["messages"], 120,
                     "every message landed", step_s=1.0)  # fmt: skip
            assert receiver.terminate(60) == 0, receiver.stderr()[-3000:]
            wait_for(lambda: bronze_rows(table) >= summary["messages"] or not job.alive(), 240,
                     "bronze to catch up", step_s=1.0)  # fmt: skip
            assert job.alive(), job.stderr()[-3000:]
            assert job.stop_via("jobs/bronze.py", 120) == 0, job.stderr()[-3000:]
    finally:
        qmf_broker.delete_queue(queue)

    landed = landed_keys(landing)
    duplicates = len(landed) - len(set(landed))
    out = assert_bronze_is_the_manifest(table, manifest, summary)
    assert set(out.column("partition").to_pylist()) == {"r0"}
    commits = bronze_commits(table)
    replays = sum(
        (logs / f"bronze-{i}.stdout").read_text().count("already committed: skipped")
        for i in range(len(bronze_delays) + 1)
    )
    assert commits == sorted(set(commits)), "a micro-batch was committed twice"
    print(
        f"\nsim seed {seed}: {summary['messages']} messages, {summary['records']} records; "
        f"landed {len(landed)} rows ({duplicates} redelivered copies); "
        f"bronze {out.num_rows} rows in {len(commits)} commits; "
        f"bronze (rows, sim running) at its kills: {at_bronze_kills}; "
        f"replayed batches skipped: {replays}"
    )


def wait_ready(receiver: Child) -> None:
    """The receiver printed its ready line (subscribed) or died trying."""
    wait_for(
        lambda: "ready: subscribed" in receiver.stderr() or not receiver.alive(),
        60,
        f"{receiver.name} to subscribe",
    )
    assert receiver.alive(), receiver.stderr()[-3000:]
