"""Arrow tables as IPC stream bytes: how tasks hand small tables to the driver and
the driver hands them to tasks (pickled with a plan or a result, it stays columnar)."""

from __future__ import annotations

import pyarrow as pa


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def from_ipc(payload: bytes) -> pa.Table:
    return pa.ipc.open_stream(payload).read_all()
