"""The configuration reference (docs/configuration.md), generated from the code.

    python -m pipeline.docs > docs/configuration.md

Every ``qmf`` subcommand is found through ``pipeline.cli.build_parser()``,
every Spark job through the ``build_parser()`` of each ``jobs/*.py``, the
Spark sources' options through their ``KNOWN`` tuples, the receiver's
options through ``receivers.receiver.config_from_options``, and the
environment variables by scanning the sources: a new command, option or
variable appears at the next generation without touching this module.
``tests/test_configuration_reference.py`` fails when the file is stale.
Descriptions that the code does not carry (source and receiver options,
environment variables) are kept here; what has none yet is listed as such.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
UNDESCRIBED = "(not described yet)"

SOURCE_OPTIONS: dict[str, str] = {
    "path": "landing log root (`<root>/<partition>/<first>-<last>.arrow`); required",
    "maxrecordspertrigger": "admission control: at most N records per micro-batch over all "
    "partitions (water-filled)",
    "startingoffsets": "`earliest`, `latest` or JSON `{partition: offset}`; a new checkpoint only",
    "endingoffsets": "batch reads only: end of the range (exclusive)",
    "maxrecordsperpartition": "a partition's range is split into Spark tasks of at most N records",
    "retention": "`committed`: delete landing segments the query has committed past; `none`: keep",
    "retentionslack": "records kept behind the committed offset before a segment may go",
    "embeddedreceiver": "`true`: run a receiver in the driver (options `receiver.*`, below)",
}

# Delta's own streaming source, as silver (over bronze) and gold (over silver) use it.
DELTA_SOURCE_OPTIONS: dict[str, str] = {
    "maxFilesPerTrigger": "at most N data files per micro-batch (Delta's default 1000); "
    "`--max-files-per-trigger` of both jobs",
    "maxBytesPerTrigger": "about N bytes of data files per micro-batch (whole files); gold's "
    "`--max-bytes-per-trigger`",
    "startingVersion": "a new checkpoint's first table version; `--starting-version TABLE=V` "
    "of both jobs",
}

RECEIVER_OPTIONS: dict[str, str] = {
    "url": "broker URL(s), comma-separated for failover (default `$QMF_BROKER_URL` or the "
    "project-local node)",
    "urls": "same as `url`",
    "preset": "`rabbitmq` or `qpidd`: how subscriptions are addressed",
    "bind": "`EXCHANGE:KEY` bindings, comma-separated (default per preset)",
    "bindings": "same as `bind`",
    "queue": "consume this durable queue (competing consumers) instead of bindings",
    "source": "raw AMQP 1.0 source addresses, comma-separated",
    "sources": "same as `source`",
    "credit": "credit window",
    "creditwindow": "same as `credit`",
    "flushcount": "group commit after N messages in hand",
    "flushms": "... or once the oldest waited T ms",
    "sasl": "allowed SASL mechanisms: `PLAIN`, `ANONYMOUS`, `EXTERNAL` (comma-separated)",
    "saslmechanisms": "same as `sasl`",
    "cafile": "CA certificate(s) to trust (amqps)",
    "certfile": "client certificate (amqps; SASL EXTERNAL)",
    "keyfile": "client private key",
    "credentialsfile": "file with `user=`/`password=` lines (or `user:password`)",
    "verifyhostname": "`false`: check the server certificate against the CA, not its host name",
    "partition": "landing partition (default `<host>-<n>`, the lowest n no live receiver holds)",
    "console": "`true`: also act as a QMF console (B/P/Q/S requests, refresh queries, "
    "replies landed)",
    "consoledialect": "the console's request dialect: `AM2` (what qpidd accepts) or `AM1`",
    "consolekey": "routing key of the console's requests: `broker` or `agent.<bank>`",
    "consolewants": "what the console asks for (default: everything)",
    "consolerefresh": "seconds between the console's refresh queries of the watched objects "
    "(`0`: never); qpidd publishes an object only when it changed, and any console's query "
    "clears that flag",
    "consolerefreshclasses": "the classes the refresh queries: `PACKAGE:CLASS` or `CLASS` "
    "(package `org.apache.qpid.broker`), comma-separated",
    "readytimeout": "seconds to wait for the subscriptions before the query goes on",
}

RECEIVER_DEFAULTS: dict[str, str] = {
    "preset": "`rabbitmq`",
    "credit": "`2000`",
    "creditwindow": "`2000`",
    "flushcount": "`500`",
    "flushms": "`50`",
    "console": "`false`",
    "consoledialect": "`AM2`",
    "consolekey": "`broker`",
    "consolerefresh": "`20`",
    "consolerefreshclasses": "`queue,exchange,broker`",
    "verifyhostname": "`true`",
    "readytimeout": "`30`",
}

ENVIRONMENT: dict[str, str] = {
    "QMF_BROKER_URL": "the broker every command and job uses (`amqp[s]://[user@]host:port`); "
    "default: the project-local node",
    "QMF_BROKER_USER": "user name for the broker (before the URL's)",
    "QMF_BROKER_PASSWORD": "password for the broker (never an option, never logged)",
    "QMF_BROKER_CREDENTIALS_FILE": "file with `user=`/`password=` lines, like `--credentials-file`",
    "QMF_BROKER_HOST": "the local node's listen address (127.0.0.1)",
    "QMF_BROKER_PORT": "the local node's AMQP port (35672)",
    "QMF_BROKER_TLS_PORT": "the local node's AMQPS port (35671)",
    "QMF_BROKER_DIST_PORT": "the local node's Erlang distribution port (35682)",
    "QMF_BROKER_EPMD_PORT": "the local node's epmd port (35669)",
    "QMF_BROKER_EXTRA_USER": "the local node's password user (`qmf`)",
    "QMF_BROKER_EXTRA_PASSWORD": "that user's password (`qmf-secret`)",
    "QMF_BROKER_GEN_EXPIRES_MS": "the local node deletes `amq.gen-*` queues idle this long (60000)",
    "QMF_BROKER_MEMORY": "the local node's memory high watermark (`2GB`)",
    "QMF_BROKER_START_TIMEOUT": "seconds `qmf broker start` waits for the node (120)",
    "QMF_RABBITMQ_BIN": "folder of the RabbitMQ scripts (`/usr/lib/rabbitmq/bin`)",
    "QMF_HOME": "state folder of the local node and the default landing log (`<repo>/.qmf`)",
    "QMF_LANDING_DIR": "default landing log root of `qmf receive` (`$QMF_HOME/landing`)",
    "QMF_DATA": "the tables' folder notebooks read (`data`, as `qmf run --data`)",
    "QMF_NOTEBOOK_OUT": "folder where notebooks save their plots (headless runs)",
    "QMF_JARS_DIR": "folder of the JARs `jars.lock` pins and of `qmf-delta-logstore.jar` "
    "(`<repo>/jars`, filled by `tools/setup.sh`); each locked one is checked against its "
    "sha256 before a session starts",
    "QMF_MAVEN_REPO": "`tools/setup.sh`: Maven repository the JARs are fetched from "
    "(`https://repo.maven.apache.org/maven2`)",
    "QMF_SETUP_SKIP_APT": "`tools/setup.sh`: never install system packages (fail if missing)",
    "PYTHON": "`tools/setup.sh`, `tools/lock.sh`: the interpreter for `.venv` (`python3`, 3.11+)",
    "PYSPARK_PYTHON": "Python of Spark's workers: must be the venv's on every node",
    "PYSPARK_DRIVER_PYTHON": "Python of the driver (spark-submit)",
    "MASTER": "Spark master when no `--master`/`spark.master` is given (else `local[2]`)",
    "PYSPARK_SUBMIT_ARGS": "read to tell whether spark-submit chose a master",
    "SPARK_LOCAL_IP": "set to 127.0.0.1 for test sessions (no loopback warning)",
    "QMF_DECODE_THREADS": "the codec's decode threads for large batches (default: the cores, at "
    "most 4); Spark's Python workers get their task's cores (`spark.task.cpus`)",
    "QMF_TEST_WORKERS": "`tools/test.sh`: test processes (pytest-xdist; default 3, 0 runs one "
    "process)",
    "QMF_WARM_PID": "set by `tools/test.sh`: it started the numba kernels' warm-up, so the "
    "test session does not start another",
    "MPLBACKEND": "notebooks: matplotlib backend (headless `Agg` when neither this nor DISPLAY "
    "is set)",
    "DISPLAY": "notebooks: a display means plots may be shown, not only saved",
    "QMF_S3_PATH_STYLE": "object storage: path-style requests (`http://host/bucket/key`), 1 or 0; "
    "on by default when `AWS_ENDPOINT_URL` names a store (`pipeline/lake/storage.py`)",
    "QMF_SPARK_LOG": "a file for Spark's and the JVM's own output when `get_spark` launches the "
    "JVM (jobs run with python, notebooks); `qmf run` uses `DATA/logs/spark-<time>.log`",
}

# Read, but not configuration: set by the code itself, by Spark, or by the OS.
NOT_CONFIGURATION = frozenset(
    {
        "QMF_BROKER_SERVER_NODE",  # a marker the code puts in the node's environment
        "QMF_SPARK_CHILD_LOG",  # a marker the code puts in the JVM's environment
        "PYSPARK_GATEWAY_PORT",  # set by spark-submit; tells the code it runs under it
        "PYSPARK_GATEWAY_SECRET",
        "PATH",
        "TMPDIR",
        "HOME",
        "ID",  # /etc/os-release fields sourced by tools/setup.sh
        "VERSION_ID",
        "PRETTY_NAME",
        "BASH_SOURCE",
    }
)

SCANNED = ("pipeline", "receivers", "jobs", "schemas")

_PY_ENV = re.compile(
    r"""(?:environ\.get|getenv|environ\.setdefault|environ\[|environ\.pop)\(?\s*["']([A-Z][A-Z0-9_]+)["']"""
    r"""|["']([A-Z][A-Z0-9_]+)["']\s+(?:not\s+)?in\s+os\.environ"""
    r"""|["'](QMF_[A-Z0-9_]+)["']"""
)
_SH_ENV = re.compile(r"\$\{([A-Z][A-Z0-9_]*):?[-=]|\b(QMF_[A-Z0-9_]+)\b")
# Read in a loop over a tuple of names (pipeline/spark.py), so no literal follows environ.
_INDIRECT = {"PYSPARK_PYTHON": "pipeline/spark.py", "PYSPARK_DRIVER_PYTHON": "pipeline/spark.py"}


# ----------------------------------------------------------------------------- discovery


def qmf_parsers() -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(``qmf sub [sub]``, one-line help, parser) for every subcommand, nested ones too."""
    from pipeline.cli import build_parser

    yield from _subcommands("qmf", build_parser())


def _subcommands(
    prefix: str, parser: argparse.ArgumentParser
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name in sorted(action.choices):
                sub = action.choices[name]
                yield f"{prefix} {name}", helps.get(name, ""), sub
                yield from _subcommands(f"{prefix} {name}", sub)


def job_parsers() -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(``jobs/<name>.py``, one-line help, parser) for every job with ``build_parser()``."""
    for path in sorted((REPO / "jobs").glob("*.py")):
        if path.stem.startswith("_"):
            continue
        module = importlib.import_module(f"jobs.{path.stem}")
        build = getattr(module, "build_parser", None)
        if build is None:
            continue
        parser = build()
        yield f"jobs/{path.name}", _first_line(module.__doc__), parser


def receiver_option_names() -> list[str]:
    """The keys ``config_from_options`` accepts (its ``known`` set) and ``start_embedded``'s."""
    from receivers import receiver

    tree = ast.parse(inspect.getsource(receiver.config_from_options))
    names: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "known" for t in node.targets)
            and isinstance(node.value, ast.Set)
        ):
            names.update(
                e.value
                for e in node.value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    embedded = inspect.getsource(receiver.start_embedded)
    names.update(re.findall(r"""o\.get\(["']([a-z]+)["']""", embedded))
    return sorted(names)


def environment() -> dict[str, list[str]]:
    """Environment variable -> files (relative) that read it."""
    found: dict[str, set[str]] = {}
    this = Path(__file__).resolve()
    files = [p for d in SCANNED for p in sorted((REPO / d).rglob("*.py")) if p != this]
    files += sorted((REPO / "tools").glob("*.sh"))
    for path in files:
        text = path.read_text(encoding="utf-8")
        pattern = _SH_ENV if path.suffix == ".sh" else _PY_ENV
        rel = path.relative_to(REPO).as_posix()
        for match in pattern.finditer(text):
            name = next(g for g in match.groups() if g)
            if name not in NOT_CONFIGURATION:
                found.setdefault(name, set()).add(rel)
    for name, rel in _INDIRECT.items():
        found.setdefault(name, set()).add(rel)
    return {k: sorted(v) for k, v in sorted(found.items())}


# ----------------------------------------------------------------------------- rendering


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0].strip() if (text or "").strip() else ""


