"""Question/answer pairs from local JSONL or parquet files, scored with math-verify."""

from __future__ import annotations

import contextlib
import heapq
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tether.files import DATA_FORMATS, numbered_jsonl, relative_to_cwd
from tether.splits import seeded_order, shuffled
from tether.tasks.base import RewardMap, Score, TaskItem, fault_score
from tether.tasks.extract import (
    DEFAULT_PROMPT_TEMPLATE,
    check_extract_mode,
    check_template,
    extract_answer,
    format_prompt,
)
from tether.tasks.registry import register_task

# Gold answers parsed per file before a run, and the time that may take: an even sample finds a file whose answers
# are mostly unparsable (the wrong field, prose answers) without parsing 100k rows.
GOLD_SAMPLE = 100
GOLD_BUDGET_S = 2.0


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read a local ``.jsonl``/``.json``/``.parquet``/``.csv`` file with ``datasets`` (no network, no cache dir)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task data file not found: {path}{relative_to_cwd(path)}")
    fmt = DATA_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"unsupported data file {path.name}; expected one of {', '.join(DATA_FORMATS)}")
    import datasets

    # A throwaway cache: the default one would keep a copy of every file ever loaded.
    try:
        with quiet_datasets(), tempfile.TemporaryDirectory(prefix="tether-data-") as cache:
            table = datasets.load_dataset(fmt, data_files=str(path), split="train", cache_dir=cache,
                                          keep_in_memory=True)
    except datasets.exceptions.DatasetGenerationError as err:
        if path.suffix.lower() == ".jsonl":
            numbered_jsonl(path, "data file")  # names the first line that is not a JSON object
        raise ValueError(unreadable(str(path), err)) from None
    return table.to_list()


def unreadable(source: str, err: Exception) -> str:
    """One line for a data file ``datasets`` could not parse: its ``DatasetGenerationError`` says only "an error
    occurred while generating the dataset" above a traceback of hundreds of lines; the parser's error is its cause."""
    cause = err.__cause__ or err.__context__ or err
    return f"{source} could not be read ({type(cause).__name__}: {str(cause).strip().splitlines()[0]})"


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """``datasets``' progress bars and its log lines below errors off inside the block (a local file loads in no
    time, its bars are noise on the command's output; a file it cannot parse is tether's one line, not datasets'
    log line before it), as they were after it."""
    import datasets

    shown, level = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if shown:
            datasets.enable_progress_bars()


def _math_text(answer: str) -> str:
    """Wrap a bare answer in ``\\boxed{}`` so math-verify's LaTeX parser reads ``x^2+1`` and ``\\frac12``."""
    return answer if ("\\boxed" in answer or "$" in answer) else f"\\boxed{{{answer}}}"


def math_equal(gold: str, predicted: str, timeout_s: int | None = 5) -> bool:
    """``verify(parse(gold), parse(predicted))`` with math-verify, raising on its errors and timeouts.

    math-verify times out with ``signal.alarm``, which only works in the main thread; elsewhere the
    call runs without a timeout (math-verify's own advice), so keep scoring on the main thread or in
    worker processes.

    Raises:
        ValueError: the gold answer does not parse (bad data, not a wrong response).
        Exception, math_verify.errors.TimeoutException: any math-verify failure.
    """
    from math_verify import parse, verify

    if threading.current_thread() is not threading.main_thread():
        timeout_s = None
    gold_parsed = parse(_math_text(gold), parsing_timeout=timeout_s, raise_on_error=True)
    if not gold_parsed:
        raise ValueError(f"gold answer {gold!r} cannot be parsed by math-verify")
    predicted_parsed = parse(_math_text(predicted), parsing_timeout=timeout_s, raise_on_error=True)
    return bool(verify(gold_parsed, predicted_parsed, timeout_seconds=timeout_s, raise_on_error=True))


