"""Where a table lives: a local (or NFS) folder, or an S3-compatible bucket (``s3a://``).

One set of settings serves every engine that opens a table: Spark's Hadoop file
system (``fs.s3a.*``, in every session ``get_spark`` makes), delta-rs and polars
(``storage_options``). They come from the standard
places only, so that a job, ``qmf top`` and a notebook find the same store:

* the endpoint of an S3-compatible store: ``AWS_ENDPOINT_URL_S3`` or
  ``AWS_ENDPOINT_URL`` (the AWS SDKs' own variables; unset: AWS S3 itself);
  ``http://`` turns TLS off, ``https://`` keeps it on (a private CA must be in the
  JVM's trust store and the system's: not tested here);
* the region: ``AWS_REGION`` or ``AWS_DEFAULT_REGION``;
* path-style requests (``http://host/bucket/key``, what most stores on premises
  want): ``QMF_S3_PATH_STYLE`` = 1 or 0; on by default when an endpoint is given;
* credentials: never here. Each engine takes them from the standard chain: the
  environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_SESSION_TOKEN``), the shared credentials file (``AWS_PROFILE``), or the
  instance's role. Nothing in this module reads, prints or logs them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["OBJECT_SCHEMES", "S3Settings", "is_object_store", "join", "require_local", "scheme"]

# The schemes of an S3 bucket as users write them: Spark's s3a (what the jobs use),
# and s3, which delta-rs, polars and pyarrow use for the same objects.
OBJECT_SCHEMES = ("s3a", "s3")
PATH_STYLE_ENV = "QMF_S3_PATH_STYLE"


def scheme(path: str | os.PathLike[str]) -> str:
    """The URI scheme of a table location ('' for a plain local path)."""
    text = os.fspath(path)
    return urlsplit(text).scheme.lower() if "://" in text else ""


def is_object_store(path: str | os.PathLike[str]) -> bool:
    return scheme(path) in OBJECT_SCHEMES


def require_local(**paths: str | os.PathLike[str] | None) -> None:
    """Refuse an object-store location for what must still be a local or NFS path.

    Spark's own Delta reads and writes (``spark.read.format("delta")``, ``DeltaTable``,
    SQL) work on ``s3a://`` in every session ``get_spark`` makes; the jobs' own layer
    (data files written by their tasks, table locks, landing log, checkpoint locks) does
    not yet (issue 49). A clear refusal at the start, not a local folder named ``s3a:``.
    """
    for name, path in paths.items():
        if path is not None and is_object_store(path):
            raise ValueError(
                f"{name} {os.fspath(path)!r}: the jobs keep their tables and checkpoints on a"
                " local or NFS path for now; object storage (s3a://) serves Spark's own Delta"
                " reads and writes (docs/cluster.md), not yet the jobs"
            )


def join(root: str | os.PathLike[str], *parts: str) -> str:
    """``root``/``parts`` for a folder or a bucket URI alike (``os.path.join`` would
    keep a URI's ``//``, but not normalise it)."""
    text = os.fspath(root)
    if not is_object_store(text):
        return os.path.join(text, *parts)
    return "/".join([text.rstrip("/"), *(p.strip("/") for p in parts)])


def _flag(value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{PATH_STYLE_ENV}={value!r}: expected 1 or 0")


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3-compatible store, credentials left to each engine's chain."""

    endpoint: str | None = None
    region: str | None = None
    path_style: bool = False

    def __post_init__(self) -> None:
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(
                    f"S3 endpoint {self.endpoint!r}: expected http://host:port or https://host:port"
                )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        env = os.environ if env is None else env
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        return cls(
            endpoint=endpoint,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            path_style=_flag(env.get(PATH_STYLE_ENV), default=endpoint is not None),
        )

    @property
    def tls(self) -> bool:
        return self.endpoint is None or self.endpoint.startswith("https://")

    def spark_conf(self) -> dict[str, str]:
        """Spark's settings for ``s3a://`` (Hadoop's S3A). Credentials: S3A's default
        chain (environment, profile file, instance role)."""
        conf = {
            "spark.hadoop.fs.s3a.path.style.access": str(self.path_style).lower(),
            "spark.hadoop.fs.s3a.connection.ssl.enabled": str(self.tls).lower(),
            # A store that is down fails a job in about a minute, not after S3A's
            # default of many retries over minutes; the stream resumes on restart.
            "spark.hadoop.fs.s3a.attempts.maximum": "3",
            "spark.hadoop.fs.s3a.retry.limit": "3",
        }
        if self.endpoint is not None:
            conf["spark.hadoop.fs.s3a.endpoint"] = self.endpoint
        if self.region is not None:
            conf["spark.hadoop.fs.s3a.endpoint.region"] = self.region
        return conf

    def storage_options(self) -> dict[str, str]:
        """delta-rs' and polars' options (object_store's names). Their credentials come
        from the same environment variables, which they read themselves."""
        opts: dict[str, str] = {}
        if self.endpoint is not None:
            opts["AWS_ENDPOINT_URL"] = self.endpoint
            if not self.tls:
                opts["AWS_ALLOW_HTTP"] = "true"
        if self.region is not None:
            opts["AWS_REGION"] = self.region
        opts["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = str(not self.path_style).lower()
        return opts
