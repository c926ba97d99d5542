"""docs/config.md is the schema's, and the schema documents every field."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tether import cli, config_docs
from tether.config import Config
from tether.config_docs import DOC_PATH, command_sections, method_sections, render_config_docs, sections


def test_checked_in_reference_is_current() -> None:
    assert DOC_PATH.read_text(encoding="utf-8") == render_config_docs(), \
        "docs/config.md is out of date: run `tether config-docs --write`"


@pytest.mark.parametrize("path,model", [*[(p, m) for p, _, m in [*sections(Config, "", None), *method_sections()]],
                                        *[(p, m) for p, _, m, _ in command_sections()]])
def test_every_field_has_a_description(path: str, model: type) -> None:
    undocumented = [name for name, field in model.model_fields.items() if not field.description]
    assert not undocumented, f"{path or 'top level'}: fields without description: {undocumented}"


def test_a_row_gives_key_type_default_allowed_values_and_description() -> None:
    text = render_config_docs()
    assert ("| `algorithm.kl.estimator` | `str` | `k3` | `k1`, `k2`, `k3` | per-token KL estimator (Schulman's k1, "
            "k2, k3; tether.algos.kl) |") in text
    assert "| `rollout.top_p` | `float` | `1.0` | > 0, <= 1 |" in text
    assert "| `env.reset_timeout_s` | `float \\| null` | `null` | > 0 |" in text  # a | would end the cell
    assert "| `task.name` | `str` | *required* |" in text
    assert "| `train.gradient_checkpointing` | `bool \\| str` | `auto` | `true`, `false`, `auto` |" in text
    for heading in ("## `health.collapse`", "## `methods.armor`", "## `sft.openai` of `tether seed-sft`"):
        assert heading in text


def test_check_option_fails_on_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "config.md"
    stale.write_text(render_config_docs().replace("AdamW learning rate", "the learning rate"))
    monkeypatch.setattr(config_docs, "DOC_PATH", stale)
    runner = CliRunner()
    failed = runner.invoke(cli.app, ["config-docs", "--check"])
    assert failed.exit_code == 1 and "out of date" in failed.output
    assert runner.invoke(cli.app, ["config-docs", "--write"]).exit_code == 0  # rewrites it
    assert runner.invoke(cli.app, ["config-docs", "--check"]).exit_code == 0
    assert stale.read_text() == render_config_docs()