def _first_paragraph(text: str | None) -> str:
    para = (text or "").strip().split("\n\n")[0]
    return " ".join(para.split())


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _metavar(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        mv = action.metavar
        return " ".join(mv) if isinstance(mv, tuple) else str(mv)
    if action.choices is not None and not isinstance(action.choices, dict):
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper()


def _option(action: argparse.Action) -> str:
    mv = _metavar(action)
    if not action.option_strings:
        text = mv
    else:
        flags = sorted(action.option_strings, key=len)
        text = ", ".join([*flags[:-1], f"{flags[-1]} {mv}".strip()])
    if action.nargs == argparse.REMAINDER:
        text += " ..."
    extra = " (repeatable)" if isinstance(action, argparse._AppendAction) else ""
    return f"`{text}`{extra}"


def _default(action: argparse.Action) -> str:
    if action.nargs == argparse.REMAINDER:
        return ""
    if action.required:
        return "required"
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    if isinstance(action, argparse._StoreFalseAction):
        return "on"
    d = action.default
    if d is None or d == argparse.SUPPRESS or d in ("", [], ()):
        return ""
    if isinstance(d, (list, tuple)):
        return "`" + ",".join(str(x) for x in d) + "`"
    return f"`{d}`"


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:
        params: dict[str, Any] = dict(vars(action), prog=prog)
        if params.get("choices") is not None:
            params["choices"] = ", ".join(str(c) for c in params["choices"])
        try:
            text = text % params
        except (KeyError, TypeError, ValueError):
            pass
    return _cell(text)


_DEFAULT_GROUPS = ("options", "optional arguments", "positional arguments")


def _parser_section(title: str, summary: str, parser: argparse.ArgumentParser) -> list[str]:
    out = [f"### `{title}`", ""]
    lead = summary or _first_paragraph(parser.description)
    if lead:
        out += [_cell(lead), ""]
    # argparse's own groups (positionals, options) as one table, then each named group.
    tables: dict[str, list[argparse.Action]] = {}
    for group in parser._action_groups:
        title = "" if group.title in _DEFAULT_GROUPS else (group.title or "")
        tables.setdefault(title, []).extend(
            a
            for a in group._group_actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
            and a.help != argparse.SUPPRESS
        )
    for title, actions in tables.items():
        if not actions:
            continue
        if title:
            out += [f"*{title}*", ""]
        out += ["| option | default | meaning |", "|---|---|---|"]
        out += [f"| {_option(a)} | {_default(a)} | {_help(a, parser.prog)} |" for a in actions]
        out.append("")
    if len(out) == 2 + (2 if lead else 0):
        out += ["No options.", ""]
    return out


def _dataclass_defaults(cls: type) -> dict[str, str]:
    """Option key (lower case, no ``_``) -> the dataclass field's default."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING and f.default not in (None, ()):
            value = f.default
            text = str(value).lower() if isinstance(value, bool) else str(value)
            out[f.name.replace("_", "")] = f"`{text}`"
    return out


def _options_table(
    names: list[str], descriptions: Mapping[str, str], defaults: Mapping[str, str]
) -> list[str]:
    out = ["| option | default | meaning |", "|---|---|---|"]
    for name in names:
        out.append(
            f"| `{name}` | {defaults.get(name, '')} | {_cell(descriptions.get(name, UNDESCRIBED))} |"
        )
    return [*out, ""]


def render() -> str:
    """The whole reference, as Markdown."""
    from pipeline.source import QmfOptions

    commands = list(qmf_parsers())
    jobs = list(job_parsers())
    env = environment()
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m pipeline.docs > docs/configuration.md`; do not edit by "
        "hand. tests/test_configuration_reference.py fails when it is stale. -->",
        "",
        "Every option of every `qmf` command and Spark job, the options of the Spark "
        "sources and of the embedded receiver, and the environment variables the code "
        "reads. How the pieces fit: [DESIGN.md](DESIGN.md); a real qpidd: [qpidd.md](qpidd.md); "
        "a cluster: [cluster.md](cluster.md); errors: [troubleshooting.md](troubleshooting.md).",
        "",
        "Contents: [`qmf` commands](#qmf-commands) · [Spark jobs](#spark-jobs) · "
        "[Spark source options](#spark-source-options) · "
        "[Embedded receiver options](#embedded-receiver-options) · "
        "[Environment variables](#environment-variables)",
        "",
        "## `qmf` commands",
        "",
        "`.venv/bin/qmf COMMAND --help` prints the same. Commands: "
        + ", ".join(f"`{name}`" for name, _, _ in commands)
        + ".",
        "",
    ]
    for name, summary, parser in commands:
        out += _parser_section(name, summary, parser)
    out += [
        "## Spark jobs",
        "",
        "Entry points for `spark-submit` (`PYSPARK_PYTHON=$PWD/.venv/bin/python "
        ".venv/bin/spark-submit [--master M] jobs/NAME.py ...`; a cluster: "
        "[cluster.md](cluster.md)). Jobs: " + ", ".join(f"`{name}`" for name, _, _ in jobs) + ".",
        "",
    ]
    for name, summary, parser in jobs:
        out += _parser_section(name, summary, parser)
    out += [
        "## Spark source options",
        "",
        "Options are case-insensitive; an unknown one fails at `load()`.",
        "",
        '### `spark.readStream.format("qmf")`: the landing log',
        "",
        "Options `receiver.<name>` go to the embedded receiver (next section).",
        "",
    ]
    out += _options_table(list(QmfOptions.KNOWN), SOURCE_OPTIONS, _dataclass_defaults(QmfOptions))
    out += [
        '### `spark.readStream.format("delta")`: Delta\'s source, in silver and gold',
        "",
        "The jobs read their input with Delta's own streaming source; the options they set "
        "(all others: Delta's documentation):",
        "",
    ]
    out += _options_table(list(DELTA_SOURCE_OPTIONS), DELTA_SOURCE_OPTIONS, {})
    out += [
        "## Embedded receiver options",
        "",
        "`receivers.receiver.start_embedded(root, options)`: the `receiver.*` options of the "
        "`qmf` source (`jobs/bronze.py --receiver-option KEY=VALUE`). Keys are case-insensitive, "
        "with or without `_`/`-`; an unknown one is an error. The standalone receiver is "
        "`qmf receive` (above).",
        "",
    ]
    out += _options_table(receiver_option_names(), RECEIVER_OPTIONS, RECEIVER_DEFAULTS)
    out += [
        "## Environment variables",
        "",
        "Found by scanning `pipeline/`, `receivers/`, `jobs/`, `schemas/` and `tools/*.sh`.",
        "",
        "| variable | meaning | read in |",
        "|---|---|---|",
    ]
    for name, files in env.items():
        where = ", ".join(f"`{f}`" for f in files)
        out.append(f"| `{name}` | {_cell(ENVIRONMENT.get(name, UNDESCRIBED))} | {where} |")
    out.append("")
    return "\n".join(out)


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
