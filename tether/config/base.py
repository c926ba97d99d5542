"""The base of every config section (:class:`Section`: pydantic, ``extra="forbid"``) and :class:`ConfigError`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from tether.errors import EXIT_CONFIG, TetherError


class ConfigError(TetherError, ValueError):
    """A configuration problem, reported before any model is loaded."""

    exit_code = EXIT_CONFIG

    @classmethod
    def under(cls, key: str, err: BaseException, message: str | None = None) -> ConfigError:
        """``err``, raised while checking what ``key`` holds, as one line that names its key once: a ConfigError
        already names its own (a key inside ``key``, e.g. ``task.kwargs.format_fn`` under ``task.kwargs``) and is
        kept as it is; anything else becomes ``key: message`` (``message`` defaults to ``str(err)``)."""
        if isinstance(err, ConfigError):
            return err
        return cls(f"{key}: {str(err) if message is None else message}")


class Section(BaseModel):
    # NaN or infinity is never a setting: a NaN weight or coefficient faults every row or every update, later
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
