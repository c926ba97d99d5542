"""LoRA through PEFT: adapters injected into the policy module in place, and what the trainer needs around them.

:func:`add_lora` puts PEFT's LoRA layers into the policy (``peft.inject_adapter_in_model``): the module stays the
Hugging Face class it was, so scoring, the in-process engine and checkpoints see the same model, and only the
adapters require grad. The reference is the same module with its adapters switched off (:class:`BaseModelView`):
``pi_ref`` is exactly the base, with no second copy of the weights.

Engines that hold their own copy of the weights (Ray actors, vLLM) receive plain Hugging Face weights with the
adapters merged in (:func:`serving_state_dict`). Checkpoints hold the adapters alone, in PEFT's format
(:func:`save_adapter`), so ``PeftModel.from_pretrained(base, directory)`` loads them; :func:`load_adapter_dir`
loads such a directory as a merged model (``tether eval`` of a LoRA run's ``checkpoints/best``).

``peft`` is optional (``pip install -e '.[lora]'``): it is imported only when a function here needs it.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from tether.config import LoraSettings

ADAPTER = "default"  # PEFT's name of the one adapter tether trains
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
# PeftModel's prefix of every key it saves and loads: the files stay loadable with PeftModel.from_pretrained.
PEFT_PREFIX = "base_model.model."


def add_lora(model: nn.Module, settings: LoraSettings, base_name: str | None = None) -> nn.Module:
    """Inject LoRA adapters into ``model`` in place and freeze every other weight.

    B starts at zero (PEFT's default), so the policy starts equal to the base. No dropout: the trainer runs the
    policy in eval mode, where the old and new log-probs of the PPO ratio must be the same function.

    Args:
        base_name: what ``adapter_config.json`` names as the base model (``model.name``: a tether alias, a
            directory or a Hub id), which :func:`tether.models.load_policy` loads under the adapters.

    Raises:
        ValueError: no target module is in ``model`` (PEFT's message lists what was asked).
    """
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, target_modules=list(settings.target_modules),
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", base_model_name_or_path=base_name)
    return inject_adapter_in_model(config, model, adapter_name=ADAPTER)  # freezes all but the adapters


def is_lora(model: Any) -> bool:
    """Whether ``model`` carries PEFT adapters (:func:`add_lora`)."""
    return isinstance(model, nn.Module) and ADAPTER in getattr(model, "peft_config", {})


def lora_layers(model: nn.Module) -> list[Any]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """``model`` computes its base function for the duration (PEFT's ``disable_adapter``, on the module itself).

    Nested use is safe: each layer goes back to the state it had on entry, and the adapters' ``requires_grad``
    with it (PEFT clears it while they are off).
    """
    layers = lora_layers(model)
    was_off = [layer.disable_adapters for layer in layers]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer, off in zip(layers, was_off, strict=True):
            layer.enable_adapters(not off)


class BaseModelView:
    """The reference of a LoRA policy: the policy's own module with its adapters off for each call, so the
    reference is exactly the base model and costs no memory.

    It answers like the model it wraps (``config``, ``parameters()``, ``generation_config``...), so engines and
    :func:`tether.models.forward.response_log_probs` take it where they take a model; a call runs with the
    adapters off, and :meth:`state_dict` holds the base weights under their plain names.
    """

    def __init__(self, policy: nn.Module) -> None:
        self.policy = policy

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with adapters_disabled(self.policy):
            return self.policy(*args, **kwargs)

    @property
    def forward(self) -> Any:
        """:meth:`__call__`, with the policy's signature (engines read the name of its cache argument)."""
        return functools.wraps(self.policy.forward)(self.__call__)

    def state_dict(self) -> dict[str, Tensor]:
        return serving_state_dict(self.policy, merged=False)


@torch.no_grad()
def serving_state_dict(model: nn.Module, *, merged: bool = True) -> dict[str, Tensor]:
    """The weights an engine with its own copy loads: plain Hugging Face names, the adapters merged in
    (``W + (alpha / r) B A``), or left out with ``merged=False`` (the base). A model without adapters gives its
    ``state_dict()``."""
    if not is_lora(model):
        return model.state_dict()
    deltas = {}
    if merged:
        from peft.tuners.tuners_utils import BaseTunerLayer

        deltas = {f"{name}.base_layer.weight": module.get_delta_weight(ADAPTER)
                  for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)}
    out = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = value + deltas[key] if key in deltas else value
    return out


def save_adapter(model: nn.Module, directory: Path) -> None:
    """The adapters of ``model`` in PEFT's format: ``adapter_model.safetensors`` and ``adapter_config.json``."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    weights = get_peft_model_state_dict(model, adapter_name=ADAPTER, save_embedding_layers=False)
    save_file({PEFT_PREFIX + k: v.detach().contiguous() for k, v in weights.items()}, Path(directory) / ADAPTER_WEIGHTS)
    model.peft_config[ADAPTER].save_pretrained(str(directory))


def load_adapter(model: nn.Module, directory: Path) -> None:
    """Load the adapters :func:`save_adapter` wrote into ``model`` (which has the same adapters), in place.

    Raises:
        ValueError: the file's adapters are not ``model``'s (other target modules or another rank).
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    saved = load_file(Path(directory) / ADAPTER_WEIGHTS, device=str(next(model.parameters()).device))
    own = {k for k in model.state_dict() if ".lora_" in k}
    try:
        result = set_peft_model_state_dict(model, {k.removeprefix(PEFT_PREFIX): v for k, v in saved.items()},
                                           adapter_name=ADAPTER)
    except RuntimeError as err:  # a size mismatch: another rank
        raise ValueError(f"{directory}: the saved adapters do not fit this model's (model.lora differs from the "
                         f"run that wrote them): {err}") from None
    missing = own & set(result.missing_keys)
    if result.unexpected_keys or missing:
        raise ValueError(f"{directory}: the saved adapters do not fit this model's (model.lora differs from the "
                         f"run that wrote them): missing {sorted(missing)[:3]}, unexpected "
                         f"{sorted(result.unexpected_keys)[:3]}")


def is_adapter_dir(path: Path) -> bool:
    """A directory of adapters alone (no ``config.json`` of a full model)."""
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def adapter_base_name(path: Path) -> str:
    """The base model an adapter directory names (``base_model_name_or_path`` of its ``adapter_config.json``).

    Raises:
        ValueError: it names none.
    """
    base = json.loads((path / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{path}: adapter_config.json names no base model (base_model_name_or_path)")
    return base


def merge_adapter_dir(base: nn.Module, path: Path) -> nn.Module:
    """``base`` with the adapters of ``path`` merged into its weights: a plain model again."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(path)).merge_and_unload()
