"""Model loading, chat prompts and the response log-prob forward pass."""

from tether.models.chat import encode_chat
from tether.models.forward import autocast, pack_prompt_response, response_log_probs
from tether.models.loading import (
    SMOLLM2,
    ModelUnavailableError,
    cache_root,
    prepare_tokenizer,
    smollm2_dir,
    smollm2_gguf,
    smollm2_tokenizer,
    tiny_model,
)
from tether.models.policy import load_policy

__all__ = [
    "SMOLLM2",
    "ModelUnavailableError",
    "autocast",
    "cache_root",
    "encode_chat",
    "load_policy",
    "pack_prompt_response",
    "prepare_tokenizer",
    "response_log_probs",
    "smollm2_dir",
    "smollm2_gguf",
    "smollm2_tokenizer",
    "tiny_model",
]
