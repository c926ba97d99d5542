"""The health: section is checked like every other one: unknown keys and bad values stop before any work."""

from __future__ import annotations

import pytest

from tests.trainer.helpers import tiny_config
from tether.config import ConfigError


def test_defaults_switch_every_check_on(tmp_path):
    h = tiny_config(tmp_path).health
    assert h.parity.enabled and h.round_trip.enabled and h.reward_audit.enabled and h.collapse.action == "warn"
    assert h.degenerate.enabled and h.degenerate.patience == 5


@pytest.mark.parametrize(("override", "where"), [
    ("health.parity.tolerance=0", "health.parity.tolerance"),
    ("health.parity.max_mismatch_frac=1.5", "health.parity.max_mismatch_frac"),
    ("health.collapse.action=restart", "health.collapse.action"),
    ("health.degenerate.patience=0", "health.degenerate.patience"),
    ("health.degenerate.max_entropy_frac=1.5", "health.degenerate.max_entropy_frac"),
    ("health.parity.tolerence=0.2", "health.parity.tolerence"),
    ("health.audit.enabled=false", "health.audit"),
])
def test_bad_health_settings_name_their_key(tmp_path, override, where):
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        tiny_config(tmp_path, override)
