"""Typed event arguments: each value lands in the map of its type, nothing is lost."""

from __future__ import annotations

import uuid

from pipeline.silver.decode import typed_arguments


def test_arguments_split_by_type() -> None:
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    got = typed_arguments({
        "qName": "q1", "depth": 7, "rhost": "10.0.0.1:5672", "durable": True,
        "ratio": 0.25, "big": 1 << 63, "id": u, "props": {"b": 1, "a": [2]}, "none": None,
        "raw": b"\x00\x01",
    })  # fmt: skip
    assert got == {
        "arg_ints": {"depth": 7, "durable": 1},
        "arg_floats": {"ratio": 0.25},
        "arg_texts": {
            "qName": "q1", "rhost": "10.0.0.1:5672", "big": str(1 << 63),
            "id": str(u), "props": '{"a":[2],"b":1}', "raw": "base64:AAE=",
        },
    }  # fmt: skip


def test_no_arguments_give_empty_maps() -> None:
    assert typed_arguments(None) == {"arg_ints": {}, "arg_floats": {}, "arg_texts": {}}
