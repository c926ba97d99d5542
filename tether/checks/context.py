"""Prompts and responses that do not fit the policy's context, found before its weights load.

The model's ``config.json`` gives the context (``max_position_embeddings``, a vision-language model's text model's;
tether's char, tiny and tiny VLM models have a known one), and the tokenizer alone counts a prompt's tokens, rendered
as train renders them (:func:`policy_tokenizer`: ``model.chat_template`` set on it when the config names one, then
:func:`tether.models.encode_chat`). A vision-language policy's prompts are counted by its processor alone
(:func:`policy_processor`), a prompt with images as the collector encodes it
(:func:`tether.models.vision.encode_vision_messages`): each image expands to as many tokens as the processor gives
its size (Qwen2-VL: one per 28x28 pixels, after resizing), which the text alone does not show.

Which prompts: a task class may offer ``longest_prompts(limit, **kwargs)``, ``(where, prompt, system, images)`` of its
longest prompts (the jsonl task's by characters, from its files; the dataset task's by characters and by image pixels,
from its local sources); only those are encoded, so the cost is a tokenizer or processor load and a few encodings,
not the data set. Tasks that generate their prompts and environments, whose observations grow turn by turn, are not
checked.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import socket
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tether.checks.findings import Findings
from tether.checks.workload import workload_class
from tether.config import Config, ConfigError

LONGEST_PROMPTS = 16  # prompts tokenised per run check: the longest by characters are the longest by tokens, nearly
# name -> its tokenizer (None: it cannot be loaded alone), inside shared_tokenizers(); None outside
_LOADED: ContextVar[dict[str, Any] | None] = ContextVar("tether_checks_tokenizers", default=None)


def warn_context(cfg: Config, found: Findings) -> None:
    """``rollout.max_new_tokens`` and the task's longest prompts against the policy's context.

    Raises:
        ConfigError: a prompt alone fills the context: nothing can be generated after it (vLLM refuses it; the
            HF engine would sample past the positions the model was trained on).
    """
    context = model_context(cfg.model.name)
    if context is None:
        return
    new = cfg.rollout.max_new_tokens
    if new >= context:
        found.warn(f"rollout.max_new_tokens={new} is not below the context of {cfg.model.name} ({context} tokens, "
                   "max_position_embeddings): prompt and response do not fit")
        return
    lengths = prompt_lengths(cfg)
    if not lengths:
        return
    longest, where = max(lengths)
    if longest >= context:
        raise ConfigError(f"task.kwargs: the prompt at {where} is {longest} tokens with the chat template; the "
                          f"context of {cfg.model.name} is {context} tokens (max_position_embeddings), and a prompt "
                          "must leave room for the response: shorten or drop it, or use a model with a longer context")
    over = sum(length + new > context for length, _ in lengths)
    if over:
        found.warn(f"rollout.max_new_tokens={new}: the longest prompt ({where}, {longest} tokens) leaves "
                   f"{context - longest} tokens of the context of {cfg.model.name} ({context}, "
                   f"max_position_embeddings); {over} of the {len(lengths)} longest prompts leave less than "
                   "max_new_tokens, so their responses run past the context")


def prompt_lengths(cfg: Config) -> list[tuple[int, str]]:
    """``(tokens, where)`` of the task's longest prompts, rendered as train renders them (:func:`policy_tokenizer`,
    or a vision-language policy's :func:`policy_processor`; ``where`` says how many of a prompt's tokens its images
    are); empty where the task offers none, its data is bad (which
    :func:`tether.checks.machine.check_workload_inputs` reports), or the tokenizer cannot be loaded alone."""
    from tether.models.chat import NO_CHAT_TEMPLATE

    section, cls = workload_class(cfg)
    hook = getattr(cls, "longest_prompts", None) if section == "task" else None
    if hook is None:
        return []
    try:
        prompts = hook(LONGEST_PROMPTS, **cfg.task.kwargs)
    except (OSError, ValueError, TypeError):
        return []
    if not prompts:
        return []
    vision = policy_reads_images(cfg.model.name)
    if not vision:  # a text policy given images is refused by the startup checks, in one line of their own
        prompts = [entry for entry in prompts if not entry[3]]
    encoder = policy_processor(cfg) if vision else policy_tokenizer(cfg)
    if encoder is None or not prompts:
        return []
    with warnings.catch_warnings():  # a tokenizer without a template is one warning line of its own check
        warnings.filterwarnings("ignore", message=re.escape(NO_CHAT_TEMPLATE))
        return [prompt_length(encoder, *entry) for entry in prompts]


def prompt_length(encoder: Any, where: str, prompt: Any, system: str | None,
                  images: tuple[Any, ...]) -> tuple[int, str]:
    """``(tokens, where)`` of one prompt: a text as :func:`tether.models.encode_chat` renders it; one with images as
    the collector encodes it (:func:`tether.tasks.images.prompt_messages`, the processor), ``where`` then saying how
    many tokens its images expanded to."""
    from tether.models.chat import encode_chat
    from tether.models.vision import encode_vision_messages
    from tether.tasks.images import open_image, prompt_messages

    if not images:
        return len(encode_chat(encoder, prompt, system=system)), where
    ids = encode_vision_messages(encoder, prompt_messages(prompt, len(images), system), list(map(open_image, images)))
    # each image's one placeholder in the templated text became the processor's expansion of it
    image_tokens = len(ids) - len(ids.template_ids) + len(images)
    return len(ids), f"{where} ({len(images)} image(s): {image_tokens} tokens)"


def policy_tokenizer(cfg: Config) -> Any | None:
    """The tokenizer train encodes prompts with, loaded alone (:func:`tokenizer_loader`): ``model.name``'s, with
    ``model.chat_template`` set on it by the function train sets it with (``build_collector``), so a check renders
    a prompt exactly as train does. None where it cannot be loaded alone, or the template file is bad
    (:func:`tether.checks.machine.check_chat_template` reports that)."""
    from tether.models.chat_template import apply_chat_template

    tokenizer = load_tokenizer(cfg.model.name)
    if tokenizer is None:
        return None
    try:  # on the shared tokenizer too: within one config's checks it is always this config's template
        apply_chat_template(tokenizer, cfg.model.chat_template)
    except ValueError:
        return None
    return tokenizer


def policy_processor(cfg: Config) -> Any | None:
    """A vision-language policy's processor, loaded alone (no weights), with ``model.chat_template`` set on it as
    train sets it; None where it cannot be loaded alone or the template file is bad."""
    from tether.models.chat_template import apply_chat_template

    processor = load_processor(cfg.model.name)
    if processor is None:
        return None
    try:
        apply_chat_template(processor, cfg.model.chat_template)
    except ValueError:
        return None
    return processor


def policy_reads_images(name: str) -> bool | None:
    """Whether model ``name`` is a vision-language model (its config has a ``vision_config``), from its config file
    alone; None when that is not on this machine (or the name is a LoRA checkpoint's, whose base decides)."""
    from tether.models.policy import TINY_VLMS, is_alias

    if name in TINY_VLMS:
        return True
    if is_alias(name):
        return False
    local = Path(name).expanduser()
    config = local / "config.json" if local.is_dir() else hub_file(name, "config.json")
    if config is None or not Path(config).is_file():
        return None
    fields = _config_json(Path(config))
    return "vision_config" in fields if fields else None  # unreadable: not known here


def load_processor(name: str) -> Any | None:
    """The processor of vision-language model ``name``, without its weights: a tiny VLM's built alone, a
    directory's through ``AutoProcessor``; None where it cannot be loaded here."""
    from tether.models.loading import cache_root
    from tether.models.policy import TINY_VLMS
    from tether.models.vision import tiny_vlm_processor

    if name in TINY_VLMS:
        return _quietly(lambda: tiny_vlm_processor(TINY_VLMS[name]))
    directory = _model_dir(name, cache_root() / "models" / name)
    return None if directory is None else _quietly(lambda: _auto_processor(directory))


def model_context(name: str) -> int | None:
    """The policy's context (``max_position_embeddings``), without its weights; None where it is not known so."""
    from tether.models.char import CHAR_CONTEXT, parse_char_alias
    from tether.models.loading import TINY_ALIAS, TINY_CONTEXT, cache_root
    from tether.models.policy import TINY_VLMS
    from tether.models.vision import TINY_VLM_CONTEXT

    if parse_char_alias(name) is not None:
        return CHAR_CONTEXT
    if TINY_ALIAS.fullmatch(name):
        return TINY_CONTEXT
    if name in TINY_VLMS:
        return TINY_VLM_CONTEXT
    directory = _model_dir(name, cache_root() / "models" / name)
    return None if directory is None else _max_positions(directory / "config.json")


@contextlib.contextmanager
def shared_tokenizers() -> Iterator[None]:
    """Within it, :func:`load_tokenizer` loads each name's tokenizer once: one config's checks ask for the policy's
    up to three times (its prompts' lengths, the comparison with the reference's, its chat template), ~0.1 s each.
    The name is the whole key: the tokenizer is read from this machine's files only (no revision, no remote code).
    Scoped, not a process-wide cache, so a later check (a test, another command in the process) reads the files
    again."""
    token = _LOADED.set({})
    try:
        yield
    finally:
        _LOADED.reset(token)


def load_tokenizer(name: str) -> Any | None:
    """The tokenizer model ``name`` loads with, loaded alone (:func:`tokenizer_loader`); None where it cannot be.
    Inside :func:`shared_tokenizers`, the one loaded first for ``name``."""
    loaded = _LOADED.get()
    if loaded is not None and name in loaded:
        return loaded[name]
    load = tokenizer_loader(name)
    tokenizer = None if load is None else load()
    if loaded is not None:
        loaded[name] = tokenizer
    return tokenizer


def tokenizer_loader(name: str) -> Callable[[], Any] | None:
    """A loader of the tokenizer model ``name`` loads with (:func:`tether.models.load_policy`), without its weights
    (the loader returns None where the tokenizer cannot be loaded alone); None where nothing here holds it (a Hub
    id not in the cache, a tiny VLM, which exists only as it is built)."""
    from tether.models.char import char_tokenizer, parse_char_alias
    from tether.models.loading import SMOLLM2, TINY_ALIAS, cache_root, smollm2_tokenizer
    from tether.models.lora import adapter_base_name, is_adapter_dir

    if parse_char_alias(name) is not None:
        return lambda: _quietly(char_tokenizer)
    if name == SMOLLM2 or TINY_ALIAS.fullmatch(name):
        return lambda: _quietly(smollm2_tokenizer)
    local = Path(name).expanduser()
    if is_adapter_dir(local):  # a LoRA run's checkpoint loads with its base model's tokenizer
        try:
            return tokenizer_loader(adapter_base_name(local))
        except ValueError:  # it names no base: check_model_dirs says so
            return None
    directory = _model_dir(name, cache_root() / "models" / name)
    return None if directory is None else lambda: _quietly(lambda: _auto_tokenizer(directory))


def _model_dir(name: str, alias_dir: Path) -> Path | None:
    """Where ``config.json`` is: a local directory, a tether alias already built, or the Hub cache's snapshot."""
    for directory in (Path(name).expanduser(), alias_dir):
        if (directory / "config.json").is_file():
            return directory
    cached = hub_file(name, "config.json")
    return None if cached is None else Path(cached).parent


def hub_file(repo_id: str, filename: str, repo_type: str = "model") -> str | None:
    """``filename`` of ``repo_id`` (a ``model``, or a ``dataset``) in the local Hugging Face cache, or None (not
    cached, or not a Hub id)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, filename, repo_type=repo_type)
    except ValueError:  # not a valid Hub id (HFValidationError)
        return None
    return found if isinstance(found, str) else None


def _config_json(config: Path) -> dict[str, Any]:
    """``config.json``'s fields; empty where it cannot be read."""
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _max_positions(config: Path) -> int | None:
    """``max_position_embeddings`` of ``config``: a vision-language model's text model's (``text_config``, where
    Idefics3 and newer Qwen2-VL configs keep it), else its own."""
    data = _config_json(config)
    text = data.get("text_config")
    value = text.get("max_position_embeddings") if isinstance(text, dict) else None
    value = value if isinstance(value, int) else data.get("max_position_embeddings")
    return value if isinstance(value, int) else None


def _auto_processor(directory: Path) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(directory)


def _auto_tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def _quietly(load: Callable[[], Any]) -> Any:
    """The tokenizer, or None when it cannot be loaded here (a directory with weights but no tokenizer files, a
    ``tokenizer.json`` transformers cannot read, the SmolLM2 package missing): the checks are a courtesy, and the
    model's own loading reports what is wrong."""
    try:
        return load()
    except Exception:  # whatever a broken tokenizer file raises: KeyError, TypeError, JSON errors...
        return None


# a proxy reaches the Hub for huggingface_hub, not for a direct connection: the probe cannot tell, so it is not made
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def hub_unreachable() -> str | None:
    """Why the Hugging Face Hub (``HF_ENDPOINT``) surely cannot be reached from here, or None (it can, or that cannot
    be told). Asked before a check reads a Hub data set: with no network, ``datasets`` retries each request with
    backoff (about 25 s) before it fails, and huggingface_hub has no setting for those retries but
    ``HF_HUB_OFFLINE``.

    One TCP connection to the endpoint's host, of :data:`~tether.rewards.judge.PROBE_TIMEOUT_S`, once per endpoint and
    process: a name that does not resolve, or a refused or unreachable address, is a reason. A slow connection is
    not (the run's own requests, with their longer limits, decide), and no TLS or HTTP is spoken, so a certificate
    store or a server's answer that differ from huggingface_hub's cannot refuse a working setup; with a proxy set no
    probe is made."""
    from huggingface_hub import constants

    if any(os.environ.get(variable) for variable in PROXY_VARIABLES):
        return None
    return _endpoint_unreachable(constants.ENDPOINT)


@functools.cache
def _endpoint_unreachable(endpoint: str) -> str | None:
    from tether.rewards.judge import PROBE_TIMEOUT_S

    url = urlsplit(endpoint)
    try:
        host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    except ValueError:  # a port that is not a number: huggingface_hub's own requests will say so
        return None
    if host is None:
        return None
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return None
    except socket.gaierror as err:
        return f"the name {host} does not resolve ({err.strerror})"
    except TimeoutError:
        return None
    except OSError as err:  # refused, or no route to the address
        return f"cannot connect to {host}:{port} ({err.strerror or type(err).__name__})"
