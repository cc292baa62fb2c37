"""Reading the operator's tokens and keys (the webhook token, the event key, the agent
token): from a file or an environment variable, one line of error naming which."""

from __future__ import annotations

import os
from pathlib import Path

from elasticrun.job.errors import ConfigError

MIN_TOKEN_LENGTH = 16


def read_secret(path: Path | None, env_name: str, flag: str) -> str | None:
    if path is not None:
        try:
            value = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise ConfigError(f"{flag} {path}: cannot read: {reason}") from None
        if not value:
            raise ConfigError(f"{flag} {path}: the file is empty")
        return value
    value = os.environ.get(env_name, "").strip()
    return value or None
