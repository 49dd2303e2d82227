"""``qmf run``: the whole pipeline on local defaults, in one command.

It starts (or reuses) the project-local broker, declares the pipeline's
durable queue (so nothing the agents publish before the receiver attaches is
lost), starts three streaming queries in one Spark session (bronze with an
embedded receiver, silver over bronze, gold over silver), runs simulated
agents for ``--duration`` seconds (or until Ctrl-C) while printing a progress
line, then stops cleanly: the agents first, bronze once it holds everything
landed, then silver and gold each drained to the end of their input
(AvailableNow from their checkpoints), and prints a summary of the tables
(tables for people; ``--json``: one JSON object, also saved under DATA/logs).
With ``--url`` it reads a broker you run instead, and ``--no-sim`` leaves the
agents to you. Spark's and the JVM's own output goes to DATA/logs/spark-<time>.log,
not the terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

QUEUE = "qmf.pipeline"
# The closing summary decodes bronze again (~20 s per 100,000 messages of 10,000-queue
# traffic): above this, a long run would wait minutes for it to exit.
SUMMARY_ROWS = 100_000
RETENTION_SLACK = 1_000  # records of landing log kept behind bronze's committed offset
BINDINGS = (
    ("qpid.management", "mgmt.#"),
    ("qpid.management", "console.#"),
    ("qpid.management", "schema.#"),
    ("qmf.default.topic", "agent.ind.#"),
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run", help="run the pipeline on local defaults (broker, agents, Delta)", description=__doc__
    )
    p.add_argument("--data", default="data", help="folder of the tables and checkpoints (./data)")
    p.add_argument("--url", help="broker URL (default: the project-local RabbitMQ node)")
    p.add_argument("--config", metavar="FILE",
                   help="a fleet file (TOML, one [[broker]] per broker; docs/cluster.md): one "
                        "receiver per broker instead of --url, and no simulated agents")
    p.add_argument("--queue", default=QUEUE,
                   help="durable queue the receiver consumes (declared on the local node)")
    p.add_argument("--duration", type=float, default=60.0,
                   help="seconds the agents publish (0: until Ctrl-C)")
    p.add_argument("--preset", choices=("rabbitmq", "qpidd"), default="rabbitmq",
                   help="receiver addressing: RabbitMQ's AMQP 1.0 plugin or a real qpidd")
    p.add_argument("--bind", action="append", default=[], metavar="EXCHANGE:KEY",
                   help="subscribe with this binding (repeatable, as in qmf receive) instead of "
                        "the durable queue (local node) or the preset's default bindings (--url)")
    p.add_argument("--no-sim", action="store_true", help="do not start simulated agents")
    tls = p.add_argument_group("broker TLS and credentials (with --url; as in qmf receive)")
    tls.add_argument("--ca-file", help="CA certificate(s) to trust (amqps)")
    tls.add_argument("--cert-file", help="client certificate (amqps, SASL EXTERNAL)")
    tls.add_argument("--key-file", help="client private key")
    tls.add_argument("--no-verify-hostname", action="store_true",
                     help="check the server certificate against the CA but not its host name")
    tls.add_argument("--credentials-file",
                     help="file with user=/password= lines; else $QMF_BROKER_USER/"
                          "$QMF_BROKER_PASSWORD, else the URL")
    tls.add_argument("--sasl", action="append", default=[], metavar="MECH",
                     help="allowed SASL mechanism(s): PLAIN, ANONYMOUS, EXTERNAL (repeatable)")
    p.add_argument("--console", choices=("AM1", "AM2"), default=None,
                   help="the receiver also acts as a QMF v1 console in this dialect (asks for "
                        "schemas broadcast before it started; AM2 for a real qpidd)")
    p.add_argument("--console-refresh", type=float, default=None, metavar="SECONDS",
                   help="with --console: query the watched objects every SECONDS, 0: never "
                        "(default 20; qmf receive --console-refresh)")
    p.add_argument("--console-refresh-classes", default=None, metavar="LIST",
                   help="with --console: the classes the refresh queries (default "
                        "queue,exchange,broker; qmf receive --console-refresh-classes)")
    p.add_argument("--dialect", choices=("am1", "am2", "v2", "v2-amqp10"), default="am1",
                   help="simulated agents' dialect (v2-amqp10: QMF v2 as qpidd sends it over "
                        "AMQP 1.0, amqp-value bodies)")
    p.add_argument("--load-intervals", type=int, default=None, metavar="N",
                   help="simulated load stops after N intervals; the agents keep heartbeating")
    p.add_argument("--short-lived", type=int, default=0, metavar="N",
                   help="simulated queues created per interval that live a few intervals and are "
                        "deleted, their last record with qpidd's stale update time (qmf sim)")
    p.add_argument("--restart", action="append", default=[], metavar="AGENT:INTERVAL",
                   help="restart a simulated agent at an interval (qmf sim --restart; repeatable)")
    p.add_argument("--stop", action="append", default=[], metavar="AGENT:INTERVAL",
                   help="a simulated agent's broker is gone from an interval on (qmf sim --stop; "
                   "AGENT:signal: once qmf run gets SIGUSR1; repeatable)")
    p.add_argument("--stall", action="append", default=[], metavar="AGENT:INTERVAL",
                   help="a simulated agent's busy queue loses its consumer at an interval (qmf "
                   "sim --stall; AGENT:signal as --stop; repeatable)")
    p.add_argument("--events", type=int, default=1, metavar="N",
                   help="random events (queueThresholdCrossedUpward/Downward, severity info) "
                   "per interval and simulated agent (qmf sim --events)")
    p.add_argument("--agents", type=int, default=2)
    p.add_argument("--queues", type=int, default=50, help="queues per simulated agent")
    p.add_argument("--interval", type=int, default=1, help="agents' publish interval (s)")
    p.add_argument("--v1-interval", type=float, default=None, metavar="SECONDS",
                   help="seconds between QMF v1 heartbeats, for gold's agent liveness (a real "
                   "qpidd's --mgmt-pub-interval; default: --interval of the simulated agents, "
                   "10 with --no-sim)")  # fmt: skip
    p.add_argument("--trigger", default="processingTime=2 seconds")
    p.add_argument("--silver-decode-on", choices=("auto", "tasks", "driver", "spark"),
                   default="auto",
                   help="where silver's micro-batches are decoded and written: Spark tasks, the "
                        "driver (reads the batch's bronze files with pyarrow: no Spark job), or "
                        "auto: the driver up to 4 MiB of bronze files per batch, tasks above")  # fmt: skip
    p.add_argument("--progress", type=float, default=5.0,
                   help="seconds between progress updates (a line redrawn in place on a "
                        "terminal, one line each otherwise)")
    p.add_argument("--json", action="store_true",
                   help="print the closing summary as one JSON object instead of tables")
    p.add_argument("--retention", choices=("none", "committed"), default="committed",
                   help="delete landing segments bronze has committed past (default)")
    p.add_argument("--retention-slack", type=int, default=RETENTION_SLACK,
                   help="records kept behind the committed offset before a segment may go")
    p.add_argument("--maintain-every", type=float, default=10.0, metavar="MINUTES",
                   help="delete rows past their retention, compact and vacuum every table "
                        "this often while running (0: never)")
    p.add_argument("--table-retention", metavar="FILE",
                   help="TOML whose [retention] table sets how long tables keep their rows "
                        "(as qmf maintain's); default: the defaults (README)")
    p.add_argument("--summary-rows", type=int, default=SUMMARY_ROWS, metavar="N",
                   help="decode bronze for the closing summary only if it holds at most N rows "
                        "(0: never); the silver and gold counts are printed either way")
    p.set_defaults(func=run)  # fmt: skip


def _sim_command(args: argparse.Namespace, url: str, manifest: Path) -> list[str]:
    intervals = 10**9 if args.duration <= 0 else max(1, int(args.duration // args.interval))
    return [
        sys.executable, "-m", "pipeline.cli", "sim",
        "--url", url, "--dialect", args.dialect, "--agents", str(args.agents),
        "--queues", str(args.queues), "--interval", str(args.interval),
        "--intervals", str(intervals), "--realtime", "--durable", "--events", str(args.events),
        "--manifest", str(manifest),
        "--overwrite",  # the manifest is this run's: the message that starts the sim says so
    ] + ([] if args.load_intervals is None else ["--load-intervals", str(args.load_intervals)]) + (
        ["--short-lived", str(args.short_lived)] if args.short_lived else []
    ) + [x for r in args.restart for x in ("--restart", r)] + [
        x for opt in ("stop", "stall") for r in getattr(args, opt) for x in (f"--{opt}", r)
    ]  # fmt: skip


def _receiver_options(args: argparse.Namespace, url: str, wants: Path) -> dict[str, str]:
    """Options of the source's embedded receiver (see receivers.receiver.config_from_options);
    with ``--config``, the fleet file (receivers.receiver.start_embedded)."""
    if args.config:
        return {"config": os.path.abspath(args.config), "consoleWants": str(wants)}
    opts = {"url": url, "preset": args.preset}
    bindings = [b.strip() for text in args.bind for b in text.split(",") if b.strip()]
    if bindings:
        opts["bind"] = ",".join(bindings)  # temporary subscriptions, as qmf receive --bind
    elif not args.url:
        opts["queue"] = args.queue  # declared on the local node above
    if args.console:
        opts.update({"console": "true", "consoleDialect": args.console, "consoleWants": str(wants)})
        if args.console_refresh is not None:
            opts["consoleRefresh"] = str(args.console_refresh)
        if args.console_refresh_classes is not None:
            opts["consoleRefreshClasses"] = args.console_refresh_classes
    for key, value in (("caFile", args.ca_file), ("certFile", args.cert_file),
                       ("keyFile", args.key_file), ("credentialsFile", args.credentials_file)):  # fmt: skip
        if value:
            opts[key] = os.path.abspath(value)
    if args.no_verify_hostname:
        opts["verifyHostname"] = "false"
    if args.sasl:
        opts["saslMechanisms"] = ",".join(args.sasl)
    return opts


def _landed(landing: Path) -> int:
    from receivers.landing import LandingLog

    return sum(LandingLog(landing).end_offsets().values())


def _landed_when_quiet(landing: Path, query: Any, quiet_s: float = 2.0, limit_s: float = 60.0) -> int:
    """What the receiver landed once that stopped growing for ``quiet_s`` (at most
    ``limit_s``, and only while ``query``, whose receiver it is, runs).

    Why: when the simulator has stopped, nothing new reaches the queue, but the
    receiver may still be behind it (a loaded machine: 108 of 1,115 messages of a
    CI run landed after the simulator stopped); the drain's target must hold them.
    """
    last = _landed(landing)
    since = time.monotonic()
    end = since + limit_s
    while query.isActive and time.monotonic() < end:
        time.sleep(0.5)
        now = _landed(landing)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
    return last


def _redeliveries(landing: Path) -> int:
    """Landed rows the receiver matched to an earlier copy (bronze skips them)."""
    import pyarrow.compute as pc

    from receivers.landing import LandingLog

    log = LandingLog(landing)
    total = 0
    for p, end in log.end_offsets().items():
        start = log.start_offsets()[p]
        col = log.read(p, start, end).column("duplicate_of")
        total += int(pc.sum(pc.is_valid(col)).as_py() or 0)
    return total


def _processed(progress: dict[str, Any] | None) -> int:
    """Messages the query has committed: the sum of its source's end offsets."""
    if not progress:
        return 0
    total = 0
    for src in progress.get("sources", []):
        end = src.get("endOffset")
        if isinstance(end, str):
            end = json.loads(end)
        if isinstance(end, dict):
            total += sum(int(v) for v in end.values())
    return total


