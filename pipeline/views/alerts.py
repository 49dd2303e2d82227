"""Prometheus alert rules over what ``qmf serve-metrics`` exposes, from one set of thresholds.

What operators of Qpid brokers alert on, as QMF publishes it: an agent that stopped
publishing, a queue that fills while nothing takes from it, a queue over its depth or
growing fast, broker events of severity warn or worse, a pipeline that falls behind its
brokers or starts quarantining messages. ``AlertThresholds`` holds every number and
window (checked when made: a bad value is one error naming the key); ``rules`` renders
the rules file Prometheus loads (``qmf alert-rules``); ``deploy/prometheus/`` holds the
file of the default thresholds and its ``promtool test rules`` cases. docs/alerts.md
says what each rule means.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.views.live import SEVERITIES

DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")  # Prometheus's duration syntax
QUEUE_DEPTH = 'qmf_statistic_value{class="queue",statistic="msgDepth"}'
QUEUE_DEQUEUES = 'qmf_statistic_rate_per_second{class="queue",statistic="msgTotalDequeues"}'
GROUP = "qmf"


class ThresholdError(ValueError):
    """A threshold that cannot make a rule (the message names the key)."""


@dataclass(frozen=True)
class AlertThresholds:
    """Every threshold of the rules. Durations in Prometheus's syntax ("30s", "5m")."""

    # QmfAgentDown: the agent missed this many publish cycles (its silence).
    agent_missed_cycles: float = 3.0
    # QmfQueueStalled: over this window the depth grew and no message was dequeued.
    queue_stall_window: str = "5m"
    # QmfQueueDepthHigh: depth above this for queue_depth_for.
    queue_depth: float = 10000.0
    queue_depth_for: str = "5m"
    # QmfQueueGrowing: depth growing faster than this (messages/s) over the window.
    queue_growth_per_second: float = 50.0
    queue_growth_window: str = "10m"
    # QmfBrokerEvent: events of this severity or worse within the window.
    event_severity: str = "warn"
    event_window: str = "10m"
    # QmfPipelineLag: the newest time gold holds of a landing broker is this far behind.
    pipeline_lag_seconds: float = 300.0
    pipeline_lag_for: str = "1m"
    # QmfQuarantineGrowing: messages quarantined within the window.
    quarantine_window: str = "15m"
    # QmfReceiverDisconnected: a receiver not connected to its broker for this long.
    receiver_down_for: str = "1m"
    # How often Prometheus evaluates the group (None: its global evaluation_interval).
    evaluation_interval: str | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "event_severity":
                if value not in SEVERITIES:
                    raise ThresholdError(f"event_severity = {value!r}: one of {', '.join(SEVERITIES)}")
            elif f.type == "float":
                if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                    raise ThresholdError(f"{f.name} = {value!r}: must be a number above 0")
            elif value is not None and (not isinstance(value, str) or not DURATION.match(value)):
                raise ThresholdError(
                    f"{f.name} = {value!r}: must be a Prometheus duration such as 30s, 5m or 1h"
                )

    @classmethod
    def load(cls, path: str | Path) -> AlertThresholds:
        """Thresholds from a TOML file (keys as the fields; those missing keep their
        defaults); a bad file, an unknown key or a bad value is one ``ThresholdError``."""
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ThresholdError(f"{path}: {exc}") from exc
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ThresholdError(f"{path}: unknown keys {unknown}: use {', '.join(sorted(known))}")
        values: dict[str, Any] = {
            k: float(v) if k in _NUMBERS and isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in data.items()
        }
        try:
            return cls(**values)
        except ThresholdError as exc:
            raise ThresholdError(f"{path}: {exc}") from exc


_NUMBERS = frozenset(f.name for f in dataclasses.fields(AlertThresholds) if f.type == "float")


def _at_least(severity: str) -> str:
    """A label regex of ``severity`` and every worse one (QMF: 0 emerg .. 7 debug)."""
    return "|".join(SEVERITIES[: SEVERITIES.index(severity) + 1])


def _new_or_grew(metric: str, window: str) -> str:
    """A counter that grew within ``window``, or whose series appeared within it above 0
    (``increase`` cannot see a series' first sample)."""
    return f"increase({metric}[{window}]) > 0 or ({metric} > 0 unless {metric} offset {window})"


