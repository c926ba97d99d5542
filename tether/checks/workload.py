"""The task or environment a config names: its name, its keyword names and their types, then its own check.

A task or environment class may define ``check_config(**kwargs)``, which raises ``ValueError`` (or ``TypeError``)
for settings it cannot run with, cheaply, without generating data; and ``check_inputs(**kwargs)``, which checks
that what the settings name is on this machine (data files, an optional package), run by :mod:`tether.checks.machine`.

A relative data path in ``task.kwargs`` or ``env.kwargs`` is read from the working directory, as verl and TRL read
theirs (``imports:`` and ``model.chat_template`` are read from the config file's folder). When such a file is missing
there but is in the config file's folder, the error says so and names the path to write: :func:`beside_the_config`.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tether.checks.findings import Findings
from tether.checks.kwargs import check_kwarg_types
from tether.config import Config, ConfigError, RunConfig
from tether.registry import UnknownNameError
from tether.user_code import is_target, resolve_target


def workload_class(cfg: Config) -> tuple[str, Any]:
    """(``task`` or ``env``, the registered class); None when it cannot be imported here (its package is
    missing, which the machine checks report)."""
    if cfg.task is not None:
        from tether.tasks import registry

        return "task", registry.task_factory(cfg.task.name)
    from tether.envs import registry as envs

    try:
        return "env", envs.env_class(cfg.env.name)
    except ImportError:
        return "env", None


def check_workload(cfg: Config, found: Findings) -> None:
    """The task's or environment's name and settings, without building it or generating data."""
    if cfg.task is not None:
        from tether.tasks import registry

        try:
            factory = registry.task_factory(cfg.task.name)
        except UnknownNameError as err:
            raise ConfigError(f"task.name: {err} (its module in imports: or on the path)") from None
        try:
            registry.check_task_kwargs(cfg.task.name, factory, cfg.task.kwargs)
        except TypeError as err:
            raise ConfigError(f"task.kwargs: {err}") from None
        from tether.rewards import check_reward_terms

        check_reward_terms(cfg.task.rewards, settings=False)  # what they name is the machine checks' business
    else:
        from tether.envs import registry as envs

        if is_target(cfg.env.name):  # imported here first, so a typo gets the did-you-mean
            resolve_target("env.name", cfg.env.name)
        try:
            envs.ENVS[cfg.env.name]
        except UnknownNameError as err:
            raise ConfigError(f"env.name: {err}") from None
        try:
            envs.check_env_kwargs(cfg.env.name, cfg.env.kwargs)
        except ImportError:  # the env's own package is missing: the machine checks say so, with how to install it
            return
        except TypeError as err:
            raise ConfigError(f"env.kwargs: {err}") from None
    section, cls = workload_class(cfg)
    kwargs = getattr(cfg, section).kwargs
    check_kwarg_types(cls, kwargs, f"{section}.kwargs")
    hook = getattr(cls, "check_config", None)
    if hook is None:
        return
    try:
        hook(**kwargs)
    except (ValueError, TypeError) as err:
        raise ConfigError.under(f"{section}.kwargs", err) from None


def _path_values(kwargs: dict[str, Any], prefix: str) -> Iterator[tuple[str, str]]:
    """``(key, value)`` for each string among ``kwargs``, and among its lists and mappings (``data_files``), keyed as
    a config names it (``task.kwargs.data_files.train``)."""
    for key, value in kwargs.items():
        if isinstance(value, str):
            yield f"{prefix}.{key}", value
        elif isinstance(value, list):
            yield from ((f"{prefix}.{key}", entry) for entry in value if isinstance(entry, str))
        elif isinstance(value, dict):
            yield from _path_values(value, f"{prefix}.{key}")


def beside_the_config(cfg: RunConfig, section: str, error: str) -> str:
    """What the error about the workload's inputs adds when a relative path it names is not in the working directory
    but is in the config file's folder: the key, the path to write from here, and the folder to run from instead.

    Data paths keep the working directory as their base (a shipped config's paths are from the repository root, and
    a run directory's copy of a config is elsewhere), so this names the fix instead of guessing the other base.
    """
    here = cfg.config_dir
    if here is None or here == Path.cwd().resolve():
        return ""
    for key, value in _path_values(getattr(cfg, section).kwargs, f"{section}.kwargs"):
        relative = value and not Path(value).is_absolute() and not value.startswith("~") and "://" not in value
        if relative and value in error and not glob.glob(value) and glob.glob(str(here / value)):
            return f"; the config file's folder {here} has it: write {key}: {os.path.relpath(here / value)}, or run " \
                f"from {here}"
    return ""
