"""Stage-1 labels from any OpenAI-compatible chat-completions endpoint (the paper uses GLM-5.2 this way).

Through :class:`tether.openai_chat.ChatClient` (plain ``urllib``, no client package). The endpoint, model and key
come from environment variables whose *names* are settings (defaults ``OPENAI_BASE_URL``, ``OPENAI_MODEL``,
``OPENAI_API_KEY``, as the SEED code reads them). Behaviour follows the code's ``_analyze_episode_with_openai``:

* temperature 0.0, ``max_completion_tokens`` 1024 (the stage-1 scripts' ``SKILL_MAX_COMPLETION_TOKENS``);
* transport errors are retried ``api_retries`` times (``OPENAI_API_RETRIES``, 5) with a fixed delay;
* an answer that does not parse, or whose skill has fewer than five words, is retried ``parse_retries`` times in
  all (``SEED_ANALYSIS_PARSE_RETRIES``, 2) with the code's repair prompt (the original prompt, the parse error, the
  last 2,000 characters of the bad answer, and the exact JSON shape).
"""

from __future__ import annotations

import os

from tether.methods.seed.analyzer import Analysis, is_nontrivial_skill, parse_analysis
from tether.openai_chat import ChatClient, ChatError


def repair_prompt(prompt: str, answer: str, error: str, *, include_summary: bool = True) -> str:
    """The code's ``_build_json_retry_prompt`` for ``episode_only``."""
    shape = ('{\n  "episode_summary": "string",\n  "episode_skill": "string"\n}' if include_summary
             else '{\n  "episode_skill": "string"\n}')
    return (f"{prompt}\n\nThe previous answer could not be parsed as the required JSON object.\n"
            f"Parse error: {error}\n\nPrevious answer:\n{str(answer or '')[-2000:]}\n\n"
            f"Return ONLY one valid JSON object with this exact shape:\n{shape}\n")


class OpenAIAnalyzer:
    """Analyzer answers from ``POST {base_url}/chat/completions``.

    Args:
        base_url_env, model_env, api_key_env: names of the environment variables to read (the key may be unset
            for local servers).
        max_completion_tokens: completion budget per request.
        temperature: sampling temperature (0.0: greedy, as the paper).
        parse_retries: attempts in all per trajectory, the first included.
        api_retries: attempts per request on HTTP or network errors.
        retry_delay: seconds between request attempts.
        timeout: seconds per request.
        include_summary: the prompt asks for ``episode_summary`` (repair prompt shape).

    Raises:
        ValueError: the base URL or model variable is unset.
    """

    def __init__(self, *, base_url_env: str = "OPENAI_BASE_URL", model_env: str = "OPENAI_MODEL",
                 api_key_env: str = "OPENAI_API_KEY", max_completion_tokens: int = 1024, temperature: float = 0.0,
                 parse_retries: int = 2, api_retries: int = 5, retry_delay: float = 1.0, timeout: float = 120.0,
                 include_summary: bool = True) -> None:
        self.base_url = os.environ.get(base_url_env, "").rstrip("/")
        self.model = os.environ.get(model_env, "")
        if not self.base_url or not self.model:
            raise ValueError(f"the OpenAI-compatible analyzer reads its endpoint from ${base_url_env} and its model "
                             f"from ${model_env}; set both (e.g. {base_url_env}=http://localhost:8000/v1)")
        self.client = ChatClient(self.base_url, self.model, os.environ.get(api_key_env, ""),
                                 max_completion_tokens=max_completion_tokens, temperature=temperature,
                                 retries=max(1, api_retries), retry_delay=retry_delay, timeout=timeout)
        self.parse_retries, self.include_summary = max(1, parse_retries), include_summary

    def complete(self, prompt: str) -> str:
        """One chat completion of a single user message; retried on transport errors."""
        return self.client.complete(prompt)

    def analyze(self, prompt: str) -> Analysis:
        """Ask until the answer parses with a non-trivial skill, or ``parse_retries`` attempts are spent.

        A request that fails after its retries ends the trajectory's analysis with that error (the code skips
        the trajectory the same way).
        """
        answer, error = "", "no attempt"
        for attempt in range(self.parse_retries):
            ask = prompt if attempt == 0 else repair_prompt(prompt, answer, error,
                                                            include_summary=self.include_summary)
            try:
                answer = self.complete(ask)
            except ChatError as exc:
                return Analysis("", "", str(exc), answer)
            result = parse_analysis(answer, include_summary=self.include_summary)
            if result.error is None and is_nontrivial_skill(result.skill):
                return result
            error = result.error or "SEED analyzer response missing required field: episode_skill"
        return Analysis("", "", error, answer)
