"""A scripted engine and tiny agent-config builders (``tether train``'s, ``tether seed-sft``'s) shared by the rollout
tests."""

from __future__ import annotations

import re
from typing import Any

import torch

from tether.checks import load_checked_config
from tether.config import Config, SeedSFTRunConfig
from tether.engine.base import Generation, SamplingParams
from tether.envs.base import EnvStep
from tether.envs.scripted import ScriptedEnv

WORDS = ("apple", "banana", "cherry", "grape", "lemon")  # the scripted env's default words
INVALID = "zzz"  # not a candidate word: an invalid action (a no-op that uses no guess)


class ScriptedEngine:
    """An engine that plays the scripted env by a fixed plan, for exact row-by-row checks.

    On its first turn (no history in the prompt) the episode at position ``j`` of the call takes
    ``kinds[j % len(kinds)]``:

    * ``"win"``: says the secret word (1 row, return 1);
    * ``"invalid"``: says ``zzz`` (invalid), then the secret word (2 rows, return 1);
    * ``"wrong"``: says a wrong candidate every turn (``turns`` rows, return 0, lost).

    Later turns follow from the last action in the prompt's history. Every response is
    ``<action>WORD</action>`` plus EOS, and token ``t`` of a response of ``c`` characters gets the
    sampling log-prob ``-c / 100`` (so a test can tell the rows apart).
    """

    def __init__(self, tokenizer: Any, kinds: tuple[str, ...] = ("win", "invalid", "wrong")) -> None:
        self.tokenizer, self.kinds = tokenizer, kinds
        self.calls: list[int] = []  # rows per generate call

    def respond(self, prompt: str, j: int) -> str:
        secret = re.search(r"The secret word is '(\w+)'", prompt).group(1)
        said = re.findall(r"\[Action \d+: ([^\]]*)\]", prompt)
        wrong = [w for w in WORDS if w != secret and w not in said]
        if not said:
            kind = self.kinds[j % len(self.kinds)]
            word = {"win": secret, "invalid": INVALID, "wrong": wrong[0]}[kind]
        else:
            word = secret if said[-1] == INVALID else wrong[0]
        return f"<action>{word}</action>"

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, *, seed: int | None = None,
                 intervention: Any = None) -> Generation:
        tok = self.tokenizer
        texts = [self.respond(tok.decode(p), j) for j, p in enumerate(prompt_ids)]
        ids = [[*tok(t, add_special_tokens=False).input_ids, tok.eos_token_id] for t in texts]
        width = max(len(i) for i in ids)
        n = len(ids)
        response_ids = torch.full((n, width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros(n, width)
        logp = torch.zeros(n, width)
        for i, (row, text) in enumerate(zip(ids, texts, strict=True)):
            response_ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1.0
            logp[i, :len(row)] = -len(text) / 100
        self.calls.append(n)
        return Generation(response_ids=response_ids, response_mask=mask, sample_log_probs=logp, texts=texts,
                          truncated=torch.zeros(n, dtype=torch.bool))

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The plan holds no weights: the trainer's push after each update has nothing to do."""


def agent_config(tmp_path: Any, *overrides: str, **sections: Any) -> Config:
    """A small agent run on the scripted env: 2 tasks x 3 clones per step, 3 guesses, no validation, envs in this
    process (``env.isolation: thread``: faster to start, and a test may count what its env classes did)."""
    base: dict[str, Any] = {
        "seed": 0, "run_dir": str(tmp_path / "run"),
        "env": {"name": "scripted", "kwargs": {"turns": 3}, "max_turns": 5, "history": 2,
                "invalid_action_penalty": 0.1, "train_tasks": 8, "val_tasks": 3, "timeout_s": 5.0,
                "isolation": "thread"},  # in-process: these tests read env state; tests/envs/test_isolated.py the rest
        "rollout": {"prompts_per_step": 2, "group_size": 3, "max_new_tokens": 8},
        "algorithm": {"advantage": "episode"},
        "optim": {"lr": 1e-3, "micro_batch_size": 8},
        "val": {"every": 0, "greedy": True},
        "train": {"steps": 1, "best_metric": "val/success_rate"},
        "logging": {"tensorboard": False, "progress": False},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return load_checked_config(data=base, overrides=list(overrides))


def seed_sft_config(tmp_path: Any, *overrides: str, **sections: Any) -> SeedSFTRunConfig:
    """:func:`agent_config`'s env, policy and sampling as a ``tether seed-sft`` config (its own schema)."""
    base: dict[str, Any] = {
        "seed": 0, "run_dir": str(tmp_path / "run"),
        "env": {"name": "scripted", "kwargs": {"turns": 3}, "max_turns": 5, "history": 2,
                "invalid_action_penalty": 0.1, "train_tasks": 8, "val_tasks": 3, "timeout_s": 5.0},
        "rollout": {"max_new_tokens": 8},
        "logging": {"tensorboard": False, "progress": False},
        "sft": {},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return load_checked_config(data=base, overrides=list(overrides), command="seed-sft")


class PlanEnv(ScriptedEnv):
    """The scripted env with a reward on every turn: a win 1.0, a wrong guess -0.5, an invalid word -0.25. An
    invalid word also sets the hazard flag ``fell_in_pit`` on its step (a later step clears it), and so does the
    wrong guess that loses the episode."""

    def step(self, action: str) -> EnvStep:
        step = super().step(action)
        won, invalid = step.info["won"], step.info["invalid_action"]
        reward = 1.0 if won else -0.25 if invalid else -0.5
        lost = step.done and not won
        return EnvStep(observation=step.observation, reward=reward, done=step.done,
                       info={**step.info, "fell_in_pit": invalid or lost})
