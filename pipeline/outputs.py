"""Files a command writes: never lose or double what is already there without being told.

A second ``qmf capture -o FILE`` once appended to FILE without a word (the capture
doubled); ``qmf sim -o`` and ``qmf decode --output`` truncated theirs. A command
that writes a file the user names checks it first with ``refusal``: an existing
file with something in it is refused unless the user said ``--append`` or
``--overwrite``. An empty file, a device (``/dev/null``) or a pipe loses nothing
and is written as asked.
"""

from __future__ import annotations

import os
import stat


def holds_data(path: str | os.PathLike[str]) -> int:
    """The size of the regular file at ``path`` when it has something in it, else 0."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def refusal(
    path: str | os.PathLike[str] | None, option: str, allowed: bool, verb: str
) -> str | None:
    """Why writing ``path`` is refused (None: go ahead). ``option`` is the flag that
    allows it (``--append``, ``--overwrite``), ``allowed`` whether it was given, ``verb``
    what that flag does to the file ("add to it", "replace it")."""
    if path is None or allowed:
        return None
    size = holds_data(path)
    if not size:
        return None
    return (
        f"{os.fspath(path)} already exists ({size:,} bytes) and is left as it is: "
        f"{option} to {verb}, or choose another file"
    )
