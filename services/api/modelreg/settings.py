"""The MLflow registry's settings (``T3AR_MLFLOW_*``, read by the API), and the names and aliases a job may ask for.

Credentials are MLflow's own variables (``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``, or
``MLFLOW_TRACKING_TOKEN``), which its client reads from the environment: t3ar never reads, logs or shows them, and
scrubs them (and a URI's ``user:password@``) out of any error it records (:func:`scrub`).
"""

from __future__ import annotations

import os
import re

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from t3ar.errors import InvalidInputError
from t3ar.urls import redact_url

#: a registered model's name as a request gives it (``register_as``) and as t3ar makes one: letters, digits, ``.``,
#: ``_``, ``-``; the team's namespace is put in front (``<team>.<name>``)
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
#: MLflow's alias rule (letters, digits, ``_``, ``-``), minus its reserved ``latest`` and ``v<digits>``
ALIAS_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SECRET_VARIABLES = ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME",
                     "MLFLOW_TRACKING_CLIENT_CERT_PATH")


class MlflowSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="T3AR_MLFLOW_", extra="ignore")

    tracking_uri: str | None = Field(default=None, description="the MLflow tracking server (http(s)://...): every "
                                                                "finished job registers a model version there; "
                                                                "unset: registration is off")
    experiment: str = Field(default="t3ar", min_length=1, description="the MLflow experiment the jobs' runs go to")
    ui_url: str | None = Field(default=None, description="the MLflow UI's address for the links a job shows "
                                                         "(default: the tracking URI, without credentials)")
    max_attempts: int = Field(default=8, ge=1, le=100, description="attempts per registration before it is failed")
    backoff_s: float = Field(default=2.0, gt=0, description="seconds before the first retry; doubled each time")
    backoff_max_s: float = Field(default=300.0, gt=0, description="the longest wait between two attempts")
    http_timeout_s: float = Field(default=30.0, gt=0, description="seconds one MLflow HTTP request may take")
    max_lineage_items: int = Field(default=5000, ge=0, description="pool items whose source and label the lineage "
                                                                   "artifact looks up (the ids are all listed)")

    @property
    def enabled(self) -> bool:
        return bool(self.tracking_uri)

    def links_base(self) -> str | None:
        base = self.ui_url or self.tracking_uri
        if not base or not base.startswith(("http://", "https://")):
            return None
        return redact_url(base).rstrip("/")

    def backoff(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt."""
        return float(min(self.backoff_max_s, self.backoff_s * 2 ** max(0, attempts - 1)))


def check_name(value: str, what: str = "register_as") -> str:
    if not NAME_PATTERN.fullmatch(value):
        raise InvalidInputError(f"{what} {value!r} is not a model name t3ar registers: 1 to 100 letters, digits, '.', "
                                "'_' or '-', starting with a letter or digit")
    return value


def check_alias(value: str) -> str:
    if not ALIAS_PATTERN.fullmatch(value) or value.lower() == "latest" or re.fullmatch(r"[vV]\d+", value):
        raise InvalidInputError(f"register_alias {value!r} is not an MLflow alias: 1 to 64 letters, digits, '_' or "
                                "'-', not 'latest' nor 'v<number>' (e.g. challenger)")
    return value


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "model"


def registered_name(*, register_as: str | None, base_model_name: str, team: str | None) -> str:
    """The registered model's name: the request's ``register_as`` or ``t3ar-<base model's name>``, in the team's
    namespace (``<team>.<name>``) when the job has a team, so two teams never share a registered model."""
    name = register_as or f"t3ar-{_slug(base_model_name)}"[:100]
    return f"{_slug(team)}.{name}" if team else name


def scrub(text: str, tracking_uri: str | None = None) -> str:
    """``text`` without the MLflow credentials of the environment, nor a URI's ``user:password@`` part."""
    for var in _SECRET_VARIABLES:
        value = os.environ.get(var)
        if value and len(value) >= 3:
            text = text.replace(value, "***")
    if tracking_uri and tracking_uri != redact_url(tracking_uri):
        text = text.replace(tracking_uri, redact_url(tracking_uri))
    return re.sub(r"(https?://)[^/@\s]+:[^/@\s]*@", r"\1***@", text)
