"""Each command reads its own schema (tether.config.SCHEMAS): `tether train` the RL config, `tether sft` and
`tether seed-sft` theirs; a key of another command's config is one error naming the key and that command."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tether.cli import app
from tether.config import (
    STAGE_ONE_SEED_KEYS,
    Config,
    ConfigError,
    SeedSFTRunConfig,
    SFTRunConfig,
    config_command,
    load_command_config,
    load_config,
)

ROOT = Path(__file__).resolve().parents[1]
TASK = {"task": {"name": "parity"}, "model": {"name": "char-64x1"}}
ENV = {"env": {"name": "frozenlake", "kwargs": {"size": 4}}, "model": {"name": "char-64x1"}}


def error_of(command: str, data: dict, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_command_config(command, data=data, overrides=overrides)
    return str(info.value)


def test_train_names_the_sft_section_as_tether_sfts():
    msg = error_of("train", {**TASK, "sft": {"data": "task"}})
    assert msg == ("invalid configuration:\n  sft: a setting of `tether sft`, which `tether train` does not read (its "
                   "config: docs/config.md; drop the key, or run `tether sft` with this config)")


def test_sft_names_the_rl_settings_as_tether_trains():
    msg = error_of("sft", {**TASK, "sft": {}, "algorithm": {"advantage": "grpo"}, "optim": {"lr": 1e-3}},
                   ["rollout.group_size=4", "train.steps=3"])
    lines = msg.splitlines()[1:]
    assert sorted(lines) == sorted(
        f"  {key}: a setting of `tether train`, which `tether sft` does not read (its config: docs/config.md; drop "
        "the key, or run `tether train` with this config)"
        for key in ("algorithm", "optim", "rollout.group_size", "train.steps"))


def test_a_key_no_command_has_is_still_an_unknown_key_with_its_guess():
    msg = error_of("sft", {**TASK, "sft": {"learning_rate": 1e-3}})
    assert "sft.learning_rate: unknown key; did you mean lr?" in msg
    assert "rollout.temprature: unknown key; did you mean temperature?" in error_of(
        "seed-sft", {**ENV, "rollout": {"temprature": 1.0}})


def test_sft_needs_its_section_and_seed_sft_an_env_and_seed_settings_only():
    assert "  sft: Field required" in error_of("sft", TASK)
    assert "  sft: Field required" in error_of("seed-sft", ENV)
    # a whole-config validator's line is its own message (it read "  <root>: Value error, tether seed-sft ...")
    assert "\n  tether seed-sft rolls out an agent: set env (not task)" in error_of("seed-sft", {**TASK, "sft": {}})
    assert "tether seed-sft reads methods.seed only, got armor, seed" in error_of(
        "seed-sft", {**ENV, "sft": {}, "methods": {"seed": {}, "armor": {}}})


def test_seed_sft_reads_the_analyzer_prompt_options_of_methods_seed_and_refuses_stage_twos():
    """Stage 2's settings in a stage-1 config would be silently ignored (methods.seed.analyzer is not the labeller,
    sft.analyzer is); the keys stage 1 reads are SEED's settings, so a rename there fails here."""
    from tether.methods.seed import SeedSettings

    assert set(STAGE_ONE_SEED_KEYS) <= set(SeedSettings.model_fields)
    shared = {"analysis_max_new_tokens": 8, "analysis_context_length": 64, "include_summary": False,
              "success_threshold": 0.5}
    assert load_command_config("seed-sft", data={**ENV, "sft": {}, "methods": {"seed": shared}}).methods["seed"] == \
        shared
    msg = error_of("seed-sft", {**ENV, "sft": {}, "methods": {"seed": {"analyzer": "rule", "opd_coef": 0.1,
                                                                      "include_summary": False}}})
    assert ("methods.seed.analyzer, methods.seed.opd_coef: settings of stage 2 (`tether train`), which `tether "
            "seed-sft` does not read: of methods.seed it reads analysis_max_new_tokens, analysis_context_length, "
            "include_summary, success_threshold only; stage 1's own settings are under sft") in msg


MOVED = ("  methods.seed.sft: moved to the top-level sft section of the `tether seed-sft` config "
         "(docs/methods/seed.md); ")


