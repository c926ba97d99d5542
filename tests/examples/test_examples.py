"""Every folder of examples/: ``tether validate``, then two RL steps of ``tether train`` on a tiny random model (and
``tether sft`` where a folder has a warm start, ``sft.yaml``).

The commands run in-process through the CLI (what a user types, with overrides that make the run tiny), from the
repository root, as the examples' READMEs say. Reward models and judges are built here: a tiny random
sequence-classification model, a stub OpenAI-compatible server on 127.0.0.1.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.rewards.helpers import start_stub_judge, tiny_reward_model
from tether.checks import load_checked_config
from tether.cli import app
from tether.config import config_command

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TINY_RUN = ["rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=6", "val.every=0",
            "train.steps=2", "train.save_every_s=0", "logging.tensorboard=false", "logging.progress=false",
            "optim.micro_batch_size=8"]


@pytest.fixture(scope="module")
def tiny_policy_dir(tmp_path_factory, tokenizer):
    from tether.models import tiny_model

    directory = tmp_path_factory.mktemp("policy")
    model, tok = tiny_model(seed=0, tokenizer=tokenizer)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def run_example(folder: str, tmp_path: Path, policy: Path, *overrides: str) -> list[dict]:
    """``tether validate``, then ``tether train`` for two steps; the metrics rows of the run."""
    config = str(EXAMPLES / folder / "config.yaml")
    assert config_command(config) == "train"
    settings = [f"model.name={policy}", f"run_dir={tmp_path / 'run'}", *TINY_RUN, *overrides]
    runner = CliRunner()
    validated = runner.invoke(app, ["validate", config, *settings])
    assert validated.exit_code == 0, validated.output
    assert validated.output.startswith("ok: ")
    trained = runner.invoke(app, ["train", config, *settings])
    assert trained.exit_code == 0, trained.output
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "actor/pg_loss" in row]
    assert [row["step"] for row in steps] == [1, 2]
    return steps


@pytest.fixture(autouse=True)
def _from_the_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_every_example_is_a_readme_a_yaml_and_at_most_one_python_file():
    folders = sorted(p for p in EXAMPLES.iterdir() if p.is_dir())
    assert len(folders) >= 4  # examples/README.md is the index
    index = (EXAMPLES / "README.md").read_text()
    for folder in folders:
        files = [p.name for p in folder.iterdir() if p.is_file() and p.suffix != ".pyc"]
        assert "README.md" in files and "config.yaml" in files, folder
        assert sum(name.endswith(".py") for name in files) <= 1, folder
        # config.yaml, and sft.yaml where RL needs a warm start first
        assert {name for name in files if name.endswith((".yaml", ".yml"))} <= {"config.yaml", "sft.yaml"}, folder
        assert f"[{folder.name}]({folder.name}/)" in index, folder


def example_configs() -> list[Path]:
    return sorted(EXAMPLES.glob("*/*.yaml"))


def import_example(folder: str, module: str):
    """The example's Python file, imported as the config's ``imports:`` would."""
    from tether.user_code import import_user_modules

    import_user_modules([str(EXAMPLES / folder / f"{module}.py")])
    return sys.modules[module]


@pytest.mark.parametrize("config", example_configs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_example_config_passes_the_config_checks_as_shipped(config):
    # the command its first line names (`# tether sft ...`), as `tether validate` reads it
    command = config_command(config)
    assert command == {"config.yaml": "train", "sft.yaml": "sft"}[config.name]
    load_checked_config(config, command=command)
    assert config.read_text().startswith(f"# tether {command} examples/{config.parent.name}/{config.name}")


@pytest.mark.parametrize(("folder", "missing", "command"), [
    ("conversational_dataset", "task.kwargs.path", "python examples/conversational_dataset/chat_format.py"),
    ("my_environment", "model.name", "tether sft examples/my_environment/sft.yaml"),
])
def test_validate_on_a_fresh_clone_names_the_command_that_writes_the_input(folder, missing, command, tmp_path):
    """Inputs an earlier command writes (the data, the warm start) are named with that command by the config's
    ``# written by:`` line, instead of "does not exist"."""
    config = str(EXAMPLES / folder / "config.yaml")
    validated = CliRunner().invoke(app, ["validate", config, f"{missing}={tmp_path / 'not_yet'}"])
    assert validated.exit_code != 0
    assert f"{missing}={tmp_path / 'not_yet'}: not here yet" in validated.output
    assert f"written by `{command}`" in validated.output
    assert (ROOT / command.split()[-1]).is_file()


