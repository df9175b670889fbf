"""What the services' settings classes share: the two bearer tokens and their start-up rule."""

from __future__ import annotations

from typing import Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings


class ServiceSettings(BaseSettings):
    """Base of a service's pydantic-settings class (which sets ``env_prefix``): ``token`` (the plain scope),
    ``admin_token`` (everything, plus deleting), ``auth_disabled``. Both tokens must be set and differ unless
    auth is disabled; the error names the environment variables. And how the service runs in uvicorn
    (:mod:`t3ar_services.common.serving`)."""

    token: SecretStr | None = None
    admin_token: SecretStr | None = None
    auth_disabled: bool = False

    # --- HTTP serving ---
    forwarded_allow_ips: str | None = Field(
        default=None, description="comma-separated addresses or networks of the reverse proxies whose "
                                  "X-Forwarded-For / X-Forwarded-Proto are trusted ('*': any); unset: none")
    header_timeout: float = Field(default=10.0, gt=0, description="seconds a request's line and headers may "
                                                                  "take to arrive before the connection is closed")
    keep_alive_timeout: int = Field(default=5, ge=1, description="seconds an idle kept-alive connection stays open")
    max_connections: int = Field(default=1000, ge=1, description="open connections at most: one over it is "
                                                                  "closed, a request on a full server gets 503")
    max_connections_per_peer: int = Field(default=250, ge=1, description="open connections one client address holds "
                                          "at most (a trusted proxy's: not capped); one more is closed as it opens")

    @model_validator(mode="after")
    def _check_per_peer(self) -> Self:
        prefix = str(self.model_config.get("env_prefix", ""))
        if self.max_connections > 1 and self.max_connections_per_peer >= self.max_connections:
            raise ValueError(f"{prefix}MAX_CONNECTIONS_PER_PEER ({self.max_connections_per_peer}) must be below "
                             f"{prefix}MAX_CONNECTIONS ({self.max_connections}): one client must not hold them all")
        return self

    @model_validator(mode="after")
    def _check_tokens(self) -> Self:
        prefix = str(self.model_config.get("env_prefix", ""))
        token, admin = f"{prefix}TOKEN", f"{prefix}ADMIN_TOKEN"
        if not self.auth_disabled and (self.token is None or self.admin_token is None):
            raise ValueError(f"set {token} and {admin}, or {prefix}AUTH_DISABLED=true for local use only")
        if self.token is not None and self.admin_token is not None and \
                self.token.get_secret_value() == self.admin_token.get_secret_value():
            raise ValueError(f"{token} and {admin} must differ")
        return self