@pytest.mark.parametrize("command, data, overrides, advice", [
    ("train", {**ENV, "methods": {"seed": {"opd_coef": 0.1, "sft": {"tasks": 2}}}}, [],
     "`tether train` does not read it: drop it here"),
    ("train", ENV, ["methods.seed.sft.lr=1e-5"], "`tether train` does not read it: drop it here"),
    # the move, not the top-level section it leaves empty
    ("seed-sft", {**ENV, "methods": {"seed": {"sft": {"tasks": 2}}}}, [], "write its keys there"),
    ("seed-sft", {**ENV, "sft": {"tasks": 2}}, ["methods.seed.sft.lr=1e-5"], "write its keys there"),
])
def test_stage_one_settings_under_methods_seed_are_one_error_naming_their_new_place(command, data, overrides,
                                                                                    advice):
    assert error_of(command, data, overrides) == f"invalid configuration:\n{MOVED}{advice}"


def test_a_moved_key_comes_with_the_configs_other_errors():
    msg = error_of("seed-sft", {**ENV, "rollout": {"temprature": 1.0}, "methods": {"seed": {"sft": {}}}})
    assert msg.splitlines()[1:] == [f"{MOVED}write its keys there", "  rollout.temprature: unknown key; did you mean "
                                    "temperature? rollout allows: max_new_tokens, stop, temperature, top_k, top_p"]


def test_each_command_gets_its_schema_and_the_sft_commands_an_rl_view_of_their_sections():
    sft = load_command_config("sft", data={**TASK, "seed": 7, "sft": {"data": "task", "epochs": 3}},
                              overrides=["rollout.temperature=0.5", "train.threads=2"])
    assert isinstance(sft, SFTRunConfig) and sft.sft.epochs == 3
    rl = sft.rl_config()
    assert isinstance(rl, Config) and (rl.seed, rl.task.name, rl.model.name) == (7, "parity", "char-64x1")
    assert (rl.rollout.temperature, rl.train.threads) == (0.5, 2)
    assert rl.rollout == type(rl.rollout)(temperature=0.5) and rl.algorithm == type(rl.algorithm)()  # RL defaults
    seed = load_command_config("seed-sft", data={**ENV, "sft": {"tasks": 2},
                                                  "methods": {"seed": {"analysis_max_new_tokens": 8}}})
    assert isinstance(seed, SeedSFTRunConfig) and seed.sft.tasks == 2
    assert seed.rl_config().methods == {"seed": {"analysis_max_new_tokens": 8}}  # stage 1's settings stay behind
    assert isinstance(load_config(data=TASK), Config)


@pytest.mark.parametrize("first_line, body, command", [
    ("# tether sft configs/x.yaml", "task: {name: parity}\n", "sft"),
    ("# tether seed-sft configs/x.yaml   (after y)", "env: {name: frozenlake}\n", "seed-sft"),
    ("# tether train configs/x.yaml", "task: {name: parity}\nsft: {data: task}\n", "train"),  # the line decides
    ("# tether eval runs/x --config configs/x.yaml", "task: {name: parity}\n", "train"),
    ("# a warm start", "task: {name: parity}\nsft: {data: task}\n", "sft"),
    ("seed: 1", "task: {name: parity}\n", "train"),
])
def test_the_command_of_a_config_file(tmp_path, first_line, body, command):
    path = tmp_path / "c.yaml"
    path.write_text(f"{first_line}\n{body}")
    assert config_command(path) == command


def test_every_shipped_config_with_an_sft_section_names_its_command_first():
    """`tether sft` and `tether seed-sft` configs both have a top-level `sft`: the first line tells them apart."""
    shipped = [p for p in sorted((ROOT / "configs").rglob("*.yaml")) if "\nsft:" in "\n" + p.read_text()]
    assert shipped and {config_command(p) for p in shipped} == {"sft", "seed-sft"}
    for path in shipped:
        assert path.read_text().startswith(f"# tether {config_command(path)} "), path


def test_validate_uses_the_schema_the_first_line_names(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"# tether sft c.yaml\nrun_dir: {tmp_path / 'run'}\ntask: {{name: addition}}\n"
                      "model: {name: char-64x1}\nlogging: {tensorboard: false}\nsft: {data: task}\n")
    result = CliRunner().invoke(app, ["validate", str(config)])
    assert result.exit_code == 0 and f"ok: {config} (tether sft, task addition)" in result.output, result.output
    result = CliRunner().invoke(app, ["validate", str(config), "optim.lr=1e-3"])
    assert result.exit_code == 2 and "optim: a setting of `tether train`" in result.output, result.output
    assert not (tmp_path / "run").exists()