def readme_programs() -> list[tuple[str, str]]:
    """(README:line, program) of each command a shell block of an example's README runs."""
    from tests.docs.test_docs_commands import shell_lines

    return [(f"{page.relative_to(ROOT)}:{number}", command.split()[0])
            for page in sorted(EXAMPLES.glob("*/README.md")) for number, command in shell_lines(page)
            if command and not command.startswith("#")]


def test_every_program_an_example_readme_runs_is_installed():
    """examples/reward_model said `huggingface-cli download`: huggingface_hub 1.0 dropped that command for `hf`,
    so the step failed with "command not found" in tether's environment."""
    venv_bin = str(Path(sys.executable).parent)
    programs = readme_programs()
    assert {program for _, program in programs} >= {"tether", "python"}  # the parse found the commands
    missing = [f"{where}: {program}" for where, program in programs
               if shutil.which(program, path=venv_bin) is None and shutil.which(program) is None]
    assert missing == []


def test_trl_reward_function(tmp_path, tiny_policy_dir):
    rewards = import_example("trl_reward_function", "apple_rewards")
    completions = ["5 + 7 = 12", "12, or 13", "12.", "Tom has 12 apples.", "twelve"]
    assert rewards.correctness_reward(["p"] * 5, completions, answer=["12"] * 5) == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert rewards.format_reward(["p"] * 5, completions) == [0.0, 0.0, 1.0, 0.0, 0.0]
    steps = run_example("trl_reward_function", tmp_path, tiny_policy_dir)
    assert all(row["reward/faults"] == 0 for row in steps)
    # `tether eval` reads the run's config.yaml, whose imports: name the file by its absolute path
    checkpoint = next(p for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.startswith("step"))
    evaluated = CliRunner().invoke(app, ["eval", str(checkpoint), "val.max_prompts=2", "val.samples=1"])
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(evaluated.stdout)["val/reward_mean"] >= 0.0


def test_my_environment_warm_start_then_rl(tmp_path, tiny_policy_dir):
    """README's order: ``tether sft sft.yaml`` (the solver's binary search), then RL from its checkpoint."""
    config = str(EXAMPLES / "my_environment" / "sft.yaml")
    settings = [f"model.name={tiny_policy_dir}", f"run_dir={tmp_path / 'sft'}", "sft.examples=4", "sft.max_steps=2",
                "sft.batch_size=4", "sft.micro_batch_size=4", "logging.tensorboard=false", "logging.progress=false"]
    runner = CliRunner()
    validated = runner.invoke(app, ["validate", config, *settings])
    assert validated.exit_code == 0, validated.output
    assert validated.output.startswith("ok: ") and "tether sft" in validated.output
    trained = runner.invoke(app, ["sft", config, *settings])
    assert trained.exit_code == 0, trained.output
    summary = json.loads((tmp_path / "sft" / "sft_summary.json").read_text())
    assert summary["data"] == "solver" and summary["steps"] == 2
    pairs = [json.loads(line) for line in (tmp_path / "sft" / "data" / "train.jsonl").read_text().splitlines()]
    first = [pair["response"] for pair in pairs if "(step 1)" in pair["prompt"]]
    assert first and set(first) == {"<action>10</action>"}  # the first guess: the middle of 1..20
    run_example("my_environment", tmp_path, tmp_path / "sft" / "checkpoint", "env.max_turns=2", "env.train_tasks=4",
                "env.val_tasks=2")


def test_the_rl_and_sft_configs_of_my_environment_share_the_env():
    import yaml

    folder = EXAMPLES / "my_environment"
    rl, sft = (yaml.safe_load((folder / name).read_text()) for name in ("config.yaml", "sft.yaml"))
    assert rl["env"] == sft["env"] and rl["imports"] == sft["imports"]
    assert rl["model"]["name"] == f"{sft['run_dir']}/checkpoint"


