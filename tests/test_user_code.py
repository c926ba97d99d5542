"""``imports:`` and ``module:Name``: user code imported before any check, resolved wherever a registry name is
accepted, and one-line errors (key, value, expectation) for what does not import or resolve."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.trainer.helpers import tiny_config
from tether.checks import check_config, load_checked_config
from tether.cli import app
from tether.config import ConfigError, load_config
from tether.user_code import import_user_modules, resolve_target

PLUGINS = "tests.user_plugins"

TASK_FILE = '''
from tether.tasks import Score, TaskItem, register_task


@register_task("{name}")
class Shout:
    def __init__(self):
        self.name, self.system_prompt = "{name}", None
        self.train = [TaskItem(f"p{{i}}", None, id=f"t/{{i}}") for i in range(4)]
        self.val = [TaskItem("v", None, id="v/0")]

    def score(self, item, text):
        return Score(float(text.isupper()), text.isupper(), text)
'''


def write_config(directory, name: str, **extra) -> tuple:
    """A config in ``directory`` importing ``plugin_<name>.py`` beside it, which registers task ``name``."""
    (directory / f"plugin_{name}.py").write_text(TASK_FILE.format(name=name))
    config = directory / "run.yaml"
    config.write_text(yaml.safe_dump({"imports": [f"plugin_{name}.py"], "task": {"name": name},
                                      "logging": {"tensorboard": False}, **extra}))
    return config


def test_a_py_file_relative_to_the_config_registers_before_the_checks(tmp_path, monkeypatch):
    (tmp_path / "cfg").mkdir()
    config = write_config(tmp_path / "cfg", "shout_a")
    monkeypatch.chdir(tmp_path)  # not the config's directory
    cfg = load_checked_config(config)
    assert cfg.imports == [str(tmp_path / "cfg" / "plugin_shout_a.py")]  # absolute: the run dir's copy works too
    again = load_checked_config(data=cfg.model_dump(mode="json"))  # e.g. `tether eval` reading run_dir/config.yaml
    assert again.task.name == "shout_a"


def test_the_cli_imports_the_config_modules(tmp_path):
    config = write_config(tmp_path, "shout_b", model={"name": "tiny-64x2"})
    out = CliRunner().invoke(app, ["validate", str(config)])
    assert out.exit_code == 0 and "task shout_b" in out.output, out.output


@pytest.mark.parametrize("imports, message", [
    (["no_such_module_q"], r"^imports\[0\]: 'no_such_module_q': module 'no_such_module_q' does not import "
                           r"\(ModuleNotFoundError"),
    (["missing.py"], r"^imports\[0\]: '.*missing\.py' is not a file"),
    (["json.py"], r"already .*json"),  # a file that would shadow a module already imported
])
def test_bad_imports_are_one_line_exit_2(tmp_path, imports, message):
    (tmp_path / "json.py").write_text("")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"imports": imports, "task": {"name": "parity"}}))
    with pytest.raises(ConfigError, match=message):
        check_config(load_config(config), machine=False)
    out = CliRunner().invoke(app, ["validate", str(config)])
    assert out.exit_code == 2 and len(out.output.strip().splitlines()) == 1, out.output


def test_a_misspelt_imports_file_names_the_nearest_files_of_its_folder(tmp_path):
    """imports: [my_reward.py] beside my_rewards.py said only that it is not a file."""
    for name in ("my_rewards.py", "my_rewards.txt", "tasks.py"):  # a .py file is what an entry names
        (tmp_path / name).write_text("")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"imports": ["my_reward.py"], "task": {"name": "parity"}}))
    with pytest.raises(ConfigError) as err:
        check_config(load_config(config), machine=False)
    assert str(err.value).startswith(f"imports[0]: '{tmp_path / 'my_reward.py'}' is not a file (a relative path ")
    assert str(err.value).endswith("when set on the command line); did you mean my_rewards.py?")


def test_a_missing_file_says_which_base_a_relative_path_was_read_from(tmp_path, monkeypatch):
    """An override ``imports=[x.py]`` is read from the working directory; its error said "relative to the config
    file". The message now shows the path read and both rules, naming the working directory."""
    (tmp_path / "cfg").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    config = tmp_path / "cfg" / "run.yaml"
    config.write_text(yaml.safe_dump({"imports": ["missing.py"], "task": {"name": "parity"}}))
    rule = (r"a relative path is read from the folder of the config file that sets it, or from the working "
            rf"directory {tmp_path / 'work'} when set on the command line")
    with pytest.raises(ConfigError, match=rf"^imports\[0\]: '{tmp_path / 'cfg' / 'missing.py'}' is not a file "
                                          rf"\({rule}\)$"):
        check_config(load_config(config), machine=False)
    with pytest.raises(ConfigError, match=rf"^imports\[0\]: '{tmp_path / 'work' / 'x.py'}' is not a file \({rule}\)$"):
        check_config(load_config(config, ["imports=[x.py]"]), machine=False)
    with pytest.raises(ConfigError, match=rf"^model\.chat_template: '{tmp_path / 'work' / 't.jinja'}' is not a file "
                                          rf"\(a Jinja chat template; {rule}\)$"):
        check_config(load_config(config, ["imports=[]", "model.chat_template=t.jinja"]))