def _bronze_summary(table: Path, max_rows: int = SUMMARY_ROWS) -> dict[str, Any]:
    """Row count and a decode summary of bronze: proof the bodies are QMF.

    Vectorized (``RecordCounts``), file by file (a long run's bodies exceed what
    one Arrow array holds), and only when bronze holds at most ``max_rows``:
    the per-record loop this replaces kept a 30-minute run busy for minutes
    after its drain.
    """
    import pyarrow.compute as pc

    from pipeline.codec.seed import seeded_registry
    from pipeline.codec.summary import RecordCounts
    from pipeline.lake import delta
    from pipeline.views.progress import table_rows

    rows = table_rows(table)
    if rows > max_rows:
        return {
            "bronze_rows": rows,
            "records_by_opcode": None,
            "summary_skipped": f"bronze holds {rows:,} rows, over --summary-rows {max_rows:,}: "
            "not decoded again (silver's counts follow)",
        }
    counts = RecordCounts(seeded_registry("xml"))
    keys: set[bytes | str] = set()
    cols = ["body", "routing_key", "content_type", "app_id", "application_properties", "msg_key"]
    for batch in delta.iter_batches(str(table), cols, batch_size=5_000):
        keys.update(pc.unique(batch.column("msg_key")).to_pylist())
        counts.add(batch)
    return {
        "bronze_rows": counts.messages,
        "twin_rows": counts.messages - len(keys),
        "records_by_opcode": counts.records_by_opcode(),
        "decode_problems": counts.problems,
    }


