"""``dataset``: a task over any Hugging Face ``datasets`` source, scored like the jsonl task (math-verify), plus
whatever ``task.rewards`` adds.

The source is a Hub id (with ``config`` and ``split``), a directory written by ``Dataset.save_to_disk`` /
``DatasetDict.save_to_disk``, a ``.jsonl``/``.json``/``.parquet``/``.csv`` file, or one of ``datasets``' file builders
with its ``data_files`` (``path: json, data_files: {train: a.jsonl, test: b.jsonl}``: TRL's
``load_dataset("json", data_files=...)``). Each row becomes an item through a
column mapping (``prompt_field``, ``answer_field``) or a ``format_fn: module:function`` that maps a row to
``{"prompt": ..., "answer": ...}`` (and any other columns). A prompt is a string, filled into ``prompt_template``, or
a conversation: a list of ``{"role", "content"}`` messages, used as it is (a content may be a list of text parts,
``[{"type": "text", "text": ...}]``: :mod:`tether.models.chat` says how it is rendered).

A row with images (an ``images`` or ``image`` column, or image parts, ``{"type": "image"}``, in its messages: TRL's
vision-language format, :mod:`tether.tasks.images`) is a prompt with images for a vision-language policy, encoded by
its processor and chat template as a visual env's observation is (docs/vision.md). Every column but the prompt
reaches reward functions as a keyword list (``meta["columns"]``), an image column as the data holds it.

Splits as the built-in tasks: ``report`` (``report_size`` rows, for the final numbers) and ``val`` (``val_size``
rows, the selection split) are carved from a seeded shuffle of ``split``, or taken from another split of the
dataset (``val_split``); training rows whose prompt is in val or report are dropped, so no split overlaps another.
"""

from __future__ import annotations

import glob
import heapq
import inspect
import reprlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.config import did_you_mean
from tether.files import DATA_FORMATS, nearest_path_guess, relative_to_cwd, written_as_local_path
from tether.splits import shuffled
from tether.tasks.base import RewardMap, Score, TaskItem, prompt_text
from tether.tasks.extract import check_extract_mode, check_template, format_prompt
from tether.tasks.images import (
    CONTENT_PARTS,
    column_images,
    image_area,
    image_column,
    image_key,
    part_images,
    resolve_image,
    without_image_data,
)
from tether.tasks.jsonl_task import (
    JsonlTask,
    answer_warnings,
    carve,
    check_train_size,
    load_rows,
    quiet_datasets,
    unreadable,
)
from tether.tasks.registry import register_task
from tether.user_code import resolve_target

ROWS_CHECKED = 100  # rows whose prompt and answer are checked before a run (the whole file is read by the run)
BUILDERS = frozenset(DATA_FORMATS.values())  # datasets' builders of tether's file formats: path: json, data_files: ...
# a null gold is most often a column the rewards do not need (a JSON row without the key reads as null)
NO_GOLD_HINT = ": give them an answer, or set answer_field: null when only task.rewards score"
DataFiles = str | list[str] | dict[str, str | list[str]]  # datasets' data_files: a file, files, or files per split
Source = tuple[str, str, DataFiles | None]  # (path, split, data_files): one split the task reads


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a directory written by ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return path.is_dir() and any((path / name).is_file() for name in ("state.json", "dataset_dict.json"))


def load_split(path: str, config: str | None, split: str, data_files: DataFiles | None = None,
               revision: str | None = None) -> list[dict[str, Any]]:
    """The rows of split ``split`` of ``path``: a ``save_to_disk`` directory, a data file (``split`` ignored: a file
    is one split), or anything ``datasets.load_dataset(path, config, data_files=..., split=..., revision=...)`` reads
    (a Hub id, a directory of data files, a builder such as ``json`` with its ``data_files``).

    Raises:
        ValueError: no such split (the message lists the ones there are).
    """
    import datasets

    local = Path(path).expanduser()
    if data_files is None and local.is_file():
        return load_rows(local)
    if data_files is None and is_saved_dataset(local):
        data = datasets.load_from_disk(str(local))
        if isinstance(data, datasets.DatasetDict):
            if split not in data:
                raise ValueError(f"split={split!r}: {path} has splits {', '.join(data)}")
            data = data[split]
        return data.to_list()
    if path in BUILDERS or local.is_dir():  # local files: no copy kept in ~/.cache/huggingface, no progress bars
        with quiet_datasets(), tempfile.TemporaryDirectory(prefix="tether-data-") as cache:
            return _load_dataset(path, config, split, data_files=data_files, revision=revision, cache_dir=cache)
    return _load_dataset(path, config, split, data_files=data_files, revision=revision)  # the Hub: its usual cache


