"""docs/tasks.md's argument tables are the tasks' constructors: under each "## `name`" heading, the table's first
column names exactly the keyword arguments of that task (`task.kwargs`), and each default the table states as a
plain value (a number, `None`, a backticked word; "all", "none" and `{}` for None, "required" for none at all) is
the constructor's. Defaults given in words ("as above", an expression) are not compared."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import tether.tasks  # noqa: F401  (registers the built-in tasks)
from tether.tasks.registry import task_factory

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tasks.md"
TABLE = re.compile(r"^\| argument \| default \| meaning \|\n\|---\|---\|---\|\n((?:\|[^\n]*\n)+)", re.M)
NONE_WORDS = ("None", "none", "all", "`{}`")  # a None default the task reads as everything, nothing or {}


def argument_tables() -> list[tuple[str, dict[str, str]]]:
    """(task name, {argument: its default cell}) of each task section's table."""
    found = []
    for section in re.split(r"^## ", PAGE.read_text(encoding="utf-8"), flags=re.M)[1:]:
        heading, table = re.match(r"`(\w+)`", section), TABLE.search(section)
        if heading and table:
            rows: dict[str, str] = {}
            for row in table.group(1).splitlines():
                name_cell, default_cell = [c.strip() for c in row.strip().strip("|").split("|")][:2]
                names = re.findall(r"`(\w+)`", name_cell)
                defaults = re.split(r" / |, ", default_cell) if len(names) > 1 else [default_cell]
                rows.update(zip(names, defaults if len(defaults) == len(names) else [""] * len(names), strict=True))
            found.append((heading.group(1), rows))
    return found


TABLES = argument_tables()


def stated(cell: str) -> tuple[bool, object]:
    """(whether the cell states a plain default, that default); ``inspect.Parameter.empty`` for "required"."""
    cell = cell.strip()
    if cell == "required":
        return True, inspect.Parameter.empty
    if cell in NONE_WORDS:
        return True, None
    if re.fullmatch(r"-?\d+(\.\d+)?", cell):
        return True, float(cell)
    word = re.fullmatch(r"`([^`]*)`", cell)
    return (True, word.group(1)) if word and not re.search(r"[ +*]", word.group(1)) else (False, None)


def keyword_defaults(task: str) -> dict[str, object]:
    params = inspect.signature(task_factory(task)).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}


def test_the_page_has_the_built_in_tasks_tables():
    assert [name for name, _ in TABLES] == ["reasoning_gym", "jsonl", "dataset"]
    assert stated("1.0") == (True, 1.0) and stated("`auto`") == (True, "auto") and not stated("as above")[0]


@pytest.mark.parametrize("task, rows", TABLES, ids=[name for name, _ in TABLES])
def test_a_task_table_names_the_constructors_arguments_and_defaults(task, rows):
    defaults = keyword_defaults(task)
    assert sorted(defaults) == sorted(rows), f"docs/tasks.md, `{task}`: the table and the constructor differ"
    for name, cell in rows.items():
        plain, value = stated(cell)
        actual = defaults[name]
        number = isinstance(actual, int | float) and not isinstance(actual, bool)
        if plain:
            assert (float(actual) if number else actual) == value, \
                f"docs/tasks.md, `{task}`: {name} defaults to {actual!r}, the table says {cell}"
