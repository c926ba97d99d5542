"""A registered test engine that holds its own copy of the weights, as Ray actors and vLLM do, but in-process."""

from __future__ import annotations

import copy
from typing import Any

from torch import Tensor

from tether.engine.hf import HFEngine
from tether.engine.registry import EngineEntry

COPY_ENGINE = EngineEntry("tests.engine.helpers:build_copy_engine", interventions=False)


class CopyEngine(HFEngine):
    """An :class:`HFEngine` over a deep copy of the model: it samples stale weights unless they are pushed."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        super().__init__(copy.deepcopy(model), tokenizer)
        self.loads = 0

    def load_weights(self, state_dict: dict[str, Tensor]) -> None:
        self.loads += 1
        super().load_weights(state_dict)


def build_copy_engine(model: Any, tokenizer: Any, model_cfg: Any) -> CopyEngine:
    return CopyEngine(model, tokenizer)


PLAIN_COPY_ENGINE = EngineEntry("tests.engine.helpers:build_plain_copy_engine", interventions=False)


class PlainCopyEngine(HFEngine):
    """An :class:`HFEngine` over a plain model built from the config and loaded with the weights engines with their
    own copy receive (a LoRA policy's merged, a reference view's base): what a Ray actor holds."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        from transformers import AutoModelForCausalLM

        from tether.models.lora import serving_state_dict

        plain = AutoModelForCausalLM.from_config(model.config)
        plain.load_state_dict(serving_state_dict(model))
        super().__init__(plain.eval(), tokenizer)


def build_plain_copy_engine(model: Any, tokenizer: Any, model_cfg: Any) -> PlainCopyEngine:
    return PlainCopyEngine(model, tokenizer)
