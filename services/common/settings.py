"""What the services' settings classes share: the two bearer tokens and their start-up rule."""

from __future__ import annotations

from typing import Self

from pydantic import SecretStr, model_validator
from pydantic_settings import BaseSettings


class ServiceSettings(BaseSettings):
    """Base of a service's pydantic-settings class (which sets ``env_prefix``): ``token`` (the plain scope),
    ``admin_token`` (everything, plus deleting), ``auth_disabled``. Both tokens must be set and differ unless
    auth is disabled; the error names the environment variables."""

    token: SecretStr | None = None
    admin_token: SecretStr | None = None
    auth_disabled: bool = False

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
