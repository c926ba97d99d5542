"""The base of every config section (:class:`Section`: pydantic, ``extra="forbid"``) and :class:`ConfigError`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from tether.errors import EXIT_CONFIG, TetherError


class ConfigError(TetherError, ValueError):
    """A configuration problem, reported before any model is loaded."""

    exit_code = EXIT_CONFIG


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
