"""The files a run writes and reads: whole files written atomically, JSONL rows appended, the one JSONL reader.

Two ways to write, by what a reader may see:

* a file written once, whole (``config.yaml``, ``summary.json``, SFT's ``data/*.jsonl``): :func:`write_text_atomic`
  and :func:`write_jsonl` write a temporary file beside it, fsync it and ``os.replace`` it, so a reader (or a run
  killed mid-write) finds the old file or the new one, never half of one;
* a log that grows (``metrics.jsonl``, ``code.jsonl``): :func:`append_jsonl` adds rows at the end and flushes;
  a kill can tear only the last line.

Every JSONL row is :func:`jsonl_line`: one ``json.dumps`` object and a newline (non-finite floats as Python's
``NaN``/``Infinity``, which ``json.loads`` reads back). This module imports nothing of tether's, so every layer can
use it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

# The data files a task reads (the jsonl and dataset tasks), by suffix, each with the ``datasets`` builder that reads
# it (``load_dataset(builder, data_files=...)``).
DATA_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def relative_to_cwd(path: str | Path) -> str:
    """What a message about a file that is not there adds after ``path``: `` (relative to the working directory
    /x/y)`` for a relative path, which is read from there and not from the config file's folder (as ``imports:`` and
    ``model.chat_template`` are); nothing for an absolute one."""
    if Path(path).expanduser().is_absolute():
        return ""
    return f" (relative to the working directory {Path.cwd()})"


def written_as_local_path(name: str) -> bool:
    """Whether ``name`` (not here) was written as a path on this machine, not a Hub id (``org/name``): it starts with
    ``./``, ``../``, ``/`` or ``~``, has more than two parts, or its first part is a directory here (``runs/x`` where
    ``runs/`` exists). Read as a Hub id, such a missing path was left to a download that fails only after the
    Hub's retries. The one rule for models and data sets alike."""
    parts = Path(name).parts
    return name.startswith((".", "/", "~")) or len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir())


def sibling_paths(name: str) -> list[str]:
    """The entries of the folder ``name`` would be in, written as ``name`` is written (``runs/x`` -> ``runs/y``, ...):
    what a did-you-mean of a path that is not here picks from; none when that folder is not here either."""
    path = Path(name)
    folder = path.parent.expanduser()
    if not folder.is_dir():
        return []
    return [str(path.parent / entry.name) for entry in folder.iterdir()]


def nearest_path_guess(name: str) -> str:
    """``"; did you mean runs/run-a?"``, the entries of :func:`sibling_paths` closest to ``name`` (a path that is not
    here), else ``""``: the end of a missing path's one line, for models and data sets alike."""
    from tether.config import did_you_mean

    others = [entry for entry in sibling_paths(name) if entry != str(Path(name))]  # a file where a folder was meant
    guess = did_you_mean(name, others).rstrip()
    return f"; {guess}" if guess else ""


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary file and ``os.replace``: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def jsonl_line(row: Mapping[str, Any], default: Callable[[Any], Any] | None = None) -> str:
    """``row`` as one JSONL line, newline included; ``default`` converts what JSON cannot hold (``json.dumps``)."""
    return json.dumps(row, default=default) + "\n"


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]],
                default: Callable[[Any], Any] | None = None) -> Path:
    """Write ``rows`` as the whole of ``path``, one JSON object a line, atomically (:func:`write_text_atomic`)."""
    return write_text_atomic(path, "".join(jsonl_line(row, default) for row in rows))


def append_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]],
                 default: Callable[[Any], Any] | None = None) -> None:
    """Append ``rows`` to ``path`` (created with its folder if missing), one JSON object a line, then flush. A last
    line torn by a kill is ended first, so it stays the one bad line instead of swallowing the first new row."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as f:  # writes go to the end wherever it reads; bytes, so the last byte can be read
        end = f.seek(0, os.SEEK_END)
        if end:
            f.seek(end - 1)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write("".join(jsonl_line(row, default) for row in rows).encode("utf-8"))


def read_jsonl(file: Path, key: str, fields: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The objects of a JSONL file, blank lines skipped; the first bad line is one error.

    Raises:
        ValueError: naming ``key``, the file and line, and what is wrong: not JSON, not an object, a missing field
            of ``fields``; or no rows at all.
    """
    return [row for _, row in numbered_jsonl(file, key, fields)]


def numbered_jsonl(file: Path, key: str, fields: tuple[str, ...] = ()) -> list[tuple[int, dict[str, Any]]]:
    """:func:`read_jsonl`, each row with its line number (counting blank lines), so later checks can name it."""
    rows = []
    with Path(file).open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{key}: {file} line {number} is not JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{key}: {file} line {number} is {type(row).__name__}, not an object")
            missing = [field for field in fields if field not in row]
            if missing:
                raise ValueError(f"{key}: {file} line {number} has no {missing[0]!r} field (fields: "
                                 f"{', '.join(row) or 'none'})")
            rows.append((number, row))
    if not rows:
        raise ValueError(f"{key}: {file} holds no rows")
    return rows
