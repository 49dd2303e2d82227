"""The simulation loop: a simulated clock, bounded runs, sinks, console requests.

Time is simulated: interval ``i`` ends at ``start_ns + (i + 1) * interval_ns``
whatever the wall clock says, so tests run many intervals in milliseconds and
get the same bytes for the same seed. ``realtime=True`` additionally sleeps so
intervals line up with the wall clock (demos, load). Every run is bounded: by
``intervals``, by ``duration_s`` of wall time and by ``max_messages``; it stops
by itself at the first bound reached.

Per interval, in this order: each agent's dynamics (a scheduled restart at
mid-interval: boot sequence + 1, every object recreated, counters from zero;
otherwise the traffic), transient and short-lived queues come and go (with
their declare/delete events), random events fire; then the console requests
that arrived during the interval are answered from that state, at the
interval's end (replies on the requester's reply-to); then each agent's
publication: schema broadcast if due, events, 'c' for objects whose properties
changed, 'i' for objects whose statistics changed (everything after a Broker
Request or console-added signal), and the heartbeat. The manifest gets a line
per record once its message went out, and a ``final`` line per object (what
the agent holds) when it is deleted, at a restart and at the end of the run.

Like qpidd, an object is published in an interval only when something in it
changed (a new or deleted object, a property or a statistic, a watermark
reset) since it was last encoded: a console's query encodes it too and clears
its changed flags, so a queried object that did not change after the query is
skipped. A quiet object is simply absent while its agent keeps heartbeating,
and the manifest lists exactly what was published. ``load_intervals`` ends the
load after that many intervals (no traffic, transients, consumer blips or
random events): the queues go quiet and the run shows what a broker whose load
stopped sends. Dialects: ``am1``, ``am2``, ``v2`` (AMQP 0-10 encoded maps, as
qpidd over 0-10) and ``v2-amqp10`` (the same v2 records as qpidd's AMQP 1.0
module sends them: amqp-value bodies, ``pipeline.sim.wire``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Protocol

from pipeline.codec.records import QmfException
from pipeline.codec.schema import SchemaRegistry
from pipeline.qmfxml import ManagementSchema, default_schema
from pipeline.sim.agent import Published, SimAgent, V2Requests
from pipeline.sim.manifest import Manifest, jsonable, record_row
from pipeline.sim.model import NS, EventSpec, LoadConfig, SimObject
from pipeline.sim.wire import BODY_ENCODING, Packed, pack, reply_messages, v2_reply_messages
from receivers.publisher import OutMessage

if TYPE_CHECKING:
    from pipeline.sim.amqp import Request

MAX_INTERVALS = 1_000_000
DIALECTS = ("am1", "am2", "v2", "v2-amqp10")
# dialect -> (the agents' record dialect, body encoding of v2 messages)
SIGNALLED = -1  # a fault interval: when the run is signalled (SimConfig.stops, stalls)
_DIALECT_PARTS: dict[str, tuple[str, str | None]] = {
    "am1": ("am1", None),
    "am2": ("am2", None),
    "v2": ("v2", None),
    "v2-amqp10": ("v2", BODY_ENCODING),
}


@dataclass
class SimConfig:
    """Everything a run depends on; the same config and seed give the same bytes."""

    dialect: str = "am1"
    agents: int = 1
    load: LoadConfig = field(default_factory=LoadConfig)
    interval_s: int = 1
    intervals: int = 10
    duration_s: float | None = None  # wall-clock bound
    max_messages: int | None = None
    rate: float | None = None  # messages/s cap (wall clock)
    batch: int = 100
    seed: int = 1
    start_ns: int | None = None  # None: wall clock at start
    realtime: bool = False
    restarts: Sequence[tuple[int, int]] = ()  # (agent index, interval) restarts
    serve_s: float = 0.0  # after the last interval, keep answering requests this long
    first_bank: int = 1  # agent bank of agent 0 (command key agent.<bank>)
    broker_key: bool = True  # agent 0 also answers the well-known key "broker"
    load_intervals: int | None = None  # the load stops after this many intervals (None: never)
    # Faults, (agent index, interval); interval SIGNALLED: the first interval that starts
    # after ``Simulation.signal_faults`` (qmf sim: SIGUSR1). A stopped agent's broker is
    # gone from then on (no heartbeat, no data, no answers); a stalled agent's first busy
    # queue with a consumer loses it (no dequeues, consumerCount 0) while enqueues go on.
    stops: Sequence[tuple[int, int]] = ()
    stalls: Sequence[tuple[int, int]] = ()

    @property
    def agent_dialect(self) -> str:
        """The records' dialect: ``v2-amqp10`` agents are ``v2`` agents."""
        return _DIALECT_PARTS[self.dialect][0]

    @property
    def body_encoding(self) -> str | None:
        """``amqp-1.0`` when v2 bodies go as amqp-value sections (``v2-amqp10``)."""
        return _DIALECT_PARTS[self.dialect][1]

    def validate(self) -> None:
        if self.dialect not in DIALECTS:
            raise ValueError(f"unknown dialect {self.dialect!r} (use {', '.join(DIALECTS)})")
        if self.load_intervals is not None and self.load_intervals < 0:
            raise ValueError("load_intervals >= 0")
        if self.agents < 1 or self.intervals < 0 or self.interval_s < 1 or self.batch < 1:
            raise ValueError("agents >= 1, intervals >= 0, interval_s >= 1, batch >= 1")
        if self.intervals > MAX_INTERVALS:
            raise ValueError(f"intervals <= {MAX_INTERVALS}")
        if self.load.queues < 0 or self.load.connections < 0:
            raise ValueError("queues and connections must be >= 0")
        if self.load.transient_per_interval < 0 or self.load.short_lived_per_interval < 0:
            raise ValueError("transients and short-lived queues per interval must be >= 0")
        if self.load.short_lived_intervals < 1:
            raise ValueError("short_lived_intervals >= 1")
        if not 1 <= self.first_bank or self.first_bank + self.agents > 1 << 24:
            raise ValueError("agent banks must lie in 1 .. 2**24 - 1")
        for what, faults in (("stop", self.stops), ("stall", self.stalls)):
            for agent, interval in faults:
                if not 0 <= agent < self.agents or interval < SIGNALLED:
                    raise ValueError(
                        f"--{what} {agent}:{interval}: the agent must be 0..{self.agents - 1},"
                        " the interval >= 0 (or 'signal')"
                    )


