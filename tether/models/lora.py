"""LoRA through PEFT: adapters injected into the policy module in place, and what the trainer needs around them.

:func:`add_lora` puts PEFT's LoRA layers into the policy (``peft.inject_adapter_in_model``): the module stays the
Hugging Face class it was, so scoring, the in-process engine and checkpoints see the same model, and only the
adapters require grad. The reference is the same module with its adapters switched off (:class:`BaseModelView`):
``pi_ref`` is exactly the base, with no second copy of the weights. A run whose reference a method resets (ARMOR's
``reset``) gives the module a second, frozen adapter instead (:func:`add_reference_adapter`): the reference is the
base with that adapter, and a reset copies the trained adapters into it, a few MB rather than a second model.

Engines that hold their own copy of the weights (Ray actors, vLLM) receive plain Hugging Face weights with the
adapters merged in (:func:`serving_state_dict`). Checkpoints hold the adapters alone, in PEFT's format
(:func:`save_adapter`), so ``PeftModel.from_pretrained(base, directory)`` loads them; :func:`load_adapter_dir`
loads such a directory as a merged model (``tether eval`` of a LoRA run's ``checkpoints/best``).

``peft`` is optional (``pip install -e '.[lora]'``): it is imported only when a function here needs it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from tether.config import LoraSettings

ADAPTER = "default"  # PEFT's name of the one adapter tether trains
REFERENCE = "reference"  # PEFT's name of the frozen adapter of a reference that a method resets
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

    if base_name is not None and Path(base_name).expanduser().is_dir():
        # a local base by its absolute path: relative, the checkpoint's base was looked for under the working
        # directory of whoever loads it (tether eval from elsewhere: a Hub download of the relative path)
        base_name = str(Path(base_name).expanduser().resolve())
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


def add_reference_adapter(model: nn.Module) -> None:
    """Give ``model`` (with :func:`add_lora`'s adapters) a frozen second adapter, :data:`REFERENCE`, of the same
    shape, with B = 0: base plus it is exactly the base until :meth:`BaseModelView.reset_to` copies the trained
    adapters into it. Added before the policy is sharded, so every strategy sees one fixed set of parameters."""
    from peft import inject_adapter_in_model

    with warnings.catch_warnings():  # "multiple adapters in the model": the point here
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        inject_adapter_in_model(copy.deepcopy(model.peft_config[ADAPTER]), model, adapter_name=REFERENCE)
    for layer in lora_layers(model):
        layer.set_adapter(ADAPTER)  # injecting made the new adapter the active, trainable one
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    if any(f".{REFERENCE}." in n or ".lora_" not in n for n in trainable):  # PEFT's marking changed under us
        raise RuntimeError(f"after adding the reference adapter, trainable parameters outside the adapters: "
                           f"{sorted(n for n in trainable if f'.{ADAPTER}.' not in n)[:3]}")


@contextlib.contextmanager
def adapter_active(model: nn.Module, name: str) -> Iterator[None]:
    """``model`` computes base + adapter ``name`` for the duration; each layer's active adapters (and PEFT's
    ``requires_grad`` marking, which follows them) are restored on exit."""
    layers = lora_layers(model)
    before = [list(layer.active_adapters) for layer in layers]
    for layer in layers:
        layer.set_adapter(name)
    try:
        yield
    finally:
        for layer, names in zip(layers, before, strict=True):
            layer.set_adapter(names)


def reference_parameters(model: nn.Module) -> dict[str, Tensor]:
    """The :data:`REFERENCE` adapter's parameters of ``model``, by name (empty when it has none)."""
    return {n: p for n, p in model.named_parameters() if f".{REFERENCE}." in n}