def _load_dataset(path: str, config: str | None, split: str, **kwargs: Any) -> list[dict[str, Any]]:
    """``datasets.load_dataset(path, config, split=split, **kwargs)`` as rows; an unknown split or config is one
    line naming the source."""
    import datasets

    try:
        return datasets.load_dataset(path, config, split=split, **kwargs).to_list()
    except ValueError as err:  # datasets names the splits or configs there are
        raise ValueError(f"{path} (config={config!r}, split={split!r}): {err}") from None
    except datasets.exceptions.DatasetGenerationError as err:  # a data file its parser refused
        raise ValueError(unreadable(f"{path} (data_files={kwargs.get('data_files')!r})", err)) from None


def data_file_entries(data_files: DataFiles) -> list[tuple[str, str]]:
    """``(key, file or pattern)`` for each entry of ``data_files``, keyed as a config names it
    (``data_files.train``)."""
    if isinstance(data_files, str):
        return [("data_files", data_files)]
    if isinstance(data_files, list):
        return [("data_files", entry) for entry in data_files]
    return [(f"data_files.{split}", entry) for split, files in data_files.items()
            for entry in ([files] if isinstance(files, str) else files)]


def check_data_files(data_files: DataFiles) -> None:
    """Each local file of ``data_files`` is here, and each glob pattern matches a file (a URL is left to the run).

    Raises:
        FileNotFoundError: naming the first one that is not, and the folder it was looked for in.
    """
    for key, entry in data_file_entries(data_files):
        if "://" in entry:
            continue
        pattern = any(char in entry for char in "*?[")  # datasets takes glob patterns: train-*.parquet
        found = glob.glob(str(Path(entry).expanduser())) if pattern else Path(entry).expanduser().exists()
        if not found:
            missing = "matches no file" if pattern else "does not exist"
            raise FileNotFoundError(f"{key}: {entry!r} {missing} here{relative_to_cwd(entry)}")


def check_messages(value: Any, where: str) -> None:
    """``value`` is a conversation: a non-empty list of ``{"role": str, "content": str or parts}``, parts being text
    (``{"type": "text", "text": str}``, rendered by :func:`tether.models.chat.encode_chat`) and images
    (``{"type": "image"}``, with the image itself under ``image`` or ``path`` or in the row's image column).

    Raises:
        ValueError: naming ``where`` and the first bad message.
    """
    if not isinstance(value, list) or not value:
        one = "; a single message? put it in a list, [{role, content}]" if isinstance(value, dict) else ""
        raise ValueError(f"{where} is {type(value).__name__}, not a string nor a non-empty list of "
                         f"{{role, content}} messages{one}")
    for i, message in enumerate(value):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and _is_content(message.get("content"))):
            sharegpt = isinstance(message, dict) and {"from", "value"} <= message.keys()  # a common layout
            hint = "; ShareGPT's {from, value} messages: map them to {role, content} with a format_fn" \
                if sharegpt else ""
            raise ValueError(f"{where}: message {i} {_message_problem(message)}, not "
                             f"{{'role': str, 'content': str or text/image parts}}{hint}")


def _is_content(content: Any) -> bool:
    """A string, or a non-empty list of text and image parts."""
    if isinstance(content, str):
        return True
    return isinstance(content, list) and bool(content) and all(
        isinstance(part, dict) and (part.get("type") == "image" or
                                    (part.get("type") == "text" and isinstance(part.get("text"), str)))
        for part in content)