def test_an_import_error_names_the_users_file_and_line(tmp_path):
    (tmp_path / "broken_plugin_c.py").write_text("x = 1\nraise RuntimeError('half-written')\n")
    with pytest.raises(ConfigError, match=r"RuntimeError: half-written at .*broken_plugin_c\.py:2\)"):
        import_user_modules([str(tmp_path / "broken_plugin_c.py")])


@pytest.mark.parametrize("value, message", [
    (f"{PLUGINS}:EvenLenght", "did you mean 'EvenLength'"),
    (f"{PLUGINS}:NOT_CALLABLE", "is a int, not a function or class"),
    ("tests.no_such:X", "module 'tests.no_such' does not import"),
    ("nocolon", "not of the form 'module:Name'"),
])
def test_resolve_target_errors(value, message):
    with pytest.raises(ConfigError, match=message) as err:
        resolve_target("task.name", value)
    assert str(err.value).startswith(f"task.name: {value!r}")


def test_a_module_that_is_not_found_says_where_it_could_come_from(tmp_path, monkeypatch):
    """A reward module named without ``imports:`` (or one letter off the file imported) said only "No module
    named ..."; a module whose own import misses a package gets no hint about where the module is."""
    (tmp_path / "byo_rewards_q.py").write_text("def fmt(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    (tmp_path / "byo_needs_dep_q.py").write_text("import no_such_dependency_q\n")
    with pytest.raises(ConfigError, match=r"No module named 'byo_rewards_q'\); list its file under imports: \(a \.py "
                                          r"path relative to the config file\) or put its folder on PYTHONPATH$"):
        resolve_target("task.rewards[0].fn", "byo_rewards_q:fmt")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the import below puts tmp_path first
    import_user_modules([str(tmp_path / "byo_rewards_q.py")])
    try:
        with pytest.raises(ConfigError, match=r"No module named 'byo_reward_q'\); did you mean 'byo_rewards_q'\?$"):
            resolve_target("task.rewards[0].fn", "byo_reward_q:fmt")
        with pytest.raises(ConfigError, match=r"'no_such_dependency_q' at .*byo_needs_dep_q\.py:1\)$"):
            resolve_target("task.rewards[0].fn", "byo_needs_dep_q:fmt")  # on sys.path now, beside byo_rewards_q.py
    finally:
        sys.modules.pop("byo_rewards_q", None)


@pytest.mark.parametrize("overrides, message", [
    ([f"task.name={PLUGINS}:EvenLenght"], r"^task\.name: .*did you mean 'EvenLength'"),
    ([f"algorithm.advantage={PLUGINS}:centerd"], r"^algorithm\.advantage: .*did you mean 'centred'"),
    ([f"algorithm.policy_loss={PLUGINS}:EvenLength"],
     r"^algorithm\.policy_loss: policy loss 'tests\.user_plugins:EvenLength': it must take"),
    (["env.name=tests.no_such_env:Maze", "task=null"], r"^env\.name: 'tests.no_such_env:Maze': module"),
])
def test_module_names_are_checked_where_registry_names_are(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, *overrides)


def test_a_run_with_a_task_an_advantage_and_a_loss_of_its_own(tmp_path):
    from tether.models import tiny_model
    from tether.trainer import Trainer

    plugins = sys.modules.get(PLUGINS) or __import__(PLUGINS, fromlist=["calls"])
    before = dict(plugins.calls)
    cfg = tiny_config(tmp_path, f"task.name={PLUGINS}:EvenLength", "task.kwargs={size: 4}",
                      f"algorithm.advantage={PLUGINS}:centred", "algorithm.advantage_kwargs={shift: 0.0}",
                      f"algorithm.policy_loss={PLUGINS}:counted_ppo")
    model, tok = tiny_model(seed=0)
    Trainer(cfg, policy=model, tokenizer=tok).fit()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "actor/pg_loss" in r] == [1, 2]
    assert plugins.calls["advantage"] > before["advantage"] and plugins.calls["loss"] > before["loss"]


@pytest.fixture
def methods_registry():
    """The method registry as it was: a resolved ``module:Name`` registers the class, which later tests (the
    config reference lists every registered method) must not see."""
    from tether.methods.base import METHODS

    with METHODS.restored():
        yield


def test_a_method_of_its_own_by_module_name(tmp_path, methods_registry):
    from tether.models import tiny_model
    from tether.trainer import Trainer

    cfg = tiny_config(tmp_path, f'methods={{"{PLUGINS}:StepCounter": {{}}}}')
    model, tok = tiny_model(seed=0)
    Trainer(cfg, policy=model, tokenizer=tok).fit()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step_counter/updates"] for r in rows if "step_counter/updates" in r] == [1.0, 2.0]


