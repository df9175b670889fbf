"""Base models: upload (validated: loaded safely, weights fit the declared architecture), list, describe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

from t3ar_services.api import schemas as s
from t3ar_services.api.deps import ApiState
from t3ar_services.api.errors import NotFoundError
from t3ar_services.api.registry import register_model
from t3ar_services.api.store import ModelRow


@dataclass(frozen=True)
class Uploaded:
    model: s.ModelOut
    created: bool  # false: the same file (same sha256, so the same id) was uploaded before


def model_out(m: ModelRow) -> s.ModelOut:
    """The answer: the stored model without what only the API reads (its feature width)."""
    return s.ModelOut(**m.model_dump(exclude={"feature_dim"}))


def upload(state: ApiState, file: BinaryIO, name: str, sent: str, owner: tuple[str, str] | None = None) -> Uploaded:
    """Store a base checkpoint (a :class:`~t3ar.errors.CheckpointError` when it is not a loadable t3ar
    checkpoint); ``sent`` is what the client called the file, for messages; ``owner``: the (team, key id) it
    belongs to (the same file uploaded by two teams belongs to both)."""
    row, created = register_model(state.store, state.settings, file, name, sent)
    if owner is not None:
        state.store.add_owner("model", row.id, *owner)
    if created:
        state.metrics.models_uploaded.inc()
    return Uploaded(model_out(row), created)


def list_models(state: ApiState, team: str | None = None) -> list[s.ModelOut]:
    return [model_out(m) for m in state.store.list_models(team)]


def describe(state: ApiState, model_id: str) -> s.ModelOut:
    row = state.store.get_model(model_id)
    if row is None:
        raise NotFoundError(f"no model {model_id!r}; list them with GET /models")
    return model_out(row)