def math_equal_any(golds: Sequence[str], predicted: str, timeout_s: int | None = 5) -> bool:
    """Whether ``predicted`` equals any of the accepted answers ``golds`` (:func:`math_equal` each, in order).

    A gold that math-verify cannot compare is passed over while another one can be (a list may hold a form it does
    not read, e.g. ``["2", "two"]``); when none can, that is the data's fault, not the response's.

    Raises:
        ValueError: ``golds`` is empty.
        Exception, math_verify.errors.TimeoutException: the first gold's failure, when every gold failed.
    """
    if not golds:
        raise ValueError("no gold answer: the list of accepted answers is empty")
    from math_verify.errors import TimeoutException

    errors: list[BaseException] = []
    for gold in golds:
        try:
            if math_equal(gold, predicted, timeout_s):
                return True
        except (Exception, TimeoutException) as error:  # TimeoutException derives from BaseException
            errors.append(error)
    if len(errors) == len(golds):
        raise errors[0]
    return False


def accepted_answers(gold: Any) -> list[str]:
    """The answers a gold answer accepts, as text: each element of a list (or tuple), as verl's ``ground_truth`` and
    TRL's data give several correct forms of one answer; else the gold itself (a string stays whole, even
    ``"[1, 2]"``, an interval)."""
    if isinstance(gold, list | tuple):
        return [str(answer) for answer in gold]
    return [str(gold)]


def is_empty_gold(gold: Any) -> bool:
    """Whether a row's gold answer accepts nothing: missing, an empty string, or an empty list (a 0 is an answer)."""
    return gold is None or (isinstance(gold, str | list | tuple) and len(gold) == 0)


def parses(answer: str, timeout_s: int | None) -> bool:
    """Whether math-verify reads ``answer`` as a gold answer (:func:`math_equal` refuses one it does not)."""
    from math_verify import parse
    from math_verify.errors import TimeoutException

    if threading.current_thread() is not threading.main_thread():
        timeout_s = None
    try:
        return bool(parse(_math_text(answer), parsing_timeout=timeout_s, raise_on_error=True))
    except (Exception, TimeoutException):  # TimeoutException derives from BaseException
        return False


