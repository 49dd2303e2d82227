"""Bronze-shaped test and benchmark data from captured messages (no broker)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from pipeline.lake import delta
from schemas.tables import BRONZE

if TYPE_CHECKING:
    from pipeline.codec.capture import CapturedMessage


def _s(v: Any) -> str | None:
    return None if v is None else str(v)


def bronze_rows(
    messages: Iterable[CapturedMessage],
    *,
    partition: str = "p0",
    first_offset: int = 0,
    batch_id: int = 0,
) -> pa.Table:
    """Bronze-shaped rows from captured messages (tests and benchmarks, no broker).

    Built with the receiver's landing code (``receivers.landing.to_table``)
    and cast by column *name* to ``schemas.tables.BRONZE``.
    """
    from receivers.landing import LandedMessage, to_table

    landed = []
    for m in messages:
        p = m.properties
        at = m.received_at_dt
        landed.append(
            LandedMessage(
                body=m.body,
                routing_key=m.routing_key,
                subject=m.subject,
                message_id=_s(p.get("message_id")),
                correlation_id=_s(p.get("correlation_id")),
                reply_to=_s(p.get("reply_to")),
                app_id=m.app_id,
                content_type=m.content_type,
                application_properties={k: str(v) for k, v in m.application_properties.items()},
                received_at_us=0 if at is None else int(at.timestamp() * 1_000_000),
            )
        )
    t = to_table(partition, first_offset, landed)
    cols: dict[str, Any] = {}
    for f in BRONZE:
        if f.name == "batch_id":
            cols[f.name] = pa.array(np.full(t.num_rows, batch_id, np.int64))
        elif f.name in t.column_names:
            cols[f.name] = t.column(f.name)
        else:
            cols[f.name] = pa.nulls(t.num_rows, f.type)
    return pa.table(cols).cast(BRONZE)


def write_bronze(path: str, tables: Sequence[pa.Table]) -> None:
    """Append bronze-shaped tables, one Delta commit each (test/benchmark data)."""
    from deltalake import write_deltalake

    from pipeline.lake import storage

    options = storage.S3Settings.from_env().storage_options() if storage.is_object_store(path) else None
    delta.create_table(path, BRONZE, name="bronze")
    for t in tables:
        write_deltalake(storage.location(path), t.cast(BRONZE), mode="append", storage_options=options)


def counts(tables: Mapping[str, pa.Table]) -> dict[str, int]:
    return {k: v.num_rows for k, v in tables.items()}
