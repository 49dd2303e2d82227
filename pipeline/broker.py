"""The project-local RabbitMQ node behind ``qmf broker start|stop|status|restart``.

The node lives entirely under ``<project>/.qmf/broker/`` (``QMF_HOME`` overrides the
``.qmf`` folder): its own Mnesia and log folders, config, enabled-plugins file, Erlang
cookie (``HOME``), epmd port and distribution port, so it never collides with a system
RabbitMQ.  Topology (exchanges, the ``amq.gen-*`` expiry policy, users, durable queues)
comes from a definitions file loaded at every boot, so a wiped state dir comes back
identical.  When ``QMF_BROKER_URL`` is set, that broker is used instead and only its
reachability is checked.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import SetupError

if TYPE_CHECKING:
    from proton import SSLDomain

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 35672
DEFAULT_TLS_PORT = 35671
DEFAULT_DIST_PORT = 35682
DEFAULT_EPMD_PORT = 35669
DEFAULT_USER = "guest"
DEFAULT_PASSWORD = "guest"
# The extra user for SASL PLAIN tests (guest is loopback-only and anonymous-mapped).
DEFAULT_EXTRA_USER = "qmf"
DEFAULT_EXTRA_PASSWORD = "qmf-secret"
# CN of the generated client certificate; also a password-less user for SASL EXTERNAL.
DEFAULT_CLIENT_CN = "qmf-client"
DEFAULT_GEN_QUEUE_EXPIRES_MS = 60_000
DEFAULT_START_TIMEOUT = 120.0
DEFAULT_STOP_TIMEOUT = 60.0

EXCHANGES: tuple[tuple[str, str], ...] = (
    ("qpid.management", "topic"),
    ("qmf.default.topic", "topic"),
    ("qmf.default.direct", "direct"),
)
PLUGINS: tuple[str, ...] = ("rabbitmq_amqp1_0", "rabbitmq_auth_mechanism_ssl")

# Set only in the server's environment (not rabbitmqctl's): identifies our beam process.
SERVER_MARK = "QMF_BROKER_SERVER_NODE"

AMQP10_SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP10_HEADER = b"AMQP\x00\x01\x00\x00"


class BrokerError(SetupError):
    """Raised when the broker cannot be started, stopped or reached; the message says why
    (a SetupError: ``qmf`` prints it on one line and exits 2)."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for the TLS listener and for a client that authenticates with a cert."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def all(self) -> tuple[Path, ...]:
        return (self.ca, self.server_cert, self.server_key, self.client_cert, self.client_key)

    def exist(self) -> bool:
        return all(p.is_file() and p.stat().st_size > 0 for p in self.all())


@dataclass(frozen=True)
class BrokerPaths:
    """Every file and folder of the local node, derived from one state dir."""

    state: Path

    @property
    def mnesia(self) -> Path:
        return self.state / "mnesia"

    @property
    def log_dir(self) -> Path:
        return self.state / "log"

    @property
    def log_file(self) -> Path:
        return self.log_dir / "rabbit.log"

    @property
    def console_log(self) -> Path:
        return self.log_dir / "console.log"

    @property
    def home(self) -> Path:
        return self.state / "home"

    @property
    def config(self) -> Path:
        return self.state / "rabbitmq.conf"

    @property
    def advanced_config(self) -> Path:
        return self.state / "advanced.config"

    @property
    def conf_env(self) -> Path:
        return self.state / "rabbitmq-env.conf"

    @property
    def inetrc(self) -> Path:
        return self.state / "erl_inetrc"

    @property
    def enabled_plugins(self) -> Path:
        return self.state / "enabled_plugins"

    @property
    def definitions(self) -> Path:
        return self.state / "definitions.json"

    @property
    def pid_file(self) -> Path:
        return self.state / "rabbit.pid"

    @property
    def lock_file(self) -> Path:
        return self.state / "lock"

    @property
    def users_file(self) -> Path:
        return self.state / "users.json"

    @property
    def queues_file(self) -> Path:
        return self.state / "queues.json"

    @property
    def tls_dir(self) -> Path:
        return self.state / "tls"

    @property
    def tls_choice(self) -> Path:
        return self.state / "tls.json"


@dataclass(frozen=True)
class BrokerConfig:
    """Where the local node listens and what it is called; env overrides applied once."""

    host: str
    port: int
    tls_port: int
    dist_port: int
    epmd_port: int
    paths: BrokerPaths
    node: str
    extra_user: str
    extra_password: str
    gen_queue_expires_ms: int
    memory_limit: str = "2GB"


@dataclass(frozen=True)
class BrokerInfo:
    """What clients need: URL, host, ports, and for the local node its files."""

    url: str
    host: str
    port: int
    tls_port: int | None
    user: str | None
    password: str | None
    local: bool
    node: str | None = None
    paths: BrokerPaths | None = None
    tls: TlsFiles | None = None
    extra_user: str | None = None
    extra_password: str | None = None

    @property
    def tls_url(self) -> str | None:
        if self.tls_port is None:
            return None
        return f"amqps://{self.host}:{self.tls_port}"


@dataclass
class BrokerStatus:
    """A cheap status (pid + port probes), no Erlang CLI involved."""

    running: bool
    managed: bool
    url: str
    node: str | None = None
    pid: int | None = None
    amqp10: bool = False
    detail: str = ""
    ports: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        state = "running" if self.running else "stopped"
        parts = [f"broker: {state}", f"url: {self.url}"]
        if self.node:
            parts.append(f"node: {self.node}")
        if self.pid:
            parts.append(f"pid: {self.pid}")
        for name, port in self.ports.items():
            parts.append(f"{name}: {port}")
        if self.detail:
            parts.append(self.detail)
        return "\n".join(parts)