class Sink(Protocol):
    def send(self, msg: OutMessage) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class MemorySink:
    """Keeps messages in a list (tests)."""

    def __init__(self) -> None:
        self.messages: list[OutMessage] = []

    def send(self, msg: OutMessage) -> None:
        self.messages.append(msg)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class CaptureSink:
    """Writes the capture JSON-lines interchange format (no broker needed)."""

    def __init__(self, path: str, clock: Callable[[], int] | None = None) -> None:
        self._fh: IO[str] = open(path, "w", encoding="utf-8")
        self._clock = clock or time.time_ns

    def send(self, msg: OutMessage) -> None:
        from pipeline.sim.capture import capture_line

        self._fh.write(json.dumps(capture_line(msg, self._clock()), sort_keys=True) + "\n")

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class BrokerSink:
    """Publishes over AMQP 1.0 with the pipelined publisher (subject = routing key)."""

    def __init__(self, url: str, *, durable: bool = False) -> None:
        from receivers.publisher import Publisher

        self.pub = Publisher(url)
        # Persistent messages survive a broker restart in a durable queue; real
        # qpidd sends QMF non-persistent, hence off by default.
        self.durable = durable

    def send(self, msg: OutMessage) -> None:
        if self.durable and not msg.durable:
            msg = dataclasses.replace(msg, durable=True)
        self.pub.publish_message(msg)

    def flush(self) -> None:
        """Wait until the broker took everything (the publisher pipelines otherwise)."""
        self.pub.flush()

    def close(self) -> None:
        self.pub.close()


