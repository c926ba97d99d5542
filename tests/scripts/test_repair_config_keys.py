"""scripts/lab/repair_config_keys.py: a run's config.yaml written by the old JSON-mode writer loads again."""

from __future__ import annotations

import pytest
import yaml

from tests.scripts import load_script
from tests.trainer.helpers import tiny_config
from tether.checks import load_checked_config
from tether.config import ConfigError


@pytest.fixture(scope="module")
def script():
    return load_script("lab/repair_config_keys.py")


def test_digit_string_keys_under_kwargs_become_ints_and_nothing_else_changes(tmp_path, script):
    cfg = tiny_config(tmp_path, task={"name": "addition", "kwargs": {"inner_carries": {0: 1.0},
                                                                      "overflow": {0: 0.5, 1: 0.5}}})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))  # what the tracker wrote
    with pytest.raises(ConfigError, match="inner_carries"):
        load_checked_config(path)
    assert script.repair(path)
    assert load_checked_config(path) == cfg
    assert not script.repair(path)  # nothing left to change: the file is not rewritten


def test_int_keys_only_where_every_key_is_a_digit_string(script):
    assert script.int_keys({"0": 1.0, "12": [{"-1": 2}]}) == {0: 1.0, 12: [{-1: 2}]}
    assert script.int_keys({"0": 1.0, "a": 2}) == {"0": 1.0, "a": 2}
    assert script.int_keys({}) == {}
