"""Every config key the prose of README.md and docs/ names in backticks (`train.steps`, `optim.lr=1e-5`) is a key of
a schema (`tether train`'s, a method's settings, `tether sft`'s or `tether seed-sft`'s). Sections whose names the
docs also use for Python objects (`model.generate`, `task.train`, `env.step`) are left out, and so is the first
column of the tables of docs/coming-from-trl-and-verl.md, which holds TRL's and verl's names. A key that has moved
is named where the docs say so; the loader must still recognise it (:data:`RETIRED`)."""

from __future__ import annotations

import re
import typing
import warnings
from pathlib import Path

import pytest
from pydantic import BaseModel

from tether.config import Config, ConfigError, load_config
from tether.config_docs import command_sections, method_sections, sections

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# docs/config.md is generated from the schema (tests/test_config_docs.py)
CHECKED = [page for page in PAGES if page.name != "config.md"]
OBJECT_NAMES = ("model", "task", "env")
FOREIGN_FIRST_COLUMN = ("coming-from-trl-and-verl.md",)
KEY = re.compile(r"`([a-z_]+(?:\.[a-z0-9_]+)+)(?:[=:][^`]*)?`")
# keys of earlier versions the docs name as such: the loader reads each with a FutureWarning or refuses it naming
# its new place, both as "<key>: moved ..." (tether/config/loading.py)
RETIRED = {"methods.seed.sft": "{epochs: 1}", "methods.eapo.advantage_grouping": "non_injected"}
FILE = re.compile(r"\.(?:py|yaml|md|jsonl?|png|sh|txt|pt|parquet)$")


def schema_sections() -> list[tuple[str, type[BaseModel]]]:
    return [(path, model) for path, _, model in [*sections(Config, "", None), *method_sections()]] + \
        [(path, model) for path, _, model, _ in command_sections()]


def is_free_form(annotation: object) -> bool:
    """A ``dict[str, Any]`` field (``task.kwargs``, ``algorithm.loss_kwargs``): any key below it is the component's."""
    return any(typing.get_origin(a) is dict for a in (annotation, *typing.get_args(annotation)))


def schema_keys() -> tuple[set[str], set[str]]:
    """(every section and field path, the paths of free-form dict fields)."""
    known, free = set(), set()
    for path, model in schema_sections():
        known.add(path)
        for name, field in model.model_fields.items():
            key = f"{path}.{name}" if path else name
            known.add(key)
            if is_free_form(field.annotation):
                free.add(key)
    return known, free


KNOWN, FREE = schema_keys()
SECTIONS = {key.split(".")[0] for key in KNOWN if "." in key} - set(OBJECT_NAMES)


def is_key(name: str) -> bool:
    if name in KNOWN or name in RETIRED:
        return True
    parts = name.split(".")
    prefixes = [".".join(parts[:i]) for i in range(1, len(parts))]
    # under a free-form dict, unless a deeper schema section exists (methods.<name> is one, though methods is a dict)
    return any(p in FREE for p in prefixes) and not any(p in KNOWN and p not in FREE for p in prefixes[1:])


def prose_keys(page: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if page.name in FOREIGN_FIRST_COLUMN and line.startswith("|"):
            line = "|".join(line.split("|")[2:])
        found += [(number, key) for key in KEY.findall(line)
                  if key.split(".")[0] in SECTIONS and not FILE.search(key)]
    return found


def test_the_pages_name_keys():
    assert sum(len(prose_keys(page)) for page in CHECKED) > 300
    assert is_key("optim.lr") and is_key("task.kwargs.val_size") and is_key("methods.armor.ref_n")
    assert not is_key("train.max_steps") and not is_key("methods.armor.no_such_setting")


def loader_says(key: str, value: str) -> list[str]:
    """What loading a train config that writes ``key`` says: the error that refuses it, or its FutureWarnings."""
    data = {"task": {"name": "parity"}, "methods": {"eapo": {"prior": "unused"}}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            load_config(data=data, overrides=[f"{key}={value}"])
        except ConfigError as error:
            return [str(error)]
    return [str(w.message) for w in caught if w.category is FutureWarning]


@pytest.mark.parametrize("key, value", RETIRED.items())
def test_a_retired_key_the_docs_name_is_still_recognised(key, value):
    assert any(f"{key}: moved" in message for message in loader_says(key, value))
    assert not any("moved" in message for message in loader_says("train.max_steps", "3"))


@pytest.mark.parametrize("page", CHECKED, ids=[str(p.relative_to(ROOT)) for p in CHECKED])
def test_every_key_the_prose_names_exists(page):
    unknown = [f"{page.relative_to(ROOT)}:{number}: {key}" for number, key in prose_keys(page) if not is_key(key)]
    assert unknown == []
