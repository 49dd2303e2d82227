"""Class schemas as the codec needs them: the element list and wire types.

A ``ClassSchema`` is what a schema response ('s', or a QMF v2 _schema_class)
says about a class; decoding content ('c'/'i'/'g') and events ('e') needs it,
because v1 records carry no lengths. Schemas are keyed by
(package, class name, 16-byte hash).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

KIND_TABLE = 1
KIND_EVENT = 2


@dataclass(frozen=True, order=True)
class SchemaKey:
    package: str
    name: str
    hash: bytes  # 16 bytes

    def __str__(self) -> str:
        return f"{self.package}:{self.name}({self.hash.hex()})"


@dataclass(frozen=True)
class Element:
    """A property, statistic or argument: name, QMF type code and attributes.

    ``extra`` holds the other map entries of the schema record verbatim
    (unit, desc, min, max, maxlen, default, dir, ...), so re-encoding a
    schema response reproduces it.
    """

    name: str
    type_code: int
    access: int | None = None  # properties: 1 RC, 2 RW, 3 RO
    index: bool = False
    optional: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Method:
    name: str
    arguments: tuple[Element, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClassSchema:
    """A table class (properties, statistics, methods) or an event class (arguments).

    AM1 has no class kind on the wire: an AM1 event class travels as a schema
    response with no properties, statistics or methods and one event record
    named like the class (see ``v1.schema_response_for``).
    """

    key: SchemaKey
    kind: int = KIND_TABLE
    properties: tuple[Element, ...] = ()
    statistics: tuple[Element, ...] = ()
    methods: tuple[Method, ...] = ()
    arguments: tuple[Element, ...] = ()  # event classes only
    # AM1 only: the event records (main map + arguments, as Methods) that an AM1
    # schema response of a table class lists beside its properties; informational,
    # 'e' records decode against event classes, never against these.
    events: tuple[Method, ...] = ()

    @property
    def optional_properties(self) -> tuple[Element, ...]:
        return tuple(p for p in self.properties if p.optional)

    @property
    def presence_octets(self) -> int:
        """Number of presence-bitmask octets in 'c'/'g' content."""
        return (len(self.optional_properties) + 7) // 8

    @property
    def v2_names(self) -> tuple[str, ...]:
        """The key each property and statistic has in a QMF v2 ``_values`` map, in
        schema order: its name, except for qpidd's min/max/average statistics, whose v1
        schema says ``XSamples``/``XAverage`` where its v2 maps say ``XCount``/``XAvg``
        (``XMin``/``XMax`` are alike): read off qpidd 1.40's generated code and traffic."""
        elements = (*self.properties, *self.statistics)
        names = {e.name for e in self.statistics}
        return tuple(v2_name(e.name, names) for e in elements)


def v2_name(name: str, statistics: Collection[str]) -> str:
    """An element's key in a QMF v2 map, given its class's statistic names (``v2_names``)."""
    for v1, v2 in (("Samples", "Count"), ("Average", "Avg")):
        base = name[: -len(v1)]
        if name.endswith(v1) and f"{base}Min" in statistics and f"{base}Max" in statistics:
            return base + v2
    return name


ORIGIN_SEED = "seed"  # known before decoding (qpid's schema XML, a file, a caller's list)
ORIGIN_WIRE = "wire"  # from a schema response decoded on the wire


class SchemaRegistry:
    """Known schemas by key; the codec's view of the schema registry table.

    Each key remembers where its schema came from (``origin``): schemas given to
    the constructor are ``"seed"`` (prior knowledge such as qpid's management
    XML), schemas added by decoding a schema response are ``"wire"``. A wire
    schema replaces a seeded one with the same key; if the two differ, the key
    is listed in ``differs_from_seed``.
    """

    def __init__(self, schemas: Iterable[ClassSchema] = (), origin: str = ORIGIN_SEED) -> None:
        self._by_key: dict[SchemaKey, ClassSchema] = {}
        self._origin: dict[SchemaKey, str] = {}
        self.differs_from_seed: set[SchemaKey] = set()
        # Decode plans the codec compiles per (dialect, opcode, key); dropped
        # when a key's schema changes.
        self.plans: dict[tuple[Any, ...], Any] = {}
        # Bumped whenever a key is added or its schema replaced, so derived views
        # (the vectorized decoder's compiled registry) know when to rebuild;
        # ``derived`` holds them by owner, with the generation they were built at.
        self.generation = 0
        self.derived: dict[str, tuple[int, Any]] = {}
        for s in schemas:
            self.add(s, origin)

    def add(self, schema: ClassSchema, origin: str = ORIGIN_WIRE) -> None:
        old = self._by_key.get(schema.key)
        if old is not schema:
            self.generation += 1
        if old is not None and old != schema:
            self.plans.clear()
            if self._origin.get(schema.key) == ORIGIN_SEED and origin == ORIGIN_WIRE:
                self.differs_from_seed.add(schema.key)
        self._by_key[schema.key] = schema
        self._origin[schema.key] = origin

    def origin(self, key: SchemaKey) -> str | None:
        """``"seed"``, ``"wire"`` or None (unknown key)."""
        return self._origin.get(key)

    def copy(self) -> SchemaRegistry:
        """An independent registry with the same schemas and origins (plans rebuilt lazily)."""
        out = SchemaRegistry()
        out._by_key = dict(self._by_key)
        out._origin = dict(self._origin)
        out.differs_from_seed = set(self.differs_from_seed)
        out.generation = self.generation
        return out

    def get(self, key: SchemaKey) -> ClassSchema | None:
        return self._by_key.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[ClassSchema]:
        return iter(self._by_key.values())

    def __len__(self) -> int:
        return len(self._by_key)
