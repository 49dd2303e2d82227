"""The codec's error hierarchy.

Decoding never raises anything but ``CodecError`` subclasses, so callers can
catch one class and turn it into a ``Problem`` while keeping the good records
decoded before the failure. Every error knows the byte offset where it
happened, and truncation errors say how many bytes were expected vs found.
"""

from __future__ import annotations


class CodecError(Exception):
    """Base of every codec error; ``offset`` is relative to the message body."""

    def __init__(self, message: str, offset: int = -1) -> None:
        super().__init__(message)
        self.offset = offset

    @property
    def reason(self) -> str:
        return str(self.args[0]) if self.args else ""


class Truncated(CodecError):
    """The buffer ended before a value did (``expected`` bytes, ``found`` left)."""

    def __init__(self, offset: int, expected: int, found: int, what: str = "value") -> None:
        super().__init__(
            f"truncated {what} at offset {offset}: expected {expected} bytes, found {found}",
            offset,
        )
        self.expected = expected
        self.found = found
        self.what = what


NeedData = Truncated


class UnknownType(CodecError):
    """A type code (AMQP 0-10 or QMF) that the codec does not know."""

    def __init__(self, offset: int, code: int, family: str = "AMQP 0-10") -> None:
        super().__init__(f"unknown {family} type code 0x{code:02x} at offset {offset}", offset)
        self.code = code
        self.family = family


class UnknownOpcode(CodecError):
    def __init__(self, offset: int, opcode: str) -> None:
        super().__init__(f"unknown opcode {opcode!r} at offset {offset}", offset)
        self.opcode = opcode


class BadMagic(CodecError):
    def __init__(self, offset: int, found: bytes) -> None:
        super().__init__(
            f"bad magic at offset {offset}: expected b'AM1' or b'AM2', found {found!r}", offset
        )
        self.found = found


class MissingSchema(CodecError):
    """Content or an event whose class schema is not (yet) in the registry."""

    def __init__(self, offset: int, key: str) -> None:
        super().__init__(f"no schema for {key} at offset {offset}", offset)
        self.key = key


class Malformed(CodecError):
    """Structurally wrong data: size fields that disagree, duplicate keys, bad text."""

    def __init__(self, offset: int, detail: str) -> None:
        super().__init__(f"malformed data at offset {offset}: {detail}", offset)
        self.detail = detail


class ReservedBitSet(CodecError):
    """A bit the spec reserves ("must be zero") is set; the record is kept, with the raw value."""

    def __init__(self, offset: int, detail: str) -> None:
        super().__init__(f"reserved bit set at offset {offset}: {detail}", offset)
        self.detail = detail


class ArgumentMismatch(CodecError):
    """Method arguments that do not fit the method the context names; they stay raw bytes."""

    def __init__(self, offset: int, detail: str) -> None:
        super().__init__(f"method arguments at offset {offset} do not fit: {detail}", offset)
        self.detail = detail


class EncodeError(CodecError):
    """A value that cannot be encoded with the requested type."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"cannot encode: {detail}", -1)
        self.detail = detail


class Problem:
    """A decode problem kept beside the good records: where, what, and the error class.

    Most problems stop the message (``fatal``). A few only flag one record that
    was still decoded and kept (a reserved bit set, arguments that do not fit
    their method): ``fatal`` is False and ``record`` is that record's index in
    ``DecodeResult.records``.
    """

    __slots__ = ("error", "fatal", "message", "offset", "opcode", "record")

    def __init__(
        self,
        error: str,
        message: str,
        offset: int,
        opcode: str | None = None,
        *,
        record: int | None = None,
        fatal: bool = True,
    ) -> None:
        self.error = error
        self.message = message
        self.offset = offset
        self.opcode = opcode
        self.record = record
        self.fatal = fatal

    @classmethod
    def from_error(
        cls, exc: CodecError, opcode: str | None = None, *, record: int | None = None
    ) -> Problem:
        return cls(
            type(exc).__name__,
            str(exc),
            exc.offset,
            opcode,
            record=record,
            fatal=record is None,
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "error": self.error,
            "message": self.message,
            "offset": self.offset,
            "opcode": self.opcode,
            "record": self.record,
            "fatal": self.fatal,
        }

    def __repr__(self) -> str:
        return f"Problem({self.error}: {self.message})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Problem) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash((self.error, self.message, self.offset, self.opcode, self.record))
