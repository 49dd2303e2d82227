"""requirements.lock and requirements-jupyter.lock against pyproject.toml: every
declared dependency is locked.

tools/setup.sh installs only what the locks list (``pip install --require-hashes``),
so a dependency added to pyproject.toml without re-running ``bash tools/lock.sh``
would be missing from every fresh environment; a range narrowed in pyproject.toml
without a new lock would leave a pin outside it. The jupyter lock (``setup.sh
--jupyter``) must hold the main lock's packages at the same versions and hashes, so
installing JupyterLab over .venv changes nothing already there. Pure file parsing,
no network.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
JUPYTER_LOCK = ROOT / "requirements-jupyter.lock"
PYPROJECT = ROOT / "pyproject.toml"

_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)$")
_HASH = re.compile(r"^--hash=sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class LockEntry:
    """One package of the lock: its exact version and the hashes pip accepts."""

    name: str
    version: Version
    hashes: tuple[str, ...]


def parse_lock(text: str) -> dict[str, LockEntry]:
    """Entries of a pip-compile lock, keyed by canonical name; rejects anything but `==`."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = "" if raw.lstrip().startswith("#") else raw.split(" #", 1)[0].strip()
        if not line:
            continue
        continued = line.endswith("\\")
        current = " ".join(filter(None, [current, line.removesuffix("\\").strip()]))
        if not continued:
            logical.append(current)
            current = ""
    if current:
        logical.append(current)
    entries: dict[str, LockEntry] = {}
    for item in logical:
        spec, *options = item.split()
        match = _PIN.match(spec)
        assert match is not None, f"not an exact pin: {item[:80]!r}"
        name = canonicalize_name(match["name"])
        assert name not in entries, f"{name} is locked twice"
        hashes = tuple(o.removeprefix("--hash=sha256:") for o in options if _HASH.match(o))
        assert len(hashes) == len(options), f"{name}: unexpected options {options}"
        entries[name] = LockEntry(name, Version(match["version"]), hashes)
    return entries


def declared_requirements(extras: tuple[str, ...] = ("test",)) -> list[Requirement]:
    """Runtime dependencies plus the given extras, as pyproject.toml states them."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    lines = [*project["dependencies"]]
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def missing_or_outside(lock: dict[str, LockEntry], requirements: list[Requirement]) -> list[str]:
    """What of ``requirements`` the lock lacks, has without a hash, or pins out of range."""
    problems: list[str] = []
    for req in requirements:
        if req.marker is not None and not req.marker.evaluate():
            continue
        entry = lock.get(canonicalize_name(req.name))
        if entry is None:
            problems.append(f"{req.name}: not in the lock")
        elif not entry.hashes:
            problems.append(f"{req.name}: no --hash=sha256 in the lock")
        elif not req.specifier.contains(entry.version, prereleases=True):
            problems.append(f"{req.name}=={entry.version} is outside {req.specifier}")
    return problems


def test_parse_lock_joins_continuations_and_reads_hashes() -> None:
    text = (
        "# header\n"
        "Foo_Bar==1.2.3 \\\n"
        "    --hash=sha256:" + "a" * 64 + " \\\n"
        "    --hash=sha256:" + "b" * 64 + "\n"
        "    # via\n"
        "    #   baz\n"
        "pip==26.3 \\\n"
        "    --hash=sha256:" + "c" * 64 + "\n"
    )
    assert parse_lock(text) == {
        "foo-bar": LockEntry("foo-bar", Version("1.2.3"), ("a" * 64, "b" * 64)),
        "pip": LockEntry("pip", Version("26.3"), ("c" * 64,)),
    }


def test_every_declared_dependency_is_pinned_with_a_hash_inside_its_range() -> None:
    problems = missing_or_outside(parse_lock(LOCK.read_text()), declared_requirements())
    assert problems == [], "run `bash tools/lock.sh --keep`:\n" + "\n".join(problems)


def test_jupyter_lock_pins_the_jupyter_extra_and_everything_else_declared() -> None:
    lock = parse_lock(JUPYTER_LOCK.read_text())
    problems = missing_or_outside(lock, declared_requirements(("test", "jupyter")))
    assert problems == [], "run `bash tools/lock.sh --keep`:\n" + "\n".join(problems)
    assert "jupyterlab" in lock
    assert "jupyterlab" not in parse_lock(LOCK.read_text())


def test_jupyter_lock_keeps_every_pin_of_the_main_lock() -> None:
    """Same version and same hashes for every package of requirements.lock: `setup.sh
    --jupyter` adds packages to .venv and changes none (lock.sh constrains the jupyter
    resolution to the main lock's pins; a main lock refreshed alone breaks this)."""
    main = parse_lock(LOCK.read_text())
    jupyter = parse_lock(JUPYTER_LOCK.read_text())
    differ = [
        f"{name}: {entry.version} in requirements.lock, "
        f"{jupyter[name].version if name in jupyter else 'missing'} in the jupyter lock"
        for name, entry in main.items()
        if name not in jupyter or jupyter[name] != entry
    ]
    assert differ == [], "run `bash tools/lock.sh --keep --jupyter-only`:\n" + "\n".join(differ)
    assert len(jupyter) > len(main)


def test_every_locked_package_has_a_hash_so_require_hashes_accepts_the_file() -> None:
    for path in (LOCK, JUPYTER_LOCK):
        lock = parse_lock(path.read_text())
        assert [name for name, entry in lock.items() if not entry.hashes] == [], path.name


def test_lock_holds_the_install_tools_and_not_the_project_itself() -> None:
    """setup.sh installs pip/setuptools/wheel from the lock, the project with --no-deps."""
    project = canonicalize_name(tomllib.loads(PYPROJECT.read_text())["project"]["name"])
    for path in (LOCK, JUPYTER_LOCK):
        lock = parse_lock(path.read_text())
        assert {"pip", "setuptools", "wheel"} <= lock.keys(), path.name
        assert project not in lock, path.name


def test_locked_setuptools_and_wheel_can_build_the_project() -> None:
    """setup.sh builds the editable install with --no-build-isolation from the locked tools."""
    lock = parse_lock(LOCK.read_text())
    build_requires = tomllib.loads(PYPROJECT.read_text())["build-system"]["requires"]
    problems: list[str] = []
    for req in map(Requirement, build_requires):
        entry = lock.get(canonicalize_name(req.name))
        if entry is None or not req.specifier.contains(entry.version):
            problems.append(f"{req}: locked {entry.version if entry else 'nothing'}")
    assert problems == []
