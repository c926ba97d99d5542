"""Rollout engines: the protocol, the in-process Hugging Face engine, and the registry ``rollout.engine`` picks from.

The vLLM and Ray engines (``tether.engine.vllm``, ``tether.engine.ray_engine``) are imported only when built.
"""

from tether.engine.base import (
    EngineUnavailableError,
    Generation,
    Intervention,
    InterventionStep,
    InterventionUnsupportedError,
    RolloutEngine,
    SamplingParams,
)
from tether.engine.decoding import process_logits, sample_tokens
from tether.engine.hf import HFEngine
from tether.engine.registry import ENGINES, build_engine, check_engine_available, engine_builder, engine_entry

__all__ = ["ENGINES", "EngineUnavailableError", "Generation", "HFEngine", "Intervention", "InterventionStep",
           "InterventionUnsupportedError", "RolloutEngine", "SamplingParams", "build_engine", "check_engine_available",
           "engine_builder", "engine_entry", "process_logits", "sample_tokens"]