def _message_problem(message: Any) -> str:
    """What is wrong with a message, in a few words: a message may hold an image's bytes, which the error line must
    not print."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # e.g. an audio part beside TRL's image and text parts
        kinds = ", ".join(str(part.get("type")) if isinstance(part, dict) else type(part).__name__ for part in content)
        return (f"has content parts ({kinds}): a dataset prompt's content is one text, or text and image parts "
                "({'type': 'text', 'text': ...}, {'type': 'image'})")
    return f"is {reprlib.repr(message)}"


def takes_one_argument(fn: Callable) -> bool:
    """Whether ``fn(row)`` binds (a builtin without a signature is given the benefit of the doubt)."""
    try:
        inspect.signature(fn).bind({})
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def take_held_out(rows: list[Any], sizes: dict[str, int], seed: int, split: str) -> dict[str, list[Any]]:
    """The held-out splits from a seeded shuffle of ``rows`` (the dataset's own held-out split or file), in the
    order of ``sizes``; ``split`` names that source in the error.

    Raises:
        ValueError: ``rows`` are fewer than the sizes ask for.
    """
    if sum(sizes.values()) > len(rows):
        named = ", ".join(f"{name}_size={size}" for name, size in sizes.items())
        raise ValueError(f"{named}: the held-out source ({split}) has only {len(rows)} rows")
    order, out, start = shuffled(rows, seed), {}, 0
    for name, size in sizes.items():
        out[name], start = order[start:start + size], start + size
    return out


@dataclass(frozen=True)
class Row:
    """A row as the task reads it: its columns (after ``format_fn``), its images' sources (:mod:`tether.tasks.images`)
    and where they came from (the column, or :data:`~tether.tasks.images.CONTENT_PARTS`; None without images)."""

    values: dict[str, Any]
    images: tuple[Any, ...] = ()
    image_source: str | None = None


def data_folder(path: str, data_files: DataFiles | None, split: str) -> Path:
    """The folder a row's relative image paths are read from: a data file's (a builder's: the first file of
    ``split``, else its first), a local directory itself, else the working directory (a Hub dataset's rows hold
    their images' bytes)."""
    if data_files is not None:
        entries = data_file_entries(data_files)
        first = next((entry for key, entry in entries if key == f"data_files.{split}"), entries[0][1])
        return Path(first).expanduser().absolute().parent
    local = Path(path).expanduser()
    if local.is_file():
        return local.absolute().parent
    return local.absolute() if local.is_dir() else Path.cwd()


def row_images(row: dict[str, Any], prompt_field: str, base: Path) -> tuple[tuple[Any, ...], str | None]:
    """A row's images and their origin (:class:`Row`): those its messages' image parts carry, else those of its
    ``images``/``image`` column; each resolved against ``base`` and checked
    (:func:`~tether.tasks.images.resolve_image`).

    Raises:
        ValueError: images in both places, an unreadable one, or image parts and images that differ in number.
    """
    from tether.models.vision import image_parts

    prompt = row.get(prompt_field)
    messages = prompt if isinstance(prompt, list) else []
    carried, column = part_images(messages), image_column(row)
    if carried and column is not None:
        raise ValueError(f"images both in the messages' image parts and in column {column!r}: keep one")
    origin = CONTENT_PARTS if carried else column
    values = carried or (column_images(row[column]) if column is not None else [])
    images = []
    for k, value in enumerate(values):
        try:
            images.append(resolve_image(value, base))
        except ValueError as err:
            raise ValueError(f"{origin}: image {k}: {err}") from None
    parts = image_parts(messages)
    if parts and parts != len(images):
        raise ValueError(f"{parts} image parts in the messages, {len(images)} images "
                         f"({origin or 'no images, images or image column'})")
    return tuple(images), origin


def load_format_fn(format_fn: str | None) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    return None if format_fn is None else resolve_target("task.kwargs.format_fn", format_fn)


@register_task("dataset")
class DatasetTask(JsonlTask):
    """Rows of a Hugging Face dataset as prompts; math-verify against ``answer_field`` where there is one.

    Args:
        path: a Hub id (``openai/gsm8k``), a ``save_to_disk`` directory, a data file, or a ``datasets`` builder of
            files (``json``, ``csv``, ``parquet``) with ``data_files``.
        config: the dataset's configuration (``main`` for gsm8k), or None.
        name: ``datasets``' name for ``config`` (``load_dataset(path, name=...)``); give one of the two.
        data_files: the files a builder (or a Hub or local dataset) reads: a file or glob pattern, a list of them,
            or a mapping of split names to them (``{train: train.jsonl, test: test.jsonl}``).
        revision: the Hub dataset's branch, tag or commit.
        split: the split the training rows (and, without ``val_split``, the held-out ones) come from.
        val_split: another split to take val and report rows from (e.g. ``test``), or None.
        val_path: another source to take them from (verl's ``data.val_files``), its split ``val_split`` (default
            ``split``).
        val_size: val (selection) rows.
        report_size: report rows (0: no report split).
        train_size: keep at most this many training rows, or all.
        seed: seed of the shuffles.
        prompt_field: the column holding the prompt: a string, or a list of ``{role, content}`` messages.
        answer_field: the column holding the gold answer, or None when the rewards need none.
        format_fn: ``module:function`` mapping a row (a dict) to ``{"prompt": ..., "answer": ..., <column>: ...}``;
            replaces ``prompt_field``/``answer_field``.
        system_prompt: a system message before each prompt (a conversation that starts with its own keeps it).
        prompt_template: a string prompt's user message, ``{question}`` replaced by the prompt (default: as is).
        extract, reward, reward_correct, reward_wrong, timeout_s: as the jsonl task's.
    """

    def __init__(self, *, path: str, config: str | None = None, name: str | None = None,
                 data_files: DataFiles | None = None, revision: str | None = None, split: str = "train",
                 val_split: str | None = None, val_path: str | None = None,
                 val_size: int = 100, report_size: int = 0, train_size: int | None = None, seed: int = 0,
                 prompt_field: str = "prompt", answer_field: str | None = "answer", format_fn: str | None = None,
                 system_prompt: str | None = None, prompt_template: str = "{question}", extract: str = "auto",
                 reward: str = "binary", reward_correct: float = 1.0, reward_wrong: float = 0.0,
                 timeout_s: int = 5) -> None:
        self.check_config(path=path, config=config, name=name, data_files=data_files, revision=revision,
                          val_path=val_path, prompt_template=prompt_template, extract=extract, val_size=val_size,
                          report_size=report_size, format_fn=format_fn, train_size=train_size)
        config = config or name
        self.prompt_field = "prompt" if format_fn else prompt_field
        self.answer_field = "answer" if format_fn else answer_field
        self.extract, self.prompt_template, self.timeout_s = extract, prompt_template, timeout_s
        self._format = load_format_fn(format_fn)
        self._system = system_prompt
        self.reward_map = RewardMap(reward, reward_correct, reward_wrong)
        rows = self._read(load_split(path, config, split, data_files, revision), path,
                          data_folder(path, data_files, split))
        sizes = {"report": report_size, "val": val_size} if report_size else {"val": val_size}
        if val_split is None and val_path is None:
            parts = carve(rows, sizes, seed)
        else:
            held_split = val_split or split
            held_source = (val_path, None, None) if val_path else (path, data_files, revision)
            held = self._read(load_split(held_source[0], config, held_split, *held_source[1:]), held_source[0],
                              data_folder(held_source[0], held_source[1], held_split))
            parts = take_held_out(held, sizes, seed, f"{val_path or path} split {held_split}")
            parts["train"] = shuffled(rows, seed)
        source = source_name(path, data_files)
        self.name = f"dataset/{source}"
        taken = {self._key(row) for name in sizes for row in parts[name]}
        kept = [row for row in parts["train"] if self._key(row) not in taken]
        self.num_overlap_dropped = len(parts["train"]) - len(kept)
        kept = kept[:train_size] if train_size is not None else kept
        if not kept:
            raise ValueError(f"{self.name}: no training rows left after removing prompts that are held out")
        self.splits = {name: [self._row_item(row, source, name, i) for i, row in enumerate(parts[name])]
                       for name in sizes}
        self.splits["train"] = [self._row_item(row, source, "train", i) for i, row in enumerate(kept)]
        conversational = {isinstance(item.prompt, list) for items in self.splits.values() for item in items}
        if len(conversational) > 1:  # the system prompt goes into a conversation, but beside a text prompt
            raise ValueError(f"{self.name}: the prompts mix texts and conversations (lists of messages); make them "
                             f"one kind, e.g. with a format_fn that returns {{'prompt': [{{'role': 'user', "
                             f"'content': ...}}], ...}} for every row")
        self.system_prompt = None if True in conversational else system_prompt  # a conversation carries its own
        # where the images come from, for the check that the policy reads them (None: a text task)
        self.image_column = next((row.image_source for rows in parts.values() for row in rows if row.images), None)

    @staticmethod
    def longest_prompts(limit: int, *, path: str, config: str | None = None, name: str | None = None,
                        data_files: DataFiles | None = None, split: str = "train", val_split: str | None = None,
                        val_path: str | None = None, prompt_field: str = "prompt", format_fn: str | None = None,
                        system_prompt: str | None = None, prompt_template: str = "{question}",
                        **_: Any) -> list[tuple[str, Any, str | None, tuple[Any, ...]]]:
        """The longest prompts of the local sources, as the collector sends them, for the context check of
        :mod:`tether.checks.context`: the ``limit`` longest by characters and, of rows with images, the ``limit``
        with the most pixels (read from the images' headers), since an image's tokens grow with its size, not with
        the text. A Hub id is left to the run, as :meth:`check_inputs` leaves it.

        Returns:
            ``(where, prompt, system message, images)`` each: ``where`` names the row, its source and its image
            column; ``prompt`` a text or a conversation (image parts bare), as an item holds it.

        Raises:
            ValueError: a row :meth:`check_inputs` or the task would refuse.
        """
        fn = load_format_fn(format_fn)
        key = "prompt" if fn else prompt_field
        found = []
        for setting, (source, split_name, files) in _sources(path, split, data_files, val_path, val_split):
            if not _is_local(source, setting, files):
                continue
            base = data_folder(source, files, split_name)
            for i, row in enumerate(load_split(source, config or name, split_name, files)):
                values = _apply(fn, format_fn, row, i) if fn else row
                if not isinstance(values.get(key), (str, list)):
                    continue  # check_inputs names the row
                if isinstance(values[key], list):  # past the rows check_inputs reads, a bad one is still one line
                    check_messages(values[key], f"column {key!r} of row {i} of {source}")
                images, origin = row_images(values, key, base)
                prompt = task_prompt(bare_prompt(values[key], images), prompt_template, system_prompt)
                where = f"row {i} of {source}" + (f", column {origin!r}" if images else "")
                system = system_prompt if isinstance(prompt, str) else None
                found.append((len(prompt_text(prompt)), sum(map(image_area, images)), where, prompt, system, images))
        longest = heapq.nlargest(limit, found, key=lambda entry: entry[0])
        largest = heapq.nlargest(limit, (entry for entry in found if entry[1]), key=lambda entry: entry[1])
        return list({entry[2]: entry[2:] for entry in longest + largest}.values())  # a row in both rankings once

    @property
    def train(self) -> list[TaskItem]:
        return self.splits["train"]

    @property
    def val(self) -> list[TaskItem]:
        return self.splits["val"]

    @staticmethod
    def check_config(*, path: str | None = None, config: str | None = None, name: str | None = None,
                     data_files: DataFiles | None = None, revision: str | None = None, val_path: str | None = None,
                     prompt_template: str = "{question}", extract: str = "auto", val_size: int = 100,
                     report_size: int = 0, format_fn: str | None = None, train_size: int | None = None,
                     **_: Any) -> None:
        """The settings, without reading the data: the source, the template, the extraction rule, the sizes,
        ``format_fn``.

        Raises:
            ValueError: the first problem.
        """
        check_template(prompt_template)
        check_extract_mode(extract)
        if val_size < 1 or report_size < 0:
            raise ValueError(f"val_size={val_size}, report_size={report_size}: val needs a row, report none or more")
        check_train_size(train_size)
        fn = load_format_fn(format_fn)
        if fn is not None and not takes_one_argument(fn):
            raise ValueError(f"format_fn: {format_fn!r} must take one argument, the row (a dict)")
        if config is not None and name is not None:
            raise ValueError(f"config={config!r}, name={name!r}: name is datasets' word for config; give one")
        if path is not None:
            check_source(path, data_files, revision)
        if val_path in BUILDERS:
            raise ValueError(f"val_path: {val_path!r} is a datasets builder, whose data_files belong to path: give "
                             f"path: {val_path}, data_files: {{train: ..., test: ...}}, val_split: test")

    @staticmethod
    def check_inputs(*, path: str, config: str | None = None, name: str | None = None,
                     data_files: DataFiles | None = None, split: str = "train", val_split: str | None = None,
                     val_path: str | None = None, prompt_field: str = "prompt", answer_field: str | None = "answer",
                     format_fn: str | None = None, timeout_s: int = 5, **_: Any) -> list[str]:
        """Before any model loads: a local source (a builder's ``data_files`` too) is read, and its first rows have
        the prompt (a string or a list of messages) and answer columns (after ``format_fn``). A Hub id is left to
        the run (reading it here would download it).

        Returns:
            Warning lines: the jsonl task's (:func:`~tether.tasks.jsonl_task.answer_warnings`), on those first rows:
            empty gold answers, and ones math-verify cannot parse; such rows are never scored correct.

        Raises:
            ValueError: the first problem, naming the column, the row and what was expected.
        """
        fn = load_format_fn(format_fn)
        prompt_key, answer_key = ("prompt", "answer") if fn else (prompt_field, answer_field)
        kinds: dict[bool, str] = {}  # text prompt or not -> the first row of that kind
        warnings = []
        for key, (source, split_name, files) in _sources(path, split, data_files, val_path, val_split):
            if not _is_local(source, key, files):
                continue
            rows = load_split(source, config or name, split_name, files)
            if not rows:
                raise ValueError(f"{source} split {split_name!r} holds no rows")
            checked = []
            for i, row in enumerate(rows[:ROWS_CHECKED]):
                formatted = _apply(fn, format_fn, row, i) if fn else row
                checked.append((i, formatted))
                for setting, column in (("prompt_field", prompt_key), ("answer_field", answer_key)):
                    if column is not None and column not in formatted:
                        what = f"format_fn {format_fn!r} returned no {column!r}" if fn else \
                            f"{setting}: no column {column!r}"
                        raise ValueError(f"{what} in row {i} of {source} ({did_you_mean(column, map(str, formatted))}"
                                         f"columns: {', '.join(formatted)})")
                prompt = formatted[prompt_key]
                if not isinstance(prompt, str):
                    check_messages(prompt, f"column {prompt_key!r} of row {i} of {source}")
                kinds.setdefault(isinstance(prompt, str), f"row {i} of {source}")
            if answer_key is not None:
                warnings += answer_warnings(key, source, checked, answer_key, timeout_s, at="row", hint=NO_GOLD_HINT)
        if len(kinds) > 1:
            raise ValueError(f"column {prompt_key!r} mixes texts ({kinds[True]}) and conversations ({kinds[False]}): "
                             "make the prompts one kind")
        return warnings

    def _read(self, rows: list[dict[str, Any]], source: str, base: Path) -> list[Row]:
        """``rows`` of ``source`` formatted, with their images (relative paths read from ``base``)."""
        read = []
        for i, row in enumerate(rows):
            values = _apply(self._format, None, row, i) if self._format else row
            try:
                self._prompt_value(values)  # here, where the row's number is known: row 130 of 5,000 can be found
                images, origin = row_images(values, self.prompt_field, base)
            except (ValueError, KeyError) as err:
                message = err.args[0] if isinstance(err, KeyError) and err.args else err
                raise type(err)(f"row {i} of {source}: {message}") from None
            read.append(Row(values, images, origin))
        return read

    def _key(self, row: Row) -> str:
        """A prompt as one string, for the overlap check: a text stripped, as the template gets it, a conversation
        as its JSON; with a digest of its images."""
        prompt = self._prompt_value(row.values)
        text = prompt_text(prompt.strip() if isinstance(prompt, str) else prompt)
        return f"{text}\n{image_key(row.images)}" if row.images else text

    def _prompt_value(self, row: dict[str, Any]) -> str | list[dict[str, str]]:
        if self.prompt_field not in row:
            raise KeyError(f"row has no prompt column {self.prompt_field!r} (columns: {', '.join(row)}); "
                           "set prompt_field=...")
        prompt = row[self.prompt_field]
        if not isinstance(prompt, str):
            check_messages(prompt, f"column {self.prompt_field!r}")
        return prompt

    def _row_item(self, read: Row, source: str, split: str, index: int) -> TaskItem:
        row = read.values
        prompt = bare_prompt(self._prompt_value(row), read.images)
        text = task_prompt(prompt, self.prompt_template, self._system)
        if self.answer_field is not None and self.answer_field not in row:
            raise KeyError(f"row has no answer column {self.answer_field!r} (columns: {', '.join(row)}); set "
                           "answer_field=... (or answer_field: null when the rewards need no gold answer)")
        answer = row.get(self.answer_field) if self.answer_field is not None else None
        columns = {k: v for k, v in row.items() if k != self.prompt_field}
        # the verifier reads the gold as text; reward functions get it as the data holds it (verl's ground_truth
        # may be a list of accepted answers or a number)
        return TaskItem(prompt=text, answer=None if answer is None else str(answer),
                        meta={"question": prompt, "columns": columns, "gold": answer}, id=f"{source}/{split}/{index}",
                        images=read.images)

    def score(self, item: TaskItem, response_text: str) -> Score:
        """math-verify against the gold answer; without one (``answer_field: null``), the wrong-answer reward and the
        response as the "answer" (the reward then comes from ``task.rewards``)."""
        if item.answer is None and self.answer_field is None:
            return Score(self.reward_map.wrong, False, response_text)
        return super().score(item, response_text)


def bare_prompt(prompt: str | list[dict[str, Any]], images: tuple[Any, ...]) -> str | list[dict[str, Any]]:
    """A row's prompt with its image parts bare (:func:`~tether.tasks.images.without_image_data`) when it has
    images: they travel beside it."""
    return without_image_data(prompt) if images and not isinstance(prompt, str) else prompt


def task_prompt(prompt: str | list[dict[str, Any]], template: str, system: str | None) -> str | list[dict[str, Any]]:
    """An item's prompt: a text filled into ``template``; a conversation as it is, ``system`` first unless it opens
    with a system message of its own."""
    if isinstance(prompt, str):
        return format_prompt(template, prompt)
    return prompt if prompt[0]["role"] == "system" or system is None else [{"role": "system", "content": system},
                                                                           *prompt]


def _sources(path: str, split: str, data_files: DataFiles | None, val_path: str | None,
             val_split: str | None) -> list[tuple[str, Source]]:
    """What the checks read, as ``(the setting a message names, (source, split, data_files))``: ``path``'s split, and
    the held-out one (``val_path``'s, or ``val_split`` of ``path``) unless it is the same data, read once under the
    first setting: the same split, or any split of a data file (a file is one split, :func:`load_split`)."""
    sources = [("path", (path, split, data_files))]
    if val_path is not None:
        sources.append(("val_path", (val_path, val_split or split, None)))
    elif val_split is not None:
        sources.append((f"val_split {val_split!r}", (path, val_split, data_files)))
    read: list[tuple[str, str | None, DataFiles | None]] = []  # data_files may be a dict: no set
    unique = []
    for setting, (source, split_name, files) in sources:
        one_split = files is None and Path(source).expanduser().is_file()
        data = (source, None if one_split else split_name, files)
        if data not in read:
            read.append(data)
            unique.append((setting, (source, split_name, files)))
    return unique


def _is_local(source: str, key: str, data_files: DataFiles | None = None) -> bool:
    """Whether ``source`` is here (then it is checked); a Hub id is not (it is read by the run).

    Raises:
        ValueError: ``source`` looks like a local path (a data-file suffix, or
            :func:`~tether.files.written_as_local_path`: ``./``, more than one ``/``, ``runs/x`` where ``runs/`` is
            here) that is not here; with the nearest entries of its folder.
        FileNotFoundError: a builder's data file that is not here.
    """
    if source in BUILDERS:
        check_data_files(data_files)
        return True
    if Path(source).expanduser().exists():
        return True
    if Path(source).suffix.lower() in DATA_FORMATS or written_as_local_path(source):
        raise ValueError(f"{key}: {source!r} does not exist here{relative_to_cwd(source)}, and is not a Hub id "
                         f"(org/name){nearest_path_guess(source)}")
    return False


def check_source(path: str, data_files: DataFiles | None, revision: str | None) -> None:
    """``path`` with ``data_files`` and ``revision`` names one source, without reading it: a builder has its files
    and no revision; a data file is the whole source.

    Raises:
        ValueError: the first problem.
    """
    if path in BUILDERS and data_files is None:
        raise ValueError(f"path: {path!r} is datasets' {path} builder: give data_files, the file(s) it reads "
                         f"(load_dataset({path!r}, data_files=...)), or give the file itself as path")
    file_suffix = Path(path).suffix.lower() in DATA_FORMATS
    if revision is not None and (path in BUILDERS or file_suffix):
        raise ValueError(f"revision: {revision!r}: only a Hub dataset has revisions, not the local data of {path!r}")
    if data_files is not None and file_suffix:
        raise ValueError(f"data_files with path: {path!r}, a data file: give the file as path alone, or path: "
                         f"{DATA_FORMATS[Path(path).suffix.lower()]} with data_files")


def source_name(path: str, data_files: DataFiles | None) -> str:
    """The source's name in the task's name and item ids: a local source's file stem (a builder's first data file),
    a Hub id with ``_`` for ``/``."""
    if path in BUILDERS and data_files is not None:
        return Path(data_file_entries(data_files)[0][1]).stem
    return Path(path).stem if Path(path).expanduser().exists() else path.replace("/", "_")


def _columns_hint(error: Exception, row: dict[str, Any]) -> str:
    """For a ``KeyError`` of a format function (``row["questoin"]``, the commonest slip), the nearest column and the
    columns the row has: the bare ``KeyError: 'questoin'`` leaves the user to open the data to see them."""
    if not isinstance(error, KeyError) or not error.args or not isinstance(error.args[0], str):
        return ""
    columns = sorted(map(str, row))
    return f"; {did_you_mean(error.args[0], columns)}the row's top-level columns: {', '.join(columns)}"


def _apply(fn: Callable, name: str | None, row: dict[str, Any], index: int) -> dict[str, Any]:
    """``fn(row)``, checked to be a mapping; a failure names the row."""
    try:
        out = fn(dict(row))
    except Exception as error:  # the user's function: its failure is the data's problem to report
        raise ValueError(f"format_fn{f' {name!r}' if name else ''} failed on row {index} "
                         f"({type(error).__name__}: {error}{_columns_hint(error, row)})") from None
    if not isinstance(out, dict):
        raise ValueError(f"format_fn{f' {name!r}' if name else ''} returned {type(out).__name__} for row {index}, "
                         "not a dict like {'prompt': ..., 'answer': ...}")
    return out
