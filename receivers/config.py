"""Broker connection settings shared by the receiver and the publisher.

One place turns URLs, TLS files, SASL mechanisms and credentials into the
arguments of ``proton.reactor.Container.connect``, so both ends authenticate
the same way. Credentials come from the environment (``QMF_BROKER_USER`` /
``QMF_BROKER_PASSWORD``), a file, or the URL's user-info; they are stripped
from every URL before it reaches proton or a log line, and never repr'd.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from proton import SSLDomain

DEFAULT_PORT = 35672
ENV_URL = "QMF_BROKER_URL"
ENV_PORT = "QMF_BROKER_PORT"
ENV_USER = "QMF_BROKER_USER"
ENV_PASSWORD = "QMF_BROKER_PASSWORD"
ENV_CREDENTIALS_FILE = "QMF_BROKER_CREDENTIALS_FILE"
SASL_MECHANISMS = ("PLAIN", "ANONYMOUS", "EXTERNAL")


class ConfigError(ValueError):
    """The connection settings are inconsistent or a referenced file is missing."""


def default_url(env: Mapping[str, str] | None = None) -> str:
    """The project-local broker's URL unless ``QMF_BROKER_URL`` names another."""
    env = os.environ if env is None else env
    if env.get(ENV_URL):
        return env[ENV_URL]
    port = int(env.get(ENV_PORT, DEFAULT_PORT))
    return f"amqp://guest:guest@127.0.0.1:{port}"


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """(url without user-info, user, password): proton must never see them in the URL."""
    parts = urlsplit(url if "://" in url else f"amqp://{url}")
    if parts.scheme not in ("amqp", "amqps"):
        raise ConfigError(f"unsupported URL scheme {parts.scheme!r} (use amqp or amqps)")
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    clean = urlunsplit((parts.scheme, f"{host}:{port}", parts.path, "", ""))
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return clean, user, password


def host_port(url: str) -> str:
    """``host:port`` of a URL, never its user-info: what a log line may name."""
    clean, _, _ = split_credentials(url)
    return urlsplit(clean).netloc


def read_credentials_file(path: str | os.PathLike[str]) -> tuple[str | None, str | None]:
    """Read ``user=...``/``password=...`` lines, or one ``user:password`` line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"credentials file {p} does not exist")
    text = p.read_text(encoding="utf-8")
    user: str | None = None
    password: str | None = None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if len(lines) == 1 and "=" not in lines[0] and ":" in lines[0]:
        user, password = lines[0].split(":", 1)
        return user, password
    for ln in lines:
        key, sep, value = ln.partition("=")
        if not sep:
            raise ConfigError(f"credentials file {p}: expected key=value lines")
        key = key.strip().lower()
        if key in ("user", "username"):
            user = value.strip()
        elif key == "password":
            password = value.strip()
        else:
            raise ConfigError(f"credentials file {p}: unknown key {key!r}")
    return user, password


@dataclass(frozen=True)
class TlsConfig:
    """Client-side TLS: the CA to trust and, for EXTERNAL or mutual TLS, our certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = field(default=None, repr=False)
    verify_hostname: bool = True

    def domain(self) -> SSLDomain:
        d = SSLDomain(SSLDomain.MODE_CLIENT)
        for f in (self.ca_file, self.cert_file, self.key_file):
            if f is not None and not Path(f).is_file():
                raise ConfigError(f"TLS file {f} does not exist")
        if self.ca_file:
            d.set_trusted_ca_db(self.ca_file)
            mode = SSLDomain.VERIFY_PEER_NAME if self.verify_hostname else SSLDomain.VERIFY_PEER
            d.set_peer_authentication(mode, self.ca_file)
        else:
            d.set_peer_authentication(SSLDomain.ANONYMOUS_PEER)
        if self.cert_file:
            if not self.key_file:
                raise ConfigError("a client certificate needs its key file")
            d.set_credentials(self.cert_file, self.key_file, self.key_password)
        return d


