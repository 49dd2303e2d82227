"""A running pipeline, watched: ``qmf top``, ``qmf serve-metrics`` and a real Prometheus
(Debian's package, started here on loopback) alerting on it. One ``qmf run`` serves all
(it is the suite's longest kind of setup).

``qmf run`` (the whole pipeline: receiver, bronze, silver, gold) on simulated v2 agents
publishing every 2 s; ``qmf serve-metrics`` over TLS behind basic authentication
(``--web-config``); Prometheus scraping it every second with the credentials and the
CA, and evaluating the rules ``qmf alert-rules`` makes (short windows: a stall over
12 s). While everything is healthy no alert is pending or firing, and ``qmf top`` and
the endpoint show gold's numbers at the versions they read, while gold grows. Then
SIGUSR1 to ``qmf run``: from the agents' next interval one agent's broker is gone and
one queue of the other loses its consumer (``--stop 1:signal --stall 0:signal``).
Prometheus's API must then report exactly QmfAgentDown for that agent, QmfQueueStalled
for that queue and QmfBrokerEvent for the queueThresholdExceeded (warn) that queue
raises once it fills, nothing else, ever. A second scrape job with a wrong
password is refused (401). The figures (signal to firing) are printed and in
docs/alerts.md. ``qmf run`` then stops cleanly on SIGINT.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from pipeline.broker import free_port
from pipeline.commands.top import format_rate
from pipeline.views.alerts import AlertThresholds, render
from tests.integration.e2e import node_env
from tests.test_live import (
    compare_at_version,
    exposed_queues,
    gold_queues,
    parse_exposition,
    shown_queues,
    text_rows,
)
from tests.test_webconfig import certificate

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

PASSWORD = "scrape me"
INTERVAL_S = 2
STALL_S = 12  # the stall window: healthy (no alert) for twice that before the faults
THRESHOLDS = AlertThresholds(
    agent_missed_cycles=3, queue_stall_window=f"{STALL_S}s", evaluation_interval="1s",
    queue_depth=1e9, queue_growth_per_second=1e6, pipeline_lag_seconds=600,
)  # fmt: skip
EXPECTED = {"QmfAgentDown", "QmfQueueStalled", "QmfBrokerEvent"}



def quarantined(data: Path) -> list[tuple[str, str, int | None]]:
    """What silver quarantined (error, reason, body size): the cause when that alert fires."""
    from deltalake import DeltaTable

    table = data / "silver" / "quarantine"
    if not (table / "_delta_log").exists():
        return []
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["error", "reason", "body"]).to_pylist()
    return [(r["error"], r["reason"], len(r["body"]) if r["body"] is not None else None) for r in rows]


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]


def prometheus_config(folder: Path, metrics_port: int, ca: Path) -> Path:
    (folder / "password").write_text(PASSWORD)
    (folder / "wrong").write_text("not the password")
    (folder / "rules.yml").write_text(render(THRESHOLDS))

    def job(name: str, password_file: str) -> str:
        return (
            f"  - job_name: {name}\n    scheme: https\n    tls_config:\n      ca_file: {ca}\n"
            f"    basic_auth:\n      username: prometheus\n      password_file: {folder / password_file}\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
        )

    cfg = folder / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {folder / 'rules.yml'}\nscrape_configs:\n"
        + job("qmf", "password") + job("qmf-wrong-password", "wrong")
    )
    return cfg


@pytest.mark.timeout(1800)
def test_top_metrics_and_prometheus_follow_a_running_pipeline_and_alert_on_its_faults(
    isolated_broker: Any, tmp_path: Path
) -> None:
    """On a node of its own: ``qmf run`` binds to the management exchanges, where other
    tests publish (their messages were quarantined here, and that alert fired)."""
    from pipeline.broker import delete_queue

    tool = shutil.which("prometheus")
    assert tool, "prometheus is missing: bash tools/setup.sh installs Debian's package"
    cert, _key = certificate(tmp_path)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                   f"basic_auth_users:\n  prometheus: '{hashed}'\n")  # fmt: skip
    metrics_port, prom_port = free_port(), free_port()
    cfg = prometheus_config(tmp_path, metrics_port, cert)
    check = subprocess.run([str(Path(tool).parent / "promtool"), "check", "config", str(cfg)],
                           capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr

    data = tmp_path / "data"
    queue = f"qmf.test-alerts-{uuid.uuid4().hex[:8]}"
    qmf = [sys.executable, "-m", "pipeline.cli"]
    env = node_env(isolated_broker)
    logs = {name: open(tmp_path / f"{name}.log", "w", encoding="utf-8")
            for name in ("run", "metrics", "prometheus")}  # fmt: skip
    procs: dict[str, subprocess.Popen[str]] = {}

    def start(name: str, cmd: list[str]) -> None:
        procs[name] = subprocess.Popen(cmd, stdout=logs[name], stderr=subprocess.STDOUT,
                                       env=env, text=True)  # fmt: skip

    def alive() -> None:
        for name, p in procs.items():
            assert p.poll() is None, (name, (tmp_path / f"{name}.log").read_text()[-3000:])

    base = f"http://127.0.0.1:{prom_port}/api/v1"
    try:
        start("run", [*qmf, "run", "--data", str(data), "--queue", queue, "--duration", "900",
                      "--dialect", "v2", "--agents", "2", "--queues", "8",
                      "--interval", str(INTERVAL_S), "--events", "0", "--progress", "30",
                      "--stop", "1:signal", "--stall", "0:signal"])  # fmt: skip
        start("metrics", [*qmf, "serve-metrics", "--data", str(data), "--port", str(metrics_port),
                          "--web-config", str(web), "--refresh", "1"])  # fmt: skip
        start("prometheus", [tool, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])  # fmt: skip

        def alerts() -> list[dict[str, Any]]:
            got: list[dict[str, Any]] = api(base, "/alerts")["alerts"]
            return got

        def query(expr: str) -> list[dict[str, Any]]:
            got: list[dict[str, Any]] = api(base, "/query", query=expr)["result"]
            return got

        # Healthy: both agents up and queues dequeuing, for longer than the stall window;
        # no alert pending or firing at any point.
        deadline, healthy_since = time.monotonic() + 900, None
        while healthy_since is None or time.monotonic() - healthy_since < 2 * STALL_S:
            alive()
            assert time.monotonic() < deadline, "the pipeline never became healthy"
            try:
                assert alerts() == [], "an alert before any fault"
                up = query("qmf_agent_up == 1")
                dequeuing = query('qmf_statistic_rate_per_second{class="queue",statistic="msgTotalDequeues"} > 0')
            except OSError:  # Prometheus still starting
                up = dequeuing = []
            if len(up) == 2 and dequeuing:
                healthy_since = healthy_since or time.monotonic()
            else:
                healthy_since = None
            time.sleep(1)
        brokers = {r["metric"]["agent"]: r["metric"]["broker"] for r in query("qmf_agent_up")}

        # qmf top while the pipeline writes: the numbers of the gold version it read.
        top = subprocess.run([*qmf, "top", "--once", "--json", "--data", str(data),
                              "--limit", "100"], capture_output=True, text=True, env=env,
                             timeout=120, check=True)  # fmt: skip
        frame = json.loads(top.stdout)
        assert compare_at_version(data, frame["rates_version"], frame["state_version"],
                                  shown_queues(frame)) >= 1  # fmt: skip
        text = subprocess.run([*qmf, "top", "--once", "--data", str(data), "--limit", "100"],
                              capture_output=True, text=True, env=env, timeout=120,
                              check=True).stdout  # fmt: skip
        m = re.search(r"gold v(\d+)", text)
        assert m is not None, text
        rows = text_rows(text)
        assert rows
        for key, q in gold_queues(data, int(m.group(1))).items():
            if key in rows and q["msgTotalEnqueues"] is not None:
                assert rows[key][0] == format_rate(q["msgTotalEnqueues"])
        # The endpoint Prometheus scrapes, scraped here too (TLS, credentials) while gold
        # grows: the numbers of the versions it read, in both formats.
        ctx = ssl.create_default_context(cafile=str(cert))
        auth = "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
        for accept in ("application/openmetrics-text; version=1.0.0", "text/plain", ""):
            req = urllib.request.Request(f"https://127.0.0.1:{metrics_port}/metrics",
                                         headers={"Accept": accept, "Authorization": auth})  # fmt: skip
            with urllib.request.urlopen(req, timeout=60, context=ctx) as resp:
                parsed = parse_exposition(resp.read().decode(), openmetrics=bool(accept) and "open" in accept)
            version = next(int(v) for n, _, v in parsed if n == "qmf_live_rates_version")
            state = next(int(v) for n, _, v in parsed if n == "qmf_live_state_version")
            assert compare_at_version(data, version, state, exposed_queues(parsed)) >= 1
            time.sleep(2)
        assert alerts() == [], "an alert before any fault"

        # The faults: from the agents' next interval.
        os.kill(procs["run"].pid, signal.SIGUSR1)
        signalled = time.time()
        manifest = data / "sim-manifest.jsonl"
        faults: dict[str, dict[str, Any]] = {}
        while len(faults) < 2:
            assert time.time() - signalled < 30, "the simulator never applied the faults"
            faults = {r["kind"]: r for line in manifest.read_text().splitlines()
                      if (r := json.loads(line))["kind"] in ("stop", "stall")}  # fmt: skip
            time.sleep(0.5)
        stopped, stall = faults["stop"]["agent"], faults["stall"]
        assert stopped in brokers and stall["agent"] in brokers and stall["queue"]
        want = {
            ("QmfAgentDown", stopped, brokers[stopped]),
            ("QmfQueueStalled", stall["queue"], brokers[stall["agent"]]),
            # the stalled queue passes its threshold: qpidd's queueThresholdExceeded (warn)
            ("QmfBrokerEvent", "queueThresholdExceeded", brokers[stall["agent"]]),
        }
        key_label = {"QmfAgentDown": "agent", "QmfQueueStalled": "name", "QmfBrokerEvent": "event"}
        firing_at: dict[str, float] = {}
        while set(firing_at) != EXPECTED:
            alive()
            assert time.time() - signalled < 240, f"firing after 240 s: {sorted(firing_at)}"
            for a in alerts():
                labels = a["labels"]
                key = labels.get(key_label.get(labels["alertname"], "-"))
                assert (labels["alertname"], key, labels.get("broker")) in want, (
                    a, quarantined(data))  # nothing else
                if a["state"] == "firing":
                    firing_at.setdefault(labels["alertname"], time.time())
            time.sleep(0.5)
        # Exactly those, once each, firing together.
        now = alerts()
        assert sorted((a["labels"]["alertname"], a["state"]) for a in now) == [
            ("QmfAgentDown", "firing"), ("QmfBrokerEvent", "firing"), ("QmfQueueStalled", "firing")]
        down = next(a for a in now if a["labels"]["alertname"] == "QmfAgentDown")
        assert down["labels"]["severity"] == "critical"
        assert down["annotations"]["summary"] == (
            f"QMF agent {stopped} of {brokers[stopped]} stopped publishing")

        # The job with the wrong password is refused by the endpoint; the right one is up.
        targets = {t["labels"]["job"]: t for t in api(base, "/targets")["activeTargets"]}
        assert targets["qmf"]["health"] == "up", targets["qmf"]
        assert targets["qmf-wrong-password"]["health"] == "down"
        assert "401" in targets["qmf-wrong-password"]["lastError"]
        print(f"\nsignal to firing: QmfAgentDown {firing_at['QmfAgentDown'] - signalled:.1f} s, "
              f"QmfQueueStalled {firing_at['QmfQueueStalled'] - signalled:.1f} s, "
              f"QmfBrokerEvent {firing_at['QmfBrokerEvent'] - signalled:.1f} s "
              f"(interval {INTERVAL_S} s, {THRESHOLDS.agent_missed_cycles:g} missed cycles, "
              f"stall window {THRESHOLDS.queue_stall_window})")  # fmt: skip
    finally:
        for name in ("prometheus", "metrics"):
            if name in procs and procs[name].poll() is None:
                procs[name].terminate()
                procs[name].wait(timeout=60)
        rc = None
        if "run" in procs:
            if procs["run"].poll() is None:
                procs["run"].send_signal(signal.SIGINT)  # stops cleanly: drain, summary
            rc = procs["run"].wait(timeout=900)
        for fh in logs.values():
            fh.close()
        delete_queue(queue, cfg=isolated_broker)
    output = (tmp_path / "run.log").read_text()
    assert rc == 0, output[-3000:]
    assert "qmf run: done." in output