def _table_counts(data: Path) -> dict[str, int]:
    from pipeline.views.progress import table_rows

    out = {name: table_rows(data / "silver" / name)
           for name in ("object_samples", "events", "heartbeats", "quarantine")}  # fmt: skip
    for name in ("statistic_rates", "object_lifecycles", "agent_liveness"):
        out[name] = table_rows(data / "gold" / name)
    return out


def simulated(args: argparse.Namespace) -> bool:
    """Whether this run starts simulated agents: not with ``--no-sim``, nor with a fleet
    file (its brokers have agents of their own)."""
    return not args.no_sim and not getattr(args, "config", None)


def liveness_rules(args: argparse.Namespace) -> Any:
    """Gold's liveness rules: v1 heartbeats carry no interval, so it is given: the
    simulated agents' own, else ``--v1-interval`` (a real broker's mgmt-pub-interval),
    else gold's default (qpidd's default publish interval, 10 s)."""
    from pipeline.gold.transforms import LivenessRules
    from receivers.fleet import fleet_intervals

    per_broker = fleet_intervals(getattr(args, "config", None))
    if args.v1_interval is not None:
        return LivenessRules(v1_interval_s=args.v1_interval, v1_intervals=per_broker)
    if not simulated(args):
        return LivenessRules(v1_intervals=per_broker)
    return LivenessRules(v1_interval_s=args.interval)