@dataclass(frozen=True)
class BrokerConfig:
    """Where and how to connect; several URLs mean failover in that order."""

    urls: tuple[str, ...] = ()
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    sasl_mechanisms: tuple[str, ...] = ()
    tls: TlsConfig | None = None
    heartbeat_s: float | None = None
    allow_insecure_mechs: bool = True
    container_id: str | None = None

    def __post_init__(self) -> None:
        if not self.urls:
            object.__setattr__(self, "urls", (default_url(),))
        clean: list[str] = []
        user, password = self.user, self.password
        for u in self.urls:
            c, uu, pp = split_credentials(u)
            clean.append(c)
            user = user if user is not None else uu
            password = password if password is not None else pp
        object.__setattr__(self, "urls", tuple(clean))
        object.__setattr__(self, "user", user)
        object.__setattr__(self, "password", password)
        for m in self.sasl_mechanisms:
            if m.upper() not in SASL_MECHANISMS:
                raise ConfigError(f"SASL mechanism {m!r} not one of {', '.join(SASL_MECHANISMS)}")

    @classmethod
    def from_sources(
        cls,
        urls: Sequence[str] = (),
        *,
        credentials_file: str | None = None,
        sasl_mechanisms: Sequence[str] = (),
        tls: TlsConfig | None = None,
        heartbeat_s: float | None = None,
        env: Mapping[str, str] | None = None,
        container_id: str | None = None,
    ) -> BrokerConfig:
        """Merge credentials: file, then environment, then URL user-info (first wins)."""
        env = os.environ if env is None else env
        user: str | None = None
        password: str | None = None
        cred_file = credentials_file or env.get(ENV_CREDENTIALS_FILE)
        if cred_file:
            user, password = read_credentials_file(cred_file)
        if user is None and env.get(ENV_USER):
            user = env[ENV_USER]
        if password is None and env.get(ENV_PASSWORD):
            password = env[ENV_PASSWORD]
        all_urls = tuple(u.strip() for url in urls for u in url.split(",") if u.strip())
        return cls(
            urls=all_urls or (default_url(env),),
            user=user,
            password=password,
            sasl_mechanisms=tuple(m.upper() for m in sasl_mechanisms),
            tls=tls,
            heartbeat_s=heartbeat_s,
            container_id=container_id,
        )

    def describe(self) -> str:
        """Printable summary without secrets."""
        mechs = " ".join(self.sasl_mechanisms) or "default"
        who = self.user or "-"
        return (
            f"{', '.join(self.urls)} (user {who}, sasl {mechs}, tls {'on' if self.tls else 'off'})"
        )

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``Container.connect`` (urls, SASL, TLS, heartbeat)."""
        kw: dict[str, Any] = {
            "urls": list(self.urls),
            "reconnect": False,
            "sasl_enabled": True,
            "allow_insecure_mechs": self.allow_insecure_mechs,
        }
        if self.sasl_mechanisms:
            kw["allowed_mechs"] = " ".join(self.sasl_mechanisms)
        certificate_or_none = {"ANONYMOUS", "EXTERNAL"}
        if self.user is not None and not (
            self.sasl_mechanisms and set(self.sasl_mechanisms) <= certificate_or_none
        ):
            kw["user"] = self.user
            if self.password is not None:
                kw["password"] = self.password
        if any(u.startswith("amqps:") for u in self.urls):
            kw["ssl_domain"] = (self.tls or TlsConfig()).domain()
        elif self.tls is not None:
            raise ConfigError("TLS settings given but no amqps:// URL")
        if self.heartbeat_s:
            kw["heartbeat"] = self.heartbeat_s
        if self.container_id:
            kw["container_id"] = self.container_id
        return kw

    def for_url(self, index: int) -> BrokerConfig:
        """The same settings restricted to one URL: the receiver does its own failover."""
        return BrokerConfig(
            urls=(self.urls[index % len(self.urls)],),
            user=self.user,
            password=self.password,
            sasl_mechanisms=self.sasl_mechanisms,
            tls=self.tls,
            heartbeat_s=self.heartbeat_s,
            allow_insecure_mechs=self.allow_insecure_mechs,
            container_id=self.container_id,
        )
