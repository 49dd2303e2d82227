"""Schemas the silver job is waiting for, handed to the receiver's console role.

Content whose schema is unknown is parked by silver. The receiver's console
already asks (Schema Request ``S``) for every class it sees content of, but
it gives up after a few attempts and forgets everything when it restarts;
an agent may also have been down when it asked. Silver, which knows exactly
what is still parked, writes one small file per missing class key into a
shared folder; the console reads the folder every few seconds and asks again
for each key (a want re-arms a request it had given up on). When a schema
response for a key arrives, the receiver removes its file; silver removes
the files of keys it has since decoded.

Files, not a table or a socket: the two run in different processes (often
different machines with shared storage), and a file per key makes writing
idempotent (create-if-absent) and removal independent of the writer.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from pipeline.codec.schema import SchemaKey

SUFFIX = ".want"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def file_name(key: SchemaKey) -> str:
    """``<package>--<class>--<hash hex>.want``, with unsafe characters replaced."""
    pkg, name = _UNSAFE.sub("_", key.package), _UNSAFE.sub("_", key.name)
    return f"{pkg}--{name}--{key.hash.hex()}{SUFFIX}"


class SchemaWants:
    """The folder of wanted schema keys (created on first write)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)

    def want(self, keys: Iterable[SchemaKey]) -> int:
        """Ask for these keys; returns how many were new (existing files are left alone)."""
        made = 0
        for key in keys:
            path = self.folder / file_name(key)
            if path.exists():
                continue
            self.folder.mkdir(parents=True, exist_ok=True)
            text = json.dumps(
                {"package": key.package, "class": key.name, "hash": key.hash.hex()}
            )
            # Write aside, then link into place: a reader never sees half a file,
            # and a concurrent writer of the same key loses harmlessly.
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                try:
                    os.link(tmp, path)
                    made += 1
                except FileExistsError:
                    pass
            finally:
                os.unlink(tmp)
        return made

    def pending(self) -> list[SchemaKey]:
        """Keys wanted now (unreadable files are skipped: they are being replaced)."""
        if not self.folder.is_dir():
            return []
        out = []
        for path in sorted(self.folder.glob(f"*{SUFFIX}")):
            try:
                d = json.loads(path.read_text(encoding="utf-8"))
                out.append(SchemaKey(d["package"], d["class"], bytes.fromhex(d["hash"])))
            except (OSError, ValueError, KeyError):
                continue
        return out

    def done(self, keys: Iterable[SchemaKey]) -> int:
        """Forget these keys (their schema arrived); returns how many files were removed."""
        removed = 0
        for key in keys:
            try:
                (self.folder / file_name(key)).unlink()
                removed += 1
            except FileNotFoundError:
                pass
        return removed
