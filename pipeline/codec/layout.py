"""How decoded content looks in Arrow: column types, cells, and the compact layout.

One definition of each column's type, shared by the vectorized decode
(``pipeline.codec.vectorized``), its per-record fallback and silver's wide views.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipeline.codec.schema import ClassSchema
from schemas.tables import CONTENT_QUARANTINE, OBJECT_SAMPLE_IDENTITY

I64 = npt.NDArray[np.int64]  # positions and offsets the kernels return

# ------------------------------------------------------------------ table layout

#: Columns every object-sample table starts with, then one column per
#: property and statistic in schema order.
IDENTITY_FIELDS: tuple[pa.Field, ...] = tuple(OBJECT_SAMPLE_IDENTITY)
IDENTITY_NAMES = frozenset(f.name for f in IDENTITY_FIELDS)
INT_TYPES: dict[int, pa.DataType] = {
    1: pa.int16(),
    2: pa.int32(),
    3: pa.int64(),
    4: pa.int64(),
    8: pa.int64(),
    9: pa.int64(),
    16: pa.int8(),
    17: pa.int16(),
    18: pa.int32(),
    19: pa.int64(),
}
TEXT_TYPES = frozenset({6, 7, 10, 14, 15, 20, 21, 22})


def arrow_type(type_code: int) -> pa.DataType:
    """Arrow type of a QMF element column (see the module docstring)."""
    hit = ARROW_OF.get(type_code)
    if hit is not None:
        return hit
    if type_code in INT_TYPES:
        return INT_TYPES[type_code]
    if type_code == 11:
        return pa.bool_()
    if type_code == 12:
        return pa.float32()
    if type_code == 13:
        return pa.float64()
    if type_code in TEXT_TYPES:
        return pa.string()
    raise ValueError(f"no column type for QMF type code {type_code}")


ARROW_OF: dict[int, pa.DataType] = {}
for _t in range(1, 23):
    if _t != 5:
        ARROW_OF[_t] = arrow_type(_t)


def column_name(name: str) -> str:
    """Element column name; a clash with an identity column gets a ``_value`` suffix."""
    return f"{name}_value" if name in IDENTITY_NAMES else name


def sample_schema(schema: ClassSchema) -> pa.Schema:
    """The fixed Arrow schema of one class's object-sample table."""
    fields = list(IDENTITY_FIELDS)
    seen = set(IDENTITY_NAMES)
    for e in (*schema.properties, *schema.statistics):
        name = column_name(e.name)
        if name in seen:
            raise ValueError(f"{schema.key}: duplicate element column {name!r}")
        seen.add(name)
        fields.append(pa.field(name, arrow_type(e.type_code)))
    return pa.schema(fields, metadata={"qmf_class": str(schema.key)})


QUARANTINE_SCHEMA = CONTENT_QUARANTINE


# --------------------------------------------------------- Python value -> cell


def to_json(value: Any) -> str:
    """Stable JSON text of a decoded map/list value (sorted keys, bytes as base64 text)."""
    return json.dumps(_jsonable(value), sort_keys=True, separators=(",", ":"), allow_nan=True)


def _jsonable(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, bytes | bytearray | memoryview):
        return "base64:" + base64.b64encode(bytes(v)).decode("ascii")
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return str(v)


def _text(v: Any) -> str:
    if isinstance(v, bytes | bytearray):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


def signed_int(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def cell(type_code: int, value: Any) -> Any:
    """A per-record decoded value as it appears in the wide table (the oracle's view)."""
    if value is None:
        return None
    if type_code in (4, 8, 9, 19):
        return signed_int(int(value), 64)
    if type_code in INT_TYPES or type_code == 11:
        return bool(value) if type_code == 11 else int(value)
    if type_code == 12:
        # A float32 on the wire; a QMF v2 map may carry a double beyond its range, which
        # becomes +-inf here as in the kernels' cast (quietly: it is the value, no fault).
        with np.errstate(over="ignore"):
            return float(np.float32(value))
    if type_code == 13:
        return float(value)
    if type_code in (6, 7):
        return _text(value)
    if type_code == 14:
        return str(value if isinstance(value, uuid.UUID) else uuid.UUID(bytes=bytes(value)))
    if type_code in (15, 21, 22):
        return to_json(value)
    if type_code == 10 and isinstance(value, Mapping):  # QMF v2 object id map
        return to_json(value)
    return str(value)


# ------------------------------------------------------------ compact layout
#
# One table for every class: the identity columns, the index key, then the
# element values in three typed lists (``ints``: integers, booleans as 0/1,
# times; ``floats``: float and double; ``texts``: every text column above),
# each in schema order (properties, then statistics). An element's position
# in its list is its *slot* (``slots``). Built for the records of all classes
# at once (``_compact_all``): kernels write the lists, format the texts and
# build the index keys, so no Python or Arrow call is made per class or element.

SLOT_INTS = "ints"
SLOT_FLOATS = "floats"
SLOT_TEXTS = "texts"
_FLOAT_CODES = frozenset({12, 13})


def slot_kind(type_code: int) -> str:
    """The typed list that holds values of this QMF type in the compact layout."""
    if type_code in _FLOAT_CODES:
        return SLOT_FLOATS
    if type_code in TEXT_TYPES:
        return SLOT_TEXTS
    return SLOT_INTS


COMPACT_SCHEMA = pa.schema(
    [
        *IDENTITY_FIELDS,
        pa.field("index_key", pa.string()),
        pa.field(SLOT_INTS, pa.list_(pa.int64())),
        pa.field(SLOT_FLOATS, pa.list_(pa.float64())),
        pa.field(SLOT_TEXTS, pa.list_(pa.string())),
    ]
)
COMPACT_NAMES = tuple(COMPACT_SCHEMA.names)
