"""Base models: validate an uploaded checkpoint (our format, loaded with ``weights_only``, weights that fit the
declared architecture) and store it as ``models/<id>.pt``. The id is derived from the file's sha256, so
uploading the same file twice yields the same model."""

from __future__ import annotations

import datetime as dt
import logging
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from t3ar.errors import CheckpointError, T3arError
from t3ar.filemode import new_file_mode
from t3ar_services.api.errors import NotFoundError
from t3ar_services.api.settings import ApiSettings
from t3ar_services.api.store import ModelRow, Store
from t3ar_services.api.uploads import as_sent, save_upload

log = logging.getLogger(__name__)


def build_words(e: Exception) -> str:
    """Why a model cannot be built, in words (never an exception's class name: a KeyError's text alone is a bare
    quoted key)."""
    if isinstance(e, T3arError):
        return str(e)
    if isinstance(e, KeyError):
        return f"it names {e.args[0]!r}, which this build of t3ar does not know" if e.args else "a name is unknown"
    return str(e) or "its backbone could not be constructed"


def model_path(data_dir: Path, model_id: str) -> Path:
    return data_dir / "models" / f"{model_id}.pt"


def _check_class_names(classes: Sequence[str]) -> None:
    from t3ar.data.pool_labels import hidden_problem

    for name in classes:
        problem = hidden_problem(name, "the class name")
        if problem is not None:
            raise CheckpointError(f"the checkpoint's {problem} (a target's and the pool's labels cannot hold it)")


def register_model(store: Store, settings: ApiSettings, src: BinaryIO, name: str,
                   sent: str = "the checkpoint") -> tuple[ModelRow, bool]:
    """Validate and store; returns (row, created). Raises CheckpointError / PayloadTooLargeError, calling the
    file ``sent`` (the client's file name)."""
    from t3ar.models.checkpoint import load_checkpoint, read_info

    models = settings.data_dir / "models"
    tmp = models / f".upload-{uuid.uuid4().hex}.pt"
    try:
        size = save_upload(src, tmp, settings.max_model_bytes, "the checkpoint", "T3AR_API_MAX_MODEL_BYTES")
        try:
            info = read_info(tmp)
            _check_class_names(info.spec.classes)
            model, _ = load_checkpoint(tmp)  # the weights must fit the architecture the checkpoint declares
        except CheckpointError as e:
            raise CheckpointError(as_sent(str(e), tmp, sent)) from e
        except Exception as e:  # architecture construction can fail in many ways on a forged spec
            log.info("model upload %s: cannot build the model: %r", sent, e)
            raise CheckpointError(f"{sent}: the checkpoint's model cannot be built from its spec: "
                                  f"{as_sent(build_words(e), tmp, sent)}; make checkpoints with `t3ar "
                                  "train-source` or `t3ar adapt`") from e
        model_id = info.sha256[:16]
        row = ModelRow(id=model_id, name=name or model_id, sha256=info.sha256, size=size,
                       arch=info.spec.arch_signature(), image_size=info.spec.image_size,
                       num_classes=len(info.spec.classes), classes=list(info.spec.classes),
                       feature_dim=model.feature_dim,
                       uploaded_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
        final = model_path(settings.data_dir, model_id)
        if not final.exists():
            os.chmod(tmp, new_file_mode())
            os.replace(tmp, final)
        created = store.add_model(row)
        return (row if created else store.get_model(model_id) or row), created
    finally:
        tmp.unlink(missing_ok=True)


def require_model(store: Store, settings: ApiSettings, model_id: str) -> ModelRow:
    row = store.get_model(model_id)
    if row is None:
        raise NotFoundError(f"no model {model_id!r}; upload one with POST /models or list them with GET /models")
    return require_file(settings, row)


def require_file(settings: ApiSettings, row: ModelRow) -> ModelRow:
    """``row``, unless its checkpoint file is missing from the data dir (404)."""
    if not model_path(settings.data_dir, row.id).is_file():
        raise NotFoundError(f"model {row.id!r} is registered but its file is missing from the data dir; "
                            "upload it again")
    return row
