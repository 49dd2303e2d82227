"""The simulated broker's object model and statistic dynamics.

One ``SimBroker`` is what one qpidd-like agent manages: system, broker, vhost,
exchanges, queues, bindings, connections, sessions and subscriptions, with the
references between them (``SimRef`` to an object number) and index properties
as qpid's schema has them. Values are plain Python values keyed by schema
element names; the agent turns references into dialect object ids when it
publishes. Everything random comes from one seeded ``random.Random`` consumed
in a fixed order, so a run is a pure function of its configuration.

Dynamics per interval (``advance``): every active queue enqueues and dequeues
at its own rate (fractional parts carried by a Bernoulli draw), depth is their
difference (never negative), bytes follow a per-queue message size, watermarks
(``hilo``) reset to the current value at the start of the interval and track a
consumer that attaches and leaves inside it; exchanges, bindings, subscriptions,
sessions, connections and the broker's totals follow from the queue traffic.

Lifecycle: transient queues live inside one interval (``transient_queue``);
short-lived queues live several intervals and are deleted after a last burst
of traffic (``short_lived_step``). Objects qpidd makes persistent at start-up
(system, broker, vhost, the durable exchanges) are flagged ``persistent``: their
ids carry epoch 0, not the boot sequence. The broker's totals include the
traffic of queues that were deleted (``retired``), so they never go down.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pipeline.qmfxml import (
    COUNTER,
    WATERMARK_HIGH,
    WATERMARK_LOW,
    ManagementSchema,
    XmlClass,
)

PKG = "org.apache.qpid.broker"
NS = 1_000_000_000
# the broker object's statistics that sum the queues' counters
BROKER_TOTALS = (
    "msgTotalEnqueues",
    "msgTotalDequeues",
    "byteTotalEnqueues",
    "byteTotalDequeues",
    "msgPersistEnqueues",
    "msgPersistDequeues",
    "bytePersistEnqueues",
    "bytePersistDequeues",
    "acquires",
    "discardsPurge",
)


@dataclass(frozen=True)
class SimRef:
    """A reference property: the object number of the target in the same agent."""

    object_num: int


@dataclass
class SimObject:
    """One managed object: values by element name, timestamps in ns, dirty flags."""

    cls: XmlClass
    object_num: int
    props: dict[str, Any]
    stats: dict[str, Any]
    create_ns: int
    delete_ns: int = 0
    # qpidd's configChanged / instChanged: set by a change, cleared when the object is
    # encoded (periodic publication or a console's query)
    prop_dirty: bool = True  # new objects publish their properties
    stat_dirty: bool = True
    # qpidd's updateTime: moves to "now" only when the object is encoded while changed
    # (0: never encoded yet); a deleted object's last record keeps it (a stale time)
    update_ns: int = 0
    persistent: bool = False  # made at start-up as persistent: epoch 0 in its ids
    # dynamics (queues); other classes ignore them
    enq_rate: float = 0.0
    deq_rate: float = 0.0
    msg_size: int = 0
    consumers: int = 0
    object_name: str | None = None  # v2 name, cached: index properties never change

    @property
    def class_name(self) -> str:
        return self.cls.name

    @property
    def deleted(self) -> bool:
        return self.delete_ns != 0


@dataclass(frozen=True)
class LoadConfig:
    """The size and behaviour of one simulated broker."""

    queues: int = 20
    connections: int = 4
    active_fraction: float = 0.5  # queues with traffic; idle ones stop being published
    max_rate: float = 50.0  # msgs/s upper bound of a queue's enqueue rate
    transient_per_interval: int = 1  # queues created and deleted inside one interval
    short_lived_per_interval: int = 0  # queues created per interval that live a few intervals
    short_lived_intervals: int = 3  # a short-lived queue is deleted this many intervals later
    watermark_prob: float = 0.2  # chance per queue and interval of a consumer coming and going
    events_per_interval: int = 1  # random threshold events


def _zero_stats(cls: XmlClass) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for e in cls.schema.statistics:
        out[e.name] = False if e.type_code == 11 else ("" if e.type_code in (6, 7) else 0)
    return out


class SimBroker:
    """The objects of one agent, created from the schema and advanced interval by interval."""

    def __init__(self, schema: ManagementSchema, rng: random.Random, load: LoadConfig) -> None:
        self.schema = schema
        self.rng = rng
        self.load = load
        self.objects: dict[int, SimObject] = {}
        self._next_num = 1
        self.boot_ns = 0
        self.broker_num = 0
        self.vhost_num = 0
        self.memory_num = 0
        self.exchanges: dict[str, int] = {}
        self.queue_nums: list[int] = []
        self.queue_binding: dict[int, int] = {}  # queue -> binding that routes its traffic
        self.queue_bindings: dict[int, list[int]] = {}  # queue -> all its bindings
        self.queue_subs: dict[int, list[int]] = {}
        self.sub_session: dict[int, int] = {}
        self.session_conn: dict[int, int] = {}
        self.conn_nums: list[int] = []
        self.transient_seq = 0
        self.short_lived_seq = 0
        self.short_lived: dict[int, int] = {}  # short-lived queue -> interval of its deletion
        # stalled queue -> the depth at which it raises queueThresholdExceeded (once)
        self.alert_depths: dict[int, int] = {}
        # counters of deleted queues, kept in the broker's totals (they never go down)
        self.retired: dict[str, int] = dict.fromkeys(BROKER_TOTALS, 0)
        self.announced: set[int] = set()  # object numbers whose creation the manifest has
        self.system_id = uuid.UUID(int=rng.getrandbits(128), version=4)

    # ------------------------------------------------------------------ building

    def cls(self, name: str) -> XmlClass:
        return self.schema.get(PKG, name)

    def _new(self, cls_name: str, props: dict[str, Any], now_ns: int) -> SimObject:
        cls = self.cls(cls_name)
        obj = SimObject(cls, self._next_num, props, _zero_stats(cls), now_ns)
        self._next_num += 1
        self.objects[obj.object_num] = obj
        return obj

    def build(self, now_ns: int) -> None:
        """Create the whole topology at boot time ``now_ns`` (object numbers restart at 1)."""
        self.objects.clear()
        self.announced.clear()
        self._next_num = 1
        self.boot_ns = now_ns
        self.exchanges.clear()
        self.queue_nums.clear()
        self.queue_binding.clear()
        self.queue_bindings.clear()
        self.queue_subs.clear()
        self.sub_session.clear()
        self.session_conn.clear()
        self.conn_nums.clear()
        self.short_lived.clear()
        self.alert_depths.clear()
        self.retired = dict.fromkeys(BROKER_TOTALS, 0)
        rng = self.rng
        system = self._new(
            "system",
            {
                "systemId": self.system_id,
                "osName": "Linux",
                "nodeName": f"sim-{str(self.system_id)[:8]}",  # one host per agent
                "release": "6.1.0",
                "version": "#1 SMP Debian",
                "machine": "x86_64",
            },
            now_ns,
        )
        system.persistent = True  # qpidd: System, Broker and Vhost are added as persistent
        broker = self._new(
            "broker",
            {
                "name": "amqp-broker",
                "systemRef": SimRef(system.object_num),
                "port": 5672,
                "workerThreads": 2,
                "maxConns": 500,
                "connBacklog": 10,
                "stagingThreshold": 0,
                "mgmtPublish": True,
                "mgmtPubInterval": 1,
                "version": "1.40.0-sim",
                "dataDir": "/var/lib/qpidd",
            },
            now_ns,
        )
        self.broker_num = broker.object_num
        broker.persistent = True
        vhost = self._new(
            "vhost",
            {"brokerRef": SimRef(broker.object_num), "name": "/", "federationTag": ""},
            now_ns,
        )
        self.vhost_num = vhost.object_num
        vhost.persistent = True
        vref = SimRef(vhost.object_num)
        # qpidd's malloc statistics are optional properties, republished as they move
        memory = self._new(
            "memory",
            {
                "name": "amqp-broker",
                "malloc_arena": 1_372_160,
                "malloc_ordblks": 144,
                "malloc_hblks": 0,
                "malloc_hblkhd": 0,
                "malloc_uordblks": 637_600,
                "malloc_fordblks": 734_560,
                "malloc_keepcost": 130_192,
            },
            now_ns,
        )
        self.memory_num = memory.object_num
        # qpidd's default exchange "" and qpid.management are not durable (boot epoch in
        # their ids); the amq.* exchanges are durable, hence persistent (epoch 0)
        for name, etype in (
            ("", "direct"),
            ("amq.direct", "direct"),
            ("amq.topic", "topic"),
            ("amq.fanout", "fanout"),
            ("amq.match", "headers"),
            ("qpid.management", "management"),
        ):
            ex = self._new(
                "exchange",
                {
                    "vhostRef": vref,
                    "name": name,
                    "type": etype,
                    "durable": name.startswith("amq."),
                    "autoDelete": False,
                    "arguments": {},
                },
                now_ns,
            )
            ex.persistent = bool(ex.props["durable"])
            self.exchanges[name] = ex.object_num
        for c in range(self.load.connections):
            address = f"127.0.0.1:5672-10.0.{c // 250}.{c % 250 + 1}:{40000 + c}"
            props: dict[str, Any] = {
                "vhostRef": vref,
                "address": address,
                "incoming": True,
                "SystemConnection": False,
                "userProxyAuth": False,
                "federationLink": False,
                "authIdentity": "anonymous",
                "shadow": False,
                "saslMechanism": "ANONYMOUS",
                "saslSsf": 0,
                "remoteProperties": {"product": "sim-client"},
                "protocol": "AMQP 1.0" if c % 2 else "AMQP 0-10",
            }
            if c % 3 != 2:  # optional properties present on some connections only
                props["remoteProcessName"] = f"client-{c}"
                props["remotePid"] = 1000 + c
                props["remoteParentPid"] = 1
            conn = self._new("connection", props, now_ns)
            self.conn_nums.append(conn.object_num)
            sprops: dict[str, Any] = {
                "vhostRef": vref,
                "name": f"session-{c}",
                "channelId": 1,
                "connectionRef": SimRef(conn.object_num),
                "detachedLifespan": 0,
                "attached": True,
            }
            if c % 2 == 0:
                sprops["fullName"] = f"{address}:session-{c}"
            sess = self._new("session", sprops, now_ns)
            self.session_conn[sess.object_num] = conn.object_num
        sessions = list(self.session_conn)
        for i in range(self.load.queues):
            q = self._add_queue(f"q{i:05d}", now_ns, durable=i % 3 == 0)
            if rng.random() < self.load.active_fraction:
                q.enq_rate = round(rng.uniform(1.0, self.load.max_rate), 3)
                q.deq_rate = round(q.enq_rate * rng.uniform(0.5, 1.0), 3)
            q.msg_size = rng.choice((64, 256, 1024, 4096))
            if sessions and i % 2 == 0:
                sess_num = sessions[i % len(sessions)]
                sub = self._new(
                    "subscription",
                    {
                        "sessionRef": SimRef(sess_num),
                        "queueRef": SimRef(q.object_num),
                        "name": f"sub-{i}",
                        "browsing": False,
                        "acknowledged": True,
                        "exclusive": False,
                        "creditMode": "WINDOW",
                        "arguments": {},
                    },
                    now_ns,
                )
                self.queue_subs.setdefault(q.object_num, []).append(sub.object_num)
                self.sub_session[sub.object_num] = sess_num
                q.consumers = 1
            self._set_counts(q)
        for num in self.exchanges.values():
            self.reset_watermarks(self.objects[num])
        self._broker_totals(now_ns)

    def _add_queue(self, name: str, now_ns: int, durable: bool) -> SimObject:
        props: dict[str, Any] = {
            "vhostRef": SimRef(self.vhost_num),
            "name": name,
            "durable": durable,
            "autoDelete": False,
            "exclusive": False,
            "arguments": {"qpid.max_count": 100000} if durable else {},
        }
        if len(self.queue_nums) % 4 == 1:
            props["altExchange"] = SimRef(self.exchanges["amq.fanout"])
        q = self._new("queue", props, now_ns)
        self.queue_nums.append(q.object_num)
        b = self._bind("", q, name, now_ns)
        self.queue_binding[q.object_num] = b.object_num
        self.queue_bindings[q.object_num] = [b.object_num]
        if len(self.queue_nums) % 4 == 0:
            t = self._bind("amq.topic", q, f"{name}.#", now_ns)
            self.queue_bindings[q.object_num].append(t.object_num)
        return q

    def _bind(self, exchange: str, q: SimObject, key: str, now_ns: int) -> SimObject:
        props: dict[str, Any] = {
            "exchangeRef": SimRef(self.exchanges[exchange]),
            "queueRef": SimRef(q.object_num),
            "bindingKey": key,
            "arguments": {},
        }
        if exchange == "amq.topic":
            props["origin"] = "sim"
        ex = self.objects[self.exchanges[exchange]].stats
        ex["bindingCount"] += 1
        ex["bindingCountHigh"] = max(ex["bindingCountHigh"], ex["bindingCount"])
        self.objects[self.exchanges[exchange]].stat_dirty = True
        return self._new("binding", props, now_ns)

    def _set_counts(self, q: SimObject) -> None:
        bindings = len(self.queue_bindings[q.object_num])
        s = q.stats
        for base, value in (("consumerCount", q.consumers), ("bindingCount", bindings)):
            s[base] = s[base + "High"] = s[base + "Low"] = value
        s["creator"] = "anonymous"

    # ------------------------------------------------------------------ dynamics

    def live(self) -> Iterator[SimObject]:
        return iter(self.objects.values())

    def _draw(self, rate: float, dt_s: float) -> int:
        x = rate * dt_s
        n = int(x)
        return n + (1 if self.rng.random() < x - n else 0)

    def _traffic(self, q: SimObject, n_enq: int, n_deq: int) -> None:
        """Apply enqueues/dequeues to a queue and everything its traffic passes through."""
        s = q.stats
        depth = s["msgTotalEnqueues"] - s["msgTotalDequeues"] + n_enq
        n_deq = min(n_deq, depth)
        if n_enq == 0 and n_deq == 0:
            return
        size = q.msg_size
        s["msgTotalEnqueues"] += n_enq
        s["byteTotalEnqueues"] += n_enq * size
        s["msgTotalDequeues"] += n_deq
        s["byteTotalDequeues"] += n_deq * size
        s["acquires"] += n_deq
        if q.props["durable"]:
            s["msgPersistEnqueues"] += n_enq
            s["bytePersistEnqueues"] += n_enq * size
            s["msgPersistDequeues"] += n_deq
            s["bytePersistDequeues"] += n_deq * size
        s["msgDepth"] = s["msgTotalEnqueues"] - s["msgTotalDequeues"]
        s["byteDepth"] = s["byteTotalEnqueues"] - s["byteTotalDequeues"]
        q.stat_dirty = True
        b = self.objects.get(self.queue_binding.get(q.object_num, -1))
        if b is not None and n_enq:
            b.stats["msgMatched"] += n_enq
            b.stat_dirty = True
            ex = self.objects[b.props["exchangeRef"].object_num]
            for k, v in (("msgReceives", n_enq), ("msgRoutes", n_enq)):
                ex.stats[k] += v
            for k in ("byteReceives", "byteRoutes"):
                ex.stats[k] += n_enq * size
            ex.stat_dirty = True
        subs = self.queue_subs.get(q.object_num, [])
        if subs and n_deq:
            sub = self.objects[subs[0]]
            sub.stats["delivered"] += n_deq
            sub.stat_dirty = True
            conn = self.objects[self.session_conn[self.sub_session[sub.object_num]]]
            conn.stats["msgsToClient"] += n_deq
            conn.stats["framesToClient"] += 2 * n_deq
            conn.stats["bytesToClient"] += n_deq * (size + 40)
            conn.stat_dirty = True
        if n_enq and self.conn_nums:
            conn = self.objects[self.conn_nums[q.object_num % len(self.conn_nums)]]
            conn.stats["msgsFromClient"] += n_enq
            conn.stats["framesFromClient"] += 2 * n_enq
            conn.stats["bytesFromClient"] += n_enq * (size + 40)
            conn.stat_dirty = True

    def stall_queue(self, interval_s: float) -> str | None:
        """The first queue with traffic and a consumer loses its consumer: no dequeues
        from now on, ``consumerCount`` 0, enqueues as before (depth grows). Once it holds
        about three intervals of enqueues more, it raises qpidd's
        ``queueThresholdExceeded`` (severity warn) once, as a queue past its
        ``qpid.alert_count`` does (``alert_depths``). Its name, or None when no queue has
        both traffic and a consumer."""
        for num in self.queue_nums:
            q = self.objects[num]
            if q.enq_rate > 0 and q.deq_rate > 0 and q.consumers > 0:
                q.deq_rate = 0.0
                q.consumers = 0
                q.stats["consumerCount"] = q.stats["consumerCountLow"] = 0
                q.stat_dirty = True
                extra = max(1, round(q.enq_rate * interval_s * 3))
                self.alert_depths[num] = q.stats["msgDepth"] + extra
                return str(q.props["name"])
        return None

    def reset_watermarks(self, obj: SimObject) -> bool:
        changed = False
        for name, info in obj.cls.statistics.items():
            if info.kind in (WATERMARK_HIGH, WATERMARK_LOW):
                cur = obj.stats[info.base]
                if obj.stats[name] != cur:
                    obj.stats[name] = cur
                    changed = True
        return changed

    def advance(self, now_ns: int, dt_s: float, traffic: bool = True) -> None:
        """One publish interval of traffic ending at ``now_ns``.

        ``traffic=False``: the load has stopped; nothing moves but the
        watermarks' reset, the broker's uptime and the memory figures (qpidd
        republishes those two every interval too).
        """
        rng = self.rng
        for num in self.exchanges.values():
            ex = self.objects[num]
            if self.reset_watermarks(ex):
                ex.stat_dirty = True
        for num in self.queue_nums:
            q = self.objects[num]
            if self.reset_watermarks(q):
                q.stat_dirty = True
            if not traffic:
                continue
            if q.enq_rate > 0:
                self._traffic(q, self._draw(q.enq_rate, dt_s), self._draw(q.deq_rate, dt_s))
            if rng.random() < self.load.watermark_prob:
                # a consumer attached and left inside the interval: only High shows it
                q.stats["consumerCountHigh"] = q.stats["consumerCount"] + 1
                q.stat_dirty = True
        mem = self.objects[self.memory_num].props
        used = max(4096, mem["malloc_uordblks"] + rng.randrange(-8192, 8193))
        mem["malloc_uordblks"] = used
        mem["malloc_fordblks"] = max(0, mem["malloc_arena"] - used)
        self.objects[self.memory_num].prop_dirty = True
        self._broker_totals(now_ns)

    def settle(self, now_ns: int) -> None:
        """The broker's totals and uptime at ``now_ns``, after everything of the interval."""
        self._broker_totals(now_ns)

    def periodic(self, now_ns: int) -> None:
        """What qpidd's periodic processing does before it publishes: the broker's uptime
        is set and the memory figures reloaded, so both are published every interval
        (even right after a console's query cleared their changed flags)."""
        b = self.objects[self.broker_num]
        b.stats["uptime"] = max(0, now_ns - self.boot_ns)
        b.stat_dirty = True
        self.objects[self.memory_num].prop_dirty = True

    def _broker_totals(self, now_ns: int) -> None:
        b = self.objects[self.broker_num]
        totals = dict(self.retired)
        for num in self.queue_nums:
            qs = self.objects[num].stats
            for k in totals:
                totals[k] += qs[k]
        b.stats.update(totals)
        b.stats["abandoned"] = b.stats.get("abandoned", 0)
        b.stats["msgDepth"] = totals["msgTotalEnqueues"] - totals["msgTotalDequeues"]
        b.stats["byteDepth"] = totals["byteTotalEnqueues"] - totals["byteTotalDequeues"]
        b.stats["queueCount"] = sum(1 for n in self.queue_nums if not self.objects[n].deleted)
        b.stats["uptime"] = max(0, now_ns - self.boot_ns)
        b.stat_dirty = True

    # ------------------------------------------------------------------ lifecycle

    def transient_queue(self, start_ns: int, interval_ns: int) -> list[SimObject]:
        """A queue (and its binding) created and deleted inside (start, start + interval)."""
        rng = self.rng
        self.transient_seq += 1
        lo = max(start_ns, self.boot_ns)  # never before the agent (re)started
        span = start_ns + interval_ns - lo
        t_create = lo + rng.randrange(1, span // 2)
        t_delete = t_create + rng.randrange(1, span // 2 - 1)
        name = f"tmp.{self.transient_seq:06d}"
        q = self._add_queue(name, t_create, durable=False)
        q.props["autoDelete"] = True
        q.props["exclusive"] = True
        q.msg_size = 128
        q.consumers = 0
        self._set_counts(q)
        n = rng.randrange(1, 20)
        self._traffic(q, n, n)
        created = [q] + [self.objects[n] for n in self.queue_bindings[q.object_num]]
        for o in created:
            o.create_ns = t_create
            o.delete_ns = t_delete
            if o.class_name == "binding":  # gone again: only the exchange's High remembers it
                ex = self.objects[o.props["exchangeRef"].object_num]
                ex.stats["bindingCount"] -= 1
        return created

    def purge(self, q: SimObject, request: int) -> int:
        """The queue's purge method: drop ``request`` messages (0 = all); returns how many."""
        s = q.stats
        depth = int(s["msgDepth"])
        n = depth if request == 0 else min(request, depth)
        if n:
            s["msgTotalDequeues"] += n
            s["byteTotalDequeues"] += n * q.msg_size
            s["discardsPurge"] += n
            s["msgDepth"] = s["msgTotalEnqueues"] - s["msgTotalDequeues"]
            s["byteDepth"] = s["byteTotalEnqueues"] - s["byteTotalDequeues"]
            q.stat_dirty = True
        return n

    def short_lived_step(
        self, interval: int, start_ns: int, interval_ns: int
    ) -> tuple[list[SimObject], list[SimObject]]:
        """Short-lived queues of one interval: (created, deleted), bindings included.

        The queues due in ``interval`` get a last burst (enqueues, then a consumer
        drains them) and are deleted at a random time inside it; then
        ``short_lived_per_interval`` new queues ``sl.NNNNNN`` (bound to the default
        exchange, with a rate of their own: ``advance`` moves them like any active
        queue) are created at random times inside it, to be deleted
        ``short_lived_intervals`` intervals later.
        """
        rng = self.rng
        lo = max(start_ns, self.boot_ns)  # never before the agent (re)started
        span = start_ns + interval_ns - lo
        deleted: list[SimObject] = []
        for num in sorted(n for n, due in self.short_lived.items() if due <= interval):
            del self.short_lived[num]
            q = self.objects[num]
            t_delete = lo + rng.randrange(1, span)
            n = rng.randrange(1, 20)
            self._traffic(q, n, n + int(q.stats["msgDepth"]))  # a last burst, drained
            deleted.extend(self._delete_queue(q, t_delete))
        created: list[SimObject] = []
        for _ in range(self.load.short_lived_per_interval):
            self.short_lived_seq += 1
            t_create = lo + rng.randrange(1, span)
            q = self._add_queue(f"sl.{self.short_lived_seq:06d}", t_create, durable=False)
            q.enq_rate = round(rng.uniform(1.0, self.load.max_rate), 3)
            q.deq_rate = round(q.enq_rate * rng.uniform(0.5, 1.0), 3)
            q.msg_size = rng.choice((64, 256, 1024, 4096))
            q.consumers = 0
            self._set_counts(q)
            objs = [q] + [self.objects[b] for b in self.queue_bindings[q.object_num]]
            for o in objs:
                o.create_ns = t_create
            self.short_lived[q.object_num] = interval + max(1, self.load.short_lived_intervals)
            created.extend(objs)
        return created, deleted

    def _delete_queue(self, q: SimObject, t_delete: int) -> list[SimObject]:
        """Mark a queue and its bindings deleted at ``t_delete`` (the exchanges count it)."""
        objs = [q] + [self.objects[b] for b in self.queue_bindings[q.object_num]]
        for o in objs:
            o.delete_ns = t_delete
            if o.class_name == "binding":
                ex = self.objects[o.props["exchangeRef"].object_num]
                s = ex.stats
                s["bindingCount"] -= 1
                s["bindingCountLow"] = min(s["bindingCountLow"], s["bindingCount"])
                ex.stat_dirty = True
        return objs

    def forget(self, objs: list[SimObject]) -> None:
        """Drop deleted objects after their last publication (a queue's counters stay in
        the broker's totals)."""
        for o in objs:
            if self.objects.pop(o.object_num, None) is None:
                continue
            self.announced.discard(o.object_num)
            if o.object_num in self.queue_bindings:
                for k in self.retired:
                    self.retired[k] += int(o.stats[k])
                self.queue_nums.remove(o.object_num)
            self.queue_binding.pop(o.object_num, None)
            self.queue_bindings.pop(o.object_num, None)
            self.short_lived.pop(o.object_num, None)


def counters_of(cls: XmlClass) -> list[str]:
    """Names of the monotonic counters of a class (they restart from zero on agent restart)."""
    return [n for n, i in cls.statistics.items() if i.kind == COUNTER]


@dataclass
class EventSpec:
    """An event to publish: class, timestamp and arguments (values by name)."""

    cls: XmlClass
    timestamp_ns: int
    arguments: dict[str, Any] = field(default_factory=dict)
