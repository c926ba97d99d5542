"""A sequence-classification reward model as a reward function: ``fn: tether.rewards:RewardModel``.

The model (``AutoModelForSequenceClassification``, one output, as TRL's reward models) reads the prompt and the
completion together, rendered with its tokenizer's chat template when it has one (else the two texts joined, with
the special tokens its tokenizer adds, BOS or ``[CLS] ... [SEP]``, as ``tokenizer(text)`` gives them), in batches of
``batch_size`` on the run's device, without gradients; the reward of a row is its logit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tether.files import written_as_local_path


def conversation(prompt: str | list[dict[str, str]], completion: str | list[dict[str, str]]) -> list[dict[str, str]]:
    """The prompt and the completion as one message list (TRL's conversational shape)."""
    head = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    tail = [{"role": "assistant", "content": completion}] if isinstance(completion, str) else list(completion)
    return head + tail


def _cached(repo_id: str) -> bool:
    """Whether the Hub model ``repo_id`` is in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid Hub id
        return False


class RewardModel:
    """Scores ``(prompt, completion)`` pairs with a sequence-classification model.

    Args:
        model: a local directory or a Hub id of an ``AutoModelForSequenceClassification`` checkpoint.
        batch_size: pairs per forward pass.
        max_length: tokens kept of each pair (the left is cut: the completion matters most).
        device: ``auto`` (the run's device: ``cuda:LOCAL_RANK`` when CUDA is there, else ``cpu``), ``cpu``, ``cuda:N``.
        output: which output logit is the reward (0 for a one-output reward model).
    """

    def __init__(self, model: str, batch_size: int = 8, max_length: int = 1024, device: str = "auto",
                 output: int = 0) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from tether.distributed import resolve_device

        self.device = resolve_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side, self.tokenizer.truncation_side = "right", "left"
        self.model = AutoModelForSequenceClassification.from_pretrained(model).to(self.device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        # The head reads a row's score at its last token that is not config.pad_token_id: padding with any other id
        # (a tokenizer whose pad token is not the config's) would score a padded row at a pad position.
        self.pad_id: int = self.model.config.pad_token_id
        self.batch_size, self.max_length, self.output = batch_size, max_length, output

    @staticmethod
    def check(model: str, batch_size: int = 8, max_length: int = 1024, device: str = "auto", output: int = 0,
              **_: Any) -> None:
        """The settings, before anything loads.

        Raises:
            ValueError: a size below 1, a model that is neither a local directory nor a Hub id, or a tether alias
                (a policy).
        """
        if batch_size < 1 or max_length < 2 or output < 0:
            raise ValueError(f"batch_size={batch_size}, max_length={max_length}, output={output}: need batch_size "
                             ">= 1, max_length >= 2, output >= 0")
        from tether.models.policy import is_alias

        local = Path(model).expanduser()
        if (local / "config.json").is_file():
            return
        if is_alias(model):  # read as a Hub id, it failed only after the policy had loaded
            raise ValueError(f"model: {model!r} is a tether alias of a policy (a causal LM without a reward head), not "
                             "a reward model: give a local directory or a Hub id (org/name) of an "
                             "AutoModelForSequenceClassification checkpoint")
        if written_as_local_path(model):
            raise ValueError(f"model: {model!r} is not a directory holding a model (no config.json)")
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "") and not _cached(model):
            raise ValueError(f"model: {model!r} is not a local directory, nor in the local Hugging Face cache, and "
                             "HF_HUB_OFFLINE is set")

    def render(self, prompt: Any, completion: Any) -> str:
        from tether.models.chat import content_text, template_messages

        messages = conversation(prompt, completion)
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(template_messages(self.tokenizer, messages), tokenize=False)
        return "\n\n".join(content_text(m["content"]) for m in messages)

    @torch.no_grad()
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        texts = [self.render(p, c) for p, c in zip(prompts, completions, strict=True)]
        # a chat template writes the special tokens into the text; joined texts have none, and a model without a
        # template (a BERT-style one reading its [CLS] token, a base LM its BOS) was trained with them added
        special = not getattr(self.tokenizer, "chat_template", None)
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(texts[start:start + self.batch_size], return_tensors="pt", padding=True,
                                   truncation=True, max_length=self.max_length, add_special_tokens=special)
            batch["input_ids"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, self.pad_id)
            logits = self.model(**batch.to(self.device)).logits
            scores += logits[:, self.output].float().tolist()
        return scores
