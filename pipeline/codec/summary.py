"""Decode statistics of a capture, keyed as in ``qpidd-capture-20s.summary.json``.

Built incrementally (``Summary.add`` per message) so ``qmf decode --summary``
streams any capture size; the keys and their meaning follow the independent
decoder's summary file, so the two can be compared number for number. One key
is ours: ``v1_schema_origin_by_class`` counts, per class, the v1 content and
event records decoded with a schema from the wire (a schema response earlier in
the capture) or from the registry's seed (qpid's XML); it assumes the registry
held only seeded schemas at the start.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from pipeline.codec.capture import CapturedMessage
from pipeline.codec.message import DecodeResult
from pipeline.codec.records import Event, MethodResponse, ObjectSample, SchemaResponse

_QUEUE_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
MAX_PROBLEM_EXAMPLES = 10


def _sorted(c: Counter[str]) -> dict[str, int]:
    return {k: c[k] for k in sorted(c)}


class Summary:
    """Counts over decoded messages; ``as_dict()`` gives the JSON object."""

    def __init__(self) -> None:
        self.messages = 0
        self.by_content_type: Counter[str] = Counter()
        self.by_capture_queue: Counter[str] = Counter()
        self.magic_first3: Counter[str] = Counter()
        self.v1_records_by_opcode: Counter[str] = Counter()
        self.v1_messages_by_opcode_set: Counter[str] = Counter()
        self.v1_classes_in_content: Counter[str] = Counter()
        self.v1_events: Counter[str] = Counter()
        self.v1_misc: Counter[str] = Counter()
        self.v2_by_opcode_content_ctype: Counter[str] = Counter()
        self.v1_max_records = 0
        self.v1_with_delete = 0
        self.v1_schemas: set[tuple[str, str, bytes]] = set()
        self.problems = 0
        self.problem_examples: list[str] = []
        # v1 broker queue samples: object id -> name, and -> {sample time: (enq, deq)}
        self.queue_names: dict[Any, str] = {}
        # where the schema of each decoded v1 content/event record came from: a schema
        # response seen earlier on the wire, else the registry's seed
        self.wire_keys: set[tuple[str, str, bytes]] = set()
        self.schema_origin: dict[str, Counter[str]] = {}
        self.queue_samples: dict[Any, dict[int, tuple[int, int]]] = {}

    def add(self, msg: CapturedMessage, result: DecodeResult) -> None:
        self.messages += 1
        self.by_content_type[str(msg.content_type)] += 1
        queue = msg.properties.get("x-capture-queue")
        if isinstance(queue, str):
            self.by_capture_queue[_QUEUE_SUFFIX.sub("", queue)] += 1
        if result.dialect == "V2":
            self.magic_first3["(QMFv2: no magic)"] += 1
            ap = msg.application_properties
            key = f"{ap.get('qmf.opcode')}|{ap.get('qmf.content')}|{msg.content_type}"
            self.v2_by_opcode_content_ctype[key] += 1
        else:
            self.magic_first3[msg.body[:3].decode("latin-1")] += 1
        if result.dialect in ("AM1", "AM2"):
            ops: set[str] = set()
            for r in result.records:
                ops.add(r.opcode)
                self.v1_records_by_opcode[r.opcode] += 1
                if isinstance(r, ObjectSample | Event):
                    self._origin(r.package, r.class_name, r.schema_hash)
                if isinstance(r, ObjectSample):
                    self.v1_classes_in_content[f"{r.package}:{r.class_name}"] += 1
                    if r.delete_ns:
                        self.v1_with_delete += 1
                    if r.class_name == "queue":
                        self._queue(r)
                elif isinstance(r, Event):
                    self.v1_events[r.event_name] += 1
                elif isinstance(r, SchemaResponse):
                    self.v1_schemas.add((r.package, r.class_name, r.schema_hash))
                    self.wire_keys.add((r.package, r.class_name, r.schema_hash))
                elif isinstance(r, MethodResponse):
                    self.v1_misc[f"m_status_{r.status}"] += 1
                    if r.text_str8:
                        self.v1_misc["m_status_text_str8_quirk"] += 1
                    if r.raw_arguments:
                        self.v1_misc["m_with_out_args"] += 1
            if ops:
                self.v1_messages_by_opcode_set["".join(sorted(ops))] += 1
            self.v1_max_records = max(self.v1_max_records, len(result.records))
        for p in result.problems:
            self.problems += 1
            if len(self.problem_examples) < MAX_PROBLEM_EXAMPLES:
                self.problem_examples.append(f"message {self.messages - 1}: {p.error}: {p.message}")

    def _origin(self, package: str, name: str, h: bytes) -> None:
        origin = "wire" if (package, name, h) in self.wire_keys else "seed"
        self.schema_origin.setdefault(f"{package}:{name}", Counter())[origin] += 1

    def _queue(self, r: ObjectSample) -> None:
        name = r.values.get("name")
        if isinstance(name, str):
            self.queue_names[r.object_id] = name
        enq = r.values.get("msgTotalEnqueues")
        deq = r.values.get("msgTotalDequeues")
        if isinstance(enq, int) and isinstance(deq, int):
            # A deleted object's last record keeps its previous publish's update time (qpidd):
            # it was read at its delete time, and carries the final counts.
            t = max(r.update_ns or 0, r.delete_ns or 0)
            self.queue_samples.setdefault(r.object_id, {}).setdefault(t, (enq, deq))

    def queue_rates(self) -> dict[str, dict[str, Any]]:
        """Enqueue/dequeue rate per queue between its first and last distinct v1 sample
        (the same sample re-sent, e.g. in a get reply, counts once)."""
        out: dict[str, dict[str, Any]] = {}
        for oid, by_time in self.queue_samples.items():
            times = sorted(by_time)
            dt = (times[-1] - times[0]) / 1e9
            if dt <= 0:
                continue
            (e0, d0), (e1, d1) = by_time[times[0]], by_time[times[-1]]
            out[self.queue_names.get(oid, str(oid))] = {
                "deq_rate": round((d1 - d0) / dt, 3),
                "enq_rate": round((e1 - e0) / dt, 3),
                "samples": len(times),
            }
        return {k: out[k] for k in sorted(out)}

    def as_dict(self) -> dict[str, Any]:
        return {
            "by_capture_queue": _sorted(self.by_capture_queue),
            "by_content_type": _sorted(self.by_content_type),
            "decode_problem_examples": list(self.problem_examples),
            "decode_problems": self.problems,
            "magic_first3": _sorted(self.magic_first3),
            "messages": self.messages,
            "queue_rates_first_to_last_v1_sample": self.queue_rates(),
            "v1_classes_in_content": _sorted(self.v1_classes_in_content),
            "v1_events": _sorted(self.v1_events),
            "v1_max_records_in_one_message": self.v1_max_records,
            "v1_messages_by_opcode_set": _sorted(self.v1_messages_by_opcode_set),
            "v1_misc": _sorted(self.v1_misc),
            "v1_records_by_opcode": _sorted(self.v1_records_by_opcode),
            "v1_records_with_delete_time": self.v1_with_delete,
            "v1_schemas_captured": len(self.v1_schemas),
            "v1_schema_origin_by_class": {
                k: _sorted(self.schema_origin[k]) for k in sorted(self.schema_origin)
            },
            "v2_by_opcode_content_ctype": _sorted(self.v2_by_opcode_content_ctype),
        }


class RecordCounts:
    """Records by opcode and decode problems of landing-shaped Arrow batches.

    What ``decode_message`` per message would count, from ``decode_content``:
    content messages are counted from the kernel's table (its ``opcode``
    column), everything else from the per-record fallback it runs itself. So
    ``qmf run``'s closing summary of a long run's bronze takes seconds, not the
    minutes a Python loop over every record took (30 minutes of 10,000 queues:
    ~18M records). Schemas met in one batch serve the next ones (``registry``
    learns, as the per-record decoder's does).
    """

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self.messages = 0
        self.by_opcode: Counter[str] = Counter()
        self.problems = 0

    def add(self, batch: Any) -> None:
        """One batch with ``body`` (and ``msg_key``, ``routing_key``, ``app_id``,
        ``content_type``, ``application_properties`` when present)."""
        import pyarrow.compute as pc

        from pipeline.codec.vectorized import decode_content

        self.messages += batch.num_rows
        res = decode_content(batch, self.registry, compact=True)
        if res.table is not None and res.table.num_rows:
            counts = pc.value_counts(res.table.column("opcode")).to_pylist()
            for c in counts:
                self.by_opcode[c["values"]] += c["counts"]
        for _key, r in res.others:
            self.by_opcode[r.opcode] += 1
        self.problems += res.quarantine.num_rows

    def records_by_opcode(self) -> dict[str, int]:
        return _sorted(self.by_opcode)
