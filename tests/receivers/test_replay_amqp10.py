"""`qmf replay` of real qpidd AMQP 1.0 captures through the broker to `qmf receive`.

qpidd sends QMF v2 bodies as an amqp-value section; the receiver lands them
AMQP 1.0 encoded with ``x-qmf-body-encoding: amqp-1.0``. Replay must send them
as amqp-value again so that the landing log holds the same bytes with the same
flag, message for message (twins included). Everything goes through
``amq.topic``, an exchange no other test publishes to, so traffic of tests
running beside this one never reaches the receiver.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline.codec.amqp10 import BODY_ENCODING_PROPERTY
from tests.receivers.test_receiver_broker import (
    REPO,
    ReceiverProcess,
    landed_rows,
    landed_table,
    wait_for,
)

pytestmark = pytest.mark.broker

SAMPLES = ("default-60s", "qmf1-qmf2-60s")


def _captured(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_replayed_qpidd_captures_land_byte_identical_with_their_flags(
    broker: Any, shared_dir: str, tmp_path: Path
) -> None:
    files = [Path(shared_dir) / "samples" / "qpidd-amqp10" / f"{s}.jsonl" for s in SAMPLES]
    recs = [r for f in files for r in _captured(f)]
    assert len(recs) == 618 + 1143
    root = tmp_path / "landing"
    rx = ReceiverProcess(
        tmp_path, "receive",
        ["--url", broker.url, "--bind", "amq.topic:#", "--landing", str(root),
         "--partition", "p0", "--flush-ms", "20"],
    )  # fmt: skip
    try:
        rx.wait_ready()
        for f in files:
            out = subprocess.run(
                [sys.executable, "-m", "pipeline.cli", "replay", "--url", broker.url,
                 "--input", str(f), "--route", "=amq.topic"],
                cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
        wait_for(lambda: landed_rows(root) >= len(recs), 120, f"{len(recs)} landed")
        rx.signal(signal.SIGTERM)
        assert rx.wait() == 0, rx.stderr()
    finally:
        rx.kill()
    t = landed_table(root)
    assert t.num_rows == len(recs)
    flags = [dict(p).get(BODY_ENCODING_PROPERTY) for p in t.column("application_properties").to_pylist()]  # fmt: skip
    landed = Counter(zip(t.column("body").to_pylist(), flags, strict=True))
    want = Counter(
        (base64.b64decode(r["body_base64"]), r["application_properties"].get(BODY_ENCODING_PROPERTY))
        for r in recs
    )  # fmt: skip
    assert landed == want
    assert sum(want.values()) - len(want) > 0, "the captures hold twins; each must land"
    assert Counter(flags) == {"amqp-1.0": 2 * 523, None: 618 + 1143 - 2 * 523}
    # the rest of the message too: routing keys, content types, v2 application properties
    props = [
        {k: v for k, v in dict(p).items() if k != BODY_ENCODING_PROPERTY}
        for p in t.column("application_properties").to_pylist()
    ]
    assert Counter(
        zip(t.column("routing_key").to_pylist(), t.column("content_type").to_pylist(),
            [json.dumps(p, sort_keys=True) for p in props], strict=True)
    ) == Counter(
        (r["routing_key"], r.get("content_type"),
         json.dumps({k: v for k, v in r["application_properties"].items()
                     if k != BODY_ENCODING_PROPERTY}, sort_keys=True))
        for r in recs
    )  # fmt: skip