def rules(t: AlertThresholds | None = None) -> dict[str, Any]:
    """The rules file (as YAML loads it) for thresholds ``t`` (default: the defaults)."""
    t = t or AlertThresholds()
    events = f'qmf_events_total{{event_severity=~"{_at_least(t.event_severity)}"}}'
    group: dict[str, Any] = {"name": GROUP}
    if t.evaluation_interval is not None:
        group["interval"] = t.evaluation_interval
    group["rules"] = [
        {
            "alert": "QmfAgentDown",
            "expr": f"qmf_agent_silence_seconds > {t.agent_missed_cycles:g} * qmf_agent_publish_interval_seconds",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "QMF agent {{ $labels.agent }} of {{ $labels.broker }} stopped publishing",
                "description": "No heartbeat or sample for {{ $value | humanizeDuration }} while "
                f"the other agents of landing broker {{{{ $labels.broker_name }}}} published "
                f"(more than {t.agent_missed_cycles:g} publish cycles).",
            },
        },
        {
            "alert": "QmfQueueStalled",
            "expr": f"(delta({QUEUE_DEPTH}[{t.queue_stall_window}]) > 0) and on (broker, name) "
            f"(max_over_time({QUEUE_DEQUEUES}[{t.queue_stall_window}]) == 0)",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "Queue {{ $labels.name }} on {{ $labels.broker }} fills and nothing consumes",
                "description": f"Its depth grew by {{{{ $value }}}} messages over {t.queue_stall_window} "
                "with no message dequeued.",
            },
        },
        {
            "alert": "QmfQueueDepthHigh",
            "expr": f"{QUEUE_DEPTH} > {t.queue_depth:g}",
            "for": t.queue_depth_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "Queue {{ $labels.name }} on {{ $labels.broker }} holds {{ $value }} messages",
                "description": f"Over {t.queue_depth:g} messages for {t.queue_depth_for}.",
            },
        },
        {
            "alert": "QmfQueueGrowing",
            "expr": f"deriv({QUEUE_DEPTH}[{t.queue_growth_window}]) > {t.queue_growth_per_second:g}",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "Queue {{ $labels.name }} on {{ $labels.broker }} grows by {{ $value }} messages/s",
                "description": f"Its depth grew faster than {t.queue_growth_per_second:g} messages/s "
                f"over {t.queue_growth_window}.",
            },
        },
        {
            "alert": "QmfBrokerEvent",
            "expr": _new_or_grew(events, t.event_window),
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.broker }} raised {{ $labels.event }} ({{ $labels.event_severity }})",
                "description": f"QMF events {{{{ $labels.event }}}} of severity {t.event_severity} or "
                f"worse within {t.event_window} (silver's events table holds them).",
            },
        },
        {
            "alert": "QmfPipelineLag",
            "expr": f"time() - qmf_pipeline_newest_timestamp_seconds > {t.pipeline_lag_seconds:g}",
            "for": t.pipeline_lag_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "Nothing new from {{ $labels.broker_name }} in gold for {{ $value | humanizeDuration }}",
                "description": "Gold's newest data of the landing broker is over "
                f"{t.pipeline_lag_seconds:g} s old: its receiver is disconnected, the broker "
                "or every agent on it stopped, or a job fell behind.",
            },
        },
        {
            "alert": "QmfQuarantineGrowing",
            "expr": _new_or_grew("qmf_quarantined_messages_total", t.quarantine_window),
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "Messages from {{ $labels.broker_name }} are quarantined",
                "description": f"Silver quarantined undecodable messages within {t.quarantine_window} "
                "(silver's quarantine table holds each with its bytes and reason).",
            },
        },
        {
            "alert": "QmfReceiverDisconnected",
            "expr": "qmf_receiver_connected == 0",
            "for": t.receiver_down_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "The receiver of {{ $labels.broker_name }} ({{ $labels.partition }}) is "
                "not connected",
                "description": f"Not connected to its broker for {t.receiver_down_for} (reconnecting, "
                "or its process is gone): nothing from that broker lands.",
            },
        },
    ]
    return {"groups": [group]}


def render(t: AlertThresholds | None = None) -> str:
    """The rules file's text: a header, then the rules as YAML."""
    head = (
        "# Prometheus alert rules for qmf serve-metrics (docs/alerts.md). Made by\n"
        "# `qmf alert-rules`"
        + ("" if t is None or t == AlertThresholds() else " --config <thresholds>")
        + "; edit the thresholds, not this file.\n"
    )
    body: str = yaml.safe_dump(rules(t), sort_keys=False, width=100)
    return head + body


__all__ = ["AlertThresholds", "ThresholdError", "render", "rules"]
