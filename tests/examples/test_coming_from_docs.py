"""docs/coming-from-trl-and-verl.md names tether keys that exist: every dotted key in its tables' tether column is a
field of the config schema (a typo there sends a TRL or verl user to a key that fails validation)."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel

from tether.config import Config

PAGE = Path(__file__).resolve().parents[2] / "docs" / "coming-from-trl-and-verl.md"
SECTIONS = ("model", "task", "env", "rollout", "algorithm", "optim", "val", "train", "logging", "distributed")
KEY = re.compile(r"`((?:" + "|".join(SECTIONS) + r")\.[a-z_][\w.]*)")


def section_model(annotation: typing.Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``X | None``, ``list[X]`` included), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = section_model(arg)
        if found is not None:
            return found
    return None


def key_exists(key: str) -> bool:
    model: type[BaseModel] | None = Config
    for part in key.split("."):
        if model is None:
            return True  # inside a free-form dict (kwargs, loss_kwargs): the component checks it
        if part not in model.model_fields:
            return False
        model = section_model(model.model_fields[part].annotation)
    return True


def tether_column_keys() -> list[str]:
    keys = []
    for line in PAGE.read_text().splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 3 and not set(cells[1].strip()) <= set("-"):
            keys += KEY.findall(cells[2])
    return keys


def test_the_mapping_names_only_keys_tether_has():
    keys = tether_column_keys()
    assert len(keys) > 40  # the tables were read
    assert [key for key in keys if not key_exists(key)] == []


def test_the_key_walker_refuses_a_typo():
    assert key_exists("optim.lr") and key_exists("task.rewards") and key_exists("algorithm.kl.estimator")
    assert not key_exists("optim.learning_rate") and not key_exists("rollout.n")
