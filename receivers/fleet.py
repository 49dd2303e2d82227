"""Many brokers, one pipeline: the fleet configuration file and its receivers.

One TOML file names every broker (``[[broker]]`` tables, shared settings in an
optional ``[defaults]`` table); ``qmf receive --config`` and ``qmf run --config``
start one receiver per broker, each into landing partitions of its own
(``<name>-<n>``) whose rows carry the broker's name (the ``broker_name`` column
every layer keeps). Each receiver runs in its own thread with its own
connection: a broker that is down, slow or refuses the credentials holds up
nobody else. A receiver that stops on a fatal error (refused credentials, a
refused link) is started again after a back-off that doubles up to
``RESTART_MAX_S``, so a fixed password or a fixed broker needs no restart of
the others.

Secrets never sit in the file: credentials come from ``credentials_file`` or
the environment, as for ``qmf receive``. Relative file paths are relative to the
configuration file.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from receivers.config import ConfigError

log = logging.getLogger("qmf.fleet")

NAME_RE = re.compile(r"^[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*$")
RESTART_INITIAL_S = 2.0
RESTART_MAX_S = 60.0

# TOML key -> (receiver option, kind). Kinds: str, path (relative to the file),
# list (strings, joined by commas), bool, float, int.
_KEYS: dict[str, tuple[str, str]] = {
    "url": ("urls", "list"),
    "urls": ("urls", "list"),
    "preset": ("preset", "str"),
    "bind": ("bind", "list"),
    "queue": ("queue", "str"),
    "source": ("sources", "list"),
    "ca_file": ("caFile", "path"),
    "cert_file": ("certFile", "path"),
    "key_file": ("keyFile", "path"),
    "credentials_file": ("credentialsFile", "path"),
    "verify_hostname": ("verifyHostname", "bool"),
    "sasl": ("saslMechanisms", "list"),
    "console": ("consoleDialect", "str"),
    "console_refresh": ("consoleRefresh", "float"),
    "console_refresh_classes": ("consoleRefreshClasses", "list"),
    "credit": ("creditWindow", "int"),
    "flush_count": ("flushCount", "int"),
    "flush_ms": ("flushMs", "float"),
}
# Keys of a broker that are not receiver options.
_OWN = ("name", "heartbeat_interval", "partition")
_SECRETS = ("password", "user", "username")


@dataclass(frozen=True)
class FleetBroker:
    """One broker of the fleet: its name, its receiver's options, its v1 heartbeat interval."""

    name: str
    options: Mapping[str, str]
    heartbeat_interval_s: float | None = None
    partition: str | None = None

    def receiver_options(self, wants: str | None = None) -> dict[str, str]:
        """The options ``receivers.receiver.config_from_options`` takes, plus the console's
        schema-wants folder (the silver job's) when the broker has a console."""
        out = dict(self.options)
        if wants and out.get("console") == "true":
            out["consoleWants"] = wants
        return out


@dataclass(frozen=True)
class Fleet:
    """Every broker of a configuration file, in the file's order."""

    brokers: tuple[FleetBroker, ...]
    path: str | None = None

    def names(self) -> list[str]:
        return [b.name for b in self.brokers]

    def heartbeat_intervals(self) -> dict[str, float]:
        """``broker_name -> seconds`` for the brokers that say (gold's v1 liveness)."""
        return {b.name: b.heartbeat_interval_s for b in self.brokers
                if b.heartbeat_interval_s is not None}  # fmt: skip


