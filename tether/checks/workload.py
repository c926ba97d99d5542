"""The task or environment a config names: its name, its keyword names and their types, then its own check.

A task or environment class may define ``check_config(**kwargs)``, which raises ``ValueError`` (or ``TypeError``)
for settings it cannot run with, cheaply, without generating data; and ``check_inputs(**kwargs)``, which checks
that what the settings name is on this machine (data files, an optional package), run by :mod:`tether.checks.machine`.
"""

from __future__ import annotations

from typing import Any

from tether.checks.findings import Findings
from tether.checks.kwargs import check_kwarg_types
from tether.config import Config, ConfigError
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

        if cfg.task.name not in registry.task_names() and not is_target(cfg.task.name):
            raise ConfigError(f"task.name: unknown task {cfg.task.name!r}; known: {', '.join(registry.task_names())} "
                              "(or module:Name of your own, with the module in imports: or on the path)")
        try:
            registry.check_task_kwargs(cfg.task.name, registry.task_factory(cfg.task.name), cfg.task.kwargs)
        except TypeError as err:
            raise ConfigError(f"task.kwargs: {err}") from None
        from tether.rewards import check_reward_terms

        check_reward_terms(cfg.task.rewards, settings=False)  # what they name is the machine checks' business
    else:
        from tether.envs import registry as envs

        if is_target(cfg.env.name):
            resolve_target("env.name", cfg.env.name)
        elif cfg.env.name not in envs.ENVS:
            raise ConfigError(f"env.name: unknown environment {cfg.env.name!r}; known: {', '.join(sorted(envs.ENVS))} "
                              "(or module:Class of your own)")
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
        raise ConfigError(f"{section}.kwargs: {err}") from None
