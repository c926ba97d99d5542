"""Character-level models for the miniature lab: one token per character, a few million parameters.

A study on two CPU cores needs a model whose parameters sit in its body, not in a 49k-token vocabulary head,
and that sees every digit and map cell as one token. This module builds

* a tokenizer over a fixed alphabet (printable ASCII, newline, four special tokens: 100 symbols), in the
  standard Hugging Face format (a ``tokenizers`` WordLevel model with one token per character, wrapped in
  :class:`transformers.PreTrainedTokenizerFast`), with a short chat template, and
* a family of randomly initialised Llama models named ``char-<hidden>x<layers>`` (e.g. ``char-256x4``, about
  3.2M parameters), created once from a fixed seed and cached under ``$TETHER_CACHE/models/<alias>`` exactly as
  SmolLM2 is, so :func:`tether.models.load_policy` loads it like any Hugging Face directory and every path
  (engine, KV cache, forward, checkpoints, eval) works unchanged.
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

import torch

CHAR_ALIAS = re.compile(r"char-(\d+)x(\d+)")
CHAR_CONTEXT = 1024  # max_position_embeddings of every char model
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Printable ASCII without the form-feed family: digits, letters, punctuation, space, newline. Grid symbols of
# tether's environments (#, @, $, ., S, F, H, G, ...) are all in it.
ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"
# "Q:"/"A:" turns keep prompts short (a 3-digit addition is about 12 tokens); a system message is a plain line.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n"
    "{% elif m['role'] == 'user' %}Q:{{ m['content'] }}\n"
    "{% else %}A:{{ m['content'] }}{{ eos_token }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
)


def char_vocab() -> dict[str, int]:
    """Token -> id: the four special tokens first (pad is 0), then the alphabet in a fixed order."""
    return {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *ALPHABET))}


def char_tokenizer() -> Any:
    """The character tokenizer as a :class:`~transformers.PreTrainedTokenizerFast` (left padding, chat template).

    Characters outside :data:`ALPHABET` become ``<unk>``; decoding joins characters with nothing between them.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # "." would skip newlines
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                        unk_token=UNK, padding_side="left", clean_up_tokenization_spaces=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def parse_char_alias(name: str) -> tuple[int, int] | None:
    """``"char-256x4"`` -> (256, 4); anything else -> None."""
    match = CHAR_ALIAS.fullmatch(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def char_size_problem(hidden: int, layers: int) -> str | None:
    """Why ``char-<hidden>x<layers>`` cannot be built (its heads are 64-dimensional), or None."""
    if hidden < 64 or hidden % 64 or layers < 1:
        return f"char-{hidden}x{layers}: hidden must be a positive multiple of 64 and layers >= 1"
    return None


def char_model_config(hidden: int, layers: int, tokenizer: Any) -> Any:
    """Llama settings of ``char-<hidden>x<layers>``: 64-dim heads, 2 KV groups, SwiGLU of 8/3 x hidden.

    Raises:
        ValueError: ``hidden`` is not a positive multiple of 64 or ``layers`` is not positive.
    """
    from transformers import LlamaConfig

    if (problem := char_size_problem(hidden, layers)) is not None:
        raise ValueError(problem)
    heads = hidden // 64
    return LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=64 * round(8 * hidden / 3 / 64),
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=CHAR_CONTEXT, initializer_range=0.02, tie_word_embeddings=True, rope_theta=10000.0,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)


def build_char_model(hidden: int, layers: int, seed: int = 0) -> tuple[Any, Any]:
    """A fresh ``char-<hidden>x<layers>`` model (random init from ``seed``; global RNG untouched) and tokenizer."""
    from transformers import LlamaForCausalLM

    tokenizer = char_tokenizer()
    config = char_model_config(hidden, layers, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def char_model_dir(name: str) -> Path:
    """The cached directory of alias ``name`` (``char-<hidden>x<layers>``), created on first use (seed 0)."""
    from tether.models.loading import _publish, cache_root

    parsed = parse_char_alias(name)
    if parsed is None:
        raise ValueError(f"{name!r} is not a character-model alias (char-<hidden>x<layers>, e.g. char-256x4)")

    def build(tmp: Path) -> None:
        model, tokenizer = build_char_model(*parsed)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return _publish(build, cache_root() / "models" / name)