class BaseModelView:
    """The reference of a LoRA policy: the policy's own module, for each call with its adapters off (exactly the
    base, ``adapter=None``) or with the frozen :data:`REFERENCE` adapter in their place (a reference that a method
    resets, :func:`add_reference_adapter`). Either way the reference costs no second copy of the model.

    It answers like the model it wraps (``config``, ``parameters()``, ``generation_config``...), so engines and
    :func:`tether.models.forward.response_log_probs` take it where they take a model; :meth:`state_dict` holds the
    reference's weights under their plain names (the reference adapter merged in), for engines with their own copy.
    """

    def __init__(self, policy: nn.Module, adapter: str | None = None) -> None:
        self.policy, self.adapter = policy, adapter

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def active(self) -> contextlib.AbstractContextManager[None]:
        """The policy computes the reference's function for the duration."""
        return adapters_disabled(self.policy) if self.adapter is None else adapter_active(self.policy, self.adapter)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.active():
            return self.policy(*args, **kwargs)

    @property
    def forward(self) -> Any:
        """:meth:`__call__`, with the policy's signature (engines read the name of its cache argument)."""
        return functools.wraps(self.policy.forward)(self.__call__)

    def state_dict(self) -> dict[str, Tensor]:
        return serving_state_dict(self.policy, adapter=self.adapter)

    @torch.no_grad()
    def reset_to(self, policy: nn.Module) -> None:
        """``theta_ref <- theta``: the trained adapters of ``policy`` (this view's own module) copied into the
        reference adapter, so base + reference adapter is the policy as it is now.

        Raises:
            ValueError: this view has no adapter of its own (its reference is the base, which never moves).
        """
        if self.adapter is None or policy is not self.policy:
            raise ValueError("only a view with its own reference adapter (add_reference_adapter) over the same "
                             "policy can be reset to it")
        trained = dict(policy.named_parameters())
        for name, param in reference_parameters(policy).items():
            param.copy_(trained[name.replace(f".{REFERENCE}.", f".{ADAPTER}.")])

    def adapter_state(self) -> dict[str, Tensor]:
        """The reference adapter's weights, for a checkpoint of a moved reference."""
        return {n: p.detach().clone() for n, p in reference_parameters(self.policy).items()}

    @torch.no_grad()
    def load_adapter_state(self, state: dict[str, Tensor]) -> None:
        """Restore :meth:`adapter_state`.

        Raises:
            ValueError: ``state`` holds other parameters than this policy's reference adapter.
        """
        own = reference_parameters(self.policy)
        if set(state) != set(own):
            raise ValueError(f"the checkpoint's reference adapter does not fit this policy's: missing "
                             f"{sorted(set(own) - set(state))[:3]}, unexpected {sorted(set(state) - set(own))[:3]}")
        for name, param in own.items():
            param.copy_(state[name])


@torch.no_grad()
def serving_state_dict(model: nn.Module, *, adapter: str | None = ADAPTER) -> dict[str, Tensor]:
    """The weights an engine with its own copy loads: plain Hugging Face names, the weights of base + ``adapter``
    merged (``W + (alpha / r) B A``), or the base alone with ``adapter=None``. A model without adapters gives its
    ``state_dict()``."""
    if not is_lora(model):
        return model.state_dict()
    deltas = {}
    if adapter is not None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        deltas = {f"{name}.base_layer.weight": module.get_delta_weight(adapter)
                  for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)}
    out = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = value + deltas[key] if key in deltas else value
    return out


def save_adapter(model: nn.Module, directory: Path, state_dict: dict[str, Tensor] | None = None) -> None:
    """The adapters of ``model`` in PEFT's format: ``adapter_model.safetensors`` and ``adapter_config.json``;
    from ``state_dict`` when given (a sharded model's, gathered), else from the module."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    weights = get_peft_model_state_dict(model, state_dict=state_dict, adapter_name=ADAPTER,
                                        save_embedding_layers=False)
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
    own = {k for k in model.state_dict() if ".lora_" in k and f".{ADAPTER}." in k}  # not a reference adapter
    try:
        result = set_peft_model_state_dict(model, {k.removeprefix(PEFT_PREFIX): v for k, v in saved.items()},
                                           adapter_name=ADAPTER)
    except RuntimeError as err:  # a size mismatch: another rank; torch names every tensor, one line each
        lines = [line.strip() for line in str(err).splitlines()]
        first = next((line for line in lines if line.startswith("size mismatch")), lines[0]).rstrip(".")
        raise ValueError(f"{directory}: the saved adapters do not fit this model's (model.lora differs from the "
                         f"run that wrote them): {first}") from None
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
