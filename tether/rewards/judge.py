"""An LLM judge as a reward function: ``fn: tether.rewards:Judge``, any OpenAI-compatible endpoint (vLLM, SGLang,
llama.cpp's server, a hosted API).

Each row's judge prompt is ``template`` with ``{prompt}``, ``{completion}`` and any dataset column (``{answer}``)
filled in; the judge's answer is parsed for a score (the first number, or the first group of ``pattern``), divided
by ``max_score``. Requests run ``concurrency`` at a time, each with a timeout and retries
(:class:`~tether.openai_chat.ChatClient`); identical judge prompts are asked once (an in-memory cache). A row whose
request fails every retry, or whose answer holds no score, is a fault: NaN, which :mod:`tether.rewards.terms`
contains and counts like any reward fault, the reason in :attr:`Judge.last_errors`.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tether.openai_chat import ChatClient, ChatError, unreachable

DEFAULT_TEMPLATE = ("Rate how well the response answers the question, from 0 (useless or wrong) to 10 (fully "
                    "correct and clear). Reply with the number only.\n\nQuestion:\n{prompt}\n\nResponse:\n"
                    "{completion}\n\nScore:")
NUMBER = r"(-?\d+(?:\.\d+)?)"
# A placeholder: ``{name}`` alone. Not ``str.format``, which reads any braces as a field: a JSON example in a template,
# ``{"score": 5}``, would raise ("Space not allowed in string format specifier"), and ``{"a":1}`` become ``{"a"}``.
PLACEHOLDER = re.compile(r"\{(\w+)\}")
PROBE_TIMEOUT_S = 2.0  # tether validate's one look at the endpoint: a local server answers in milliseconds


def text_of(value: Any) -> str:
    """A prompt or completion as text: a string as it is, a conversation as ``role: content`` lines (text parts
    joined, :func:`tether.models.chat.content_text`)."""
    from tether.models.chat import content_text

    if isinstance(value, str):
        return value
    return "\n".join(f"{m['role']}: {content_text(m['content'])}" for m in value)


class Judge:
    """Scores each completion by asking a language model.

    Args:
        model: the judge model's name on the server.
        base_url: the API root (``http://localhost:8000/v1``); default: ``$OPENAI_BASE_URL``.
        api_key_env: the environment variable holding the key (unset or empty: no key, a local server).
        template: the judge prompt; ``{prompt}``, ``{completion}`` and dataset columns are filled in.
        pattern: a regular expression whose first group is the score (default: the first number).
        max_score: the score is divided by it (10 for the default template: rewards in [0, 1]).
        timeout_s: seconds per request.
        retries: attempts per request, the first included.
        retry_delay_s: seconds between attempts.
        concurrency: requests in flight at once.
        cache_size: judge prompts remembered with their scores (0: no cache).
        max_tokens: the judge's completion budget.
    """

    def __init__(self, model: str, base_url: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 template: str = DEFAULT_TEMPLATE, pattern: str = NUMBER, max_score: float = 10.0,
                 timeout_s: float = 60.0, retries: int = 3, retry_delay_s: float = 1.0, concurrency: int = 8,
                 cache_size: int = 10_000, max_tokens: int = 16) -> None:
        self.check(model, base_url, api_key_env, template, pattern, max_score, timeout_s, retries, retry_delay_s,
                   concurrency, cache_size, max_tokens)
        url = base_url or os.environ.get("OPENAI_BASE_URL", "")
        self.client = ChatClient(url, model, os.environ.get(api_key_env, ""), max_completion_tokens=max_tokens,
                                 temperature=0.0, retries=retries, retry_delay=retry_delay_s, timeout=timeout_s)
        self.template, self.pattern, self.max_score = template, re.compile(pattern), max_score
        self.concurrency, self.cache_size = concurrency, cache_size
        self.cache: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()
        self.last_errors: list[str | None] = []
        self.requests = 0

    @staticmethod
    def check(model: str, base_url: str | None = None, api_key_env: str = "OPENAI_API_KEY",
              template: str = DEFAULT_TEMPLATE, pattern: str = NUMBER, max_score: float = 10.0,
              timeout_s: float = 60.0, retries: int = 3, retry_delay_s: float = 1.0, concurrency: int = 8,
              cache_size: int = 10_000, max_tokens: int = 16, **_: Any) -> None:
        """The settings, before anything runs.

        Raises:
            ValueError: the first problem (no endpoint, a template without ``{completion}``, a pattern without a
                group, a size or time out of range).
        """
        url = base_url or os.environ.get("OPENAI_BASE_URL", "")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: {url!r} is not an http(s) URL (set base_url, or $OPENAI_BASE_URL)")
        if "{completion}" not in template:
            raise ValueError("template: must contain {completion}, where the response goes")
        try:
            groups = re.compile(pattern).groups
        except re.error as err:
            raise ValueError(f"pattern: {pattern!r} is not a regular expression ({err})") from None
        if groups < 1:
            raise ValueError(f"pattern: {pattern!r} has no group; the first group is the score")
        if min(timeout_s, max_score) <= 0 or min(retries, concurrency, max_tokens) < 1 or \
                min(cache_size, retry_delay_s) < 0:
            raise ValueError("timeout_s and max_score must be > 0; retries, concurrency and max_tokens >= 1; "
                             "cache_size and retry_delay_s >= 0")

    @staticmethod
    def probe_endpoint(base_url: str | None = None, api_key_env: str = "OPENAI_API_KEY", **_: Any) -> str | None:
        """Whether a server answers at the endpoint, asked once with a short timeout by ``tether validate`` (never
        in a run): the settings check cannot see a server that is not started, and training would then fault every
        row. Returns a warning line (``base_url: cannot connect to ...``), or None."""
        url = base_url or os.environ.get("OPENAI_BASE_URL", "")
        problem = unreachable(url, os.environ.get(api_key_env, ""), timeout=PROBE_TIMEOUT_S)
        if problem is None:
            return None
        where = "" if base_url else " (from $OPENAI_BASE_URL)"
        return (f"base_url{where}: {problem}; every row of this reward would be a fault: start the judge's server "
                "before training, or fix base_url")

    def judge_prompt(self, prompt: Any, completion: Any, columns: dict[str, Any]) -> str:
        """``template`` with each ``{name}`` of a field filled in; every other brace, an unknown ``{name}`` included,
        stays as written."""
        fields = {k: "" if v is None else str(v) for k, v in columns.items()}
        fields.update(prompt=text_of(prompt), completion=text_of(completion))
        return PLACEHOLDER.sub(lambda m: fields.get(m.group(1), m.group(0)), self.template)

    def parse(self, answer: str) -> float:
        """The score in the judge's answer, divided by ``max_score``.

        Raises:
            ValueError: no score in the answer.
        """
        found = self.pattern.search(answer)
        if found is None:
            raise ValueError(f"no score in the judge's answer {answer[:80]!r}")
        return float(found.group(1)) / self.max_score

    def _ask(self, text: str) -> tuple[float, str | None]:
        with self._lock:  # requests run in threads: another may evict this entry between a look and a read
            cached = self.cache.get(text)
            self.requests += cached is None
        if cached is not None:
            return cached, None
        try:
            score = self.parse(self.client.complete(text))
        except (ChatError, ValueError) as err:
            return math.nan, str(err)
        if self.cache_size:
            with self._lock:  # requests run in threads
                self.cache[text] = score
                while len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
        return score, None

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        rows = [{k: v[i] for k, v in columns.items()} for i in range(len(completions))]
        texts = [self.judge_prompt(p, c, row) for p, c, row in zip(prompts, completions, rows, strict=True)]
        unique = list(dict.fromkeys(texts))  # a prompt asked twice in one batch is one request
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            answers = dict(zip(unique, pool.map(self._ask, unique), strict=True))
        self.last_errors = [answers[t][1] for t in texts]
        return [answers[t][0] for t in texts]
