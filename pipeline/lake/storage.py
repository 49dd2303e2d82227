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

import functools
import os
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    from pyarrow import fs as pafs

__all__ = [
    "LOCATION_ENV",
    "OBJECT_SCHEMES",
    "S3Settings",
    "arrow_filesystem",
    "data_files",
    "exists",
    "file_size",
    "is_object_store",
    "join",
    "list_files",
    "location",
    "parquet_file",
    "parquet_writer",
    "read_text",
    "remove_files",
    "require_local",
    "scheme",
    "write_parquet",
]  # fmt: skip

# The schemes of an S3 bucket as users write them: Spark's s3a (what the jobs use),
# and s3, which delta-rs, polars and pyarrow use for the same objects.
OBJECT_SCHEMES = ("s3a", "s3")
PATH_STYLE_ENV = "QMF_S3_PATH_STYLE"
# The variables that say where the store is (never the credentials): what Spark's
# executors are given, so that the tasks that write data files find the same store.
LOCATION_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
                PATH_STYLE_ENV)  # fmt: skip


def scheme(path: str | os.PathLike[str]) -> str:
    """The URI scheme of a table location ('' for a plain local path)."""
    text = os.fspath(path)
    return urlsplit(text).scheme.lower() if "://" in text else ""


def is_object_store(path: str | os.PathLike[str]) -> bool:
    return scheme(path) in OBJECT_SCHEMES


def require_local(**paths: str | os.PathLike[str] | None) -> None:
    """Refuse an object-store location for what must be a local or NFS path.

    Every table and checkpoint of the jobs and the backfill may be on ``s3a://``; what
    stays on a file system: the landing log (fsync before settle, on the ingest host),
    the scratch folders the executors share (gold's shuffle, the backfill's decoded
    range) and ``qmf run``'s data folder. A clear refusal at the start, not a local
    folder named ``s3a:``.
    """
    for name, path in paths.items():
        if path is not None and is_object_store(path):
            raise ValueError(
                f"{name} {os.fspath(path)!r}: must be a local or NFS path for now; object"
                " storage (s3a://) serves bronze's table and Spark's own Delta reads and"
                " writes (docs/cluster.md)"
            )


def location(path: str | os.PathLike[str]) -> str:
    """How every part of the lake names a table or file: an absolute local path, or a
    bucket URI as Spark's S3A reads it (``s3a://bucket/key``: ``s3://`` becomes
    ``s3a://``, no trailing slash, no ``.``/``..``)."""
    text = os.fspath(path)
    if not is_object_store(text):
        return os.path.abspath(text)
    parts = urlsplit(text)
    if not parts.netloc:
        raise ValueError(f"{text!r}: an object store location needs a bucket (s3a://bucket/...)")
    key = posixpath.normpath("/" + parts.path).strip("/")
    return f"s3a://{parts.netloc}/{key}" if key else f"s3a://{parts.netloc}"


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
        chain (environment, profile file, instance role). How Delta commits to a bucket
        (our log store, with S3 conditional writes) is set beside delta-spark's own
        settings, in every session, bucket or not: ``pipeline.runtime.jars.LOGSTORE_CONF``."""
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


# ---------------------------------------------------------------------------
# Files of a table, wherever it lives: the local path keeps the plain os calls (the
# jobs' hot paths), a bucket goes through pyarrow's S3 client with the same settings.


@functools.lru_cache(maxsize=8)
def _s3_filesystem(settings: S3Settings) -> pafs.S3FileSystem:
    from pyarrow import fs as pafs

    endpoint = urlsplit(settings.endpoint) if settings.endpoint is not None else None
    return pafs.S3FileSystem(
        region=settings.region,
        endpoint_override=endpoint.netloc if endpoint is not None else None,
        scheme=endpoint.scheme if endpoint is not None else "https",
        force_virtual_addressing=not settings.path_style,
    )


def arrow_filesystem(loc: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's file system for a ``location`` and the path in it (``bucket/key`` on a
    store). Credentials: the AWS SDK's default chain, as Spark's S3A."""
    from pyarrow import fs as pafs

    if not is_object_store(loc):
        return pafs.LocalFileSystem(), loc
    parts = urlsplit(loc)
    return _s3_filesystem(S3Settings.from_env()), f"{parts.netloc}{parts.path}".rstrip("/")


