"""A client of any OpenAI-compatible chat-completions endpoint (``POST {base_url}/chat/completions``), plain
``urllib``, no client package: SEED's analyzer and the LLM-judge reward both speak through it.

Transport errors, HTTP errors and malformed answers are retried ``retries`` times in all with a fixed delay; then
:meth:`ChatClient.complete` raises :class:`ChatError` naming the endpoint and the last error.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class ChatError(RuntimeError):
    """A chat completion that failed every attempt."""


@dataclass(frozen=True)
class ChatClient:
    """One endpoint and model.

    Attributes:
        base_url: the API root, e.g. ``http://localhost:8000/v1`` (no trailing ``/chat/completions``).
        model: the model name the server knows.
        api_key: sent as ``Authorization: Bearer ...``; empty for local servers.
        max_completion_tokens: completion budget per request.
        temperature: sampling temperature (0.0: greedy).
        retries: attempts per request, the first included.
        retry_delay: seconds between attempts.
        timeout: seconds per attempt.
    """

    base_url: str
    model: str
    api_key: str = ""
    max_completion_tokens: int = 1024
    temperature: float = 0.0
    retries: int = 5
    retry_delay: float = 1.0
    timeout: float = 120.0

    def complete(self, messages: str | Sequence[dict[str, str]]) -> str:
        """The assistant's answer to a user message (a string) or to a conversation.

        Raises:
            ChatError: every attempt failed.
        """
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        body = json.dumps({"model": self.model, "messages": list(messages), "temperature": self.temperature,
                           "max_completion_tokens": self.max_completion_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url, error = f"{self.base_url.rstrip('/')}/chat/completions", None
        for attempt in range(max(1, self.retries)):
            request = urllib.request.Request(url, data=body, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    payload: dict[str, Any] = json.loads(response.read())
                return str(payload["choices"][0]["message"].get("content") or "")
            # http.client.HTTPException: a body cut short (IncompleteRead) or a bad status line, neither an OSError;
            # ValueError: a body that is not JSON or not UTF-8; AttributeError: a "message" that is not an object
            except (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException, KeyError, IndexError,
                    TypeError, ValueError, AttributeError) as exc:
                error = exc
                if attempt + 1 < self.retries:
                    time.sleep(self.retry_delay)
        raise ChatError(f"chat completion at {self.base_url} failed {max(1, self.retries)} times: {error}")


def unreachable(base_url: str, api_key: str = "", timeout: float = 2.0) -> str | None:
    """Why nothing answers at ``base_url`` (``GET {base_url}/models``, one attempt of ``timeout`` seconds), or None.

    Any HTTP answer, an error status included (401 without a key, 404 from a server without that route), means a
    server is there: only a refused or timed-out connection, or a name that does not resolve, is a reason.
    """
    url = f"{base_url.rstrip('/')}/models"
    try:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as err:
        return f"cannot connect to {url} ({getattr(err.reason, 'strerror', None) or err.reason})"
    except TimeoutError:
        return f"no answer from {url} within {timeout:g} s"
    except OSError as err:
        return f"cannot connect to {url} ({err.strerror or str(err) or type(err).__name__})"
    except (ValueError, http.client.InvalidURL) as err:  # a port that is not a number, a bad IPv6 address
        return f"{url} is not a valid URL ({err})"
    except http.client.HTTPException as err:  # a port that answers, but not in HTTP (an SSH server)
        return f"{url} answers, but not as an HTTP server ({type(err).__name__})"
