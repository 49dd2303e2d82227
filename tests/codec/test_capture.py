"""Capture JSON-lines format: read, write, round trip."""

from __future__ import annotations

import io
import os

import pytest

from pipeline.codec.capture import (
    CapturedMessage,
    CaptureError,
    parse_capture,
    read_capture,
    write_capture,
)


def test_sample_round_trips_line_for_line(shared_dir: str) -> None:
    path = os.path.join(shared_dir, "samples", "qpidd-capture-20s.jsonl")
    msgs = list(read_capture(path))
    assert len(msgs) == 863
    assert msgs[0].body[:4] == b"AM2b" and msgs[0].routing_key == "cap-v1reply-0b4aa0e2"
    out = io.StringIO()
    assert write_capture(out, msgs) == 863
    with open(path) as f:
        assert out.getvalue() == f.read()


def test_fields_and_extra_keys(tmp_path: object) -> None:
    m = CapturedMessage(
        body=b"\x00\x01",
        routing_key="k",
        subject="k",
        content_type="amqp/map",
        properties={"app_id": "qmf2"},
        application_properties={"qmf.opcode": "_exception"},
        received_at="2026-11-22T09:02:30.111153Z",
        extra={"note": 1},
    )
    assert m.app_id == "qmf2"
    assert m.received_at_dt is not None and m.received_at_dt.microsecond == 111153
    (back,) = parse_capture([__import__("json").dumps(m.to_json())])
    assert back == m


def test_bad_lines_name_their_number() -> None:
    with pytest.raises(CaptureError, match="line 2: not JSON"):
        list(parse_capture(['{"body_base64": ""}', "{oops"]))
    with pytest.raises(CaptureError, match="line 1: capture record needs body_base64"):
        list(parse_capture(['{"routing_key": "x"}']))
    with pytest.raises(CaptureError, match="line 1: bad body_base64"):
        list(parse_capture(['{"body_base64": "!!"}']))
