"""Qpid's management schema XML -> ``ClassSchema`` objects, as qpidd puts them on the wire.

qpidd's code generator (managementgen) turns the XML into the schema records a
console receives; the simulator must send the very same records, so this module
re-does what the generator does and was checked against the schema responses
of the real capture in ``../shared/samples``:

- class names are lower-cased on the wire (``Queue`` -> ``queue``); event names are not;
- watermark types (``hilo*``) expand to ``X``, ``XHigh``, ``XLow`` with desc ``"... (High)"``;
  ``mma*`` types expand to ``XSamples``, ``XMin``, ``XMax``, ``XAverage``;
- ``count*``/``hilo*``/``mma*`` are carried as their base integer type;
- the 16-byte schema hash is managementgen's MD5 over the element sub-tree (element
  names, attribute names and values in document order); an event's hash adds the
  digests of its ``eventArguments`` entries.

Besides the ``ClassSchema`` it keeps what the wire does not say but the roadmap
and the simulator need: the statistic kind (counter, gauge, watermark, ...),
object references between classes, the parent reference and event severities.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.dom import minidom
from xml.dom.minidom import Element as DomElement
from xml.dom.minidom import Node

from pipeline.codec.schema import (
    KIND_EVENT,
    KIND_TABLE,
    ClassSchema,
    Element,
    Method,
    SchemaKey,
    SchemaRegistry,
)

# QMF type codes (AM1 spec; 20-22 from real qpidd).
T_U8, T_U16, T_U32, T_U64 = 1, 2, 3, 4
T_SSTR, T_LSTR, T_ABSTIME, T_DELTATIME, T_REF, T_BOOL = 6, 7, 8, 9, 10, 11
T_FLOAT, T_DOUBLE, T_UUID, T_MAP = 12, 13, 14, 15
T_S8, T_S16, T_S32, T_S64 = 16, 17, 18, 19
T_OBJECT, T_LIST, T_ARRAY = 20, 21, 22

# XML type name -> (type code, style); style None | "count" | "wm" | "mma".
XML_TYPES: Mapping[str, tuple[int, str | None]] = {
    "objId": (T_REF, None),
    "uint8": (T_U8, None),
    "uint16": (T_U16, None),
    "uint32": (T_U32, None),
    "uint64": (T_U64, None),
    "int8": (T_S8, None),
    "int16": (T_S16, None),
    "int32": (T_S32, None),
    "int64": (T_S64, None),
    "bool": (T_BOOL, None),
    "sstr": (T_SSTR, None),
    "lstr": (T_LSTR, None),
    "absTime": (T_ABSTIME, None),
    "deltaTime": (T_DELTATIME, None),
    "float": (T_FLOAT, None),
    "double": (T_DOUBLE, None),
    "uuid": (T_UUID, None),
    "map": (T_MAP, None),
    "list": (T_LIST, None),
    "hilo8": (T_U8, "wm"),
    "hilo16": (T_U16, "wm"),
    "hilo32": (T_U32, "wm"),
    "hilo64": (T_U64, "wm"),
    "count8": (T_U8, "count"),
    "count16": (T_U16, "count"),
    "count32": (T_U32, "count"),
    "count64": (T_U64, "count"),
    "mma32": (T_U32, "mma"),
    "mma64": (T_U64, "mma"),
    "mmaTime": (T_DELTATIME, "mma"),
}

ACCESS = {"RC": 1, "RW": 2, "RO": 3}

# qpid's event severities (syslog order).
SEVERITIES: Mapping[str, int] = {
    "emerg": 0,
    "alert": 1,
    "crit": 2,
    "error": 3,
    "warn": 4,
    "notice": 5,
    "inform": 6,
    "debug": 7,
}

NUMERIC_CODES = frozenset(
    {T_U8, T_U16, T_U32, T_U64, T_S8, T_S16, T_S32, T_S64, T_DELTATIME, T_FLOAT, T_DOUBLE}
)

# Statistic kinds.
COUNTER = "counter"  # monotonic within one agent boot; rates are deltas
GAUGE = "gauge"  # current level
WATERMARK = "watermark"  # current value of a hilo statistic
WATERMARK_HIGH = "watermark_high"  # per-interval high water mark
WATERMARK_LOW = "watermark_low"  # per-interval low water mark
MMA_SAMPLES = "mma_samples"
MMA_MIN = "mma_min"
MMA_MAX = "mma_max"
MMA_AVERAGE = "mma_average"
STATE = "state"  # non-numeric statistic (bool, string)

# count* statistics that are levels, not monotonic totals (the XML cannot say so).
_GAUGE_COUNTS = frozenset({("Broker", "queueCount")})
_CURRENT = re.compile(r"\b[Cc]urrent")

_SCHEMA_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schemas", "qpid"
)
DEFAULT_FILES = (
    "qpid-management-schema.xml",
    "qpid-management-schema-acl.xml",
    "qpid-management-schema-ha.xml",
    "qpid-management-schema-linearstore.xml",
)


class SchemaXmlError(ValueError):
    """The XML does not describe a schema managementgen would accept."""


@dataclass(frozen=True)
class StatisticInfo:
    """What the wire does not carry about one (expanded) statistic."""

    name: str
    base: str  # the XML statistic it came from (``consumerCount`` for ``consumerCountHigh``)
    xml_type: str
    kind: str


@dataclass(frozen=True)
class XmlClass:
    """One class or event of the XML with its wire schema and the extra facts."""

    schema: ClassSchema
    xml_name: str
    references: Mapping[str, str] = field(default_factory=dict)  # property -> class name
    parent_ref: str | None = None
    statistics: Mapping[str, StatisticInfo] = field(default_factory=dict)
    xml_types: Mapping[str, str] = field(default_factory=dict)  # property/arg -> XML type
    severity: int | None = None  # events only

    @property
    def key(self) -> SchemaKey:
        return self.schema.key

    @property
    def name(self) -> str:
        return self.schema.key.name

    @property
    def package(self) -> str:
        return self.schema.key.package

    @property
    def is_event(self) -> bool:
        return self.schema.kind == KIND_EVENT

    @property
    def index_properties(self) -> tuple[Element, ...]:
        return tuple(p for p in self.schema.properties if p.index)

    def statistic_kind(self, name: str) -> str:
        return self.statistics[name].kind


@dataclass
class ManagementSchema:
    """All classes and events of one or more schema files, in file order."""

    classes: list[XmlClass] = field(default_factory=list)

    def __iter__(self) -> Iterator[XmlClass]:
        return iter(self.classes)

    def __len__(self) -> int:
        return len(self.classes)

    @property
    def packages(self) -> list[str]:
        """Package names in first-seen order (the order of 'p' indications)."""
        seen: dict[str, None] = {}
        for c in self.classes:
            seen.setdefault(c.package, None)
        return list(seen)

    def get(self, package: str, name: str) -> XmlClass:
        for c in self.classes:
            if c.package == package and c.name == name:
                return c
        raise KeyError(f"{package}:{name}")

    def find(self, name: str) -> XmlClass:
        """A class by wire or XML name, whatever the package (names are unique in qpid's set)."""
        for c in self.classes:
            if c.name == name or c.xml_name == name:
                return c
        raise KeyError(name)

    def by_key(self, key: SchemaKey) -> XmlClass | None:
        for c in self.classes:
            if c.key == key:
                return c
        return None

    def registry(self) -> SchemaRegistry:
        return SchemaRegistry(c.schema for c in self.classes)


def _md5_tree(md5: Any, node: DomElement) -> None:
    """managementgen's Hash._compute: name, attributes in order, element children."""
    md5.update((node.nodeName or "").encode())
    attrs = node.attributes
    for i in range(attrs.length):
        item = attrs.item(i)
        assert item is not None
        md5.update((item.nodeName or "").encode())
        md5.update((item.nodeValue or "").encode())
    for child in node.childNodes:
        if child.nodeType == Node.ELEMENT_NODE:
            assert isinstance(child, DomElement)
            _md5_tree(md5, child)


def _children(node: DomElement, tag: str) -> list[DomElement]:
    return [
        c
        for c in node.childNodes
        if c.nodeType == Node.ELEMENT_NODE and isinstance(c, DomElement) and c.tagName == tag
    ]


def _attr(node: DomElement, name: str) -> str | None:
    return node.getAttribute(name) if node.hasAttribute(name) else None


def _number(text: str) -> int | float:
    try:
        return int(text, 0)
    except ValueError:
        return float(text)


def _type_of(node: DomElement, where: str) -> tuple[str, int, str | None]:
    xml_type = _attr(node, "type")
    if xml_type is None or xml_type not in XML_TYPES:
        raise SchemaXmlError(f"{where}: unknown type {xml_type!r}")
    code, style = XML_TYPES[xml_type]
    return xml_type, code, style


def _extras(node: DomElement, keys: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in keys:
        v = _attr(node, k)
        if v is None:
            continue
        out[k] = _number(v) if k in ("min", "max", "maxlen") else v
    return out


def _statistic_kind(cls: str, node: DomElement, code: int, style: str | None) -> str:
    if style == "count":
        desc = _attr(node, "desc") or ""
        gauge = (
            _attr(node, "assign") is not None
            or _CURRENT.search(desc) is not None
            or (cls, node.getAttribute("name")) in _GAUGE_COUNTS
        )
        return GAUGE if gauge else COUNTER
    return GAUGE if code in NUMERIC_CODES else STATE


def _parse_class(package: str, node: DomElement) -> XmlClass:
    xml_name = node.getAttribute("name")
    where = f"{package}:{xml_name}"
    md5 = hashlib.md5()
    _md5_tree(md5, node)
    props: list[Element] = []
    refs: dict[str, str] = {}
    parent: str | None = None
    xml_types: dict[str, str] = {}
    for p in _children(node, "property"):
        name = p.getAttribute("name")
        xml_type, code, _ = _type_of(p, f"{where}.{name}")
        access_text = _attr(p, "access") or "RO"
        if access_text not in ACCESS:
            raise SchemaXmlError(f"{where}.{name}: bad access {access_text!r}")
        props.append(
            Element(
                name=name,
                type_code=code,
                access=ACCESS[access_text],
                index=_attr(p, "index") == "y",
                optional=_attr(p, "optional") == "y",
                extra=_extras(p, ("unit", "min", "max", "maxlen", "desc")),
            )
        )
        xml_types[name] = xml_type
        ref = _attr(p, "references")
        if ref is not None:
            refs[name] = ref.split(":")[-1].lower()
            if _attr(p, "parentRef") == "y":
                parent = name
    stats: list[Element] = []
    infos: dict[str, StatisticInfo] = {}
    for s in _children(node, "statistic"):
        name = s.getAttribute("name")
        xml_type, code, style = _type_of(s, f"{where}.{name}")
        extra = _extras(s, ("unit", "desc"))
        desc = extra.get("desc")
        parts: list[tuple[str, str, str | None]]
        if style == "wm":
            parts = [
                ("", WATERMARK, None),
                ("High", WATERMARK_HIGH, "High"),
                ("Low", WATERMARK_LOW, "Low"),
            ]
        elif style == "mma":
            parts = [
                ("Samples", MMA_SAMPLES, "Samples"),
                ("Min", MMA_MIN, "Min"),
                ("Max", MMA_MAX, "Max"),
                ("Average", MMA_AVERAGE, "Average"),
            ]
        else:
            parts = [("", _statistic_kind(xml_name, s, code, style), None)]
        for suffix, kind, label in parts:
            e_extra = dict(extra)
            if label is not None and desc is not None:
                e_extra["desc"] = f"{desc} ({label})"
            stats.append(Element(name=name + suffix, type_code=code, extra=e_extra))
            infos[name + suffix] = StatisticInfo(name + suffix, name, xml_type, kind)
    methods: list[Method] = []
    for m in _children(node, "method"):
        args: list[Element] = []
        for a in _children(m, "arg"):
            aname = a.getAttribute("name")
            _, code, _ = _type_of(a, f"{where}.{m.getAttribute('name')}.{aname}")
            args.append(
                Element(
                    name=aname,
                    type_code=code,
                    extra=_extras(a, ("dir", "unit", "min", "max", "maxlen", "desc", "default")),
                )
            )
        methods.append(Method(m.getAttribute("name"), tuple(args), _extras(m, ("desc",))))
    schema = ClassSchema(
        key=SchemaKey(package, xml_name.lower(), md5.digest()),
        kind=KIND_TABLE,
        properties=tuple(props),
        statistics=tuple(stats),
        methods=tuple(methods),
    )
    return XmlClass(schema, xml_name, refs, parent, infos, xml_types)


def _parse_events(package: str, root: DomElement) -> list[XmlClass]:
    arg_nodes: dict[str, DomElement] = {}
    for ea in _children(root, "eventArguments"):
        for a in _children(ea, "arg"):
            arg_nodes[a.getAttribute("name")] = a
    out: list[XmlClass] = []
    for ev in _children(root, "event"):
        name = ev.getAttribute("name")
        md5 = hashlib.md5()
        _md5_tree(md5, ev)
        args: list[Element] = []
        xml_types: dict[str, str] = {}
        for arg_name in [a.strip() for a in (_attr(ev, "args") or "").split(",") if a.strip()]:
            anode = arg_nodes.get(arg_name)
            if anode is None:
                raise SchemaXmlError(f"{package}:{name}: undeclared event argument {arg_name!r}")
            sub = hashlib.md5()
            _md5_tree(sub, anode)
            md5.update(sub.digest())
            xml_type, code, _ = _type_of(anode, f"{package}:{name}.{arg_name}")
            args.append(
                Element(name=arg_name, type_code=code, extra=_extras(anode, ("unit", "desc")))
            )
            xml_types[arg_name] = xml_type
        sev_text = _attr(ev, "sev") or "inform"
        if sev_text not in SEVERITIES:
            raise SchemaXmlError(f"{package}:{name}: unknown severity {sev_text!r}")
        schema = ClassSchema(
            key=SchemaKey(package, name, md5.digest()), kind=KIND_EVENT, arguments=tuple(args)
        )
        out.append(XmlClass(schema, name, xml_types=xml_types, severity=SEVERITIES[sev_text]))
    return out


def parse_schema_xml(text: str | bytes) -> list[XmlClass]:
    """All classes, then all events, of one schema document."""
    doc = minidom.parseString(text)
    root = doc.documentElement
    if root is None or root.tagName != "schema":
        raise SchemaXmlError("root element is not <schema>")
    package = root.getAttribute("package")
    if not package:
        raise SchemaXmlError("<schema> has no package")
    classes = [_parse_class(package, c) for c in _children(root, "class")]
    return classes + _parse_events(package, root)


def load_schema(paths: Iterable[str] | None = None) -> ManagementSchema:
    """Parse schema files (default: the project's copy of qpid's broker, acl, ha, store)."""
    files = (
        list(paths) if paths is not None else [os.path.join(_SCHEMA_DIR, f) for f in DEFAULT_FILES]
    )
    out = ManagementSchema()
    for path in files:
        with open(path, "rb") as fh:
            out.classes.extend(parse_schema_xml(fh.read()))
    return out


_DEFAULT: ManagementSchema | None = None


def default_schema() -> ManagementSchema:
    """The default schema, parsed once per process (it never changes at run time)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = load_schema()
    return _DEFAULT


def describe(schema: ManagementSchema) -> list[dict[str, Any]]:
    """A plain table of every class (for tools that should not parse XML): wire facts + kinds."""
    out: list[dict[str, Any]] = []
    for c in schema:
        s = c.schema
        out.append(
            {
                "package": c.package,
                "name": c.name,
                "xml_name": c.xml_name,
                "kind": "event" if c.is_event else "table",
                "hash": c.key.hash.hex(),
                "severity": c.severity,
                "parent_ref": c.parent_ref,
                "properties": [
                    {
                        "name": p.name,
                        "type": p.type_code,
                        "xml_type": c.xml_types.get(p.name),
                        "access": p.access,
                        "index": p.index,
                        "optional": p.optional,
                        "references": c.references.get(p.name),
                    }
                    for p in s.properties
                ],
                "statistics": [
                    {
                        "name": e.name,
                        "type": e.type_code,
                        "xml_type": c.statistics[e.name].xml_type,
                        "kind": c.statistics[e.name].kind,
                        "base": c.statistics[e.name].base,
                        "unit": e.extra.get("unit"),
                    }
                    for e in s.statistics
                ],
                "methods": [m.name for m in s.methods],
                "arguments": [
                    {"name": a.name, "type": a.type_code, "xml_type": c.xml_types.get(a.name)}
                    for a in s.arguments
                ],
            }
        )
    return out


DESCRIPTION_FILE = os.path.join(_SCHEMA_DIR, "classes.json")


def main() -> None:
    """Regenerate ``schemas/qpid/classes.json`` from the XML (``python -m pipeline.qmfxml``)."""
    import json

    with open(DESCRIPTION_FILE, "w", encoding="utf-8") as fh:
        json.dump(describe(default_schema()), fh, indent=1, sort_keys=True)
        fh.write("\n")


if __name__ == "__main__":
    main()