def warm_dialects(args: argparse.Namespace) -> tuple[str, ...]:
    """The simulator dialects whose traffic exercises the kernels this run will need.

    The v2 kernels take one to two minutes to compile on a cold cache (first run),
    so they are warmed only where v2 traffic comes: a real broker (qpidd's default
    is v2 only) or a v2 simulation. One dialect covers both of their encodings."""
    return ("am1", "v2-amqp10") if not simulated(args) or args.dialect.startswith("v2") else ("am1",)


def warm_decoder(dialects: tuple[str, ...] = ("am1", "v2-amqp10")) -> None:
    """Compile the numba decode kernels once, in this process, before silver starts.

    They cache to disk (``cache=True``), so Spark's Python workers load them
    instead of each compiling for ~20 s inside silver's first micro-batch (a
    fresh install shows "decoded 0 samples/s" for a whole short run otherwise).
    A few simulated messages of each of ``dialects`` exercise their kernels: the
    v2 kernels too where v2 traffic comes (a live qpidd with its defaults sends
    nothing else, and a run against one sat at 0 samples for two minutes while
    silver compiled them).
    """
    import pyarrow as pa

    from pipeline.codec.amqp10 import BODY_ENCODING_PROPERTY
    from pipeline.codec.seed import seeded_registry
    from pipeline.codec.vectorized import decode_content
    from pipeline.sim.model import LoadConfig
    from pipeline.sim.runner import MemorySink, SimConfig, Simulation

    for dialect in dialects:
        sink = MemorySink()
        cfg = SimConfig(dialect=dialect, load=LoadConfig(queues=2, connections=1), intervals=2,
                        batch=10, seed=1)  # fmt: skip
        Simulation(cfg, sink, None).run()
        props = []
        for m in sink.messages:
            p = {k: str(v) for k, v in (m.application_properties or {}).items()}
            if m.body_encoding is not None:
                p[BODY_ENCODING_PROPERTY] = m.body_encoding
            props.append(list(p.items()))
        batch = pa.table({
            "body": pa.array([m.body for m in sink.messages], pa.binary()),
            "routing_key": pa.array([m.routing_key for m in sink.messages], pa.string()),
            "app_id": pa.array([m.app_id for m in sink.messages], pa.string()),
            "content_type": pa.array([m.content_type for m in sink.messages], pa.string()),
            "application_properties": pa.array(props, pa.map_(pa.string(), pa.string())),
        })  # fmt: skip
        decode_content(batch, seeded_registry(), compact=True)


