"""``qmf sim``: run simulated QMF agents against a broker or into a capture file.

Every run is bounded (intervals, wall-clock duration, message count) and
stops by itself; the manifest (``--manifest``) lists exactly what was sent.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.sim.runner import Simulation


def _restart(text: str) -> tuple[int, int]:
    agent, _, interval = text.partition(":")
    try:
        return int(agent), int(interval)
    except ValueError as exc:
        raise argparse.ArgumentTypeError("use AGENT:INTERVAL, e.g. 0:5") from exc


def _fault(text: str) -> tuple[int, int]:
    """AGENT:INTERVAL, or AGENT:signal (the first interval after SIGUSR1)."""
    from pipeline.sim.runner import SIGNALLED

    agent, _, interval = text.partition(":")
    try:
        return int(agent), SIGNALLED if interval == "signal" else int(interval)
    except ValueError as exc:
        raise argparse.ArgumentTypeError("use AGENT:INTERVAL or AGENT:signal, e.g. 0:5") from exc


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("sim", help="run simulated QMF agents (bounded)", description=__doc__)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--output", "-o", metavar="FILE", help="write a capture file (no broker)")
    out.add_argument("--url", help="broker URL (default: the project-local broker)")
    p.add_argument("--manifest", metavar="FILE", help="ground-truth manifest (JSON lines)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output or --manifest file (without it one is refused)",
    )
    p.add_argument(
        "--dialect",
        choices=("am1", "am2", "v2", "v2-amqp10"),
        default="am1",
        help="am1 (M3 notes), am2 (qpidd's QMF v1), v2 (QMF v2 as AMQP 0-10 maps), v2-amqp10 "
        "(QMF v2 as qpidd's AMQP 1.0 module sends it: amqp-value bodies)",
    )
    p.add_argument("--agents", type=int, default=1)
    p.add_argument("--queues", type=int, default=20, help="queues per agent (load: 10000+)")
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--active-fraction", type=float, default=0.5)
    p.add_argument(
        "--max-rate", type=float, default=50.0, help="max enqueue rate of a queue (msg/s)"
    )
    p.add_argument(
        "--transients",
        type=int,
        default=1,
        help="queues per interval created and deleted inside the interval",
    )
    p.add_argument(
        "--short-lived",
        type=int,
        default=0,
        metavar="N",
        help="queues created per interval (sl.NNNNNN, with a binding) that receive traffic "
        "and are deleted --short-lived-intervals later (last record: final counters, "
        "delete time, the previous publication's update time)",
    )
    p.add_argument(
        "--short-lived-intervals",
        type=int,
        default=3,
        metavar="K",
        help="intervals a --short-lived queue lives (default 3)",
    )
    p.add_argument("--events", type=int, default=1, help="random events per interval")
    p.add_argument("--interval", type=int, default=1, help="publish interval (s)")
    p.add_argument(
        "--load-intervals",
        type=int,
        default=None,
        metavar="N",
        help="the load stops after N intervals: queues go quiet (not republished), "
        "heartbeats go on (default: load throughout)",
    )
    p.add_argument("--intervals", type=int, default=10, help="number of intervals (bound)")
    p.add_argument("--duration", type=float, default=None, help="wall-clock bound (s)")
    p.add_argument("--max-messages", type=int, default=None, help="message-count bound")
    p.add_argument("--rate", type=float, default=None, help="message rate cap (msg/s)")
    p.add_argument("--batch", type=int, default=100, help="records per message")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--durable", action="store_true", help="publish persistent messages (survive a restart)"
    )
    p.add_argument("--first-bank", type=int, default=1, help="agent bank of the first agent")
    p.add_argument(
        "--no-broker-key", action="store_true", help="answer only agent.<bank>, not 'broker'"
    )
    p.add_argument("--start-ns", type=int, default=None, help="simulated start time (default: now)")
    p.add_argument("--realtime", action="store_true", help="pace intervals with the wall clock")
    p.add_argument(
        "--restart", type=_restart, action="append", default=[], metavar="AGENT:INTERVAL"
    )
    p.add_argument(
        "--stop", type=_fault, action="append", default=[], metavar="AGENT:INTERVAL",
        help="the agent's broker is gone from that interval on: no heartbeat, no data, no "
        "answers (AGENT:signal: from the first interval after SIGUSR1; repeatable)",
    )
    p.add_argument(
        "--stall", type=_fault, action="append", default=[], metavar="AGENT:INTERVAL",
        help="the agent's first busy queue with a consumer loses it at that interval: "
        "enqueues go on, dequeues stop (AGENT:signal as --stop; repeatable)",
    )
    p.add_argument(
        "--serve",
        type=float,
        default=0.0,
        help="answer console requests this long after the last interval (s)",
    )
    p.set_defaults(func=run)


def _announce(sim: Simulation) -> None:
    """One JSON line on stdout once requests can be answered: who the agents are."""
    agents = [
        {
            "index": a.index,
            "uuid": str(a.uuid),
            "agent": a.record_agent,
            "broker_bank": a.broker_bank,
            "agent_bank": a.agent_bank,
            "command_keys": [k for _, k in a.command_addresses],
            "v2_name": a.v2_name,
        }
        for a in sim.agents
    ]
    print(json.dumps({"ready": True, "dialect": sim.config.dialect, "agents": agents}), flush=True)


def run(args: argparse.Namespace) -> int:
    from pipeline.sim.manifest import Manifest
    from pipeline.sim.model import LoadConfig
    from pipeline.sim.runner import BrokerSink, CaptureSink, SimConfig, Simulation, Sink

    load = LoadConfig(
        queues=args.queues,
        connections=args.connections,
        active_fraction=args.active_fraction,
        max_rate=args.max_rate,
        transient_per_interval=args.transients,
        short_lived_per_interval=args.short_lived,
        short_lived_intervals=args.short_lived_intervals,
        events_per_interval=args.events,
    )
    cfg = SimConfig(
        dialect=args.dialect,
        agents=args.agents,
        load=load,
        interval_s=args.interval,
        intervals=args.intervals,
        duration_s=args.duration,
        max_messages=args.max_messages,
        rate=args.rate,
        batch=args.batch,
        seed=args.seed,
        start_ns=args.start_ns,
        realtime=args.realtime,
        restarts=tuple(args.restart),
        stops=tuple(args.stop),
        stalls=tuple(args.stall),
        serve_s=args.serve,
        first_bank=args.first_bank,
        broker_key=not args.no_broker_key,
        load_intervals=args.load_intervals,
    )
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"qmf sim: {exc}", file=sys.stderr)
        return 2
    from pipeline.outputs import refusal

    for path in (args.output, args.manifest):
        refused = refusal(path, "--overwrite", args.overwrite, "replace it")
        if refused:
            print(f"qmf sim: {refused}", file=sys.stderr)
            return 2
    sink: Sink | None = None
    requests = None
    manifest = Manifest(args.manifest, keep=False)
    sim: Simulation | None = None
    try:
        if args.output:
            sink = CaptureSink(args.output)
        else:
            url = args.url
            if url is None:
                from pipeline.broker import ensure_broker

                url = ensure_broker().url
            sink = BrokerSink(url, durable=args.durable)
        sim = Simulation(cfg, sink, manifest)
        if not args.output:
            from pipeline.sim.amqp import CommandListener

            addresses = [pair for a in sim.agents for pair in a.command_addresses]
            requests = CommandListener(url, addresses, sim.registry)
            sim.requests = requests
        _announce(sim)
        previous = {
            sig: signal.signal(sig, lambda *_: sim.stop())
            for sig in (signal.SIGTERM, signal.SIGINT)
        }
        previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, lambda *_: sim.signal_faults())
        try:
            summary = sim.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        try:
            if sink is not None:
                sink.close()
        finally:
            manifest.close()
            if requests is not None:
                requests.close()
    print(json.dumps(summary.__dict__, sort_keys=True))
    return 0
