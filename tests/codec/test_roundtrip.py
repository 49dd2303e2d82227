"""Property-based round trips for records of every kind and every dialect.

decode(encode(r)) == r for generated records, and encode(decode(x)) == x for the
bytes x they encode to.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.codec.message import decode_message
from pipeline.codec.records import Record
from pipeline.codec.schema import ClassSchema, SchemaRegistry
from pipeline.codec.v1 import decode_v1, encode_record, encode_records, schema_response_for
from pipeline.codec.v2 import encode_v2
from tests.codec import strategies as S

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIALECTS = st.sampled_from(["AM1", "AM2"])


def _v1_roundtrip(records: list[Record], schemas: list[ClassSchema]) -> None:
    reg = SchemaRegistry(schemas)
    body = encode_records(records, reg)
    decoded, problems = decode_v1(body, SchemaRegistry(schemas))
    assert problems == []
    assert decoded == records
    assert encode_records(decoded, reg) == body


@SETTINGS
@given(st.data())
def test_simple_v1_records(data: st.DataObject) -> None:
    dialect = data.draw(DIALECTS)
    recs = data.draw(st.lists(S.simple_v1_records(dialect), min_size=1, max_size=4))
    # a message ends after 'm' / AM1 'M' (their tails are raw arguments)
    recs = [r for r in recs if r.opcode != "m"] + [r for r in recs if r.opcode == "m"][:1]
    _v1_roundtrip(recs, [])


@SETTINGS
@given(st.data())
def test_object_samples(data: st.DataObject) -> None:
    dialect = data.draw(DIALECTS)
    schema, rec = data.draw(S.object_samples(dialect))
    _v1_roundtrip([rec], [schema])


@SETTINGS
@given(st.data())
def test_several_object_samples_and_events_in_one_message(data: st.DataObject) -> None:
    dialect = data.draw(DIALECTS)
    pairs = data.draw(
        st.lists(st.one_of(S.object_samples(dialect), S.events(dialect)), min_size=1, max_size=5)
    )
    schemas = {s.key: s for s, _ in pairs}
    recs = [r for s, r in pairs if schemas[s.key] is s]
    _v1_roundtrip(recs, list(schemas.values()))


@SETTINGS
@given(st.data())
def test_events(data: st.DataObject) -> None:
    dialect = data.draw(DIALECTS)
    schema, rec = data.draw(S.events(dialect))
    _v1_roundtrip([rec], [schema])


@SETTINGS
@given(st.data())
def test_method_requests(data: st.DataObject) -> None:
    dialect = data.draw(DIALECTS)
    schema, rec = data.draw(S.method_requests(dialect))
    _v1_roundtrip([rec], [schema] if schema else [])


@SETTINGS
@given(st.data())
def test_schema_responses_then_content(data: st.DataObject) -> None:
    dialect = data.draw(DIALECTS)
    schema, sample = data.draw(S.object_samples(dialect))
    event_schema = data.draw(S.class_schemas(dialect, event=True))
    responses = [schema_response_for(schema, dialect)]
    if dialect == "AM2" and event_schema.key != schema.key:
        responses.append(schema_response_for(event_schema, dialect))
    body = encode_records([*responses, sample], SchemaRegistry([schema]))
    reg = SchemaRegistry()  # empty: the schema comes from the message itself
    decoded, problems = decode_v1(body, reg)
    assert problems == []
    assert decoded == [*responses, sample]
    assert decoded[0].schema == schema  # type: ignore[attr-defined]
    assert reg.get(schema.key) == schema
    assert encode_records(decoded, reg) == body
    assert encode_record(decoded[0]) == encode_record(responses[0])


@SETTINGS
@given(S.v2_records())
def test_v2_messages(records: list[Record]) -> None:
    enc = encode_v2(records)
    res = decode_message(
        enc.body,
        registry=SchemaRegistry(),
        application_properties=enc.application_properties,
        content_type=enc.content_type,
        app_id="qmf2",
    )
    assert res.problems == []
    assert res.records == records
    again = encode_v2(res.records)
    assert again.body == enc.body


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([b"AM1", b"AM2"]),
    st.sampled_from(sorted(set("BbzQqSshcigGMmPpAaxe"))),
    st.binary(max_size=80),
)
def test_arbitrary_bytes_only_codec_problems_and_lossless(
    magic: bytes, op: str, tail: bytes
) -> None:
    """Random bodies behind a valid header: never an exception; a clean decode re-encodes exactly."""
    from tests.codec.test_am2_vectors import registry

    body = magic + op.encode() + b"\x00\x00\x00\x01" + tail
    res = decode_message(body, registry=registry())
    if not res.problems:
        assert encode_records(res.records, registry()) == body
