"""A tiny deterministic env for testing rollout loops: say the secret word within N turns.

The seed picks the secret word from ``words``; the task text reveals it (``reveal=True``, so a
scripted policy can win) or only lists the candidates. A correct guess wins (reward 1.0, done); after
``turns`` wrong guesses the episode is lost (done, reward 0.0; an empty or, with ``list_words``,
off-list word is an invalid no-op and uses no guess), so a loop test can exercise both
env-side termination and its own ``max_turns`` truncation (set ``turns`` above ``max_turns``).

``fault`` makes the env misbehave on purpose, to test :class:`tether.envs.SafeEnv`:
``"reset_raise"``, ``"step_raise"``, ``"reset_hang"``, ``"step_hang"`` (a hang sleeps ``hang_s``), ``"reset_spin"`` or
``"step_spin"`` (a busy loop of ``hang_s`` that never sleeps: a thread's timeout cannot stop it, a process's can),
``"solution_raise"`` or ``"solution_hang"``. Step faults fire on step number ``fault_turn`` (1-based).
"""

from __future__ import annotations

import time

from tether.envs.base import (
    EnvReset,
    EnvStep,
    check_can_step,
    eval_seeds,
    normalize_action,
    parse_tagged_action,
    train_seeds,
)

_FAULTS = (None, "reset_raise", "step_raise", "reset_hang", "step_hang", "reset_spin", "step_spin", "solution_raise",
           "solution_hang")


class ScriptedEnv:
    """Say-the-secret-word env.

    Args:
        words (tuple[str, ...]): candidate secret words; seed ``s`` picks ``words[s % len(words)]``.
        turns (int): guesses allowed before the episode is lost.
        reveal (bool): whether the task text names the secret word.
        list_words (bool): whether ``admissible_actions`` lists the candidates (so off-list guesses are
            invalid actions) or is None (any non-empty action is valid).
        fault (str | None): deliberate misbehaviour, see the module docstring.
        fault_turn (int): the step number (1-based) at which a step fault fires.
        hang_s (float): how long a hang sleeps or a spin loops.
    """

    name = "scripted"
    max_turns = 5
    action_format = "Reply with one word inside <action> </action> tags, e.g. <action>apple</action>."
    train_seeds = staticmethod(train_seeds)
    eval_seeds = staticmethod(eval_seeds)

    @staticmethod
    def check_config(*, words: tuple[str, ...] = ("apple",), turns: int = 3, fault: str | None = None,
                     **_: object) -> None:
        """The settings the constructor refuses, checked before any model loads (``tether.checks``)."""
        if not words:
            raise ValueError("words must not be empty")
        if turns < 1:
            raise ValueError(f"turns must be >= 1, got {turns}")
        if fault not in _FAULTS:
            raise ValueError(f"fault must be one of {_FAULTS}, got {fault!r}")

    def __init__(self, *, words: tuple[str, ...] = ("apple", "banana", "cherry", "grape", "lemon"),
                 turns: int = 3, reveal: bool = True, list_words: bool = True, fault: str | None = None,
                 fault_turn: int = 1, hang_s: float = 60.0) -> None:
        self.check_config(words=words, turns=turns, fault=fault)
        self.words = tuple(normalize_action(w) for w in words)  # guesses are compared normalised
        self.turns = turns
        self.reveal = reveal
        self.list_words = list_words
        self.fault = fault
        self.fault_turn = fault_turn
        self.hang_s = hang_s
        self._secret = ""
        self._steps = 0
        self._guesses = 0
        self._started = False
        self._done = False

    @property
    def admissible(self) -> list[str] | None:
        return list(self.words) if self.list_words else None

    def reset(self, seed: int) -> EnvReset:
        self._misbehave("reset")
        self._secret = self.words[seed % len(self.words)]
        self._steps, self._guesses = 0, 0
        self._started, self._done = True, False
        if self.reveal:
            task = f"Say the secret word. The secret word is '{self._secret}'."
        else:
            task = f"Guess the secret word, one of: {', '.join(self.words)}."
        obs = f"You have {self.turns} guesses. Say a word."
        return EnvReset(observation=obs, task=task, admissible_actions=self.admissible,
                        info={"secret": self._secret})

    def step(self, action: str) -> EnvStep:
        check_can_step(self.name, self._started, self._done)
        self._steps += 1
        if self._steps == self.fault_turn:
            self._misbehave("step")
        guess = normalize_action(action)
        invalid = not guess or (self.list_words and guess not in self.words)
        won = not invalid and guess == self._secret
        if not invalid:
            self._guesses += 1
        self._done = won or self._guesses >= self.turns
        info = {"won": won, "admissible_actions": self.admissible, "invalid_action": invalid,
                "guesses": self._guesses}
        return EnvStep(observation=self._feedback(action, invalid, won), reward=1.0 if won else 0.0,
                       done=self._done, info=info)

    def _feedback(self, action: str, invalid: bool, won: bool) -> str:
        left = self.turns - self._guesses
        if invalid:
            return f"'{action}' is not a word you can say. Nothing happens. {left} guesses left."
        if won:
            return f"Correct! '{self._secret}' is the secret word."
        return f"'{action}' is not the secret word. {left} guesses left."

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        return parse_tagged_action(response_text, self.admissible)

    def solution(self) -> list[str] | None:
        if not self._started or self._done:
            return None
        self._misbehave("solution")
        return [self._secret]

    def close(self) -> None:
        self._started = False

    def _misbehave(self, where: str) -> None:
        if self.fault == f"{where}_raise":
            raise RuntimeError(f"scripted fault: {where} raised on purpose")
        if self.fault == f"{where}_hang":
            time.sleep(self.hang_s)
        if self.fault == f"{where}_spin":
            end = time.monotonic() + self.hang_s
            while time.monotonic() < end:
                pass
