"""``qmf serve-metrics``: the latest rates and gauges of the live view for Prometheus.

An HTTP endpoint dashboards scrape. ``/metrics`` exposes what dashboards use
(families ``queue``: every queue's depth, enqueue and dequeue rates and
consumers; ``broker``: every statistic of the broker objects; ``objects``:
live objects per broker and class, e.g. connections); ``/metrics/all`` (or
``?family=all``) every statistic of every object. Query parameters select,
as RabbitMQ's per-object endpoint does: ``family=``, ``class=``,
``statistic=``, ``broker=`` (each repeatable or a comma list) and ``name=`` (a
regular expression matched against the whole name, Python ``re`` syntax, as
PromQL's ``=~`` anchors it); with a selector but no ``family`` every
statistic is selected from. Family ``health`` (in the default) is what alert rules
need (``qmf alert-rules``, docs/alerts.md): per agent its last sighting, publish
interval, silence and up/down (``qmf_agent_*``), per landing broker how far gold has
come (``qmf_pipeline_newest_timestamp_seconds``) and the messages quarantined
(``qmf_quarantined_messages_total``), events per broker, name and severity
(``qmf_events_total``; the counters count from the endpoint's start) and whether each
receiver of the landing log (``--landing``) is connected (``qmf_receiver_connected``). A counter's value is the rate of its latest gold
interval (``qmf_statistic_rate_per_second``; 0 once its agent was seen more
than 1.5 publish cycles after the interval's end without a new sample of the
object: unchanged, ``pipeline.views.live.with_quiet``), any other statistic's its
latest value (``qmf_statistic_value``). Labels: ``broker``, ``class``,
``name`` (gold's names), ``statistic``; a broker publishing an object through
its QMF v1 and v2 agents (qpidd) gives it once (``pipeline.views.live.collapse``).
A background thread reads what the tables gained every ``--refresh`` seconds
(``pipeline.views.live``; the first read starts from gold's latest state) and renders
the default exposition ahead, so a scrape, the first included, answers from
what is rendered. The
exposition and its content negotiation (OpenMetrics or the Prometheus text
format by the ``Accept`` header, gzip by ``Accept-Encoding``) are
prometheus_client's. ``/healthz`` answers ``ok`` with the table version read.
``--web-config`` adds TLS and basic authentication (every path), in the format of
Prometheus's exporters (``pipeline.views.webconfig``), for a Prometheus on another host.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import logging
import os
import re
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import polars as pl
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from pipeline.lake import storage
from pipeline.views.live import CONSUMERS, DEPTH, DEQUEUES, ENQUEUES, LiveView, data_location
from pipeline.views.webconfig import REALM, WebConfig, WebConfigError
from receivers.landing import ReceiverStatus, receiver_statuses

log = logging.getLogger(__name__)

RATE_METRIC = "qmf_statistic_rate_per_second"
VALUE_METRIC = "qmf_statistic_value"
OBJECTS_METRIC = "qmf_objects"
VERSION_METRIC = "qmf_live_rates_version"
STATE_VERSION_METRIC = "qmf_live_state_version"
AGENT_SEEN_METRIC = "qmf_agent_last_seen_timestamp_seconds"
AGENT_INTERVAL_METRIC = "qmf_agent_publish_interval_seconds"
AGENT_SILENCE_METRIC = "qmf_agent_silence_seconds"
AGENT_UP_METRIC = "qmf_agent_up"
NEWEST_METRIC = "qmf_pipeline_newest_timestamp_seconds"
EVENTS_METRIC = "qmf_events"  # exposed as qmf_events_total
QUARANTINE_METRIC = "qmf_quarantined_messages"  # exposed as qmf_quarantined_messages_total
RECEIVER_METRIC = "qmf_receiver_connected"
# qmf_agent_up is 0 once an agent missed this many publish cycles (gold's liveness rule).
MISSED_CYCLES = 3
LABELS = ("broker", "class", "name", "statistic")  # + agent, object_id when ambiguous
HELP = {
    RATE_METRIC: "Rate of a QMF counter statistic over its latest gold interval (per second); "
    "0 once its agent was seen 1.5 publish cycles after it without the object (unchanged).",
    VALUE_METRIC: "Latest value of a QMF gauge, watermark or min/max/average statistic.",
    OBJECTS_METRIC: "Live QMF objects of a class on a broker (by gold's object lifecycles).",
    VERSION_METRIC: "Delta version of gold statistic_rates this exposition was read at.",
    STATE_VERSION_METRIC: "Delta version of gold rate_state this exposition was read at.",
    AGENT_SEEN_METRIC: "When gold last saw the agent (its heartbeat or a sample; Unix seconds).",
    AGENT_INTERVAL_METRIC: "The agent's publish cycle (seconds), as gold measures it.",
    AGENT_SILENCE_METRIC: "How far the newest time gold holds of its landing broker's agents "
    "is past the agent's last sighting (seconds): it does not grow while the pipeline lags.",
    AGENT_UP_METRIC: f"1 while the agent missed fewer than {MISSED_CYCLES} publish cycles "
    "(by its silence), else 0.",
    NEWEST_METRIC: "The newest time gold holds of any agent of the landing broker (Unix "
    "seconds): now minus this is the pipeline's lag behind the broker.",
    EVENTS_METRIC: "QMF events read since this endpoint started, by broker, event and its severity (label event_severity).",
    QUARANTINE_METRIC: "Messages quarantined (undecodable) since this endpoint started, by "
    "landing broker.",
    RECEIVER_METRIC: "1 while the receiver of a landing partition is connected to its broker "
    "(its status in the landing log, its process alive), else 0; a receiver stopped on "
    "purpose is not listed.",
}
QUEUE_STATISTICS = (DEPTH, ENQUEUES, DEQUEUES, CONSUMERS)
FAMILIES = {
    "queue": f"class queue, statistics {', '.join(QUEUE_STATISTICS)}",
    "broker": "class broker, every statistic",
    "objects": f"{OBJECTS_METRIC}: live objects per broker and class",
    "health": "agents' liveness, the pipeline's progress, events and quarantine (qmf_agent_*, "
    "qmf_pipeline_*, qmf_events_total, qmf_quarantined_messages_total)",
    "all": "every statistic of every object, the object counts and health",
}
DEFAULT_FAMILIES = frozenset({"queue", "broker", "objects", "health"})
PARAMETERS = ("family", "class", "statistic", "broker", "name")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve-metrics", help="Prometheus/OpenMetrics endpoint of the latest rates and gauges",
        description=__doc__,
    )  # fmt: skip
    p.add_argument("--data", default="data", help="folder qmf run writes (./data), or a bucket (s3a://bucket/prefix)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=9469, help="port to listen on (0: any free)")
    p.add_argument("--landing", metavar="DIR",
                   help="the landing log whose receivers to report (qmf_receiver_connected; "
                   "default DATA/landing, qmf run's, when DATA is a folder)")
    p.add_argument("--web-config", metavar="FILE",
                   help="TLS and basic authentication, as Prometheus exporters' "
                   "--web.config.file (YAML: tls_server_config, basic_auth_users)")
    p.add_argument("--refresh", type=float, default=2.0, metavar="S",
                   help="seconds between background reads of the tables (what a scrape "
                   "shows lags them by at most this plus one read)")
    p.set_defaults(func=run)


class SelectionError(ValueError):
    """A query the endpoint cannot answer (HTTP 400)."""


@dataclass(frozen=True)
class Selection:
    """What a scrape asks for: families, then filters (empty: any)."""

    families: frozenset[str] = DEFAULT_FAMILIES
    classes: frozenset[str] = frozenset()
    statistics: frozenset[str] = frozenset()
    brokers: frozenset[str] = frozenset()
    name: str | None = None  # a regular expression the whole name matches

    @classmethod
    def parse(cls, path: str, query: str) -> Selection:
        """The selection of a request: ``/metrics`` or ``/metrics/all`` and its query."""
        if path not in ("/metrics", "/metrics/all"):
            raise LookupError(path)
        params = urllib.parse.parse_qs(query, keep_blank_values=False)
        unknown = sorted(set(params) - set(PARAMETERS))
        if unknown:
            raise SelectionError(f"unknown parameters {unknown}: use {', '.join(PARAMETERS)}")

        def values(key: str) -> frozenset[str]:
            return frozenset(v for raw in params.get(key, []) for v in raw.split(",") if v)

        families = values("family") | ({"all"} if path == "/metrics/all" else set())
        bad = sorted(families - set(FAMILIES))
        if bad:
            raise SelectionError(f"unknown families {bad}: use {', '.join(FAMILIES)}")
        names = params.get("name", [])
        if len(names) > 1:
            raise SelectionError("name= takes one regular expression (use | to combine)")
        name = names[0] if names else None
        if name is not None:
            try:
                re.compile(name)
            except re.error as exc:
                raise SelectionError(f"name={name!r} is not a regular expression: {exc}") from exc
        selectors = any(values(k) for k in ("class", "statistic", "broker")) or name is not None
        if not families:
            families = frozenset({"all"}) if selectors else DEFAULT_FAMILIES
        return cls(
            families=frozenset(families), classes=values("class"),
            statistics=values("statistic"), brokers=values("broker"), name=name,
        )  # fmt: skip

    def where(self) -> pl.Expr:
        """The rows (``LiveView.rows``) of the families, classes and statistics selected."""
        cls, stat = pl.col("class_name"), pl.col("statistic")
        if "all" in self.families:
            out = pl.lit(True)
        else:
            wanted = [pl.lit(False)]
            if "queue" in self.families:
                wanted.append((cls == "queue") & stat.is_in(list(QUEUE_STATISTICS)))
            if "broker" in self.families:
                wanted.append(cls == "broker")
            out = pl.any_horizontal(wanted)
        if self.statistics:
            out = out & stat.is_in(sorted(self.statistics))
        if self.classes:
            out = out & cls.is_in(sorted(self.classes))
        return out

    def rows(self, current: pl.DataFrame) -> pl.DataFrame:
        """Of current rows (``LiveView.current_frame`` of ``where``), those of the brokers
        and names selected."""
        return self._common(current)

    def objects(self, counts: pl.DataFrame) -> pl.DataFrame | None:
        """The object counts (``LiveView.objects``) this selection exposes, if any: with
        family ``objects``, or ``all`` unless statistics or names are selected (a count
        is neither), filtered by class and broker."""
        if "objects" not in self.families and (
            "all" not in self.families or self.statistics or self.name is not None
        ):
            return None
        return self._common(counts, names=False)

    def health(self) -> bool:
        """Whether the health families are exposed: with family ``health``, or ``all``
        unless classes, statistics or names are selected (they select statistics)."""
        if "health" in self.families:
            return True
        return "all" in self.families and not (self.classes or self.statistics or self.name)

    def _common(self, t: pl.DataFrame, names: bool = True) -> pl.DataFrame:
        if self.classes:
            t = t.filter(pl.col("class_name").is_in(sorted(self.classes)))
        if self.brokers:
            t = t.filter(pl.col("broker").is_in(sorted(self.brokers)))
        if names and self.name is not None and t.height:
            pattern = re.compile(self.name)
            shown = [n for n in t["name"].unique().to_list() if pattern.fullmatch(n)]
            t = t.filter(pl.col("name").is_in(shown))
        return t


def metric_families(
    rows: pl.DataFrame,
    objects: pl.DataFrame | None,
    version: int | None,
    state_version: int | None = None,
) -> list[Metric]:
    """The metric families of selected current rows (collapsed: ``pipeline.views.live.collapse``).

    Counters without a rate (their latest interval was a reset) are left out: their rate is
    unknown until the next interval. Rows of an ambiguous name (one agent has two objects
    of it) carry ``agent`` and ``object_id`` as well.
    """
    rate = GaugeMetricFamily(RATE_METRIC, HELP[RATE_METRIC])
    value = GaugeMetricFamily(VALUE_METRIC, HELP[VALUE_METRIC])
    if rows.height:
        t = rows.with_columns(
            _value=pl.when(pl.col("kind") == "counter").then("rate").otherwise("value"),
            _counter=pl.col("kind") == "counter",
        ).filter(pl.col("_value").is_not_null())
        t = t.sort("class_name", "broker", "name", "statistic", "agent", "object_id")
        cols = ("broker", "class_name", "name", "statistic", "agent", "object_id", "ambiguous",
                "_counter", "_value")  # fmt: skip
        data = [t[c].to_list() for c in cols]
        for broker, cls, name, statistic, agent, oid, ambiguous, counter, v in zip(*data, strict=True):
            labels = {"broker": broker, "class": cls, "name": name, "statistic": statistic}
            if ambiguous:
                labels.update(agent=agent, object_id=oid)
            family = rate if counter else value
            family.samples.append(Sample(family.name, labels, float(v)))
    out: list[Metric] = [rate, value]
    if objects is not None:
        count = GaugeMetricFamily(OBJECTS_METRIC, HELP[OBJECTS_METRIC], labels=["broker", "class"])
        for broker, cls, n in objects.sort("broker", "class_name").select(
            "broker", "class_name", "count"
        ).iter_rows():
            count.add_metric([broker, cls], float(n))
        out.append(count)
    if version is not None:
        out.append(GaugeMetricFamily(VERSION_METRIC, HELP[VERSION_METRIC], value=float(version)))
    if state_version is not None:
        out.append(GaugeMetricFamily(STATE_VERSION_METRIC, HELP[STATE_VERSION_METRIC],
                                     value=float(state_version)))  # fmt: skip
    return out


def health_families(
    view: LiveView, brokers: frozenset[str] = frozenset(),
    receivers: list[ReceiverStatus] | None = None,
) -> list[Metric]:  # fmt: skip
    """The health families of the view and the receivers' statuses (``brokers``: only
    those, by the ``broker`` label; the landing-broker families by ``broker_name``).
    A status's ``connected`` is taken as given: ``MetricsState`` clears it for a
    receiver whose process is gone, once per refresh."""
    labels = ["broker", "agent", "broker_name"]
    seen = GaugeMetricFamily(AGENT_SEEN_METRIC, HELP[AGENT_SEEN_METRIC], labels=labels)
    cycle = GaugeMetricFamily(AGENT_INTERVAL_METRIC, HELP[AGENT_INTERVAL_METRIC], labels=labels)
    silence = GaugeMetricFamily(AGENT_SILENCE_METRIC, HELP[AGENT_SILENCE_METRIC], labels=labels)
    up = GaugeMetricFamily(AGENT_UP_METRIC, HELP[AGENT_UP_METRIC], labels=labels)
    every_agent = view.agent_health()
    agents = every_agent
    if brokers:
        agents = agents.filter(pl.col("broker").is_in(sorted(brokers)))
    for broker, agent, name, last, every, quiet in agents.select(
        "broker", "agent", "broker_name", "last_seen_ns", "cycle_ns", "silence_ns"
    ).iter_rows():
        values = [broker, agent, name]
        seen.add_metric(values, last / 1e9)
        cycle.add_metric(values, every / 1e9)
        silence.add_metric(values, quiet / 1e9)
        up.add_metric(values, 1.0 if quiet < MISSED_CYCLES * every else 0.0)
    newest = GaugeMetricFamily(NEWEST_METRIC, HELP[NEWEST_METRIC], labels=["broker_name"])
    quarantined = CounterMetricFamily(QUARANTINE_METRIC, HELP[QUARANTINE_METRIC], labels=["broker_name"])
    of_agents = set(agents["broker_name"].to_list())  # with brokers: only theirs
    landing = sorted(of_agents if brokers else of_agents | set(view.quarantined))
    by_broker = view.newest_by_broker(every_agent)
    for name in landing:
        if name in by_broker:
            newest.add_metric([name], by_broker[name] / 1e9)
        quarantined.add_metric([name], float(view.quarantined.get(name, 0)))
    events = CounterMetricFamily(EVENTS_METRIC, HELP[EVENTS_METRIC], labels=["broker", "event", "event_severity"])
    for (broker, event, severity), n in sorted(view.event_counts.items()):
        if not brokers or broker in brokers:
            events.add_metric([broker, event, severity], float(n))
    connected = GaugeMetricFamily(RECEIVER_METRIC, HELP[RECEIVER_METRIC],
                                  labels=["broker_name", "partition"])  # fmt: skip
    for r in receivers or []:
        if not brokers or r.broker_name in of_agents:
            connected.add_metric([r.broker_name, r.partition], 1.0 if r.connected else 0.0)
    return [seen, cycle, silence, up, newest, quarantined, events, connected]


class LiveCollector:
    """A prometheus_client collector over the live view: the families of one selection."""

    def __init__(
        self, view: LiveView, selection: Selection, receivers: list[ReceiverStatus] | None = None
    ) -> None:
        self.view = view
        self.selection = selection
        self.receivers = receivers or []

    def collect(self) -> Iterator[Metric]:
        s = self.selection
        rows = s.rows(self.view.current_frame(s.where(), collapsed=True))
        view = self.view
        yield from metric_families(
            rows, s.objects(view.objects()), view.rates_version, view.state_tail.version
        )
        if s.health():
            yield from health_families(view, s.brokers, self.receivers)


# What Prometheus sends (OpenMetrics) and what curl sends: the default exposition is
# rendered ahead in both.
PRERENDERED_ACCEPTS = ("application/openmetrics-text; version=1.0.0", "")


class MetricsState:
    """The live view behind the endpoint; one refresh at a time (handlers run in threads).
    Expositions are kept per (table versions, selection, format) until the tables change.
    ``from_state=False`` starts by reading every rates file (a benchmark's baseline).

    Served (``start``), a background thread refreshes the view every ``every_s`` and
    renders the default exposition ahead, so a scrape answers from what is rendered
    (milliseconds at 10,000 queues) instead of reading and rendering while Prometheus
    waits; what it shows lags the tables by at most one refresh. Without ``start`` (tests,
    benchmarks) every scrape refreshes first."""

    def __init__(
        self, data: Path | str, from_state: bool = True, landing: Path | str | None = None
    ) -> None:
        self.view = LiveView(data, max_events=0, from_state=from_state, health=True)
        self.landing = landing
        if landing is None and not storage.is_object_store(os.fspath(data)):
            self.landing = Path(data) / "landing"  # qmf run's layout
        self.receivers: list[ReceiverStatus] = []
        self.lock = threading.Lock()
        self._cache: dict[tuple[Selection, str], bytes] = {}
        self._cache_versions: tuple[Any, ...] | None = None
        self._stamp: tuple[Any, ...] = ()
        self._background = False
        self.refresh_errors = 0

    def _read(self) -> tuple[Any, ...]:
        """Refresh the view and the receivers' statuses: what the expositions depend on."""
        self.view.refresh()
        if self.landing is not None:
            # a receiver whose process died wrote nothing: it is not connected either
            self.receivers = [
                dataclasses.replace(r, connected=r.connected and r.process_alive())
                for r in receiver_statuses(self.landing) if not r.stopped
            ]  # fmt: skip
        up = tuple((r.partition, r.connected) for r in self.receivers)
        self._stamp = (*self.view.versions, up)
        return self._stamp

    def _render(self, selection: Selection, accept: str) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(LiveCollector(self.view, selection, self.receivers))
        return encoder(registry), content_type

    def prepare(self) -> bool:
        """Refresh the view; when the tables changed, render the default exposition in
        every prerendered format. True when something changed."""
        with self.lock:
            stamp = self._read()
            if self._cache_versions == stamp and self._cache:
                return False
            cache: dict[tuple[Selection, str], bytes] = {}
            for accept in PRERENDERED_ACCEPTS:
                body, content_type = self._render(Selection(), accept)
                cache[(Selection(), content_type)] = body
            self._cache = cache  # one assignment: scrapes see the old or the new whole
            self._cache_versions = stamp
            return True

    def start(self, every_s: float) -> threading.Thread:
        """Read the lake now, then keep it read in the background (a daemon thread)."""
        self.prepare()
        self._background = True

        def loop() -> None:
            while True:
                time.sleep(every_s)
                try:
                    self.prepare()
                except Exception as exc:  # a table being rewritten: try again next time
                    self.refresh_errors += 1
                    log.warning("metrics refresh failed (%s); the last exposition stays", exc)

        thread = threading.Thread(target=loop, name="qmf-metrics-refresh", daemon=True)
        thread.start()
        return thread

    def scrape(
        self, selection: Selection | None = None, accept: str | None = None
    ) -> tuple[bytes, str]:
        """The exposition (body, content type), in the format ``accept`` negotiates."""
        selection = selection or Selection()
        _, content_type = choose_encoder(accept or "")
        key = (selection, content_type)
        if self._background:
            body = self._cache.get(key)
            if body is not None:
                return body, content_type
        with self.lock:
            stamp = self._stamp if self._background else self._read()
            if self._cache_versions != stamp:
                self._cache = {}
                self._cache_versions = stamp
            body = self._cache.get(key)
            if body is None:
                body, content_type = self._render(selection, accept or "")
                cache = {} if len(self._cache) >= 32 else dict(self._cache)
                cache[key] = body
                self._cache = cache
            return body, content_type

    def health(self) -> str:
        with self.lock:
            if not self._background:
                self._read()
            return f"ok gold_statistic_rates_version={self.view.rates_version}\n"


def make_server(
    state: MetricsState, host: str, port: int, web: WebConfig | None = None
) -> ThreadingHTTPServer:
    """A threaded HTTP server answering /metrics, /metrics/all and /healthz from ``state``;
    with ``web``, over TLS and/or behind basic authentication."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if web is not None and not web.allows(self.headers.get("Authorization")):
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Basic realm="{REALM}"')
                self.send_header("Content-Length", "13")
                self.end_headers()
                self.wfile.write(b"unauthorized\n")
                return
            try:
                if path == "/healthz":
                    self._send(200, "text/plain; charset=utf-8", state.health().encode())
                    return
                selection = Selection.parse(path, query)
                body, ctype = state.scrape(selection, self.headers.get("Accept"))
                gz = gzip_accepted(self.headers.get("Accept-Encoding") or "")
                self._send(200, ctype, gzip.compress(body) if gz else body, gzip_=gz)
            except LookupError:
                self._send(404, "text/plain; charset=utf-8",
                           b"not found: try /metrics, /metrics/all or /healthz\n")  # fmt: skip
            except SelectionError as exc:
                self._send(400, "text/plain; charset=utf-8", f"bad request: {exc}\n".encode())
            except Exception as exc:  # a scrape error is an HTTP 500, not a dead server
                self._send(500, "text/plain; charset=utf-8", f"error: {exc}\n".encode())

        def _send(self, code: int, content_type: str, body: bytes, gzip_: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            if gzip_:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # no line per scrape

    if web is not None and web.tls:
        server: ThreadingHTTPServer = _TLSServer((host, port), Handler, web.ssl_context())
    else:
        server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


class _TLSServer(ThreadingHTTPServer):
    """Each connection's TLS handshake in its own thread (not in the accepting one, where a
    slow or silent client would hold up every other)."""

    def __init__(self, address: tuple[str, int], handler: Any, context: ssl.SSLContext) -> None:
        super().__init__(address, handler)
        self.context = context

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            request = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return  # a failed handshake (plain HTTP, a wrong client certificate)
        super().finish_request(request, client_address)


def run(args: argparse.Namespace) -> int:
    web = None
    if args.web_config:
        try:
            web = WebConfig.load(args.web_config)
        except WebConfigError as exc:
            print(f"qmf serve-metrics: {exc}", file=sys.stderr)
            return 2
    state = MetricsState(data_location(args.data), landing=args.landing)
    server = make_server(state, args.host, args.port, web)
    host, port = server.server_address[:2]
    scheme = "https" if web is not None and web.tls else "http"
    login = " (basic authentication)" if web is not None and web.users else ""
    print(f"qmf serve-metrics: {scheme}://{host!s}:{port}/metrics{login} (data {args.data})",
          flush=True)  # fmt: skip
    try:
        # Read the lake now (requests wait in the listen queue), then keep it read in the
        # background: every scrape, the first included, answers from what is rendered.
        state.start(args.refresh)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    print("qmf serve-metrics: stopped", file=sys.stderr)
    return 0