def test_two_methods_that_intervene_in_sampling_are_refused_before_any_model_loads(tmp_path, methods_registry):
    # the MethodSet's rule stopped the run only at its first generation, after the models loaded
    with pytest.raises(ConfigError, match=r"^methods tests\.user_plugins:Steering and tests\.user_plugins:"
                                          r"OtherSteering each intervene in sampling"):
        tiny_config(tmp_path, f'methods={{"{PLUGINS}:Steering": {{}}, "{PLUGINS}:OtherSteering": {{}}}}')
    tiny_config(tmp_path, f'methods={{"{PLUGINS}:Steering": {{}}}}')  # one is the rule


@pytest.mark.parametrize(("key", "message"), [
    (f"{PLUGINS}:EvenLength", r"^methods\.tests\.user_plugins:EvenLength: .* not a subclass of "
                              r"tether\.methods\.base\.Method"),
    (f"{PLUGINS}:StepCountr", r"has no 'StepCountr'; did you mean 'StepCounter'\?$"),
])
def test_a_method_name_that_is_not_a_method_class_is_one_line(tmp_path, key, message, methods_registry):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, f'methods={{"{key}": {{}}}}')


def test_an_env_class_by_module_name(tmp_path):
    cfg = tiny_config(tmp_path, "task=null", "env.name=tether.envs.scripted:ScriptedEnv", "env.kwargs={turns: 2}")
    check_config(cfg, machine=False)
    from tether.envs import make_env

    assert make_env("tether.envs.scripted:ScriptedEnv", turns=2).reset(0).task.startswith("Say the secret word")


@pytest.mark.parametrize("tuple_reset, message", [
    (True, r"^env\.name=tests\.user_plugins:GymnasiumStyle: reset\(0\) returned tuple, not an EnvReset; reset returns "
           r"tether\.envs\.EnvReset\(observation, task"),
    (False, r"^env\.name=tests\.user_plugins:GymnasiumStyle: step\('0'\) returned tuple, not an EnvStep;"),
])
def test_an_env_of_ones_own_with_gymnasium_returns_is_refused_before_any_model_loads(tmp_path, tuple_reset, message):
    """Its tuples passed tether validate: the run loaded the model, then every episode faulted (step) or the
    rollout loop died with a traceback (reset)."""
    cfg = tiny_config(tmp_path, "task=null", f"env.name={PLUGINS}:GymnasiumStyle", "model.name=tiny-64x2",
                      f"env.kwargs={{tuple_reset: {tuple_reset}}}")
    with pytest.raises(ConfigError, match=message):
        check_config(cfg)  # what tether validate and every command run before a model loads


def test_an_env_of_ones_own_without_what_the_run_reads_is_refused_before_any_model_loads(tmp_path):
    """It passed tether validate; tether train loaded the policy, then stopped with "env ... (constructor): building
    the first environment raised AttributeError: ... no attribute 'action_format'" (the first missing one only)."""
    cfg = tiny_config(tmp_path, "task=null", f"env.name={PLUGINS}:HalfAnEnv", "model.name=tiny-64x2")
    with pytest.raises(ConfigError) as info:
        check_config(cfg)
    assert str(info.value) == (
        f"env.name={PLUGINS}:HalfAnEnv: the env has no action_format, parse_action, train_seeds, eval_seeds, which "
        "the run uses (the TextEnv protocol, docs/environments.md; tether.envs.base has parse_tagged_action, and "
        "train_seeds and eval_seeds to set as staticmethods)")


@pytest.mark.slow
def test_a_fresh_process_imports_them_too(tmp_path):
    """What `tether experiment` does for each run: a new ``python -m tether.cli`` process, another directory."""
    import os
    import subprocess

    (tmp_path / "cfg").mkdir()
    config = write_config(tmp_path / "cfg", "shout_d", model={"name": "tiny-64x2"})
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "tether.cli", "validate", str(config), "task.name=plugin_shout_d:Shout"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "task plugin_shout_d:Shout" in done.stdout


def test_the_capitals_example_of_docs_tasks_md_runs_from_its_yaml(tmp_path):
    """docs/tasks.md "Adding a task": its Python block as a file, its YAML block beside it, validated as written."""
    import re

    page = (Path(__file__).resolve().parents[1] / "docs" / "tasks.md").read_text()
    section = page.split("## Adding a task", 1)[1]
    code, config = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0], \
        re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)[0]
    (tmp_path / "capitals.py").write_text(code)
    data = yaml.safe_load(config)
    (tmp_path / "capitals.yaml").write_text(yaml.safe_dump({**data, "logging": {"tensorboard": False}}))
    from tether.tasks import make_task
    from tether.tasks.registry import unregister_task

    try:
        cfg = load_checked_config(tmp_path / "capitals.yaml")
        task = make_task(cfg.task.name, **cfg.task.kwargs)
        assert len(task.val) == 1 and task.score(task.val[0], f"<answer>{task.val[0].answer}</answer>").correct
        load_checked_config(tmp_path / "capitals.yaml", ["task.name=capitals:CapitalsTask"])
    finally:  # the page's module and the name it registers go, so a later test may import the page's file again
        unregister_task("capitals")
        sys.modules.pop("capitals", None)
