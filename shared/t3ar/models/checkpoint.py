"""The t3ar checkpoint: one file that fully describes a classifier.

Layout (a dict saved with ``torch.save``; loaded with ``weights_only=True`` so an uploaded file cannot run
code)::

    {"format": "t3ar.checkpoint", "version": 1,
     "spec": ModelSpec (architecture, classes, image size, normalisation, head),
     "adapt_config": the frozen AdaptConfig used (or None for a source model),
     "lineage": Lineage (base model hash, target hash, retrieved pool ids, retriever identity),
     "metrics": {...}, "state_dict": {...}}

The same payload may come as a safetensors file (``t3ar export --format safetensors``,
:mod:`t3ar.models.safetensors_io`): :func:`read_info` and :func:`load_checkpoint` take either, told apart by
their first bytes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from t3ar.errors import CheckpointError, DivergedError
from t3ar.filemode import new_file_mode
from t3ar.models.classifier import Classifier, ModelSpec, build_classifier
from t3ar.models.safetensors_io import is_safetensors, payload_from_safetensors

FORMAT = "t3ar.checkpoint"
VERSION = 1


class Lineage(BaseModel):
    """Where an adapted model came from. ``pool_ids`` are the pool samples its adaptation retrieved."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_model_sha256: str | None = None
    target_sha256: str | None = None
    target_size: int | None = None
    pool_ids: tuple[str, ...] = ()
    retriever: str | None = None
    method: str = "source"
    created_at: str = Field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))


@dataclass(frozen=True)
class CheckpointInfo:
    """Everything in a checkpoint except the weights."""

    spec: ModelSpec
    adapt_config: dict[str, Any] | None
    lineage: Lineage
    metrics: dict[str, Any]
    sha256: str


