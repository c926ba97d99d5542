"""Checks of a config against this machine, before any model loads: the files, models and packages it names.

:func:`tether.config.load_config` checks what a config says; these check that what it names is here. They are kept
apart because a shipped config may name a checkpoint that an earlier stage will write, or a data file to fetch
first: such a config is valid, and only a run of it needs the files. ``tether validate`` and the start of
``train``, ``eval``, ``sft``, ``seed-sft`` and each stage of a recipe run them. Each failure is one :class:`ConfigError`
line naming the key, the value and what would be accepted.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tether.config import Config, ConfigError

HUB_ID_PARTS = 2  # "org/name"


def check_model(key: str, name: str) -> None:
    """``name`` is a tether alias, a local directory, or a Hub id already in the local cache (tether loads
    offline when ``HF_HUB_OFFLINE`` is set; otherwise a Hub id not cached yet is left to download)."""
    from tether.models.char import parse_char_alias
    from tether.models.loading import SMOLLM2, TINY_ALIAS
    from tether.models.policy import TINY_VLMS

    is_alias = (name == SMOLLM2 or name in TINY_VLMS or parse_char_alias(name) is not None
                or TINY_ALIAS.fullmatch(name) is not None)
    if is_alias or Path(name).expanduser().is_dir():
        return
    parts = name.split("/")
    looks_like_hub_id = len(parts) == HUB_ID_PARTS and all(parts) and not name.startswith((".", "~"))
    if not looks_like_hub_id:
        raise ConfigError(f"{key}: {name!r} is not a directory here, nor a tether alias ({SMOLLM2}, "
                          "char-<hidden>x<layers>, tiny-<hidden>x<layers>, tiny-qwen2.5-vl, tiny-idefics3), "
                          "nor a Hub id (org/name)")
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "") or \
        os.environ.get("TRANSFORMERS_OFFLINE", "0") not in ("0", "")
    if offline and not _in_hub_cache(name):
        raise ConfigError(f"{key}: {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                          f"download it first (huggingface-cli download {name}) or give a local directory")


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def check_packages(cfg: Config) -> None:
    """Optional packages the config turns on (the engine's are checked by its registry entry at the start)."""
    for key, package in (("logging.wandb", "wandb"), ("logging.mlflow", "mlflow")):
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) is not None and importlib.util.find_spec(package) is None:
            raise ConfigError(f"{key} is set but the package {package!r} is not installed; pip install {package}, "
                              f"or remove {key}")


def check_task_inputs(cfg: Config) -> None:
    """The task's own inputs (e.g. data files), through its optional ``check_inputs(**kwargs)`` hook."""
    if cfg.task is None:
        return
    from tether.tasks import registry

    hook = getattr(registry._TASKS[cfg.task.name], "check_inputs", None)
    if hook is None:
        return
    try:
        hook(**cfg.task.kwargs)
    except (OSError, ValueError) as err:
        raise ConfigError(f"task.kwargs: {err}") from None


def check_inputs(cfg: Config, *, model: bool = True) -> None:
    """Everything the config names that must exist on this machine; ``model=False`` when the caller brings the
    policy itself (its reference path is still checked)."""
    if model:
        check_model("model.name", cfg.model.name)
    if cfg.model.ref_name:
        check_model("model.ref_name", cfg.model.ref_name)
    check_packages(cfg)
    check_task_inputs(cfg)