def _value(where: str, key: str, kind: str, value: Any, base: Path) -> str:
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{where}: {key} must be {expected}, not {value!r}")

    if kind == "list":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or not all(isinstance(x, str) for x in items):
            raise bad("a string or a list of strings")
        return ",".join(items)
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        return str(value).lower()
    if kind in ("float", "int"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        if kind == "int" and not isinstance(value, int):
            raise bad("an integer")
        return str(value)
    if not isinstance(value, str) or not value:
        raise bad("a non-empty string")
    return str(base / value) if kind == "path" else value


def _broker(where: str, table: Mapping[str, Any], base: Path) -> FleetBroker:
    for k in table:
        if k in _SECRETS:
            raise ConfigError(f"{where}: no {k} in the file: use credentials_file (user=/"
                              "password= lines) or $QMF_BROKER_USER/$QMF_BROKER_PASSWORD")  # fmt: skip
        if k not in _KEYS and k not in _OWN:
            raise ConfigError(f"{where}: unknown key {k!r} (known: "
                              f"{', '.join(sorted([*_KEYS, *_OWN]))})")  # fmt: skip
    name = table.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{where}: name must be letters, digits, '_', with '.' or '-' "
                          f"between them, not {name!r}")  # fmt: skip
    if "url" in table and "urls" in table:
        raise ConfigError(f"{where} ({name}): url or urls, not both")
    if "url" not in table and "urls" not in table:
        raise ConfigError(f"{where} ({name}): a url is required")
    opts: dict[str, str] = {}
    for k, v in table.items():
        if k in _KEYS:
            opt, kind = _KEYS[k]
            opts[opt] = _value(f"{where} ({name})", k, kind, v, base)
    if "consoleDialect" in opts:
        if opts["consoleDialect"] not in ("AM1", "AM2"):
            raise ConfigError(f"{where} ({name}): console must be AM1 or AM2")
        opts["console"] = "true"
    hb = table.get("heartbeat_interval")
    if hb is not None:
        _value(f"{where} ({name})", "heartbeat_interval", "float", hb, base)
        if hb <= 0:
            raise ConfigError(f"{where} ({name}): heartbeat_interval must be positive")
    part = table.get("partition")
    if part is not None:
        _value(f"{where} ({name})", "partition", "str", part, base)
    from receivers.receiver import config_from_options

    try:  # every broker's settings are checked before anything starts
        config_from_options(opts)
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"{where} ({name}): {exc}") from exc
    return FleetBroker(name, opts, None if hb is None else float(hb), part)


def parse_fleet(text: str, base: str | os.PathLike[str] = ".", path: str | None = None) -> Fleet:
    """The fleet a TOML text describes; every problem is a ConfigError naming its place."""
    where = path or "fleet configuration"
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from exc
    unknown = sorted(set(doc) - {"broker", "defaults"})
    if unknown:
        raise ConfigError(f"{where}: unknown table(s) {', '.join(unknown)} "
                          "(a fleet has [defaults] and [[broker]] tables)")  # fmt: skip
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ConfigError(f"{where}: [defaults] must be a table")
    for k in ("name", "partition"):
        if k in defaults:
            raise ConfigError(f"{where}: [defaults] cannot set {k} (one per broker)")
    tables = doc.get("broker", [])
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"{where}: no [[broker]] table: name at least one broker")
    brokers = [
        _broker(f"{where}: broker {i + 1}", {**defaults, **t}, Path(base))
        for i, t in enumerate(tables)
    ]
    seen: set[str] = set()
    for b in brokers:
        if b.name in seen:
            raise ConfigError(f"{where}: two brokers named {b.name!r}")
        seen.add(b.name)
    return Fleet(tuple(brokers), path)


