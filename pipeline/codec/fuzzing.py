"""Fuzzing the codec with mutated and truncated real messages (used by tests and tools/fuzz_codec.py).

Each case mutates one message of a capture and checks the codec's contract:

1. ``decode_message`` never raises; every problem is one of the codec's errors;
2. the records decoded before the first changed byte equal the original
   message's records there (a bad record never hides the good ones before it);
3. a mutated message that decodes without problems re-encodes to exactly its
   bytes (decoding is strict enough to be lossless). Messages holding a NaN
   float are exempt from 3 (a float32 signalling NaN cannot survive Python's
   float) and counted apart.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.codec import errors
from pipeline.codec.capture import CapturedMessage
from pipeline.codec.message import DecodeResult, decode_message, encode_message
from pipeline.codec.records import MethodRequest, MethodResponse, Record
from pipeline.codec.schema import SchemaRegistry
from pipeline.codec.v1 import encode_record
from pipeline.codec.v2 import V2Encoded

CODEC_ERRORS = frozenset(
    name
    for name, obj in vars(errors).items()
    if isinstance(obj, type) and issubclass(obj, errors.CodecError)
)
INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xFF, 0xFE, 0x14, 0x15, 0x16, 0xA8, 0xA9, 0xAA, 0x90)


@dataclass
class Base:
    """One original message, decoded once, with the end offset of each v1 record."""

    msg: CapturedMessage
    records: list[Record]
    ends: list[int]


def prepare(messages: Sequence[CapturedMessage]) -> tuple[list[Base], SchemaRegistry]:
    """Decode the capture once (in order, so schemas precede content); keep cleanly decoded messages."""
    reg = SchemaRegistry()
    bases = []
    for m in messages:
        res = m.decode(reg)
        if res.problems or not res.records:
            continue
        ends: list[int] = []
        if res.dialect in ("AM1", "AM2"):
            at = 0
            for r in res.records:
                at += len(encode_record(r, reg))
                ends.append(at)
        bases.append(Base(m, res.records, ends))
    return bases, reg


def _truncate(rng: random.Random, b: bytes) -> bytes:
    return b[: rng.randrange(len(b))]


def _flip(rng: random.Random, b: bytes) -> bytes:
    out = bytearray(b)
    for _ in range(rng.randint(1, 4)):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def _overwrite(rng: random.Random, b: bytes) -> bytes:
    out = bytearray(b)
    for _ in range(rng.randint(1, 3)):
        out[rng.randrange(len(out))] = (
            rng.choice(INTERESTING) if rng.random() < 0.6 else rng.randrange(256)
        )
    return bytes(out)


def _insert(rng: random.Random, b: bytes) -> bytes:
    at = rng.randrange(len(b) + 1)
    return b[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) + b[at:]


def _delete(rng: random.Random, b: bytes) -> bytes:
    at = rng.randrange(len(b))
    return b[:at] + b[at + rng.randint(1, 16) :]


def _duplicate(rng: random.Random, b: bytes) -> bytes:
    at = rng.randrange(len(b))
    n = rng.randint(1, 64)
    return b[: at + n] + b[at : at + n] + b[at + n :]


def _size_field(rng: random.Random, b: bytes) -> bytes:
    """Overwrite 4 bytes with a boundary u32 (hits map/list/array sizes and counts)."""
    if len(b) < 4:
        return _flip(rng, b)
    at = rng.randrange(len(b) - 3)
    v = rng.choice((0, 1, 3, 4, 5, 0x7FFFFFFF, 0xFFFFFFFF, len(b), len(b) - at))
    return b[:at] + v.to_bytes(4, "big") + b[at + 4 :]


MUTATIONS: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "truncate": _truncate,
    "flip": _flip,
    "overwrite": _overwrite,
    "insert": _insert,
    "delete": _delete,
    "duplicate": _duplicate,
    "size_field": _size_field,
}


def _has_nan(v: Any, depth: int = 0) -> bool:
    if depth > 50:
        return False
    if isinstance(v, float):
        return math.isnan(v)
    if isinstance(v, dict):
        return any(_has_nan(x, depth + 1) for x in v.values())
    if isinstance(v, list | tuple):
        return any(_has_nan(x, depth + 1) for x in v)
    for name in ("values", "arguments", "value", "attributes", "body"):
        if hasattr(v, name) and _has_nan(getattr(v, name), depth + 1):
            return True
    return False


@dataclass
class FuzzStats:
    cases: int = 0
    by_mutation: Counter[str] = field(default_factory=Counter)
    problems_by_error: Counter[str] = field(default_factory=Counter)
    clean: int = 0
    reencoded_exact: int = 0
    nan_exempt: int = 0
    prefix_checked: int = 0
    records_before_problem: int = 0
    failures: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "by_mutation": dict(sorted(self.by_mutation.items())),
            "problems_by_error": dict(sorted(self.problems_by_error.items())),
            "decoded_without_problem": self.clean,
            "reencoded_byte_exact": self.reencoded_exact,
            "nan_exempt": self.nan_exempt,
            "prefix_checked": self.prefix_checked,
            "good_records_kept_before_a_problem": self.records_before_problem,
            "failures": len(self.failures),
        }


def _open_ended(rec: Record) -> bool:
    """v1 records whose raw-argument tail runs to the end of the message (no length on the wire)."""
    return isinstance(rec, MethodResponse | MethodRequest) and rec.arguments is None


def _first_diff(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    for i in range(0, n, 64):  # compare in blocks: no per-byte loop on the common prefix
        if a[i : i + 64] != b[i : i + 64]:
            for j in range(i, min(i + 64, n)):
                if a[j] != b[j]:
                    return j
    return n


def run_case(
    base: Base,
    registry: SchemaRegistry,
    rng: random.Random,
    stats: FuzzStats,
    max_failures: int = 20,
) -> None:
    """Mutate one message and check the contract; failures are appended to ``stats.failures``."""
    name = rng.choice(sorted(MUTATIONS))
    body = base.msg.body
    mutated = MUTATIONS[name](rng, body) if body else body
    stats.cases += 1
    stats.by_mutation[name] += 1
    reg = registry.copy()
    m = base.msg
    try:
        res: DecodeResult = decode_message(
            mutated,
            registry=reg,
            application_properties=m.application_properties,
            content_type=m.content_type,
            app_id=m.app_id,
            routing_key=m.routing_key,
        )
    except Exception as exc:  # the contract under test: nothing may escape
        if len(stats.failures) < max_failures:
            stats.failures.append(
                f"{name}: raised {type(exc).__name__}: {exc} body={mutated[:64].hex()}"
            )
        return
    for p in res.problems:
        stats.problems_by_error[p.error] += 1
        if p.error not in CODEC_ERRORS and len(stats.failures) < max_failures:
            stats.failures.append(f"{name}: non-codec problem {p}")
    if res.problems:
        stats.records_before_problem += len(res.records)
    # records wholly before the first changed byte are unchanged
    if base.ends and res.dialect in ("AM1", "AM2"):
        at = _first_diff(body, mutated)
        k = 0
        for rec, end in zip(base.records, base.ends, strict=True):
            if end > at or _open_ended(rec):
                break
            k += 1
        stats.prefix_checked += 1
        if res.records[:k] != base.records[:k] and len(stats.failures) < max_failures:
            stats.failures.append(f"{name}: first {k} records changed by a mutation at {at}")
    if not res.problems and res.records:
        stats.clean += 1
        if any(_has_nan(r) for r in res.records):
            stats.nan_exempt += 1
            return
        try:
            out = encode_message(res.records, reg)
        except errors.CodecError as exc:
            if len(stats.failures) < max_failures:
                stats.failures.append(f"{name}: re-encode failed: {exc} body={mutated[:64].hex()}")
            return
        got = out.body if isinstance(out, V2Encoded) else out
        if got == mutated:
            stats.reencoded_exact += 1
        elif len(stats.failures) < max_failures:
            stats.failures.append(
                f"{name}: re-encode differs at {_first_diff(got, mutated)} body={mutated[:64].hex()}"
            )


def fuzz(messages: Sequence[CapturedMessage], cases: int, seed: int = 0) -> FuzzStats:
    """Run ``cases`` mutation cases over the messages with a fixed seed (reproducible)."""
    bases, registry = prepare(messages)
    rng = random.Random(seed)
    stats = FuzzStats()
    for _ in range(cases):
        run_case(rng.choice(bases), registry, rng, stats)
    return stats