def save_checkpoint(
    path: Path,
    model: Classifier,
    spec: ModelSpec,
    *,
    adapt_config: dict[str, Any] | None = None,
    lineage: Lineage | None = None,
    metrics: dict[str, Any] | None = None,
) -> str:
    """Write the checkpoint atomically (temp file + rename in the same folder); return its sha256.
    :class:`~t3ar.errors.DivergedError`, and nothing written, when a floating tensor of the model is not finite: a
    diverged run must fail, not hand on a model whose outputs are NaN or whose exports cannot match it."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    broken = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if broken:
        raise DivergedError(f"the model has non-finite values in {len(broken)} of its tensors ({', '.join(broken[:3])}"
                            f"{', ...' if len(broken) > 3 else ''}): the run diverged; no checkpoint was written")
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "spec": spec.model_dump(mode="json"),
        "adapt_config": adapt_config,
        "lineage": (lineage or Lineage()).model_dump(mode="json"),
        "metrics": metrics or {},
        "state_dict": state,
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    return write_atomic(Path(path), buf.getvalue())


def write_atomic(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path`` all or nothing (temp file in the same folder, fsync, rename); the mode a new file
    gets under the umask (0644 under 022).
    Returns the sha256 of ``data``. An earlier file at ``path`` is replaced only once the new one is whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, new_file_mode())  # mkstemp creates 0600: the umask's mode instead (0644 under 022)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return hashlib.sha256(data).hexdigest()


def read_payload(path: Path) -> tuple[dict[str, Any], str]:
    """The checkpoint's dict (``format``, ``version``, ``spec``, ``lineage``, ``adapt_config``, ``metrics``,
    ``state_dict``) from a ``.pt`` file or a t3ar safetensors file, and the file's sha256. Reading runs no code
    (``weights_only`` / safetensors). Raises CheckpointError for anything else."""
    if not Path(path).is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    data = Path(path).read_bytes()
    if is_safetensors(data):
        payload: Any = payload_from_safetensors(data, str(path))
    else:
        try:
            payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:  # pickle / zip errors come in many types
            raise CheckpointError(
                f"{path} is not a t3ar checkpoint (it cannot be read as plain tensors without running code); "
                "create one with `t3ar train-source` or `t3ar adapt`"
            ) from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a t3ar checkpoint (no '{FORMAT}' header)")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {payload.get('version')}; this t3ar reads {VERSION}")
    return payload, hashlib.sha256(data).hexdigest()


def _invalid(exc: ValidationError, shown: int = 5) -> str:
    """``exc`` in one line a person reads: each field and what is wrong with it (no pydantic links)."""
    errors = exc.errors(include_url=False)
    parts = [f"{'.'.join(str(x) for x in e['loc']) or 'value'}: {e['msg']}" for e in errors[:shown]]
    more = f" (and {len(errors) - shown} more)" if len(errors) > shown else ""
    return "is invalid: " + "; ".join(parts) + more


def info_from_payload(payload: dict[str, Any], sha: str, path: Path) -> CheckpointInfo:
    """The validated metadata of a :func:`read_payload` dict (CheckpointError when malformed)."""
    if "spec" not in payload:
        raise CheckpointError(f"{path}: malformed checkpoint: it has no 'spec' entry (the model's backbone, classes "
                              "and image size); make checkpoints with `t3ar train-source` or `t3ar adapt`")
    try:
        spec = ModelSpec.model_validate(payload["spec"])
    except ValidationError as exc:
        raise CheckpointError(f"{path}: malformed checkpoint: its spec {_invalid(exc)}") from exc
    try:
        lineage = Lineage.model_validate(payload.get("lineage") or {})
    except ValidationError as exc:
        raise CheckpointError(f"{path}: malformed checkpoint: its lineage {_invalid(exc)}") from exc
    if not isinstance(payload.get("state_dict"), dict):
        raise CheckpointError(f"{path}: checkpoint has no state_dict")
    return CheckpointInfo(spec, payload.get("adapt_config"), lineage, dict(payload.get("metrics") or {}), sha)


def read_info(path: Path) -> CheckpointInfo:
    """Read and validate everything but the weights (cheap enough for API upload validation)."""
    return info_from_payload(*read_payload(path), path)


def load_checkpoint(
    path: Path, *, expect: ModelSpec | None = None, device: torch.device | str = "cpu"
) -> tuple[Classifier, CheckpointInfo]:
    """Rebuild the classifier from the checkpoint alone (no pretrained weights needed) and load its weights.

    ``expect``: when given, the checkpoint must have the same architecture and class list, else a
    CheckpointError says what differs.
    """
    payload, sha = read_payload(path)
    info = info_from_payload(payload, sha, path)
    if expect is not None:
        check_compatible(info.spec, expect, what=str(path))
    return classifier_from_payload(payload, info, path).to(device), info


def classifier_from_payload(payload: dict[str, Any], info: CheckpointInfo, path: Path) -> Classifier:
    """The classifier a :func:`read_payload` dict describes, its weights loaded (on the CPU, in train mode as
    built). CheckpointError when the weights do not fit the declared architecture."""
    model = build_classifier(info.spec.model_copy(update={"backbone": info.spec.backbone.without_weights()}))
    try:
        model.load_state_dict(payload["state_dict"], strict=True)
    except RuntimeError as exc:
        raise CheckpointError(
            f"{path}: weights do not fit its declared architecture {info.spec.arch_signature()}: "
            f"{str(exc).splitlines()[0]}"
        ) from exc
    return model


def check_compatible(found: ModelSpec, expected: ModelSpec, *, what: str = "checkpoint") -> None:
    """Raise CheckpointError naming the difference when two specs cannot share weights."""
    if found.arch_signature() != expected.arch_signature():
        raise CheckpointError(
            f"{what}: architecture {found.arch_signature()} does not match the expected "
            f"{expected.arch_signature()}"
        )
    if tuple(found.classes) != tuple(expected.classes):
        extra = sorted(set(found.classes) - set(expected.classes))[:5]
        missing = sorted(set(expected.classes) - set(found.classes))[:5]
        raise CheckpointError(
            f"{what}: class list differs ({found.num_classes} vs {expected.num_classes} classes; "
            f"unexpected {extra}, missing {missing})"
        )