# --------------------------------------------------------------------------- config


def project_root() -> Path:
    """The repo root when running from a checkout, else the cwd (installed package)."""
    here = Path(__file__).resolve().parent.parent
    if (here / "pyproject.toml").is_file():
        return here
    return Path.cwd()


def qmf_home() -> Path:
    env = os.environ.get("QMF_HOME")
    return Path(env).expanduser().resolve() if env else project_root() / ".qmf"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise BrokerError(f"{name}={raw!r} is not an integer") from exc


def load_config(home: Path | str | None = None) -> BrokerConfig:
    """Read env overrides; the node name hashes the state dir so two checkouts differ.

    ``home`` replaces the ``.qmf`` folder (like QMF_HOME) for callers that run a node
    of their own; ports still come from the environment (see isolated_config()).
    """
    base = Path(home).expanduser().resolve() if home is not None else qmf_home()
    state = base / "broker"
    digest = hashlib.sha1(str(state).encode()).hexdigest()[:8]
    return BrokerConfig(
        host=os.environ.get("QMF_BROKER_HOST", DEFAULT_HOST),
        port=_env_int("QMF_BROKER_PORT", DEFAULT_PORT),
        tls_port=_env_int("QMF_BROKER_TLS_PORT", DEFAULT_TLS_PORT),
        dist_port=_env_int("QMF_BROKER_DIST_PORT", DEFAULT_DIST_PORT),
        epmd_port=_env_int("QMF_BROKER_EPMD_PORT", DEFAULT_EPMD_PORT),
        paths=BrokerPaths(state),
        node=f"qmf-{digest}@localhost",
        extra_user=os.environ.get("QMF_BROKER_EXTRA_USER", DEFAULT_EXTRA_USER),
        extra_password=os.environ.get("QMF_BROKER_EXTRA_PASSWORD", DEFAULT_EXTRA_PASSWORD),
        gen_queue_expires_ms=_env_int("QMF_BROKER_GEN_EXPIRES_MS", DEFAULT_GEN_QUEUE_EXPIRES_MS),
        memory_limit=_memory_limit(os.environ.get("QMF_BROKER_MEMORY", "2GB")),
    )


def config_env(cfg: BrokerConfig) -> dict[str, str]:
    """The environment variables that make ``load_config`` give ``cfg``'s node and ports
    (for a ``qmf`` process run against a node of ``isolated_config``)."""
    return {
        "QMF_HOME": str(cfg.paths.state.parent),
        "QMF_BROKER_PORT": str(cfg.port),
        "QMF_BROKER_TLS_PORT": str(cfg.tls_port),
        "QMF_BROKER_DIST_PORT": str(cfg.dist_port),
        "QMF_BROKER_EPMD_PORT": str(cfg.epmd_port),
    }


def _memory_limit(raw: str) -> str:
    """RabbitMQ ignores an unparsable watermark (falls back to 40% of RAM): refuse it here."""
    value = raw.strip()
    if not re.fullmatch(r"\d+(\.\d+)?([kKMGT]i?B|[kKMGT]B|B)?", value):
        raise BrokerError(f"QMF_BROKER_MEMORY={raw!r}: expected e.g. 2GB, 512MiB, 1073741824")
    return value


def _ephemeral_low() -> int:
    """The first port the kernel hands out for outgoing connections (Linux; else 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1) -> int:
    """A loopback port p with p..p+span-1 bindable now, below the ephemeral range.

    A port the kernel gave for ``bind(0)`` comes from the range it also uses for the
    source ports of outgoing connections, so any client (Spark, the S3 client, another
    test) may take it before the server binds it. Below that range only servers that
    chose the same port collide, and a random pick keeps that rare (callers retry).
    """
    high = _ephemeral_low() - span
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, high) if high > 10000 else rng.randrange(1024, 65000 - span)
        if all(_bindable(port + i) for i in range(span)):
            return port
    raise BrokerError("no free loopback port range found")


def isolated_config(home: Path | str) -> BrokerConfig:
    """A second, throw-away node under ``home`` on free ports (tests that stop/restart).

    Pass it as ``cfg=`` to start_broker/stop_broker/restart_broker/declare_queue...; the
    shared node other tests use is left alone.
    """
    return dataclasses.replace(
        load_config(home),
        port=free_port(),
        tls_port=free_port(),
        dist_port=free_port(10),  # + the CLI's distribution range above it
        epmd_port=free_port(),
    )


def start_isolated(home: Path | str, timeout: float | None = None, attempts: int = 3) -> BrokerConfig:
    """``isolated_config`` started: new ports when another server bound one first.

    Between picking a free port and the node's bind, another process may take it; the
    node then fails to boot with ``eaddrinuse``, and a fresh pick is the cure.
    """
    for _ in range(attempts - 1):
        cfg = isolated_config(home)
        try:
            start_broker(timeout, cfg=cfg)
            return cfg
        except BrokerError as exc:
            if "eaddrinuse" not in str(exc).lower():
                raise
            log.warning("node %s: a port was taken before it bound; new ports", cfg.node)
    cfg = isolated_config(home)
    start_broker(timeout, cfg=cfg)
    return cfg


def _rabbit_bin(name: str) -> str:
    """Use the unwrapped scripts: /usr/sbin's wrappers would su to the rabbitmq user."""
    base = os.environ.get("QMF_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin")
    path = Path(base) / name
    if path.is_file():
        return str(path)
    found = shutil.which(name)
    if found:
        return found
    raise BrokerError(
        f"{name} not found (looked in {base} and PATH); run tools/setup.sh "
        "to install rabbitmq-server, or set QMF_BROKER_URL to use another broker"
    )