def test_conversational_dataset(tmp_path, tiny_policy_dir):
    import_example("conversational_dataset", "chat_format").make_dataset(tmp_path / "chats", rows=40)
    run_example("conversational_dataset", tmp_path, tiny_policy_dir, f"task.kwargs.path={tmp_path / 'chats'}",
                "task.kwargs.val_size=4", "task.kwargs.report_size=4")


def test_verl_compute_score(tmp_path, tiny_policy_dir):
    from tether.rewards.verl_score import load_compute_score

    compute_score = load_compute_score(str(EXAMPLES / "verl_compute_score" / "score.py"), "compute_score")
    assert compute_score("digit_sums", "3 + 4 = 7", "7") == 1.0
    assert compute_score("digit_sums", "7 or 8", "7", format_score=0.1) == 0.1
    assert compute_score("digit_sums", "seven", "7", extra_info={}, format_score=0.1) == 0.0
    steps = run_example("verl_compute_score", tmp_path, tiny_policy_dir)
    assert all(row["reward/faults"] == 0 for row in steps)


def test_reward_model(tmp_path, tiny_policy_dir, tokenizer):
    model = tiny_reward_model(tmp_path / "rm", tokenizer)
    steps = run_example("reward_model", tmp_path, tiny_policy_dir,
                        f"task.rewards=[{{fn: 'tether.rewards:RewardModel', kwargs: {{model: '{model}'}}}}]")
    assert all(row["reward/faults"] == 0 and row["train/reward_mean"] != 0 for row in steps)


def test_llm_judge(tmp_path, tiny_policy_dir):
    server, url = start_stub_judge()
    try:
        steps = run_example("llm_judge", tmp_path, tiny_policy_dir,
                            f"task.rewards=[{{fn: 'tether.rewards:Judge', kwargs: {{model: stub, base_url: '{url}', "
                            "retry_delay_s: 0}}]")
    finally:
        server.shutdown()
    assert all(row["reward/faults"] == 0 for row in steps)


def test_the_example_environment_follows_the_protocol():
    from tether.envs import EnvReset, EnvStep, EpisodeOverError, TextEnv

    GuessNumber = import_example("my_environment", "guess_number").GuessNumber
    env = GuessNumber(high=20, guesses=5)
    assert isinstance(env, TextEnv) and "<action>" in env.action_format
    assert not set(env.train_seeds(50)) & set(env.eval_seeds(50))
    first = env.reset(3)
    assert isinstance(first, EnvReset) and first.task
    secret = env._secret
    assert env.reset(3).observation == first.observation and env._secret == secret  # seeded
    plan = env.solution()  # a binary search: the middle of what the feedback allows, first
    assert plan[0] == "10" and plan[-1] == str(secret) and len(plan) <= env.guesses
    invalid = env.step("banana")
    assert isinstance(invalid, EnvStep) and invalid.info["invalid_action"] and not invalid.done
    if secret > 1:
        low = env.step("1")
        assert "too low" in low.observation and low.reward == 0.0 and not low.info["won"]
        assert env.solution()[0] == "11"  # 2..20
    win = env.step(str(secret))
    assert win.done and win.won and win.reward == 1.0
    assert env.solution() is None
    with pytest.raises(EpisodeOverError):
        env.step("1")
    assert env.parse_action("I say <action>12</action>") == ("12", True)
    assert env.parse_action("<action>twelve</action>")[1] is False


def test_the_example_solver_wins_every_episode_within_its_guesses():
    GuessNumber = import_example("my_environment", "guess_number").GuessNumber
    env = GuessNumber(high=20, guesses=5)
    for seed in env.train_seeds(200):
        env.reset(seed)
        plan = env.solution()
        for _ in range(env.guesses):
            assert env.solution() == plan  # the plan from each state is the rest of the first one
            step = env.step(plan.pop(0))
            if step.done:
                break
        assert step.won and plan == [], seed