def _initialized(query: Any, timeout_s: float = 120.0) -> None:
    """Wait until a query's sources are up before the next one starts.

    Each Python streaming source starts a Python runner that must connect back
    to the JVM within Spark's fixed 10 s; three starting at once on a busy
    2-core machine can miss that.
    """
    deadline = time.monotonic() + timeout_s
    while query.isActive and time.monotonic() < deadline:
        if query.status.get("message") != "Initializing sources":
            return
        time.sleep(0.2)


def _drain(spark: Any, name: str, start: Any, settings: Any, timeout_s: float) -> int:
    """Run a downstream query once more with AvailableNow: to the end of its input."""
    import dataclasses

    from pipeline.runtime.streaming import await_query

    query = start(spark, dataclasses.replace(settings, trigger="availableNow"))
    rc = await_query(query, name, available_now=True, timeout_s=timeout_s)
    if rc:
        print(f"qmf run: draining {name} failed (the cause above; Spark's log: {_spark_log()})",
              file=sys.stderr)  # fmt: skip
    return rc


def _spark_log() -> str:
    from pipeline.spark import spark_log

    path = spark_log()
    return str(path) if path is not None else "the console"


def log_paths(data: Path, stamp: str | None = None) -> tuple[Path, Path]:
    """This run's Spark log and JSON summary: DATA/logs/spark-<time>.log, summary-<time>.json."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    logs = data / "logs"
    return logs / f"spark-{stamp}.log", logs / f"summary-{stamp}.json"


def earlier_tables(data: Path) -> str | None:
    """What the data folder already holds from earlier runs, said once: this run adds to
    those tables and its summary covers them too (no surprise in the totals)."""
    from pipeline.views.progress import table_rows

    rows = table_rows(data / "bronze")
    if rows == 0:
        return None
    return (
        f"qmf run: {data} already holds an earlier run's tables (bronze {rows:,} rows): this "
        "run continues them and the summary counts them too (--data DIR for a new one)"
    )


def report(summary: dict[str, Any], as_json: bool, saved: Path | None) -> None:
    """The closing summary on stdout: tables for people, or the JSON object (``--json``);
    the JSON is also in ``saved`` (DATA/logs/summary-<time>.json)."""
    from pipeline.views.progress import print_summary

    text = json.dumps(summary, indent=1)
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(text + "\n", encoding="utf-8")
    if as_json:
        print(text)
        return
    print_summary(summary)
    if saved is not None:
        print(f"qmf run: the summary as JSON: {saved}")


def run(args: argparse.Namespace) -> int:
    from pyspark.errors import PySparkRuntimeError

    from pipeline.bronze import BronzeSettings, start_bronze
    from pipeline.gold import GoldSettings, start_gold
    from pipeline.lake.maintain import MaintainSettings, PeriodicMaintenance
    from pipeline.lake.retention import RetentionPolicy
    from pipeline.lake.storage import require_local
    from pipeline.runtime import sparklog
    from pipeline.silver import SilverSettings, start_silver
    from pipeline.spark import get_spark, spark_log
    from pipeline.views.progress import ProgressDisplay, Rates, progress_stats
    from pipeline.views.progress import summary as tables_summary
    from receivers.config import ConfigError, host_port
    from receivers.receiver import config_from_options

    try:
        require_local(**{"--data": args.data})
    except ValueError as exc:
        print(f"qmf run: {exc}", file=sys.stderr)
        return 2
    data = Path(args.data).resolve()
    fleet = None
    try:  # bad --bind, --preset, TLS files or fleet file: say so before starting anything
        if args.config:
            if args.url or args.bind or args.console:
                raise ConfigError("--config names the brokers: no --url, --bind or --console "
                                  "beside it (the file's [[broker]] tables say them)")  # fmt: skip
            from receivers.fleet import load_fleet

            fleet = load_fleet(args.config)
        else:
            config_from_options(_receiver_options(args, args.url or "amqp://127.0.0.1", Path("w")))
        keeps = RetentionPolicy.load(args.table_retention)
    except (ConfigError, ValueError) as exc:  # RetentionError is a ValueError
        print(f"qmf run: {exc}", file=sys.stderr)
        return 2
    consoles = bool(args.console) or (
        fleet is not None and any(b.options.get("console") == "true" for b in fleet.brokers)
    )
    landing, table, checkpoint = data / "landing", data / "bronze", data / "checkpoints" / "bronze"
    for d in (landing, checkpoint.parent):
        d.mkdir(parents=True, exist_ok=True)
    silver_settings = SilverSettings(
        bronze=str(table), root=str(data / "silver"),
        checkpoint=str(data / "checkpoints" / "silver"), trigger=args.trigger,
        decode_on=args.silver_decode_on,
        schema_wants=str(data / "schema_wants") if consoles else None,
    )  # fmt: skip
    gold_settings = GoldSettings(
        silver=str(data / "silver"), root=str(data / "gold"),
        checkpoint=str(data / "checkpoints" / "gold"), trigger=args.trigger,
        # v1 heartbeats carry no interval: the simulated agents' is known, a real
        # broker's is its mgmt-pub-interval (gold's default, 10 s).
        liveness=liveness_rules(args),
    )  # fmt: skip

    if fleet is not None:
        url = f"the {len(fleet.brokers)} brokers of {args.config} ({', '.join(fleet.names())})"
    elif args.url:
        url = args.url
    else:
        from pipeline.broker import declare_queue, ensure_broker

        url = ensure_broker().url
        declare_queue(args.queue, BINDINGS, durable=True)
    print(f"qmf run: broker ready ({url if fleet else host_port(url)}); landing {landing}, "
          f"bronze {table}", flush=True)  # fmt: skip
    earlier = earlier_tables(data)
    if earlier:
        print(earlier, flush=True)

    settings = BronzeSettings(
        landing=str(landing),
        table=str(table),
        checkpoint=str(checkpoint),
        trigger=args.trigger,
        embedded_receiver=True,
        receiver_options=_receiver_options(args, url, data / "schema_wants"),
        retention=args.retention,
        retention_slack=args.retention_slack,
    )
    warm = threading.Thread(
        target=warm_decoder, args=(warm_dialects(args),), name="qmf-warm-decoder", daemon=True
    )
    warm.start()  # alongside the SparkSession's start
    log_file, summary_file = log_paths(data)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sparklog.terminal_logging(log_file)  # ours to the terminal, py4j's and pyspark's to the file
    try:
        spark = get_spark("qmf-run", log_file=log_file)
    except PySparkRuntimeError as exc:  # the JVM did not start: why is in its output
        sparklog.report_start_failure("qmf run", exc, log_file)
        return 1
    if spark_log() is not None:
        print(f"qmf run: Spark's and the JVM's own output: {spark_log()}", flush=True)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    sim: subprocess.Popen[bytes] | None = None
    if simulated(args):
        # Before the bronze stream: the embedded receiver's console (--console) sends its
        # one Broker Request when it has subscribed, and the agents must be listening by
        # then (started after the stream, they missed it in 3 of 6 runs on a loaded
        # machine). What they publish meanwhile waits in the durable queue.
        cmd = _sim_command(args, url, data / "sim-manifest.jsonl")
        sim = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=os.environ.copy())
        # SIGUSR1 to qmf run is the simulated agents' (their --stop/--stall AGENT:signal).
        child = sim
        previous[signal.SIGUSR1] = signal.signal(
            signal.SIGUSR1, lambda *_: child.send_signal(signal.SIGUSR1)
        )
        print(f"qmf run: {args.agents} simulated {args.dialect} agents publishing (what they "
              f"send: {data / 'sim-manifest.jsonl'}, this run's only)", flush=True)  # fmt: skip
    try:
        query = start_bronze(spark, settings)
    except BaseException:
        if sim is not None:
            sim.kill()
        raise
    downstream: list[Any] = []
    rates = Rates()
    maintenance = PeriodicMaintenance(  # docs/maintenance.md
        data, args.maintain_every * 60, MaintainSettings(retention=keeps)
    )
    t0 = time.monotonic()
    try:
        _initialized(query)
        warm.join(300)
        downstream.append(start_silver(spark, silver_settings))
        _initialized(downstream[0])
        downstream.append(start_gold(spark, gold_settings))
        maintenance.start()
        deadline = None if args.duration <= 0 else t0 + args.duration
        next_line = t0
        with ProgressDisplay() as display:
            while not stop.is_set() and query.isActive and all(q.isActive for q in downstream):
                now = time.monotonic()
                if now >= next_line:  # before the deadline's check: a run shows one at least
                    landed, done = _landed(landing), _processed(query.lastProgress)
                    counts = _table_counts(data)
                    display.update(progress_stats(now - t0, landed, done, counts, rates))
                    next_line = now + args.progress
                if deadline is not None and now >= deadline and (
                    sim is None or sim.poll() is not None
                ):
                    break
                time.sleep(0.5)
        if sim is not None and sim.poll() is None:
            sim.terminate()
            sim.wait(timeout=30)
        # Drain: wait (bounded) until bronze has what was landed when the run stopped.
        # A live broker keeps publishing and the receiver keeps landing until the query
        # stops, so the target is fixed here; what lands after it stays in the landing
        # log (durable, settled) and is bronze's first input on the next run. After our
        # simulator stopped nothing new comes: the target waits for the queue's backlog.
        target = _landed_when_quiet(landing, query) if sim is not None else _landed(landing)
        drain_deadline = time.monotonic() + 120
        while query.isActive and time.monotonic() < drain_deadline:
            if _processed(query.lastProgress) >= target:
                break
            time.sleep(1.0)
    finally:
        from pipeline.runtime.streaming import stop_queries

        maintenance.stop()
        if sim is not None and sim.poll() is None:
            sim.kill()
        # Between batches, all at once: each batch in flight ends (not cancelled) within
        # one grace period for the three queries.
        stop_queries([query, *downstream])
        for s, h in previous.items():
            signal.signal(s, h)
    failed = query.exception() or next((q.exception() for q in downstream if q.exception()), None)
    rc = 0
    if failed is None:
        # Silver, then gold, to the end of what bronze holds: nothing landed is left behind.
        print("qmf run: draining silver and gold", flush=True)
        rc = _drain(spark, "silver", start_silver, silver_settings, 600) or _drain(
            spark, "gold", start_gold, gold_settings, 600
        )
    spark.stop()
    sparklog.flush()  # our last warnings from Spark's Python processes, before the summary
    if failed is not None:
        from pipeline.runtime.streaming import query_error

        print(f"qmf run: a query failed: {query_error(failed)} (Spark's log: {_spark_log()})",
              file=sys.stderr)  # fmt: skip
        return 1
    if rc:
        return rc
    summary = _bronze_summary(table, args.summary_rows)
    summary["landed_messages"] = _landed(landing)
    summary["redeliveries_skipped"] = _redeliveries(landing)
    summary.update(tables_summary(data))
    report(summary, args.json, summary_file)
    print(f"qmf run: done. Tables under {data}: bronze, silver/*, gold/* "
          f"(e.g. polars.read_delta({str(data / 'gold' / 'statistic_rates')!r}))")  # fmt: skip
    return 0
