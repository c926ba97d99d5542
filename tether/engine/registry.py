"""Rollout engines by name: ``rollout.engine`` picks one, ``rollout.engine_kwargs`` are its settings.

Each entry names a builder ``build(model, tokenizer, model_cfg, **settings) -> RolloutEngine`` whose
keyword-only arguments are the engine's settings (checked against the config before anything loads), an
optional availability check that the trainer runs before loading the policy (so a missing GPU or package
fails in the first second, not after a 7B load), and whether the engine runs
:class:`~tether.engine.base.Intervention` hooks. Entries are import paths: vLLM and Ray are imported only
when chosen. The trainer builds whatever is configured through :func:`build_engine` and never names an engine.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tether.registry import Registry, load_target

if TYPE_CHECKING:
    from tether.config import ModelConfig
    from tether.engine.base import RolloutEngine


@dataclass(frozen=True)
class EngineEntry:
    """A registered engine.

    Attributes:
        builder: ``"module:function"`` of the builder.
        interventions: True when the engine runs per-step interventions (EAPO needs them).
        check: ``"module:function"`` that raises :class:`~tether.engine.base.EngineUnavailableError` when the
            engine cannot run on this machine; None when it always can.
        shares_policy: True when the engine samples with the policy module itself (no copy of its own), which
            is what FSDP2 needs: it gathers the sharded policy around each ``generate`` call.
    """

    builder: str
    interventions: bool
    check: str | None = None
    shares_policy: bool = False


#: Registered engine names and their entries; a ``"module:function"`` name is an unregistered builder: it runs no
#: interventions, keeps its own weights and is always available.
ENGINES: Registry[EngineEntry] = Registry("engine", resolve=lambda target: EngineEntry(target, interventions=False),
                                          own="module:function")
ENGINES.add("hf", EngineEntry("tether.engine.hf:build_hf_engine", interventions=True, shares_policy=True))
ENGINES.add("vllm", EngineEntry("tether.engine.vllm:build_vllm_engine", interventions=False,
                                check="tether.engine.vllm:check_vllm_available"))
ENGINES.add("ray", EngineEntry("tether.engine.ray_engine:build_ray_engine", interventions=False,
                               check="tether.engine.ray_engine:check_ray_engine_available"))


def engine_entry(name: str) -> EngineEntry:
    """The entry registered under ``name`` (UnknownNameError, a KeyError, listing the registered names otherwise),
    or that of a ``"module:function"`` builder."""
    return ENGINES[name]


def engine_builder(name: str) -> Callable[..., RolloutEngine]:
    """The builder of engine ``name`` (its keyword-only arguments are the allowed ``engine_kwargs``)."""
    return load_target(engine_entry(name).builder)


def check_engine_available(name: str) -> None:
    """Raise :class:`~tether.engine.base.EngineUnavailableError` if engine ``name`` cannot run here."""
    entry = engine_entry(name)
    if entry.check is not None:
        load_target(entry.check)()


def build_engine(name: str, model: Any, tokenizer: Any, model_cfg: ModelConfig,
                 settings: dict[str, Any] | None = None, *, logprob_chunk_tokens: int | None = None) -> RolloutEngine:
    """Engine ``name`` over ``model`` with ``settings`` (``rollout.engine_kwargs``); ``logprob_chunk_tokens``
    (``train.logprob_chunk_tokens``) goes to an engine whose builder takes it, one that scores with tether's own
    forward (:meth:`HFEngine.score <tether.engine.hf.HFEngine.score>`), so its scoring bounds the LM head's logits as
    every trainer forward does."""
    builder = engine_builder(name)
    settings = dict(settings or {})
    if logprob_chunk_tokens is not None and "logprob_chunk_tokens" in inspect.signature(builder).parameters:
        settings["logprob_chunk_tokens"] = logprob_chunk_tokens
    return builder(model, tokenizer, model_cfg, **settings)