def unparsable_answers(rows: list[tuple[int, dict[str, Any]]], answer_field: str, timeout_s: int | None,
                       sample: int = GOLD_SAMPLE, budget_s: float = GOLD_BUDGET_S) -> tuple[list[tuple[int, str]], int]:
    """The gold answers math-verify cannot parse among an even sample of the non-empty ones (empty ones are
    warned about apart), within ``budget_s`` seconds: a parse takes about 6 ms, and a file may hold 100k rows. A list
    gold is unparsable when none of its answers parses (scoring passes over the ones it cannot read).

    Returns:
        ((line, gold as the row holds it) of each unparsable one, in file order; how many were checked).
    """
    answered = [(line, row[answer_field]) for line, row in rows if not is_empty_gold(row[answer_field])]
    stride = max(1, -(-len(answered) // sample))  # ceil: at most ``sample`` answers, spread over the whole file
    bad, checked, deadline = [], 0, time.monotonic() + budget_s
    for line, gold in answered[::stride]:
        if time.monotonic() > deadline:
            break
        checked += 1
        if not any(parses(answer, timeout_s) for answer in accepted_answers(gold)):
            bad.append((line, gold))
    return bad, checked


def answer_warnings(key: str, source: str | Path, rows: list[tuple[int, dict[str, Any]]], answer_field: str,
                    timeout_s: int | None, at: str = "line", hint: str = "") -> list[str]:
    """One warning line for rows with an empty answer and one for gold answers math-verify cannot parse: both
    rows are never scored correct, whatever the model answers. The jsonl and dataset tasks' one check.

    Args:
        rows: ``(number, row)`` of each row checked; ``at`` names the numbers (a file's ``line``, a dataset's
            ``row``).
        hint: what to do about empty answers, ending that line.
    """
    warnings = []
    empty = [number for number, row in rows if is_empty_gold(row[answer_field])]
    if empty:
        warnings.append(f"{key}: {len(empty)} of {len(rows)} rows checked in {source} have an empty "
                        f"{answer_field!r} (the first: {at} {empty[0]}); they are never scored correct{hint}")
    bad, checked = unparsable_answers(rows, answer_field, timeout_s)
    if bad:
        number, answer = bad[0]
        warnings.append(f"{key}: {len(bad)} of {checked} gold answers sampled from {source} cannot be parsed by "
                        f"math-verify (the first: {at} {number}, {answer_field}={answer!r}); such rows are scored as "
                        "faults (reward/faults), never correct")
    return warnings


def carve(rows: list[Any], sizes: dict[str, int], seed: int) -> dict[str, list[Any]]:
    """Seeded shuffle, then the first ``sizes[a]`` rows are split ``a``, the next ``sizes[b]`` split ``b`` (in the
    order of ``sizes``), and the rest ``train``; the splits share no row.

    Raises:
        ValueError: the held-out splits leave no training row (the message names the sizes and the rows).
    """
    held = sum(sizes.values())
    if any(size < 0 for size in sizes.values()) or not 0 < held < len(rows):
        named = ", ".join(f"{name}_size={size}" for name, size in sizes.items())
        raise ValueError(f"{named} must be at least 1 in all and leave a training row: the data has {len(rows)} "
                         f"rows, so at most {len(rows) - 1} held out")
    order = seeded_order(len(rows), seed)
    out, start = {}, 0
    for name, size in sizes.items():
        out[name] = [rows[i] for i in order[start:start + size]]
        start += size
    out["train"] = [rows[i] for i in order[start:]]
    return out


def check_train_size(train_size: int | None) -> None:
    """``train_size`` keeps the first N shuffled training rows: a Python slice took ``-1`` as "all but the last"."""
    if train_size is not None and train_size < 1:
        raise ValueError(f"train_size={train_size} must be at least 1 (or null: every training row)")


def _split(rows: list[dict[str, Any]], val_size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Seeded shuffle, then the first ``val_size`` rows are val and the rest train."""
    if val_size < 1:
        raise ValueError(f"val_size={val_size} must be between 1 and the number of rows - 1 ({len(rows) - 1})")
    splits = carve(rows, {"val": val_size}, seed)
    return splits["train"], splits["val"]


@register_task("jsonl")
class JsonlTask:
    """Prompt/answer rows from local files, scored with math-verify.

    Give either ``path`` (one file, split with ``seed`` into ``val_size`` val rows and the rest
    train) or ``train_path`` and ``val_path``. Train rows whose prompt also appears in val are
    dropped (``self.num_overlap_dropped`` says how many), so the held-out set never overlaps.

    Args:
        path: one ``.jsonl``/``.json``/``.parquet`` file to split.
        train_path: training file (with ``val_path``).
        val_path: held-out file (with ``train_path``).
        val_size: number of val rows when splitting ``path``.
        train_size: keep at most this many train rows (after shuffling), or all if ``None``.
        seed: seed of the split and of the train-row order.
        prompt_field: name of the question field.
        answer_field: name of the gold-answer field.
        extract: answer extraction rule (``auto``, ``answer_tag``, ``boxed``, ``last_number``).
        prompt_template: user message; ``{question}`` is replaced by the row's prompt.
        system_prompt: system message, or ``None``.
        reward: ``"binary"`` or ``"score"`` (the same here: math-verify gives no partial credit).
        reward_correct: reward of a correct answer.
        reward_wrong: reward of a wrong answer, a missing answer, and a scorer fault.
        timeout_s: math-verify timeout per parse/compare, in seconds (main thread only).
    """

    def __init__(self, *, path: str | None = None, train_path: str | None = None, val_path: str | None = None,
                 val_size: int = 100, train_size: int | None = None, seed: int = 0,
                 prompt_field: str = "prompt", answer_field: str = "answer", extract: str = "auto",
                 prompt_template: str = DEFAULT_PROMPT_TEMPLATE, system_prompt: str | None = None,
                 reward: str = "binary", reward_correct: float = 1.0, reward_wrong: float = 0.0,
                 timeout_s: int = 5) -> None:
        check_extract_mode(extract)
        check_template(prompt_template)
        check_train_size(train_size)
        self.prompt_field, self.answer_field = prompt_field, answer_field
        self.extract = extract
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.reward_map = RewardMap(reward, reward_correct, reward_wrong)
        self.timeout_s = timeout_s
        train_rows, val_rows, source = self._load(path, train_path, val_path, val_size, seed)
        self.name = f"jsonl/{source}"
        # compared as the template gets them (stripped): " 2 + 2?" and "2 + 2?" are one prompt to the model
        held_out = {self._prompt(r).strip() for r in val_rows}
        kept = [r for r in train_rows if self._prompt(r).strip() not in held_out]
        self.num_overlap_dropped = len(train_rows) - len(kept)
        if train_size is not None:
            kept = kept[:train_size]
        if not kept:
            raise ValueError(f"{self.name}: no training rows left after removing prompts that are in val")
        self.train = [self._item(r, source, "train", i) for i, r in enumerate(kept)]
        self.val = [self._item(r, source, "val", i) for i, r in enumerate(val_rows)]

    @staticmethod
    def check_config(*, path: str | None = None, train_path: str | None = None, val_path: str | None = None,
                     extract: str = "auto", prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
                     train_size: int | None = None, **_: Any) -> None:
        """The settings, checked without reading the files: which files, the extraction rule, the template, the
        training rows kept.

        Raises:
            ValueError: the first problem.
        """
        one_file = path is not None and train_path is None and val_path is None
        two_files = path is None and train_path is not None and val_path is not None
        if not (one_file or two_files):
            raise ValueError("the jsonl task needs either path=... (split into train/val) or both train_path=... "
                             "and val_path=...")
        for key, file in (("path", path), ("train_path", train_path), ("val_path", val_path)):
            if file is not None and Path(file).suffix.lower() not in DATA_FORMATS:
                raise ValueError(f"{key}: {file!r} is not one of {', '.join(DATA_FORMATS)}")
        check_extract_mode(extract)
        check_template(prompt_template)
        check_train_size(train_size)

    @staticmethod
    def check_inputs(*, path: str | None = None, train_path: str | None = None, val_path: str | None = None,
                     prompt_field: str = "prompt", answer_field: str = "answer", timeout_s: int = 5,
                     **_: Any) -> list[str]:
        """Before any model loads: each data file exists, and each line of a ``.jsonl`` one is an object with the
        prompt and answer fields (the first bad line is named).

        Returns:
            Warning lines: rows whose answer is empty, and gold answers math-verify cannot parse (an even sample
            of each file's: :func:`unparsable_answers`); such rows can never be scored correct.

        Raises:
            ValueError: the first problem, with the file and line.
        """
        warnings = []
        for key, file in (("path", path), ("train_path", train_path), ("val_path", val_path)):
            if file is None:
                continue
            file = Path(file)
            if not file.is_file():
                raise ValueError(f"{key}: data file {str(file)!r} does not exist{relative_to_cwd(file)}")
            if file.suffix.lower() == ".jsonl":
                rows = numbered_jsonl(file, key, (prompt_field, answer_field))
                warnings += answer_warnings(key, file, rows, answer_field, timeout_s)
        return warnings

    @staticmethod
    def longest_prompts(limit: int, *, path: str | None = None, train_path: str | None = None,
                        val_path: str | None = None, prompt_field: str = "prompt",
                        prompt_template: str = DEFAULT_PROMPT_TEMPLATE, system_prompt: str | None = None,
                        **_: Any) -> list[tuple[str, str, str | None, tuple[()]]]:
        """The ``limit`` longest prompts of the ``.jsonl`` files by characters, as the collector sends them, for the
        context check of :mod:`tether.checks.context` (counting their tokens needs the tokenizer alone).

        Returns:
            ``(where, user message, system message, images)`` each, ``where`` being ``"<file> line <n>"``, the
            images none (a jsonl task's prompts are text).
        """
        found = []
        for file in (path, train_path, val_path):
            if file is None or Path(file).suffix.lower() != ".jsonl":
                continue
            for line, row in numbered_jsonl(Path(file), "task.kwargs", (prompt_field,)):
                found.append((len(str(row[prompt_field])), f"{file} line {line}", str(row[prompt_field])))
        longest = heapq.nlargest(limit, found, key=lambda entry: entry[0])
        return [(where, format_prompt(prompt_template, text), system_prompt, ()) for _, where, text in longest]

    def _load(self, path: str | None, train_path: str | None, val_path: str | None, val_size: int,
              seed: int) -> tuple[list[dict], list[dict], str]:
        if path is not None and train_path is None and val_path is None:
            train_rows, val_rows = _split(self._rows(path), val_size, seed)
            return train_rows, val_rows, Path(path).stem
        if path is None and train_path is not None and val_path is not None:
            train_rows = shuffled(self._rows(train_path), seed)  # so train_size takes a seeded subset
            return train_rows, self._rows(val_path), Path(train_path).stem
        raise ValueError("jsonl task needs either path=... (split into train/val) or both train_path=... "
                         "and val_path=...")

    def _rows(self, path: str) -> list[dict[str, Any]]:
        """The rows of ``path``, each prompt checked where its number is known (the first rows are checked before
        the build; a bad prompt past them was told without its row)."""
        rows = load_rows(path)
        for i, row in enumerate(rows):
            try:
                self._prompt(row)
            except (TypeError, KeyError) as err:
                message = err.args[0] if isinstance(err, KeyError) and err.args else err
                raise type(err)(f"row {i} of {path}: {message}") from None
        return rows

    def _prompt(self, row: dict[str, Any]) -> str:
        if self.prompt_field not in row:
            raise KeyError(f"row has no prompt field {self.prompt_field!r} (fields: {', '.join(row)}); "
                           "set prompt_field=...")
        prompt = row[self.prompt_field]
        if not isinstance(prompt, str):
            # TRL's conversational data: the dataset task reads the same file with its message lists as they are
            hint = ("; a conversation (a list of {role, content} messages) is read by the dataset task: "
                    "task.name=dataset, with the same path (docs/tasks.md)") if isinstance(prompt, list) else ""
            raise TypeError(f"field {self.prompt_field!r} must be a string, got {type(prompt).__name__}{hint}")
        return prompt

    def _item(self, row: dict[str, Any], source: str, split: str, index: int) -> TaskItem:
        if self.answer_field not in row:
            raise KeyError(f"row has no answer field {self.answer_field!r} (fields: {', '.join(row)}); "
                           "set answer_field=...")
        answer = row[self.answer_field]
        return TaskItem(prompt=format_prompt(self.prompt_template, self._prompt(row)),
                        answer=None if answer is None else str(answer),
                        meta={"question": self._prompt(row), "gold": answer},
                        id=f"{source}/{split}/{index}")

    def score(self, item: TaskItem, response_text: str) -> Score:
        """Extract the answer and compare it to the gold one with math-verify; never raises."""
        extracted = extract_answer(response_text, self.extract)
        if extracted is None:
            return Score(self.reward_map(0.0, False), False, None)
        from math_verify.errors import TimeoutException

        try:
            correct = math_equal_any(self.golds(item), extracted, self.timeout_s)
        # math-verify's TimeoutException derives from BaseException, so Exception alone misses it.
        except (Exception, TimeoutException) as error:
            return fault_score(error, extracted, reward=self.reward_map.wrong)
        return Score(self.reward_map(float(correct), correct), correct, extracted)

    def golds(self, item: TaskItem) -> list[str]:
        """The accepted answers of ``item``'s gold, as the data holds it (``meta["gold"]``, else its text):
        :func:`accepted_answers`.

        Raises:
            ValueError: the item has none.
        """
        gold = item.meta.get("gold", item.answer)
        if gold is None:
            raise ValueError(f"item {item.id} has no gold answer")
        return accepted_answers(gold)