def list_files(folder: str, start: str = "") -> list[str]:
    """Locations of the files directly in ``folder`` whose names start with ``start``
    (one listing; none when the folder is missing)."""
    if not is_object_store(folder):
        try:
            return [e.path for e in os.scandir(folder) if e.name.startswith(start) and e.is_file()]
        except (FileNotFoundError, NotADirectoryError):
            return []
    from pyarrow import fs as pafs

    fs, path = arrow_filesystem(folder)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return [
        join(folder, i.base_name) for i in infos
        if i.type == pafs.FileType.File and i.base_name.startswith(start)
    ]  # fmt: skip


def data_files(table: str) -> set[str]:
    """The files under a table's folder, as paths relative to it, leaving out every
    folder or file whose name starts with ``_`` or ``.`` (``_delta_log``, scratch,
    hidden files): what Delta's VACUUM would consider deleting."""
    from pyarrow import fs as pafs

    fs, root = arrow_filesystem(location(table))
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    except FileNotFoundError:
        return set()
    out = set()
    for i in infos:
        if i.type != pafs.FileType.File:
            continue
        rel = i.path[len(root) :].lstrip("/")
        if not any(part.startswith(("_", ".")) for part in rel.split("/")):
            out.add(rel)
    return out


def remove_files(locations: Iterable[str]) -> None:
    """Delete files; one already gone is no error."""
    for loc in locations:
        if not is_object_store(loc):
            try:
                os.remove(loc)
            except FileNotFoundError:
                pass
            continue
        fs, path = arrow_filesystem(loc)
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass


def exists(loc: str) -> bool:
    if not is_object_store(loc):
        return os.path.exists(loc)
    from pyarrow import fs as pafs

    fs, path = arrow_filesystem(loc)
    return bool(fs.get_file_info(path).type != pafs.FileType.NotFound)


def file_size(loc: str) -> int:
    if not is_object_store(loc):
        return os.path.getsize(loc)
    fs, path = arrow_filesystem(loc)
    size = fs.get_file_info(path).size
    if size is None:
        raise FileNotFoundError(loc)
    return int(size)


def read_text(loc: str) -> str:
    if not is_object_store(loc):
        with open(loc, encoding="utf-8") as fh:
            return fh.read()
    fs, path = arrow_filesystem(loc)
    with fs.open_input_stream(path) as fh:
        return bytes(fh.read()).decode("utf-8")


def parquet_file(loc: str) -> pq.ParquetFile:
    """A Parquet file to read its footer and row groups from."""
    import pyarrow.parquet as pq

    if not is_object_store(loc):
        return pq.ParquetFile(loc)
    fs, path = arrow_filesystem(loc)
    return pq.ParquetFile(fs.open_input_file(path))


def rs_table(loc: str | os.PathLike[str], version: int | None = None) -> DeltaTable:
    """delta-rs' view of a table (the readers that run no Spark), with the store's
    options when it is on one."""
    from deltalake import DeltaTable

    where = location(loc)
    options = S3Settings.from_env().storage_options() if is_object_store(where) else None
    return DeltaTable(where, version=version, storage_options=options)


def write_parquet(loc: str, table: pa.Table) -> None:
    """``table`` as one Parquet file at ``loc`` (scratch files a batch's tasks read)."""
    w = parquet_writer(loc, table.schema)
    try:
        w.write_table(table)
    finally:
        w.close()


def parquet_writer(loc: str, schema: pa.Schema, **options: object) -> pq.ParquetWriter:
    """A Parquet writer to ``loc`` (on a store the object appears at ``close``)."""
    import pyarrow.parquet as pq

    if not is_object_store(loc):
        return pq.ParquetWriter(loc, schema, **options)
    fs, path = arrow_filesystem(loc)
    return pq.ParquetWriter(path, schema, filesystem=fs, **options)
