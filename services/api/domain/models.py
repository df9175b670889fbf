"""Base models: upload (validated: loaded safely, weights fit the declared architecture), list, describe."""

from __future__ import annotations

import datetime as dt
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
    created: bool  # false: the uploader's team (or, without a team, anyone) uploaded the same file before


def model_out(m: ModelRow, own: dict[str, tuple[str, str]] | None = None) -> s.ModelOut:
    """The answer: the stored model without what only the API reads (its feature width); with ``own`` (a team's
    uploads, :meth:`Store.model_uploads`), the team's own name and upload time for it (issue 50, N6: another
    team's upload of the same file showed that team's name and time)."""
    out = s.ModelOut(**m.model_dump(exclude={"feature_dim"}))
    if own is not None and m.id in own:
        out = out.model_copy(update={"name": own[m.id][0], "uploaded_at": own[m.id][1]})
    return out


def upload(state: ApiState, file: BinaryIO, name: str, sent: str, owner: tuple[str, str] | None = None) -> Uploaded:
    """Store a base checkpoint (a :class:`~t3ar.errors.CheckpointError` when it is not a loadable t3ar
    checkpoint); ``sent`` is what the client called the file, for messages; ``owner``: the (team, key id) it
    belongs to (the same file uploaded by two teams belongs to both, each with its own name and time)."""
    row, created = register_model(state.store, state.settings, file, name, sent)
    if created:
        state.metrics.models_uploaded.inc()
    if owner is None:
        return Uploaded(model_out(row), created)
    state.store.add_owner("model", row.id, *owner)
    team = owner[0]
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    first_for_team = state.store.add_model_upload(row.id, team, name or row.id, row.uploaded_at if created else now)
    return Uploaded(model_out(row, state.store.model_uploads(team)), first_for_team)


def list_models(state: ApiState, team: str | None = None) -> list[s.ModelOut]:
    own = state.store.model_uploads(team) if team is not None else None
    return [model_out(m, own) for m in state.store.list_models(team)]


def describe(state: ApiState, model_id: str, team: str | None = None) -> s.ModelOut:
    """The model (``team``: as that team uploaded it)."""
    row = state.store.get_model(model_id)
    if row is None:
        raise NotFoundError(f"no model {model_id!r}; list them with GET /models")
    return model_out(row, state.store.model_uploads(team) if team is not None else None)