def node_env(cfg: BrokerConfig) -> dict[str, str]:
    """Environment for rabbitmq-server and rabbitmqctl: everything points into the state dir."""
    p = cfg.paths
    # A clean environment: a caller's ERL_*/RABBITMQ_* (or a test's monkeypatched env)
    # must not leak into a node that outlives it.
    path = os.environ.get("PATH", "")
    env = {
        "PATH": ":".join(x for x in (path, "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin") if x),
        "LANG": "C.UTF-8",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
    }
    env.update(
        {
            "HOME": str(p.home),
            "RABBITMQ_NODENAME": cfg.node,
            "RABBITMQ_USE_LONGNAME": "false",
            "RABBITMQ_CONF_ENV_FILE": str(p.conf_env),
            "RABBITMQ_CONFIG_FILE": str(p.config),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(p.advanced_config),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(p.enabled_plugins),
            "RABBITMQ_MNESIA_BASE": str(p.mnesia),
            "RABBITMQ_LOG_BASE": str(p.log_dir),
            "RABBITMQ_PID_FILE": str(p.pid_file),
            "RABBITMQ_DIST_PORT": str(cfg.dist_port),
            # The CLI's own distribution ports default to 35672-35682: our AMQP port.
            "RABBITMQ_CTL_DIST_PORT_MIN": str(cfg.dist_port + 1),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(cfg.dist_port + 9),
            "ERL_EPMD_PORT": str(cfg.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            # Resolve "localhost" (the node's host part) without /etc/hosts, which
            # minimal images (debootstrap minbase, some containers) lack.
            "ERL_INETRC": str(p.inetrc),
            # A failed boot must not stall on a large crash dump (nor litter the cwd).
            "ERL_CRASH_DUMP": str(p.log_dir / "erl_crash.dump"),
            "ERL_CRASH_DUMP_SECONDS": "5",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "RABBITMQ_ALLOW_INPUT": "",
            "LC_ALL": "C.UTF-8",
        }
    )
    return env


# --------------------------------------------------------------------------- definitions


def password_hash(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's rabbit_password_hashing_sha256: base64(salt4 + sha256(salt4 + password))."""
    salt = os.urandom(4) if salt is None else salt
    digest = hashlib.sha256(salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


def _read_json(path: Path, default: object) -> object:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default
    except json.JSONDecodeError as exc:
        raise BrokerError(f"{path} is not valid JSON: {exc}") from exc


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _users(cfg: BrokerConfig) -> dict[str, dict[str, str]]:
    """guest, the extra SASL user, the cert user, plus users added with add_user()."""
    raw = _read_json(cfg.paths.users_file, {})
    stored: dict[str, dict[str, str]] = raw if isinstance(raw, dict) else {}
    users: dict[str, dict[str, str]] = {
        DEFAULT_USER: {"hash": password_hash(DEFAULT_PASSWORD, b"qmf0"), "tags": "administrator"},
        DEFAULT_CLIENT_CN: {"hash": "", "tags": ""},
    }
    if cfg.extra_user:
        users[cfg.extra_user] = {
            "hash": password_hash(cfg.extra_password, b"qmf1"),
            "tags": "",
        }
    users.update(stored)
    return users


def _queues(cfg: BrokerConfig) -> dict[str, dict[str, object]]:
    raw = _read_json(cfg.paths.queues_file, {})
    return raw if isinstance(raw, dict) else {}


def _queue_defs(
    name: str, durable: bool, bindings: Sequence[tuple[str, str]]
) -> tuple[dict[str, object], list[dict[str, object]]]:
    queue: dict[str, object] = {
        "name": name,
        "vhost": "/",
        "durable": durable,
        "auto_delete": False,
        "arguments": {},
    }
    binds: list[dict[str, object]] = [
        {
            "source": exchange,
            "vhost": "/",
            "destination": name,
            "destination_type": "queue",
            "routing_key": key,
            "arguments": {},
        }
        for exchange, key in bindings
    ]
    return queue, binds


def build_definitions(cfg: BrokerConfig) -> dict[str, object]:
    """The whole topology as one RabbitMQ definitions document."""
    users = _users(cfg)
    queues: list[dict[str, object]] = []
    bindings: list[dict[str, object]] = []
    for name, spec in sorted(_queues(cfg).items()):
        raw_binds = spec.get("bindings", [])
        pairs = [(str(b[0]), str(b[1])) for b in raw_binds] if isinstance(raw_binds, list) else []
        q, b = _queue_defs(name, bool(spec.get("durable", True)), pairs)
        queues.append(q)
        bindings.extend(b)
    return {
        "rabbit_version": "3.10.8",
        "vhosts": [{"name": "/"}],
        "users": [
            {
                "name": name,
                "password_hash": u["hash"],
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": u.get("tags", ""),
            }
            for name, u in sorted(users.items())
        ],
        "permissions": [
            {"user": name, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
            for name in sorted(users)
        ],
        "exchanges": [
            {
                "name": name,
                "vhost": "/",
                "type": kind,
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
            for name, kind in EXCHANGES
        ],
        "policies": [
            {
                "vhost": "/",
                "name": "qmf-expire-amq-gen",
                "pattern": r"^amq\.gen-",
                "apply-to": "queues",
                "definition": {"expires": cfg.gen_queue_expires_ms},
                "priority": 0,
            }
        ],
        "queues": queues,
        "bindings": bindings,
    }


def _tls_files(cfg: BrokerConfig) -> TlsFiles | None:
    """The TLS files the listener uses: a chosen set (ensure_tls(dir)) or the state dir's."""
    raw = _read_json(cfg.paths.tls_choice, None)
    if isinstance(raw, dict):
        files = TlsFiles(*(Path(str(raw[k])) for k in (
            "ca", "server_cert", "server_key", "client_cert", "client_key")))
    else:
        files = _tls_in(cfg.paths.tls_dir)
    return files if files.exist() else None


def build_config(cfg: BrokerConfig, tls: TlsFiles | None) -> str:
    """rabbitmq.conf (new-style): loopback listeners, definitions at boot, TLS if present."""
    lines = [
        "# generated by pipeline/broker.py; edits are overwritten at each start",
        f"listeners.tcp.1 = {cfg.host}:{cfg.port}",
        f"load_definitions = {cfg.paths.definitions}",
        "loopback_users.guest = true",
        "log.console = false",
        "log.file = rabbit.log",
        "log.file.level = info",
        "log.file.rotation.size = 10485760",
        "log.file.rotation.count = 3",
        # Shared 2-core test machines also run Spark: cap the node instead of 40% of RAM.
        f"vm_memory_high_watermark.absolute = {cfg.memory_limit}",
        "disk_free_limit.absolute = 50MB",
        "auth_mechanisms.1 = PLAIN",
        "auth_mechanisms.2 = AMQPLAIN",
        "auth_mechanisms.3 = EXTERNAL",
        "ssl_cert_login_from = common_name",
        "amqp1_0.default_user = guest",
        "amqp1_0.protocol_strict_mode = false",
    ]
    if tls is not None:
        lines += [
            f"listeners.ssl.1 = {cfg.host}:{cfg.tls_port}",
            f"ssl_options.cacertfile = {tls.ca}",
            f"ssl_options.certfile = {tls.server_cert}",
            f"ssl_options.keyfile = {tls.server_key}",
            "ssl_options.verify = verify_peer",
            "ssl_options.fail_if_no_peer_cert = false",
        ]
    else:
        lines.append("listeners.ssl = none")
    return "\n".join(lines) + "\n"


def _write_inetrc(p: BrokerPaths) -> None:
    """Erlang resolver config: "localhost" is 127.0.0.1 even without /etc/hosts."""
    text = '{host, {127,0,0,1}, ["localhost"]}.\n{lookup, [file, native]}.\n'
    if not p.inetrc.is_file() or p.inetrc.read_text() != text:
        p.state.mkdir(parents=True, exist_ok=True)
        _write_atomic(p.inetrc, text)


def write_node_files(cfg: BrokerConfig) -> TlsFiles | None:
    """(Re)write config, plugins and definitions; cheap, so done at every start."""
    p = cfg.paths
    for d in (p.state, p.mnesia, p.log_dir, p.home):
        d.mkdir(parents=True, exist_ok=True)
    tls = _tls_files(cfg)
    if tls is None and shutil.which("openssl"):
        tls = generate_tls(p.tls_dir)
    _write_atomic(p.config, build_config(cfg, tls))
    _write_atomic(p.advanced_config, "[].\n")
    _write_inetrc(p)
    _write_atomic(p.conf_env, "# intentionally empty: keeps /etc/rabbitmq/rabbitmq-env.conf out\n")
    _write_atomic(p.enabled_plugins, "[" + ",".join(PLUGINS) + "].\n")
    _write_atomic(p.definitions, json.dumps(build_definitions(cfg), indent=1), 0o600)
    return tls


# --------------------------------------------------------------------------- TLS


def _tls_in(directory: Path) -> TlsFiles:
    return TlsFiles(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )


def _openssl(args: Sequence[str], cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise BrokerError("openssl not found; install it (tools/setup.sh does)")
    proc = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise BrokerError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def check_tls_files(files: TlsFiles) -> None:
    """Load every PEM as the listener and a client would: RabbitMQ boots fine with broken
    TLS files and only fails each handshake later, so catch that before configuring."""
    try:
        ssl.create_default_context(cafile=str(files.ca))
        for cert, key in ((files.server_cert, files.server_key),
                          (files.client_cert, files.client_key)):
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError) as exc:
        raise BrokerError(f"unusable TLS files in {files.ca.parent}: {exc}") from exc


def tls_handshake(host: str, port: int, files: TlsFiles, timeout: float = 5.0) -> str | None:
    """None when a TLS handshake with the listener verifies against our CA, else why not."""
    ctx = ssl.create_default_context(cafile=str(files.ca))
    ctx.load_cert_chain(str(files.client_cert), str(files.client_key))
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, \
                ctx.wrap_socket(raw, server_hostname="localhost"):
            return None
    except (ssl.SSLError, ssl.CertificateError, OSError) as exc:
        return str(exc) or type(exc).__name__


def generate_tls(directory: Path | str, client_cn: str = DEFAULT_CLIENT_CN,
                 days: int = 3650) -> TlsFiles:
    """A throw-away CA, a server cert for localhost/127.0.0.1 and a client cert (CN=client_cn).

    Idempotent: existing files are kept, so a running listener stays valid.
    """
    d = Path(directory).resolve()
    files = _tls_in(d)
    if files.exist():
        return files
    d.mkdir(parents=True, exist_ok=True)
    ext = d / "ext.cnf"
    ext.write_text(
        "[server]\n"
        "basicConstraints = CA:FALSE\n"
        "keyUsage = digitalSignature, keyEncipherment\n"
        "extendedKeyUsage = serverAuth\n"
        "subjectAltName = DNS:localhost, DNS:127.0.0.1, IP:127.0.0.1\n"
        "[client]\n"
        "basicConstraints = CA:FALSE\n"
        "keyUsage = digitalSignature, keyEncipherment\n"
        "extendedKeyUsage = clientAuth\n"
    )
    n = str(days)
    _openssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
              "-out", "ca.pem", "-days", n, "-subj", "/CN=qmf-test-ca"], d)
    for role, cn in (("server", "localhost"), ("client", client_cn)):
        _openssl(["req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{role}.key",
                  "-out", f"{role}.csr", "-subj", f"/CN={cn}"], d)
        _openssl(["x509", "-req", "-in", f"{role}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                  "-CAcreateserial", "-out", f"{role}.pem", "-days", n,
                  "-extfile", "ext.cnf", "-extensions", role], d)
        (d / f"{role}.csr").unlink(missing_ok=True)
    for key in ("ca.key", "server.key", "client.key"):
        os.chmod(d / key, 0o600)
    return files


# --------------------------------------------------------------------------- probes


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def amqp10_handshake(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when the listener answers an AMQP 1.0 SASL header with the same header.

    Without the AMQP 1.0 plugin RabbitMQ answers with its 0-9-1 header instead.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(AMQP10_SASL_HEADER)
            got = b""
            deadline = time.monotonic() + timeout
            while len(got) < 8 and time.monotonic() < deadline:
                chunk = sock.recv(8 - len(got))
                if not chunk:
                    break
                got += chunk
            return got == AMQP10_SASL_HEADER
    except OSError:
        return False


def amqp10_attach(url: str, address: str = "/exchange/qpid.management",
                  timeout: float = 10.0, ssl_domain: SSLDomain | None = None) -> None:
    """Open a real proton connection and attach a sender; raises BrokerError on failure."""
    from proton.utils import BlockingConnection

    try:
        conn = BlockingConnection(url, timeout=timeout, ssl_domain=ssl_domain)
    except Exception as exc:
        raise BrokerError(f"cannot open an AMQP 1.0 connection to {_redact(url)}: {exc}") from exc
    try:
        conn.create_sender(address)
    except Exception as exc:
        raise BrokerError(f"cannot attach to {address} on {_redact(url)}: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def _redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_bytes()[-16384:].decode("utf-8", "replace")
    except OSError:
        return f"({path} not readable)"
    return "\n".join(data.splitlines()[-lines:])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own exited child) is not alive.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _is_our_node(pid: int, cfg: BrokerConfig) -> bool:
    """RabbitMQ names the node at runtime (not via -sname), so match on its environment."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return "beam" in exe and f"{SERVER_MARK}={cfg.node}".encode() in environ


def _node_pid(cfg: BrokerConfig) -> int | None:
    """The beam pid of *this* node: the pid file if it is right, else a bounded /proc scan."""
    try:
        pid = int(cfg.paths.pid_file.read_text().strip())
    except (OSError, ValueError):
        pid = 0
    if pid and _pid_alive(pid) and _is_our_node(pid, cfg):
        return pid
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            cand = int(entry.name)
            if _is_our_node(cand, cfg) and _pid_alive(cand):
                return cand
    return None


# --------------------------------------------------------------------------- lifecycle


@contextlib.contextmanager
def _locked(cfg: BrokerConfig, timeout: float = 300.0) -> Iterator[None]:
    """Serialise start/stop across processes (parallel test sessions call ensure_broker)."""
    cfg.paths.state.mkdir(parents=True, exist_ok=True)
    with open(cfg.paths.lock_file, "a+") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BrokerError(f"timed out waiting for {cfg.paths.lock_file}") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def external_url() -> str | None:
    url = os.environ.get("QMF_BROKER_URL", "").strip()
    return url or None


def local_info(cfg: BrokerConfig | None = None) -> BrokerInfo:
    cfg = cfg or load_config()
    return BrokerInfo(
        url=f"amqp://{DEFAULT_USER}:{DEFAULT_PASSWORD}@{cfg.host}:{cfg.port}",
        host=cfg.host,
        port=cfg.port,
        tls_port=cfg.tls_port if _tls_files(cfg) is not None else None,
        user=DEFAULT_USER,
        password=DEFAULT_PASSWORD,
        local=True,
        node=cfg.node,
        paths=cfg.paths,
        tls=_tls_files(cfg),
        extra_user=cfg.extra_user or None,
        extra_password=cfg.extra_password if cfg.extra_user else None,
    )


def remote_info(url: str) -> BrokerInfo:
    parts = urllib.parse.urlsplit(url if "://" in url else f"amqp://{url}")
    tls = parts.scheme == "amqps"
    port = parts.port or (5671 if tls else 5672)
    return BrokerInfo(
        url=urllib.parse.urlunsplit(parts),
        host=parts.hostname or "127.0.0.1",
        port=port,
        tls_port=port if tls else None,
        user=urllib.parse.unquote(parts.username) if parts.username else None,
        password=urllib.parse.unquote(parts.password) if parts.password else None,
        local=False,
    )


def _check_ports_free(cfg: BrokerConfig) -> None:
    for name, port in (("AMQP", cfg.port), ("TLS", cfg.tls_port), ("distribution", cfg.dist_port)):
        if port_open(cfg.host, port, timeout=0.5):
            raise BrokerError(
                f"{name} port {cfg.host}:{port} is already in use by another process "
                f"(not node {cfg.node}); stop it or choose other ports with "
                "QMF_BROKER_PORT / QMF_BROKER_TLS_PORT / QMF_BROKER_DIST_PORT"
            )
    # An epmd there is fine (ours from an earlier run); anything else would hang the boot.
    if port_open("127.0.0.1", cfg.epmd_port, timeout=0.5) and not _is_epmd(cfg.epmd_port):
        raise BrokerError(
            f"epmd port 127.0.0.1:{cfg.epmd_port} is taken by something that is not epmd; "
            "choose another with QMF_BROKER_EPMD_PORT"
        )


def _is_epmd(port: int, timeout: float = 2.0) -> bool:
    """epmd answers NAMES_REQ ("n") with its own port as 4 big-endian bytes."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"\x00\x01n")
            got = b""
            deadline = time.monotonic() + timeout
            while len(got) < 4 and time.monotonic() < deadline:
                chunk = sock.recv(4 - len(got))
                if not chunk:
                    break
                got += chunk
            return len(got) == 4 and int.from_bytes(got, "big") == port
    except OSError:
        return False


def _wait_ready(cfg: BrokerConfig, proc: subprocess.Popen[bytes] | None, timeout: float) -> int:
    """Poll until AMQP 1.0 works end to end; returns the beam pid."""
    deadline = time.monotonic() + timeout
    info = local_info(cfg)
    last_error = "the AMQP port never opened"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(_failure(
                cfg, f"rabbitmq-server exited (code {proc.returncode}) before accepting "
                "AMQP 1.0 connections"))
        if amqp10_handshake(cfg.host, cfg.port, timeout=2.0):
            try:
                amqp10_attach(info.url, timeout=min(10.0, max(1.0, deadline - time.monotonic())))
            except BrokerError as exc:
                last_error = str(exc)
            else:
                pid = _node_pid(cfg)
                tls = _tls_files(cfg)
                tls_error = tls_handshake(cfg.host, cfg.tls_port, tls) if tls else None
                if pid is not None and tls_error is None:
                    return pid
                last_error = (f"TLS listener {cfg.host}:{cfg.tls_port} fails: {tls_error}"
                              if tls_error else "node answers but its pid file is missing")
        elif port_open(cfg.host, cfg.port, timeout=0.5):
            last_error = "the port answers but not with AMQP 1.0 (plugin not loaded yet?)"
        time.sleep(0.5)
    raise BrokerError(_failure(cfg, f"not ready after {timeout:.0f}s: {last_error}"))


_KEY_LINE = re.compile(r"ERROR|BOOT FAILED|Kernel pid terminated|\[error\].*(reason|Error)")


def _failure(cfg: BrokerConfig, why: str) -> str:
    """The reason first (key lines of both logs), then the raw tails."""
    p = cfg.paths
    tails = {path: _tail(path) for path in (p.log_file, p.console_log)}
    key = [ln for text in tails.values() for ln in text.splitlines() if _KEY_LINE.search(ln)]
    parts = [f"local RabbitMQ node {cfg.node} failed to start: {why}"]
    if key:
        parts.append("--- key lines\n" + "\n".join(key[-8:]))
    parts += [f"--- tail of {path}\n{text}" for path, text in tails.items()]
    return "\n".join(parts)


def _start_locked(cfg: BrokerConfig, timeout: float) -> BrokerInfo:
    pid = _node_pid(cfg)
    if pid is not None:
        # Whoever started it held the lock until it was ready, so it should answer now;
        # if not, it runs with other ports or is wedged: say so instead of waiting long.
        try:
            _wait_ready(cfg, None, min(timeout, 30.0))
        except BrokerError as exc:
            raise BrokerError(
                f"node {cfg.node} (pid {pid}) runs but does not accept AMQP 1.0 on "
                f"{cfg.host}:{cfg.port}; if its ports changed, run `qmf broker restart`.\n{exc}"
            ) from exc
        return local_info(cfg)
    _check_ports_free(cfg)
    write_node_files(cfg)
    server = _rabbit_bin("rabbitmq-server")
    cfg.paths.pid_file.unlink(missing_ok=True)
    with open(cfg.paths.console_log, "ab") as out:
        out.write(f"\n==== qmf broker start {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            [server],
            env={**node_env(cfg), SERVER_MARK: cfg.node},
            cwd=cfg.paths.state,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the calling shell / pytest session
        )
    try:
        _wait_ready(cfg, proc, timeout)
    except BrokerError:
        _kill_node(cfg, proc.pid)
        _stop_epmd(cfg)
        raise
    return local_info(cfg)


def _kill_node(cfg: BrokerConfig, wrapper_pid: int | None) -> None:
    """Best effort after a failed start: stop whatever this start launched."""
    pid = _node_pid(cfg)
    for target in (pid, wrapper_pid):
        if target:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid and _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def start_broker(timeout: float | None = None, cfg: BrokerConfig | None = None) -> BrokerInfo:
    """Start the local node (idempotent) and wait until AMQP 1.0 attaches work."""
    cfg = cfg or load_config()
    t = timeout if timeout is not None else float(
        os.environ.get("QMF_BROKER_START_TIMEOUT", DEFAULT_START_TIMEOUT))
    with _locked(cfg):
        return _start_locked(cfg, t)


def _stop_locked(cfg: BrokerConfig, timeout: float) -> bool:
    pid = _node_pid(cfg)
    if pid is None:
        return False
    # RabbitMQ treats SIGTERM as a graceful `rabbitmqctl stop`: queues flushed to disk.
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.2)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        kill_deadline = time.monotonic() + 10
        while time.monotonic() < kill_deadline and _pid_alive(pid):
            time.sleep(0.1)
    # Listener sockets close with the VM; wait for the port so a restart can bind it.
    port_deadline = time.monotonic() + 10
    while time.monotonic() < port_deadline and port_open(cfg.host, cfg.port, timeout=0.2):
        time.sleep(0.1)
    cfg.paths.pid_file.unlink(missing_ok=True)
    return True


def stop_broker(timeout: float = DEFAULT_STOP_TIMEOUT, cfg: BrokerConfig | None = None) -> bool:
    """Stop this project's node only; True if it was running."""
    cfg = cfg or load_config()
    with _locked(cfg):
        was = _stop_locked(cfg, timeout)
        _stop_epmd(cfg)
        return was


def _stop_epmd(cfg: BrokerConfig) -> None:
    """Our node spawned an epmd on its private port; epmd refuses -kill while nodes live."""
    exe = shutil.which("epmd")
    if exe is None or not port_open("127.0.0.1", cfg.epmd_port, timeout=0.3):
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([exe, "-port", str(cfg.epmd_port), "-kill"], capture_output=True,
                       timeout=10, stdin=subprocess.DEVNULL)


def restart_broker(timeout: float | None = None, cfg: BrokerConfig | None = None) -> BrokerInfo:
    """Graceful stop + start keeping all state (durable queues and their messages)."""
    cfg = cfg or load_config()
    t = timeout if timeout is not None else float(
        os.environ.get("QMF_BROKER_START_TIMEOUT", DEFAULT_START_TIMEOUT))
    with _locked(cfg):
        _stop_locked(cfg, DEFAULT_STOP_TIMEOUT)
        return _start_locked(cfg, t)


def broker_status(cfg: BrokerConfig | None = None) -> BrokerStatus:
    """Cheap status of the broker in use (local node, or the one at QMF_BROKER_URL)."""
    url = external_url() if cfg is None else None
    if url is not None:
        info = remote_info(url)
        up = port_open(info.host, info.port, timeout=2.0)
        return BrokerStatus(
            running=up, managed=False, url=_redact(info.url),
            amqp10=up and (info.tls_port is not None or amqp10_handshake(info.host, info.port)),
            detail="external broker (QMF_BROKER_URL)",
        )
    cfg = cfg or load_config()
    pid = _node_pid(cfg)
    amqp10 = pid is not None and amqp10_handshake(cfg.host, cfg.port, timeout=2.0)
    ports = {"amqp_port": cfg.port, "dist_port": cfg.dist_port, "epmd_port": cfg.epmd_port}
    if _tls_files(cfg) is not None:
        ports["tls_port"] = cfg.tls_port
    detail = f"state: {cfg.paths.state}\nlog: {cfg.paths.log_file}"
    if pid is not None and not amqp10:
        detail += "\nnode process is up but AMQP 1.0 does not answer yet"
    return BrokerStatus(
        running=pid is not None and amqp10, managed=True, url=local_info(cfg).url,
        node=cfg.node, pid=pid, amqp10=amqp10, detail=detail, ports=ports,
    )


def ensure_broker(timeout: float | None = None, cfg: BrokerConfig | None = None) -> BrokerInfo:
    """The broker to use: QMF_BROKER_URL if set (reachability checked), else the local node."""
    url = external_url() if cfg is None else None
    if url is not None:
        info = remote_info(url)
        if not port_open(info.host, info.port, timeout=5.0):
            raise BrokerError(f"broker at {_redact(info.url)} (QMF_BROKER_URL) is not reachable")
        return info
    return start_broker(timeout, cfg)


# --------------------------------------------------------------------------- admin


def rabbitmqctl(*args: str, timeout: float = 60.0, cfg: BrokerConfig | None = None) -> str:
    """Run rabbitmqctl against this project's node; raises BrokerError with its output."""
    if cfg is None and external_url() is not None:
        raise BrokerError("rabbitmqctl administration is only available for the local node")
    cfg = cfg or load_config()
    _write_inetrc(cfg.paths)
    cmd = [_rabbit_bin("rabbitmqctl"), "-n", cfg.node, "-q", *args]
    try:
        proc = subprocess.run(cmd, env=node_env(cfg), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise BrokerError(f"rabbitmqctl {' '.join(args)} timed out after {timeout}s") from exc
    if proc.returncode != 0:
        raise BrokerError(
            f"rabbitmqctl {' '.join(args)} failed ({proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()}"
        )
    return proc.stdout


def _local_cfg(cfg: BrokerConfig | None) -> BrokerConfig:
    """Admin helpers need the local node: refuse clearly when QMF_BROKER_URL is in force."""
    if cfg is not None:
        return cfg
    if external_url() is not None:
        raise BrokerError(
            "queue/user/TLS administration is only available for the project-local node; "
            "with QMF_BROKER_URL declare them on that broker yourself"
        )
    return load_config()


def _import(defs: dict[str, object], cfg: BrokerConfig) -> None:
    """Apply a partial definitions document to the running node (no restart)."""
    if _node_pid(cfg) is None:
        return  # applied from definitions.json at the next boot
    tmp = cfg.paths.state / f"import-{os.getpid()}-{time.monotonic_ns()}.json"
    try:
        _write_atomic(tmp, json.dumps(defs), 0o600)
        rabbitmqctl("import_definitions", str(tmp), cfg=cfg)
    finally:
        tmp.unlink(missing_ok=True)


def declare_queue(name: str, bindings: Sequence[tuple[str, str]] = (),
                  durable: bool = True, cfg: BrokerConfig | None = None) -> None:
    """Declare a named queue and its bindings, live and in the boot definitions.

    Consumers then read it through the AMQP 1.0 address ``/amq/queue/<name>``.
    """
    cfg = _local_cfg(cfg)
    with _locked(cfg):
        queues = _queues(cfg)
        spec = queues.get(name, {})
        old = spec.get("bindings", [])
        merged = [list(b) for b in old] if isinstance(old, list) else []
        for exchange, key in bindings:
            if [exchange, key] not in merged:
                merged.append([exchange, key])
        queues[name] = {"durable": durable, "bindings": merged}
        cfg.paths.state.mkdir(parents=True, exist_ok=True)
        _write_atomic(cfg.paths.queues_file, json.dumps(queues, indent=1, sort_keys=True))
        _write_atomic(cfg.paths.definitions, json.dumps(build_definitions(cfg), indent=1), 0o600)
        q, b = _queue_defs(name, durable, [(str(x[0]), str(x[1])) for x in merged])
        _import({"queues": [q], "bindings": b}, cfg)


def delete_queue(name: str, cfg: BrokerConfig | None = None) -> None:
    """Forget a queue declared with declare_queue() and delete it from the running node."""
    cfg = _local_cfg(cfg)
    with _locked(cfg):
        queues = _queues(cfg)
        queues.pop(name, None)
        if cfg.paths.state.is_dir():
            _write_atomic(cfg.paths.queues_file, json.dumps(queues, indent=1, sort_keys=True))
            _write_atomic(cfg.paths.definitions,
                          json.dumps(build_definitions(cfg), indent=1), 0o600)
        if _node_pid(cfg) is not None:
            with contextlib.suppress(BrokerError):
                rabbitmqctl("delete_queue", name, cfg=cfg)


def queue_depths(cfg: BrokerConfig | None = None) -> dict[str, int]:
    """Ready + unacknowledged message counts per queue, from the running node."""
    out = rabbitmqctl("list_queues", "--no-table-headers", "name", "messages", cfg=cfg)
    depths: dict[str, int] = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 2 and parts[1].strip().isdigit():
            depths[parts[0]] = int(parts[1])
    return depths


def add_user(name: str, password: str, tags: str = "",
             cfg: BrokerConfig | None = None) -> None:
    """A user with full rights on vhost "/", for SASL PLAIN; persists across restarts."""
    cfg = _local_cfg(cfg)
    with _locked(cfg):
        raw = _read_json(cfg.paths.users_file, {})
        stored: dict[str, dict[str, str]] = raw if isinstance(raw, dict) else {}
        stored[name] = {"hash": password_hash(password), "tags": tags}
        cfg.paths.state.mkdir(parents=True, exist_ok=True)
        _write_atomic(cfg.paths.users_file, json.dumps(stored, indent=1, sort_keys=True), 0o600)
        _write_atomic(cfg.paths.definitions, json.dumps(build_definitions(cfg), indent=1), 0o600)
        _import(
            {
                "users": [{"name": name, "password_hash": stored[name]["hash"],
                           "hashing_algorithm": "rabbit_password_hashing_sha256",
                           "tags": tags}],
                "permissions": [{"user": name, "vhost": "/", "configure": ".*",
                                 "write": ".*", "read": ".*"}],
            },
            cfg,
        )


def ensure_tls(directory: Path | str | None = None, restart: bool = True,
               cfg: BrokerConfig | None = None) -> TlsFiles:
    """Make sure the TLS listener serves certificates from ``directory``.

    Without a directory the state dir's generated set is used; that set is configured at
    every start, so no restart happens.  A different directory (certificates a test made)
    changes the listener's files, which RabbitMQ only reads at boot: the running node is
    restarted (state kept) unless ``restart=False``.
    """
    cfg = _local_cfg(cfg)
    target = Path(directory).resolve() if directory is not None else cfg.paths.tls_dir
    with _locked(cfg):
        files = generate_tls(target)
        check_tls_files(files)
        current = _tls_files(cfg)
        cfg.paths.state.mkdir(parents=True, exist_ok=True)
        if target == cfg.paths.tls_dir:
            cfg.paths.tls_choice.unlink(missing_ok=True)
        else:
            _write_atomic(cfg.paths.tls_choice, json.dumps(
                {k: str(getattr(files, k)) for k in (
                    "ca", "server_cert", "server_key", "client_cert", "client_key")}))
        running = _node_pid(cfg) is not None
        if current != files and running and restart:
            _stop_locked(cfg, DEFAULT_STOP_TIMEOUT)
            _start_locked(cfg, DEFAULT_START_TIMEOUT)
        elif running and not port_open(cfg.host, cfg.tls_port, timeout=0.5) and restart:
            _stop_locked(cfg, DEFAULT_STOP_TIMEOUT)
            _start_locked(cfg, DEFAULT_START_TIMEOUT)
    return files


def client_ssl_domain(files: TlsFiles, client_cert: bool = True) -> SSLDomain:
    """A proton SSLDomain trusting the CA, verifying the peer name, optionally with a cert."""
    from proton import SSLDomain

    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(files.ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if client_cert:
        domain.set_credentials(str(files.client_cert), str(files.client_key), None)
    return domain
