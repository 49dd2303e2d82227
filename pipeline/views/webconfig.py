"""The metrics endpoint's web configuration: TLS and basic authentication, as Prometheus's
exporters read it (the exporter-toolkit's ``--web.config.file`` YAML), so one file
format serves every exporter an operator runs.

Supported: ``tls_server_config`` (``cert_file``, ``key_file``, ``client_ca_file``,
``client_auth_type`` ``NoClientCert`` or ``RequireAndVerifyClientCert``,
``min_version`` ``TLS12`` or ``TLS13``) and ``basic_auth_users`` (user: bcrypt hash,
as ``htpasswd -nBC 10 user`` makes it). Paths are relative to the file. Anything else
(an unknown key, a missing file, a hash that is not bcrypt) is refused when the file
is read, naming the key. A password is checked with bcrypt once; a match is then kept
(its SHA-256) so that scrapes stay fast, as the exporter-toolkit does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

TLS_KEYS = frozenset({"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version"})
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
MIN_VERSION = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
REALM = "qmf serve-metrics"


class WebConfigError(ValueError):
    """A web configuration that cannot be served (the message names the file and key)."""


@dataclass
class WebConfig:
    """What ``load`` read: TLS settings (None: plain HTTP) and users (empty: no login)."""

    path: str
    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    users: dict[str, bytes] = field(default_factory=dict)
    _good: set[bytes] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, path: str | Path) -> WebConfig:
        base = Path(path).parent
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise WebConfigError(f"{path}: {exc}") from exc
        if not isinstance(data, dict):
            raise WebConfigError(f"{path}: expected a mapping of tls_server_config, basic_auth_users")
        unknown = sorted(set(data) - {"tls_server_config", "basic_auth_users"})
        if unknown:
            raise WebConfigError(
                f"{path}: unsupported keys {unknown}: use tls_server_config, basic_auth_users"
            )
        out = cls(str(path))
        tls = data.get("tls_server_config")
        if tls is not None:
            out._tls(tls, base)
        users = data.get("basic_auth_users") or {}
        if not isinstance(users, dict):
            raise WebConfigError(f"{path}: basic_auth_users: expected user: bcrypt hash pairs")
        for user, hashed in users.items():
            text = str(hashed)
            if not text.startswith(("$2a$", "$2b$", "$2y$")) or len(text) != 60:
                raise WebConfigError(
                    f"{path}: basic_auth_users.{user}: not a bcrypt hash (htpasswd -nBC 10 {user})"
                )
            out.users[str(user)] = text.encode()
        return out

    def _tls(self, tls: Any, base: Path) -> None:
        where = f"{self.path}: tls_server_config"
        if not isinstance(tls, dict):
            raise WebConfigError(f"{where}: expected a mapping")
        unknown = sorted(set(tls) - TLS_KEYS)
        if unknown:
            raise WebConfigError(f"{where}: unsupported keys {unknown}: use {', '.join(sorted(TLS_KEYS))}")
        for key in ("cert_file", "key_file"):
            if not tls.get(key):
                raise WebConfigError(f"{where}.{key}: required")

        def file(key: str) -> Path | None:
            if not tls.get(key):
                return None
            p = base / str(tls[key])
            if not p.is_file():
                raise WebConfigError(f"{where}.{key}: {p} is not a file")
            return p

        self.cert_file, self.key_file = file("cert_file"), file("key_file")
        self.client_ca_file = file("client_ca_file")
        auth = tls.get("client_auth_type", "NoClientCert")
        if auth not in CLIENT_AUTH:
            raise WebConfigError(f"{where}.client_auth_type: {auth!r}: use {', '.join(CLIENT_AUTH)}")
        self.client_auth = CLIENT_AUTH[auth]
        if self.client_auth == ssl.CERT_REQUIRED and self.client_ca_file is None:
            raise WebConfigError(f"{where}.client_ca_file: required by {auth}")
        version = tls.get("min_version", "TLS12")
        if version not in MIN_VERSION:
            raise WebConfigError(f"{where}.min_version: {version!r}: use {', '.join(MIN_VERSION)}")
        self.min_version = MIN_VERSION[version]
        try:
            self.ssl_context()
        except (ssl.SSLError, OSError) as exc:
            raise WebConfigError(f"{where}: the certificate and key do not load: {exc}") from exc

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    def ssl_context(self) -> ssl.SSLContext:
        """The server's TLS context (only with ``tls``)."""
        assert self.cert_file is not None and self.key_file is not None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = self.min_version
        ctx.load_cert_chain(self.cert_file, self.key_file)
        ctx.verify_mode = self.client_auth
        if self.client_ca_file is not None:
            ctx.load_verify_locations(self.client_ca_file)
        return ctx

    def allows(self, authorization: str | None) -> bool:
        """Whether a request's ``Authorization`` header passes (no users: every request)."""
        if not self.users:
            return True
        if not authorization or not authorization.startswith("Basic "):
            return False
        try:
            user, sep, password = base64.b64decode(authorization[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if not sep or hashed is None:
            return False
        token = hashlib.sha256(hashed + b"\0" + password.encode()).digest()
        with self._lock:
            if any(hmac.compare_digest(token, good) for good in self._good):
                return True
        if not bcrypt.checkpw(password.encode(), hashed):
            return False
        with self._lock:
            if len(self._good) < 1024:
                self._good.add(token)
        return True


__all__ = ["REALM", "WebConfig", "WebConfigError"]
