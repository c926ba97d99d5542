"""A multi-turn environment of your own in one file: guess a number from 1 to ``high``, told "higher" or "lower".

tether's environments follow one small protocol (docs/environments.md): ``reset(seed)`` starts an episode,
``step(action)`` applies one action string, ``parse_action`` turns a model response into that string. The config
names the class as ``guess_number:GuessNumber`` (module:Class); no registration and no edit of tether.
"""

import random

from tether.envs.base import EnvReset, EnvStep, check_can_step, eval_seeds, parse_tagged_action, train_seeds


class GuessNumber:
    """Guess the secret number in ``guesses`` tries; reward 1.0 for finding it. Its solver is a binary search.

    Args:
        high: the secret is drawn from 1..high, seeded by the episode's seed.
        guesses: wrong guesses allowed before the episode is lost.
    """

    name = "guess_number"
    max_turns = 6
    action_format = "Reply with one number inside <action> </action> tags, e.g. <action>7</action>."
    train_seeds = staticmethod(train_seeds)  # training seeds and held-out seeds never overlap
    eval_seeds = staticmethod(eval_seeds)

    def __init__(self, *, high: int = 20, guesses: int = 5) -> None:
        if high < 2 or guesses < 1:
            raise ValueError(f"high={high} must be at least 2 and guesses={guesses} at least 1")
        self.high, self.guesses = high, guesses
        self._secret, self._left, self._started, self._done = 0, 0, False, False
        self._low, self._high = 1, high  # the numbers the feedback so far still allows

    def reset(self, seed: int) -> EnvReset:
        self._secret = random.Random(seed).randint(1, self.high)
        self._left, self._started, self._done = self.guesses, True, False
        self._low, self._high = 1, self.high
        return EnvReset(observation=f"I picked a number from 1 to {self.high}. You have {self.guesses} guesses.",
                        task=f"Find my secret number between 1 and {self.high}.")

    def step(self, action: str) -> EnvStep:
        check_can_step(self.name, self._started, self._done)
        text = action.strip()
        if not text.isdigit() or not 1 <= int(text) <= self.high:  # an invalid action changes nothing
            return EnvStep(f"'{action}' is not a number from 1 to {self.high}. {self._left} guesses left.", 0.0,
                           False, {"won": False, "admissible_actions": None, "invalid_action": True})
        guess = int(text)
        self._left -= 1
        won = guess == self._secret
        self._done = won or self._left == 0
        if won:
            feedback = f"Yes! {guess} is my number."
        else:
            feedback = f"{guess} is too {'low' if guess < self._secret else 'high'}. {self._left} guesses left."
            if guess < self._secret:
                self._low = max(self._low, guess + 1)
            else:
                self._high = min(self._high, guess - 1)
        return EnvStep(feedback, 1.0 if won else 0.0, self._done,
                       {"won": won, "admissible_actions": None, "invalid_action": False})

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        action, valid = parse_tagged_action(response_text)
        return action, valid and action.isdigit()

    def solution(self) -> list[str] | None:
        """A binary search's guesses from here to the secret, for the SFT warm start (``sft.data: solver``, which
        takes the first at each state): each is the middle of the numbers the feedback still allows, so the next
        one reads only what the prompt shows; from 1..20 it wins within 5 guesses. None outside an episode."""
        if not self._started or self._done:
            return None
        low, high, plan = self._low, self._high, []
        while True:
            guess = (low + high) // 2
            plan.append(str(guess))
            if guess == self._secret:
                return plan
            low, high = (guess + 1, high) if guess < self._secret else (low, guess - 1)

    def close(self) -> None:
        self._started = False
