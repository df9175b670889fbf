"""The adaptation API's answers as models: the API serves them (its OpenAPI schema is generated from them) and
:class:`~t3ar.clients.api.ApiClient` returns them, so the CLI reads typed fields.

They live in the library because the CLI reads them too (the library never imports the services); the API's
:mod:`t3ar_services.api.schemas` imports them from here.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class Progress(BaseModel):
    """A job's progress as the worker running it last wrote it (throttled; phase changes go out at once)."""

    phase: str | None = Field(default=None, description="starting, loading, retrieving, adapting, saving, done")
    epoch: int | None = None
    epochs: int | None = None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    loss_ce: float | None = None
    loss_contrastive: float | None = None
    pl_change_rate: float | None = Field(default=None, description="share of pseudo-labels that changed")
    lr: float | None = None
    candidate: str | None = Field(default=None, description="a job with a holdout: the candidate running, e.g. "
                                                            "'bn-adapt (2/3)'")
    device: str | None = None
    host: str | None = Field(default=None, description="machine running the job")
    pid: int | None = Field(default=None, description="process running the job")
    updated_at: str | None = None
