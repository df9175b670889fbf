"""requirements.lock (scripts/lock.sh) pins every package that t3ar[all,dev] installs, at the installed version:
setup.sh and the Dockerfiles install with it as constraints, so a dependency added to pyproject.toml without
re-locking fails here instead of drifting unpinned."""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _lock() -> dict[str, str]:
    out = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"requirements.lock: {line!r} is not name==version"
            out[canonicalize_name(name)] = version.strip()
    return out


def _closure(root: str, extras: set[str]) -> dict[str, str]:
    """Every distribution ``root[extras]`` needs here (environment markers evaluated), with its version."""
    found: dict[str, str] = {}
    todo, seen = [(root, frozenset(extras))], set()
    while todo:
        name, ex = todo.pop()
        if (canonicalize_name(name), ex) in seen:
            continue
        seen.add((canonicalize_name(name), ex))
        dist = md.distribution(name)
        found[canonicalize_name(dist.metadata["Name"])] = dist.version
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (ex or {""})):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return found


def test_lock_pins_everything_installed_at_its_version() -> None:
    lock = _lock()
    needed = _closure("t3ar", {"all", "dev", "milvus-server", "mlflow"})  # what scripts/setup.sh installs
    needed.pop("t3ar")
    missing = sorted(set(needed) - set(lock))
    assert not missing, f"not in requirements.lock (run scripts/setup.sh && scripts/lock.sh): {missing}"
    differ = {n: (needed[n], lock[n]) for n in needed if needed[n] != lock[n]}
    assert not differ, f"installed != locked (installed, locked): {differ}"


def test_lock_satisfies_pyproject() -> None:
    """The locked versions are inside the ranges pyproject.toml declares (e.g. torch's tested range)."""
    lock = _lock()
    for spec in md.distribution("t3ar").requires or []:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        if name in lock:
            assert req.specifier.contains(lock[name], prereleases=True), (spec, lock[name])
