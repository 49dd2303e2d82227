"""Where every decode starts: a schema registry seeded with qpid's management schema.

Real qpidd sends class schemas only when a console asks ('S' -> 's'), so a
capture of its broadcasts alone holds content the decoder cannot split
(v1 records carry no lengths). qpid's management schema XML gives the very
schemas (and hashes) qpidd puts on the wire (``pipeline.qmfxml``); seeding the
registry with it lets such captures decode offline. Schemas decoded on the
wire still win for their key; ``SchemaRegistry.origin`` says which one was used.
"""

from __future__ import annotations

from pipeline.codec.schema import ORIGIN_SEED, SchemaRegistry

SEED_XML = "xml"  # qpid's broker, acl, ha and linear-store schema files (schemas/qpid/)
SEED_NONE = "none"  # nothing known in advance: schemas only from the wire


def seeded_registry(spec: str = SEED_XML) -> SchemaRegistry:
    """A registry for decoding: ``"xml"`` (default), ``"none"``, or schema XML file paths
    separated by commas (each parsed as qpid's code generator does)."""
    from pipeline import qmfxml

    if spec == SEED_NONE:
        return SchemaRegistry()
    if spec == SEED_XML:
        schema = qmfxml.default_schema()
    else:
        schema = qmfxml.load_schema([p for p in spec.split(",") if p])
    return SchemaRegistry((c.schema for c in schema), origin=ORIGIN_SEED)
