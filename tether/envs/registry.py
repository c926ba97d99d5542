"""Name -> env class registry: ``make_env("sokoban", num_boxes=2)``.

Entries are import paths, so an env's optional dependency (gymnasium, textworld, alfworld) is imported
only when that env is built. Keyword arguments are checked against the constructor's signature before
anything is imported or built, so a typo names itself and the allowed keywords.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from tether.config import did_you_mean
from tether.envs.base import TextEnv
from tether.envs.safe import SafeEnv
from tether.registry import Registry, load_target


def _check_target(target: str) -> None:
    if ":" not in target:
        raise ValueError(f"target must look like 'package.module:Class', got {target!r}")


#: Registered env names and the ``module:Class`` each builds; a ``module:Class`` name is its own path.
ENVS: Registry[str] = Registry("env", _check_target, resolve=lambda target: target, own="module:Class")
ENVS.add("scripted", "tether.envs.scripted:ScriptedEnv")
ENVS.add("sokoban", "tether.envs.sokoban:SokobanEnv")
ENVS.add("sokoban_visual", "tether.envs.sokoban_visual:VisualSokobanEnv")
ENVS.add("ezpoints", "tether.envs.ezpoints:EZPointsEnv")
ENVS.add("frozenlake", "tether.envs.frozenlake:FrozenLakeEnv")
ENVS.add("thin_ice", "tether.envs.thin_ice:ThinIceEnv")
ENVS.add("textworld", "tether.envs.textworld_env:TextWorldEnv")
ENVS.add("alfworld", "tether.envs.alfworld_env:AlfWorldEnv")
ENVS.add("webshop", "tether.envs.webshop_env:WebShopEnv")


def register_env(name: str, target: str) -> None:
    """Register ``target`` (``"package.module:Class"``) under ``name``; a taken name or a target without a colon
    raises ValueError."""
    ENVS.add(name, target)


def env_class(name: str) -> type:
    """The class registered under ``name``, or the one a ``"module:Class"`` name points at (imported now).

    Raises:
        ValueError: unknown name (:class:`~tether.registry.UnknownNameError`, listing the registered ones).
    """
    return load_target(ENVS[name])


def check_env_kwargs(name: str, kwargs: dict[str, Any]) -> None:
    """Raise TypeError naming any keyword the env's constructor does not take, and the allowed ones."""
    allowed = [p for p in inspect.signature(env_class(name)).parameters if p != "self"]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(f"env {name!r} got unknown keyword(s) {', '.join(unknown)}; "
                        f"{did_you_mean(unknown[0], allowed)}allowed: {', '.join(allowed) or '(none)'}")


def make_env(name: str, **kwargs: Any) -> TextEnv:
    """Build the env registered under ``name`` with ``kwargs``.

    >>> env = make_env("scripted", turns=2)
    >>> env.reset(seed=0).task
    "Say the secret word. The secret word is 'apple'."

    Raises:
        ValueError: unknown name. TypeError: unknown keyword.
        tether.envs.EnvUnavailableError: the env's package or data is missing.
    """
    check_env_kwargs(name, kwargs)
    return env_class(name)(**kwargs)


def make_safe_env(name: str, *, timeout_s: float = 30.0, reset_timeout_s: float | None = None,
                  **kwargs: Any) -> SafeEnv:
    """``make_env`` wrapped in :class:`SafeEnv` (faults end the episode; a new env replaces a faulted one)."""
    check_env_kwargs(name, kwargs)
    return SafeEnv(functools.partial(make_env, name, **kwargs), timeout_s=timeout_s,
                   reset_timeout_s=reset_timeout_s)
