"""verl's ``custom_reward_function`` as a reward term: ``fn: tether.rewards:VerlScore``.

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info)`` once per response and takes a
number (a float, a numpy scalar, a 0-d tensor), or a dict whose ``"score"`` is the reward. :class:`VerlScore` loads
that function from the same file (``path``, ``name``) and calls it the same way: ``solution_str`` is the response
text alone (verl decodes the response tokens; a conversational completion gives its content, not ``assistant: ...``),
``ground_truth`` the row's gold answer, ``data_source`` and ``extra_info`` the row's columns of those names (``None``
where absent). A row whose call raises or returns no number is a fault of that row alone.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tether.files import relative_to_cwd
from tether.rewards.terms import as_real


def solution_str(completion: str | Sequence[dict[str, Any]]) -> str:
    """The response as verl's ``solution_str``: the text, or the content of a conversational completion's messages
    (TRL's ``[{"role": "assistant", "content": ...}]``), which verl never wraps in a role."""
    return completion if isinstance(completion, str) else "".join(message["content"] for message in completion)


def load_compute_score(path: str, name: str) -> Callable[..., Any]:
    """The function ``name`` of the Python file ``path`` (verl's ``custom_reward_function.path`` / ``.name``).

    Raises:
        ValueError: no such file, or no such function in it.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"path: {path!r} is not a file{relative_to_cwd(path)}: it names the Python file of the "
                         "function, verl's custom_reward_function.path")
    spec = importlib.util.spec_from_file_location(f"tether_verl_reward_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        functions = [key for key, value in vars(module).items() if callable(value) and not key.startswith("_")]
        close = difflib.get_close_matches(name, functions, n=1, cutoff=0.6)
        raise ValueError(f"name: {path} has no function {name!r}" + (f"; did you mean {close[0]!r}?" if close else ""))
    return fn


def check_verl_call(fn: Callable[..., Any], path: str, name: str, reward_kwargs: dict[str, Any]) -> None:
    """``fn`` takes the call verl makes, by keyword, with ``reward_kwargs``; a function that cannot would raise on
    every row of the run (each a contained fault).

    Raises:
        ValueError: naming the function's signature, the call and what binding it says.
    """
    call = {"data_source": None, "solution_str": "", "ground_truth": None, "extra_info": None, **reward_kwargs}
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    try:
        signature.bind(**call)
    except TypeError as err:
        shown = ", ".join(f"{key}=..." for key in call)
        raise ValueError(f"name: {path}: {name}{signature} cannot take verl's call compute_score({shown}): "
                         f"{err}") from None


class VerlScore:
    """A verl ``compute_score`` function, called per row.

    Args:
        path: the Python file holding it.
        name: its name (verl's default: ``compute_score``).
        reward_kwargs: extra keyword arguments of every call (verl's ``custom_reward_function.reward_kwargs``).
    """

    def __init__(self, path: str, name: str = "compute_score", reward_kwargs: dict[str, Any] | None = None) -> None:
        self.compute_score = load_compute_score(path, name)
        self.reward_kwargs = dict(reward_kwargs or {})
        self.last_errors: list[str | None] = []

    @staticmethod
    def check(path: str, name: str = "compute_score", reward_kwargs: dict[str, Any] | None = None) -> None:
        """The file exists and defines the function (loading it runs the file's top level, as verl does), which
        takes verl's call with ``reward_kwargs``."""
        check_verl_call(load_compute_score(path, name), path, name, dict(reward_kwargs or {}))

    def _one(self, completion: Any, row: dict[str, Any]) -> tuple[float, str | None]:
        try:
            out = self.compute_score(data_source=row.get("data_source"), solution_str=solution_str(completion),
                                     ground_truth=row.get("answer"), extra_info=row.get("extra_info"),
                                     **self.reward_kwargs)
        except Exception as error:  # one row's failure is that row's fault
            return math.nan, f"compute_score raised {type(error).__name__}: {error}"
        score = as_real(out.get("score") if isinstance(out, dict) else out)  # verl takes a 0-d tensor too
        if score is not None:
            return score, None
        return math.nan, f"compute_score returned {out!r}, not a number or a dict with 'score'"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        rows = [{k: v[i] for k, v in columns.items()} for i in range(len(completions))]
        results = [self._one(c, row) for c, row in zip(completions, rows, strict=True)]
        self.last_errors = [error for _, error in results]
        return [score for score, _ in results]