class RequestSource(Protocol):
    """Console requests addressed to the agents."""

    def poll(self, timeout_s: float) -> list[Request]: ...

    def close(self) -> None: ...


@dataclass
class RunSummary:
    intervals: int = 0
    messages: int = 0
    records: int = 0
    replies: int = 0
    restarts: int = 0
    stops: int = 0
    stalls: int = 0
    stopped_by: str = "intervals"


class Simulation:
    """A bounded simulation run over one or more agents."""

    def __init__(
        self,
        config: SimConfig,
        sink: Sink,
        manifest: Manifest | None = None,
        schema: ManagementSchema | None = None,
        requests: RequestSource | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.sink = sink
        self.manifest = manifest or Manifest()
        self.schema = schema or default_schema()
        self.registry: SchemaRegistry = self.schema.registry()
        self.requests = requests
        self.agents = [
            SimAgent(
                i,
                config.agent_dialect,
                self.schema,
                config.load,
                config.seed,
                first_bank=config.first_bank,
                broker_key=config.broker_key,
                epoch_refs=config.body_encoding is not None,
            )
            for i in range(config.agents)
        ]
        self.summary = RunSummary()
        self._wall0 = 0.0
        self._stop = False
        self.start_ns = 0
        self._now_ns = 0  # simulated time of the state the agents hold
        self._restarts: set[tuple[int, int]] = set()
        self._signalled = False
        self._fault_interval: int | None = None  # the first interval after the signal
        self.stopped: set[int] = set()  # agents whose broker is gone (SimConfig.stops)

    # ------------------------------------------------------------------ bounds

    def stop(self) -> None:
        """Ask the run to end after the current interval (thread-safe enough: a flag)."""
        self._stop = True

    def signal_faults(self) -> None:
        """Apply the faults set for ``SIGNALLED`` from the next interval on (a flag:
        safe from a signal handler)."""
        self._signalled = True

    def _faults(self, interval: int) -> None:
        """The stops and stalls due at ``interval``, each with a manifest line."""
        cfg = self.config
        if self._signalled and self._fault_interval is None:
            self._fault_interval = interval

        def due(at: int) -> bool:
            return at == interval or (at == SIGNALLED and self._fault_interval == interval)

        for index, at in cfg.stops:
            if due(at) and index not in self.stopped:
                self.stopped.add(index)
                agent = self.agents[index]
                self.manifest.write({"kind": "stop", "agent": agent.record_agent,
                                     "agent_uuid": str(agent.uuid), "interval": interval})  # fmt: skip
                self.summary.stops += 1
        for index, at in cfg.stalls:
            if due(at):
                agent = self.agents[index]
                queue = agent.model.stall_queue(cfg.interval_s)
                self.manifest.write({"kind": "stall", "agent": agent.record_agent,
                                     "agent_uuid": str(agent.uuid), "interval": interval,
                                     "queue": queue})  # fmt: skip
                self.summary.stalls += 1

    def _out_of_time(self) -> bool:
        d = self.config.duration_s
        return d is not None and time.monotonic() - self._wall0 >= d

    def _budget_left(self) -> int | None:
        m = self.config.max_messages
        return None if m is None else m - self.summary.messages

    def _send(self, packed: Sequence[Packed], interval: int, agent: SimAgent, kind: str) -> bool:
        """Send messages in order; False when max_messages stopped the run."""
        rate = self.config.rate
        for p in packed:
            left = self._budget_left()
            if left is not None and left <= 0:
                self.summary.stopped_by = "max_messages"
                return False
            if rate:
                due = self._wall0 + self.summary.messages / rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            self.sink.send(p.message)
            msg_index = self.summary.messages
            self.summary.messages += 1
            for r in p.records:
                row = record_row(r)
                row.update(
                    interval=interval,
                    message=msg_index,
                    routing_key=p.message.routing_key,
                    exchange=p.message.exchange,
                    agent_uuid=str(agent.uuid),
                    source=kind,
                )
                self.manifest.write(row)
                self.summary.records += 1
                if kind == "reply":
                    self.summary.replies += 1
        return True

    # ------------------------------------------------------------------ steps

    def _events_for(
        self,
        agent: SimAgent,
        declared: list[SimObject],
        deleted: list[SimObject],
        interval_start: int,
        random_events: bool = True,
    ) -> list[EventSpec]:
        """The interval's events: queueDeclare/queueDelete of the queues created and
        deleted in it (at those times), clientConnect after a boot, random thresholds."""
        specs: list[EventSpec] = []
        find = self.schema.find

        def common(o: SimObject) -> dict[str, Any]:
            return {
                "rhost": "127.0.0.1:5672-10.0.0.1:40000",
                "user": "anonymous",
                "qName": o.props["name"],
            }

        declared_nums = {o.object_num for o in declared}
        for o in declared:
            if o.class_name != "queue":
                continue
            specs.append(
                EventSpec(
                    find("queueDeclare"),
                    o.create_ns,
                    {
                        **common(o),
                        "durable": o.props["durable"],
                        "excl": o.props["exclusive"],
                        "autoDel": o.props["autoDelete"],
                        "altEx": "",
                        "args": {},
                        "disp": "created",
                    },
                )
            )
            if o.deleted:  # a transient: declared and deleted inside the interval
                specs.append(EventSpec(find("queueDelete"), o.delete_ns, common(o)))
        for o in deleted:
            if o.class_name == "queue" and o.object_num not in declared_nums:
                specs.append(EventSpec(find("queueDelete"), o.delete_ns, common(o)))
        model = agent.model
        if interval_start <= model.boot_ns < interval_start + self.config.interval_s * NS or (
            model.boot_ns < interval_start and not agent.booted
        ):
            agent.booted = True  # the clients (re)connect right after the broker started
            for n in model.conn_nums:
                conn = model.objects[n]
                specs.append(
                    EventSpec(
                        find("clientConnect"),
                        model.boot_ns + n,
                        {
                            "rhost": conn.props["address"],
                            "user": conn.props["authIdentity"],
                            "properties": dict(conn.props["remoteProperties"]),
                        },
                    )
                )
        rng = agent.rng
        queues = agent.model.queue_nums
        for _ in range(agent.model.load.events_per_interval if random_events else 0):
            if not queues:
                break
            q = agent.model.objects[queues[rng.randrange(len(queues))]]
            up = rng.random() < 0.5
            specs.append(
                EventSpec(
                    find("queueThresholdCrossedUpward" if up else "queueThresholdCrossedDownward"),
                    interval_start + rng.randrange(1, self.config.interval_s * NS),
                    {
                        "qName": q.props["name"],
                        "msgDepth": q.stats["msgDepth"],
                        "byteDepth": q.stats["byteDepth"],
                    },
                )
            )
        model = agent.model
        for num, depth in sorted(model.alert_depths.items()):
            full = model.objects.get(num)
            if full is not None and full.stats["msgDepth"] >= depth:
                del model.alert_depths[num]  # once, as qpidd raises it
                specs.append(
                    EventSpec(
                        find("queueThresholdExceeded"),
                        interval_start + self.config.interval_s * NS // 2,
                        {"qName": full.props["name"], "msgDepth": full.stats["msgDepth"],
                         "byteDepth": full.stats["byteDepth"]},
                    )
                )  # fmt: skip
        specs.sort(key=lambda e: e.timestamp_ns)
        return specs

    def _publication(
        self, agent: SimAgent, now_ns: int, events: list[EventSpec]
    ) -> list[Published]:
        pubs: list[Published] = []
        if agent.send_schema:
            pubs.extend(agent.schema_records())
            agent.send_schema = False
        pubs.extend(agent.event(e) for e in events)
        force = agent.force_all
        by_class: dict[str, list[SimObject]] = {}
        for o in agent.model.objects.values():
            by_class.setdefault(o.cls.name, []).append(o)
        for objs in by_class.values():
            # qpidd: 'c' when the properties changed (configChanged), and always in a
            # deleted object's last record; 'i' when the statistics changed (instChanged);
            # both after a console arrived (forcePublish)
            props = [o for o in objs if force or o.prop_dirty or o.deleted]
            has_stats = bool(objs[0].cls.schema.statistics)
            stats = [o for o in objs if has_stats and (force or o.stat_dirty)]
            sent = {o.object_num for o in props} | {o.object_num for o in stats}
            update = {
                o.object_num: agent.update_time(o, now_ns) for o in objs if o.object_num in sent
            }
            if agent.dialect == "v2":  # one _data map holds properties and statistics
                pubs.extend(
                    Published(
                        agent.sample(o, "g", update[o.object_num]), agent.obj_key(o.cls, "data")
                    )
                    for o in objs
                    if o.object_num in sent
                )
            else:
                pubs.extend(
                    Published(
                        agent.sample(o, "c", update[o.object_num]), agent.obj_key(o.cls, "prop")
                    )
                    for o in props
                )
                pubs.extend(
                    Published(
                        agent.sample(o, "i", update[o.object_num]), agent.obj_key(o.cls, "stat")
                    )
                    for o in stats
                )
            for o in objs:
                o.prop_dirty = o.stat_dirty = False
        agent.force_all = False
        pubs.append(agent.heartbeat(now_ns, self.config.interval_s))
        return pubs

    def _lifecycle(self, agent: SimAgent, deleted: list[SimObject], interval: int) -> None:
        """Manifest lines for objects that came into being (first published) or went away."""

        def row(kind: str, o: SimObject, ts: int) -> dict[str, Any]:
            return {
                "kind": kind,
                "agent": agent.record_agent,
                "agent_uuid": str(agent.uuid),
                "interval": interval,
                "package": o.cls.package,
                "class_name": o.cls.name,
                "object_id": jsonable(agent.oid(o.object_num)),
                "object_name": agent.object_name(o),
                "timestamp_ns": ts,
            }

        model = agent.model
        for o in model.objects.values():
            if o.object_num not in model.announced:
                model.announced.add(o.object_num)
                self.manifest.write(row("create", o, o.create_ns))
        for o in deleted:
            self.manifest.write(row("delete", o, o.delete_ns))

    def _finals(
        self, agent: SimAgent, objs: Iterable[SimObject], reason: str, ts: int, interval: int
    ) -> None:
        """``final`` manifest lines: what the agent holds for each object when it goes away
        (``reason`` deleted, restart) or the run ends (end), published or not."""
        for o in objs:
            self.manifest.write(
                {
                    "kind": "final",
                    "reason": reason,
                    "agent": agent.record_agent,
                    "agent_uuid": str(agent.uuid),
                    "interval": interval,
                    "boot_seq": agent.boot_seq,
                    "package": o.cls.package,
                    "class_name": o.cls.name,
                    "object_id": jsonable(agent.oid(o.object_num)),
                    "object_name": agent.object_name(o),
                    "create_ns": o.create_ns,
                    "delete_ns": o.delete_ns,
                    "update_ns": o.update_ns,
                    "timestamp_ns": ts,
                    "values": jsonable(agent.values(o, "i")),
                }
            )

    def _restart(self, agent: SimAgent, at_ns: int, interval: int) -> None:
        """The agent's broker restarts at ``at_ns``: the old generation's final values,
        then every object made again (new create times, counters at zero)."""
        old = agent.boot_seq
        self.manifest.write(
            {
                "kind": "restart",
                "agent": agent.record_agent,
                "agent_uuid": str(agent.uuid),
                "interval": interval,
                "timestamp_ns": at_ns,
                "old_boot_seq": old,
                "boot_seq": old + 1,
            }
        )
        self._finals(agent, list(agent.model.objects.values()), "restart", at_ns, interval)
        agent.boot_seq += 1
        agent.model.build(at_ns)
        agent.booted = False
        agent.force_all = True
        agent.send_schema = True
        self.summary.restarts += 1

    def _dynamics(
        self, agent: SimAgent, interval: int, t0: int, loaded: bool
    ) -> tuple[list[SimObject], list[SimObject], list[EventSpec]]:
        """Everything that happens to one agent's broker in an interval, before its
        publication: a restart or the traffic, transient and short-lived queues coming
        and going, events. (declared, deleted, events)."""
        cfg = self.config
        interval_ns = cfg.interval_s * NS
        model = agent.model
        if (agent.index, interval) in self._restarts:
            self._restart(agent, t0 + interval_ns // 2, interval)
        else:
            model.advance(t0 + interval_ns, float(cfg.interval_s), traffic=loaded)
        declared: list[SimObject] = []
        deleted: list[SimObject] = []
        for _ in range(model.load.transient_per_interval if loaded else 0):
            objs = model.transient_queue(t0, interval_ns)
            declared.extend(objs)
            deleted.extend(objs)
        if loaded and (model.load.short_lived_per_interval or model.short_lived):
            created, gone = model.short_lived_step(interval, t0, interval_ns)
            declared.extend(created)
            deleted.extend(gone)
        events = self._events_for(agent, declared, deleted, t0, random_events=loaded)
        model.settle(t0 + interval_ns)
        return declared, deleted, events

    def serve_requests(self, timeout_s: float, interval: int) -> bool:
        """Answer whatever console requests arrive within ``timeout_s``; False if out of budget."""
        if self.requests is None:
            if timeout_s > 0:
                time.sleep(timeout_s)
            return True
        now_ns = self._now_ns  # the time of the state the agents hold (an interval's end)
        for req in self.requests.poll(timeout_s):
            rec = req.record
            for agent in self.agents:
                if agent.index in self.stopped or not agent.answers(req.key):
                    continue
                try:
                    packed = self._answer(agent, req, now_ns)
                except Exception as exc:  # a request we cannot answer must not end the run
                    packed = self._answer_error(agent, req, exc)
                self.manifest.write(
                    {
                        "kind": "request",
                        "agent": agent.record_agent,
                        "agent_uuid": str(agent.uuid),
                        "interval": interval,
                        "opcode": rec.opcode,
                        "seq": rec.seq,
                        "routing_key": req.key,
                        "reply_to": req.reply_to,
                    }
                )
                if not self._send(packed, interval, agent, "reply"):
                    return False
                self.sink.flush()  # a console waits for these
        return True

    def _answer(self, agent: SimAgent, req: Request, now_ns: int) -> list[Packed]:
        if agent.dialect == "v2":
            replies = V2Requests(agent).handle(req.record, now_ns)
            return v2_reply_messages(
                replies, req.reply_to, req.correlation_id, agent.v2_name,
                self.registry, self.config.body_encoding,
            )  # fmt: skip
        return reply_messages(agent.handle(req.record, now_ns), self.registry, req.reply_to)

    def _answer_error(self, agent: SimAgent, req: Request, exc: Exception) -> list[Packed]:
        """qpidd answers a request it chokes on with an error; so do we (status 7)."""
        text = f"Exception: {type(exc).__name__}: {exc}"[:200]
        if agent.dialect == "v2":
            err = QmfException(dialect="V2", opcode="_exception", code=7, text=text, values={})
            return v2_reply_messages(
                [err], req.reply_to, req.correlation_id, agent.v2_name,
                self.registry, self.config.body_encoding,
            )  # fmt: skip
        z = agent.complete(req.record.seq, 7, text)
        return reply_messages([z], self.registry, req.reply_to)

    def _serve_until(self, deadline: float, interval: int) -> bool:
        """Answer requests until ``deadline`` (monotonic) or stop(); False if out of budget."""
        while not self._stop:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            if not self.serve_requests(min(0.2, left), interval):
                return False
        return True

    def run(self) -> RunSummary:
        """Run until a bound is reached; closes nothing (the caller owns sink and manifest).

        Per interval: every agent's dynamics (``_dynamics``), then the console
        requests that arrived during the interval are answered from that state at the
        interval's end (a query clears the changed flags of what it returns, as in
        qpidd), then the publication. At the end, a ``final`` manifest line per object.
        """
        cfg = self.config
        self._wall0 = time.monotonic()
        start = cfg.start_ns if cfg.start_ns is not None else time.time_ns()
        self.start_ns = start
        self._now_ns = start
        interval_ns = cfg.interval_s * NS
        self._restarts = {(a, i) for a, i in cfg.restarts}
        for agent in self.agents:
            agent.model.build(start)
        for i in range(cfg.intervals):
            if self._stop:
                self.summary.stopped_by = "stop"
                break
            if self._out_of_time():
                self.summary.stopped_by = "duration"
                break
            t0 = start + i * interval_ns
            t1 = t0 + interval_ns
            due: float | None = None
            if cfg.realtime:  # publish interval i when it is over on the wall clock
                due = self._wall0 + (i + 1) * cfg.interval_s
                if cfg.duration_s is not None and due > self._wall0 + cfg.duration_s:
                    self._serve_until(self._wall0 + cfg.duration_s, i)
                    self.summary.stopped_by = "duration"
                    break
            loaded = cfg.load_intervals is None or i < cfg.load_intervals
            self._faults(i)
            live = [agent for agent in self.agents if agent.index not in self.stopped]
            pending = [self._dynamics(agent, i, t0, loaded) for agent in live]
            self._now_ns = t1
            if due is not None:
                if not self._serve_until(due, i):
                    break
                if self._stop:
                    self.summary.stopped_by = "stop"
                    break
            elif not self.serve_requests(0.0, i):
                break
            ok = True
            for agent, (_declared, deleted, events) in zip(live, pending, strict=True):
                agent.model.periodic(t1)
                pubs = self._publication(agent, t1, events)
                packed = pack(
                    pubs,
                    self.registry,
                    dialect=agent.dialect,
                    agent_name=agent.v2_name,
                    batch=cfg.batch,
                    encoding=cfg.body_encoding,
                )
                ok = self._send(packed, i, agent, "publish")
                if ok:
                    self._lifecycle(agent, deleted, i)
                self._finals(agent, deleted, "deleted", t1, i)
                agent.model.forget(deleted)
                if not ok:
                    break
            if not ok:
                break
            self.sink.flush()
            self.summary.intervals = i + 1
        else:
            self.summary.stopped_by = "intervals"
        if cfg.serve_s > 0 and self.summary.stopped_by == "intervals":
            self._serve_until(time.monotonic() + cfg.serve_s, self.summary.intervals)
        for agent in self.agents:
            objs = list(agent.model.objects.values())
            self._finals(agent, objs, "end", self._now_ns, self.summary.intervals)
        return self.summary


def run_to(
    config: SimConfig,
    sink: Sink,
    manifest_path: str | None = None,
    requests: RequestSource | None = None,
) -> tuple[RunSummary, Manifest]:
    """Run a simulation and close the sink and manifest whatever happens."""
    manifest = Manifest(manifest_path)
    try:
        sim = Simulation(config, sink, manifest, requests=requests)
        summary = sim.run()
    finally:
        try:
            sink.close()
        finally:
            manifest.close()
            if requests is not None:
                requests.close()
    return summary, manifest


__all__ = ["BrokerSink", "CaptureSink", "MemorySink", "SimConfig", "Simulation", "run_to"]