def load_fleet(path: str | os.PathLike[str]) -> Fleet:
    """Read and check a fleet configuration file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"fleet configuration {p} does not exist")
    return parse_fleet(p.read_text(encoding="utf-8"), p.resolve().parent, str(p))


def fleet_intervals(path: str | os.PathLike[str] | None) -> tuple[tuple[str, float], ...]:
    """``(broker_name, seconds)`` of each broker that gives a heartbeat_interval, for gold's
    ``LivenessRules.v1_intervals``; none without a file."""
    if path is None:
        return ()
    return tuple(sorted(load_fleet(path).heartbeat_intervals().items()))


@dataclass
class _Member:
    broker: FleetBroker
    receiver: Any = None
    failures: int = 0
    next_start: float = 0.0
    last_error: str | None = None
    starts: int = 0


@dataclass
class FleetReceivers:
    """One receiver thread per broker of ``fleet``, landing under ``root``; restarts a
    receiver that stopped on an error, with a back-off, until ``stop()``.

    ``make`` builds a receiver for a broker (tests and the Spark source pass their own
    console folder); the default lands with ``receivers.receiver.LandingSink``.
    """

    fleet: Fleet
    root: str
    wants: str | None = None
    make: Callable[[FleetBroker], Any] | None = None
    members: list[_Member] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _build(self, b: FleetBroker) -> Any:
        if self.make is not None:
            return self.make(b)
        from receivers.receiver import LandingSink, QmfReceiver, config_from_options

        cfg = config_from_options(b.receiver_options(self.wants))
        return QmfReceiver(cfg, LandingSink(self.root, b.partition, broker=b.name))

    def _start(self, m: _Member) -> None:
        try:
            m.receiver = self._build(m.broker)
            m.receiver.start_thread(name=f"qmf-receiver-{m.broker.name}")
            m.starts += 1
        except Exception as exc:  # a held partition, a missing TLS file: try again later
            self._failed(m, exc)

    def _failed(self, m: _Member, exc: BaseException) -> None:
        m.receiver = None
        m.failures += 1
        m.last_error = str(exc)
        wait = min(RESTART_INITIAL_S * 2 ** (m.failures - 1), RESTART_MAX_S)
        m.next_start = time.monotonic() + wait
        log.error("broker %s: receiver stopped (%s); starting it again in %.0f s",
                  m.broker.name, exc, wait)  # fmt: skip

    def start(self, ready_timeout_s: float = 30.0) -> FleetReceivers:
        """Start every receiver, wait (at most ``ready_timeout_s`` in all) until each has
        subscribed or failed, then watch them in a daemon thread."""
        self.members = [_Member(b) for b in self.fleet.brokers]
        for m in self.members:
            self._start(m)
        deadline = time.monotonic() + ready_timeout_s
        for m in self.members:
            r = m.receiver
            while r is not None and not r.ready.wait(0.05) and r.error is None:
                if time.monotonic() > deadline:
                    log.warning("broker %s: not subscribed after %.0f s; still trying",
                                m.broker.name, ready_timeout_s)  # fmt: skip
                    break
        self._thread = threading.Thread(target=self._watch, name="qmf-fleet", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            self.check()

    def check(self) -> None:
        """Restart receivers whose thread ended (on an error) once their back-off is over."""
        now = time.monotonic()
        for m in self.members:
            r = m.receiver
            if r is not None and r.ended:
                self._failed(m, r.error or RuntimeError("receiver thread ended"))
            elif r is not None and r.ready.is_set():
                m.failures = 0
            if m.receiver is None and now >= m.next_start and not self._stop.is_set():
                self._start(m)

    def status(self) -> dict[str, dict[str, Any]]:
        """Per broker: running, subscribed, starts, the last error (an operator's view)."""
        out: dict[str, dict[str, Any]] = {}
        for m in self.members:
            r = m.receiver
            error = m.last_error
            if r is not None and r.error is not None:  # ended, not yet seen by ``check``
                error = str(r.error)
            out[m.broker.name] = {
                "running": r is not None and not r.ended,
                "subscribed": bool(r is not None and r.ready.is_set() and not r.ended),
                "starts": m.starts,
                "last_error": error,
                "partition": None if r is None else r.sink.partition,
            }
        return out

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop every receiver (each lands and settles what it holds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        errors: list[str] = []
        for m in self.members:
            if m.receiver is not None:
                try:
                    m.receiver.stop(timeout_s)
                except Exception as exc:
                    errors.append(f"{m.broker.name}: {exc}")
        if errors:
            log.warning("fleet stop: %s", "; ".join(errors))

