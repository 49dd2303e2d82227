"""``qmf serve-metrics``: the latest rate and gauge per object for Prometheus and OpenMetrics.

An HTTP endpoint (``/metrics``) existing dashboards scrape: for every object
and counter statistic the rate of its latest gold interval
(``qmf_statistic_rate_per_second``; 0 once its agent was seen more than 1.5
publish cycles after the interval's end without a new sample of the object:
unchanged, ``pipeline.live.with_quiet``), for every other
statistic (gauges, watermarks, min/max/average) its latest value
(``qmf_statistic_value``).
Labels: agent, package, class, object_id, name (from the index key),
statistic. Each scrape reads what the tables gained since the previous one
(``pipeline.live``). A client that accepts ``application/openmetrics-text``
gets OpenMetrics 1.0 (ending in ``# EOF``), any other the Prometheus text
format 0.0.4. ``/healthz`` answers ``ok`` with the table version read.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.live import LiveView, key_name

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
RATE_METRIC = "qmf_statistic_rate_per_second"
VALUE_METRIC = "qmf_statistic_value"
LABELS = ("agent", "package", "class", "object_id", "name", "statistic")
VERSION_METRIC = "qmf_live_rates_version"
HELP = {
    RATE_METRIC: "Rate of a QMF counter statistic over its latest gold interval (per second); "
    "0 once its agent was seen 1.5 publish cycles after it without the object (unchanged).",
    VALUE_METRIC: "Latest value of a QMF gauge, watermark or min/max/average statistic.",
    VERSION_METRIC: "Delta version of gold statistic_rates this exposition was read at.",
}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve-metrics", help="OpenMetrics/Prometheus endpoint of the latest rates and gauges",
        description=__doc__,
    )  # fmt: skip
    p.add_argument("--data", default="data", help="folder qmf run writes (./data)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=9469, help="port to listen on (0: any free)")
    p.set_defaults(func=run)


def escape_label(value: str) -> str:
    """A label value as both text formats want it: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def samples(latest: pa.Table) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Metric name -> (labels, value) of the current rows (one per series and statistic).

    Counters without a rate (their latest interval was a reset) are left out:
    their rate is unknown until the next interval. Two rows with the same
    labels (an object's series before and after its index key was known) keep
    the later one.
    """
    out: dict[str, list[tuple[dict[str, str], float]]] = {RATE_METRIC: [], VALUE_METRIC: []}
    if latest.num_rows == 0:
        return out
    t = latest.sort_by([("end_ns", "ascending")])
    counter = pc.equal(t.column("kind"), "counter")
    value = pc.if_else(counter, t.column("rate"), t.column("value"))
    t = t.append_column("_metric_value", value).filter(pc.is_valid(value))
    seen: dict[tuple[str, tuple[str, ...]], int] = {}
    for r in t.to_pylist():
        metric = RATE_METRIC if r["kind"] == "counter" else VALUE_METRIC
        labels = {
            "agent": r["agent"],
            "package": r["package"],
            "class": r["class_name"],
            "object_id": r["object_id"],
            "name": key_name(r["index_key"], r["object_id"]),
            "statistic": r["statistic"],
        }
        k = (metric, tuple(labels.values()))
        entry = (labels, float(r["_metric_value"]))
        if k in seen:  # sorted by time: the later row wins
            out[metric][seen[k]] = entry
        else:
            seen[k] = len(out[metric])
            out[metric].append(entry)
    for rows in out.values():
        rows.sort(key=lambda e: tuple(e[0].values()))
    return out


def exposition(latest: pa.Table, openmetrics: bool, version: int | None = None) -> str:
    """The text exposition of the current rows in either format (``version``: of the
    gold rates table read, exposed as ``qmf_live_rates_version`` when known)."""
    families = samples(latest)
    if version is not None:
        families[VERSION_METRIC] = [({}, float(version))]
    lines: list[str] = []
    for metric, rows in families.items():
        lines.append(f"# HELP {metric} {escape_help(HELP[metric])}")
        lines.append(f"# TYPE {metric} gauge")
        lines.extend(_sample_lines(metric, rows))
    if openmetrics:
        lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _sample_lines(metric: str, rows: Iterable[tuple[dict[str, str], float]]) -> Iterable[str]:
    for labels, value in rows:
        body = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
        yield (
            f"{metric}{{{body}}} {format_value(value)}"
            if body
            else f"{metric} {format_value(value)}"
        )


def wants_openmetrics(accept: str | None) -> bool:
    return bool(accept) and "application/openmetrics-text" in (accept or "")


class MetricsState:
    """The live view behind the endpoint; one refresh at a time (handlers run in threads)."""

    def __init__(self, data: Path) -> None:
        self.view = LiveView(data)
        self.lock = threading.Lock()
        self._cache: dict[bool, tuple[tuple[int | None, ...], str]] = {}

    def scrape(self, openmetrics: bool) -> str:
        """The exposition now; the same text again while the tables have not changed."""
        with self.lock:
            self.view.refresh()
            key = self.view.versions
            cached = self._cache.get(openmetrics)
            if cached is None or cached[0] != key:
                text = exposition(self.view.current(), openmetrics, self.view.rates_version)
                self._cache[openmetrics] = cached = (key, text)
            return cached[1]

    def health(self) -> str:
        with self.lock:
            self.view.refresh()
            return f"ok gold_statistic_rates_version={self.view.rates_version}\n"


def make_server(state: MetricsState, host: str, port: int) -> ThreadingHTTPServer:
    """A threaded HTTP server answering /metrics and /healthz from ``state``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
                if path == "/metrics":
                    om = wants_openmetrics(self.headers.get("Accept"))
                    self._send(200, OPENMETRICS if om else PROMETHEUS, state.scrape(om))
                elif path == "/healthz":
                    self._send(200, "text/plain; charset=utf-8", state.health())
                else:
                    self._send(404, "text/plain; charset=utf-8", "not found: try /metrics\n")
            except Exception as exc:  # a scrape error is an HTTP 500, not a dead server
                self._send(500, "text/plain; charset=utf-8", f"error: {exc}\n")

        def _send(self, code: int, content_type: str, text: str) -> None:
            body = text.encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # no line per scrape

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def run(args: argparse.Namespace) -> int:
    server = make_server(MetricsState(Path(args.data)), args.host, args.port)
    host, port = server.server_address[:2]
    print(f"qmf serve-metrics: http://{host!s}:{port}/metrics (data {args.data})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    print("qmf serve-metrics: stopped", file=sys.stderr)
    return 0
