"""Text (and visual) environments for multi-turn RL: protocol, registry, fault containment (docs/environments.md)."""

from tether.envs.base import (
    EVAL_SEED_OFFSET,
    IMAGE_PLACEHOLDER,
    EnvReset,
    EnvStep,
    EnvUnavailableError,
    EpisodeOverError,
    Observation,
    TextEnv,
    escape_placeholders,
    eval_seeds,
    is_eval_seed,
    normalize_action,
    observation_key,
    observation_text,
    parse_tagged_action,
    train_seeds,
)
from tether.envs.registry import ENVS, check_env_kwargs, env_class, make_env, make_safe_env, register_env
from tether.envs.safe import SafeEnv, call_with_timeout

__all__ = [
    "ENVS",
    "EVAL_SEED_OFFSET",
    "IMAGE_PLACEHOLDER",
    "EnvReset",
    "EnvStep",
    "EnvUnavailableError",
    "EpisodeOverError",
    "Observation",
    "SafeEnv",
    "TextEnv",
    "call_with_timeout",
    "check_env_kwargs",
    "env_class",
    "escape_placeholders",
    "eval_seeds",
    "is_eval_seed",
    "make_env",
    "make_safe_env",
    "normalize_action",
    "observation_key",
    "observation_text",
    "parse_tagged_action",
    "register_env",
    "train_seeds",
]
