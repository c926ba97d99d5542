"""`tether validate` runs what `tether train` would find only after its model loads (tether/checks/startup.py):
the task built from its data, a local model directory's contents, the device, the launch, the batch arithmetic,
and inputs an earlier command writes named with that command."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.rewards.user_tasks import waves
from tests.trainer.helpers import tiny_config
from tether.checks import check_config, load_checked_config
from tether.checks.context import PROXY_VARIABLES
from tether.cli import app
from tether.config import ConfigError, config_command, load_command_config, load_config
from tether.tasks.base import prompt_text
from tether.trainer import Trainer


def rows_file(tmp_path: Path, n: int, prompt=lambda i: f"{i}+1?") -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": prompt(i), "answer": str(i + 1)}) + "\n" for i in range(n)))
    return path


def jsonl_run(tmp_path: Path, path: Path, **kwargs) -> dict:
    return {"run_dir": str(tmp_path / "run"), "task": {"name": "jsonl", "kwargs": {"path": str(path), **kwargs}}}


def test_fewer_rows_than_val_size_fails_validate_and_train_alike_before_any_model(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(jsonl_run(tmp_path, rows_file(tmp_path, 50))))
    for command in ("validate", "train"):
        out = CliRunner().invoke(app, [command, str(config)])
        assert out.exit_code == 2, out.output
        message = out.output.strip()
        assert "\n" not in message and message.startswith("task.kwargs: val_size=100 ") and "50 rows" in message \
            and "at most 49" in message, message
    assert not (tmp_path / "run").exists()
    assert check_config(load_config(data=jsonl_run(tmp_path, rows_file(tmp_path, 50), val_size=10)),
                        policy=False) == []


def test_a_prompt_field_holding_a_list_fails_before_any_model_and_names_the_task_that_reads_one(tmp_path):
    """TRL's conversational data (a ``prompt`` list of messages) in the jsonl task: the line said "must be a string,
    got list" and stopped there; the dataset task reads such a file as it is."""
    messages = lambda i: [{"role": "user", "content": f"{i}+1?"}]  # noqa: E731
    data = jsonl_run(tmp_path, rows_file(tmp_path, 20, prompt=messages), val_size=5)
    with pytest.raises(ConfigError) as info:
        check_config(load_config(data=data), policy=False)
    assert str(info.value) == (f"task.kwargs: row 0 of {data['task']['kwargs']['path']}: field 'prompt' must be a "
                               "string, got list; a conversation (a list of {role, content} messages) is read by the "
                               "dataset task: task.name=dataset, with the same path (docs/tasks.md)")
    data["task"]["name"] = "dataset"
    assert check_config(load_config(data=data), policy=False) == []


def dataset_rows(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1?", "solution": str(i + 1), "level": i % 3}) + "\n"
                            for i in range(12)))
    return path


@pytest.mark.parametrize("fn, message", [
    # TRL's accuracy_reward(completions, solution, **kwargs) with the column misspelt
    ("solution_typo", "requires 'soluton', which neither the call nor a column of the task's rows gives (columns: "
                      "answer, level, solution); did you mean 'solution'?"),
    ("completion_typo", "requires 'completion', which neither the call nor a column of the task's rows gives (columns: "
                        "answer, level, solution); did you mean 'completions'?"),
])
def test_a_reward_function_requiring_an_argument_no_row_has_fails_validate(tmp_path, fn, message):
    """A reward function whose required argument is no column (a typo of one) passed validate, then raised
    TypeError on every call of the run: every row a fault, rewards all 0, the run going on."""
    data = {"run_dir": str(tmp_path / "run"), "task": {
        "name": "dataset", "kwargs": {"path": str(dataset_rows(tmp_path)), "answer_field": "solution", "val_size": 4},
        "rewards": [{"fn": "tests.rewards.user_rewards:solution_match"},
                    {"fn": f"tests.rewards.user_rewards:{fn}", "kwargs": {"scale": 2.0}}]}}
    with pytest.raises(ConfigError) as info:
        check_config(load_config(data=data), policy=False)
    assert str(info.value) == f"task.rewards[1].fn: {fn!r} {message}"
    data["task"]["rewards"] = data["task"]["rewards"][:1]  # solution_match's `solution` is a column
    assert check_config(load_config(data=data), policy=False) == []


def rewarded_rows(tmp_path: Path, fn: str, **spec) -> dict:
    return {"run_dir": str(tmp_path / "run"), "task": {
        "name": "dataset", "kwargs": {"path": str(dataset_rows(tmp_path)), "answer_field": "solution", "val_size": 4},
        "rewards": [{"fn": "tests.rewards.user_rewards:solution_match"},
                    {"fn": f"tests.rewards.user_rewards:{fn}", **spec}]}}


RETURNS = "a reward function returns one finite number (or None) per completion"


def called(tmp_path: Path) -> str:
    """How the line names the call: the first training row (of the task's seeded shuffle), its gold the completion."""
    from tether.tasks import make_task

    first = make_task("dataset", **rewarded_rows(tmp_path, "scaled")["task"]["kwargs"]).train[0]
    assert first.answer == str(int(prompt_text(first.prompt).split("+")[0]) + 1)  # the gold of that row's prompt
    return f"called on training row {first.id!r} with the completion {first.answer!r}, "


@pytest.mark.parametrize("fn, came_back", [
    ("returns_text", "returned str for 1 completions"),
    ("returns_nothing", "returned NoneType for 1 completions"),
    ("short_list", "returned 0 values for 1 completions"),
])
def test_a_reward_function_that_returns_no_value_per_completion_fails_validate_and_train(tmp_path, fn, came_back):
    """A reward returning a string, None or a list of another length passed validate; the run then warned once and
    faulted every row of every batch (nothing trains). Called once on a real row, it is refused before any model."""
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(rewarded_rows(tmp_path, fn)))
    for command in ("validate", "train"):
        out = CliRunner().invoke(app, [command, str(config)])
        assert out.exit_code == 2, out.output
        assert out.output.strip() == (f"task.rewards[1].fn: 'tests.rewards.user_rewards:{fn}', {called(tmp_path)}"
                                      f"{came_back}; "
                                      f"{RETURNS}, a list as long as completions: every call of the run would fault "
                                      "all its rows")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("fn, spec, came_back", [
    ("broken", {}, "raised RuntimeError: reward server down"),
    ("nan_on_first", {}, "returned nan, not a finite number or None"),
    ("sleeps", {"timeout_s": 0.1}, "the call timed out after 0.1s (its process was killed)"),  # the run's limit
])
def test_a_reward_function_that_faults_on_the_first_row_is_a_warning_of_validate(tmp_path, fn, spec, came_back):
    """A raise, a NaN or a timeout on that row: the run contains them (faulted rows), and the fault may be that row's,
    so it is a warning; it passed validate without a word."""
    warnings = check_config(load_config(data=rewarded_rows(tmp_path, fn, **spec)), policy=False)
    assert warnings == [f"task.rewards[1].fn: 'tests.rewards.user_rewards:{fn}', {called(tmp_path)}{came_back}; "
                        f"{RETURNS}: the run counts each row it faults on in reward/faults"]
    assert check_config(load_config(data=rewarded_rows(tmp_path, "completions_only")), policy=False) == []


T = "tests.rewards.user_tasks"


@pytest.mark.parametrize("task, message", [
    ({"name": f"{T}:Stalling", "kwargs": {"stall_split": "train", "stall": "raise"}},
     "raised RuntimeError: verifier down; the run would stop at its first batch (set task.timeout_s to count such "
     "rows as faults instead)"),
    ({"name": f"{T}:BareReward"}, f"gave {waves('')!r}; a task's score returns one tether.tasks.Score(reward, correct, "
                                  "extracted) per response, reward a number"),
])
def test_a_task_of_ones_own_whose_score_the_run_cannot_take_fails_validate(tmp_path, task, message):
    """A raise in one's own task's score (without task.timeout_s), or a bare number for a Score, passed validate and
    stopped the run at its first batch, after the model loaded (AttributeError: 'float' object has no attribute
    'reward')."""
    with pytest.raises(ConfigError) as info:
        check_config(load_config(data={"run_dir": str(tmp_path / "run"), "task": task}), policy=False)
    scoring = f"task.name={task['name']}: scoring training row 'stalling/train/0' with the response ''"
    assert str(info.value) == f"{scoring} {message}"


@pytest.mark.parametrize("task, message", [
    ("NoSystemPrompt", "the task has no system_prompt, which the run reads (a task has name, train, val, system_prompt "
                       "and score: tether.tasks.Task, docs/tasks.md)"),
    ("NumberPrompts", "val[3] has a prompt that is int, not a string nor a non-empty list of {role, content} "
                      "messages"),
])
def test_a_task_of_ones_own_the_run_cannot_read_fails_validate(tmp_path, task, message):
    """Without system_prompt, or with a number for a prompt, a task passed validate and stopped the run after the
    policy had loaded (AttributeError: ... no attribute 'system_prompt'; TypeError: 'int' object is not iterable)."""
    with pytest.raises(ConfigError) as info:
        check_config(load_config(data={"run_dir": str(tmp_path / "run"), "task": {"name": f"{T}:{task}"}}),
                     policy=False)
    assert str(info.value) == f"task.name={T}:{task}: {message}"


def test_a_task_score_that_faults_under_its_limit_is_a_warning(tmp_path):
    """Under task.timeout_s the run counts a raise as a fault of its rows: validate warns."""
    task = {"name": f"{T}:Stalling", "kwargs": {"stall_split": "train", "stall": "raise"}, "timeout_s": 5}
    warnings = check_config(load_config(data={"run_dir": str(tmp_path / "run"), "task": task}), policy=False)
    assert len(warnings) == 1 and warnings[0].startswith(
        f"task.name={T}:Stalling: scoring training row 'stalling/train/0' with the response '' faulted (") and \
        "RuntimeError: verifier down" in warnings[0] and warnings[0].endswith(
        "; the run counts each row it faults on in reward/faults")
    task["kwargs"] = {}  # the same task, scoring: no line
    assert check_config(load_config(data={"run_dir": str(tmp_path / "run"), "task": task}), policy=False) == []


def hub_dataset_config(tmp_path: Path, monkeypatch, cached: bool) -> dict:
    """A config reading ``openai/gsm8k`` with nothing answering at the Hub's endpoint (a port nothing listens on),
    the Hub cache in ``tmp_path``, holding that data set's README when ``cached``."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    for variable in PROXY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    if cached:  # the cache's layout: refs/main names the snapshot
        repo = tmp_path / "hub" / "datasets--openai--gsm8k"
        (repo / "snapshots" / "abc").mkdir(parents=True)
        (repo / "snapshots" / "abc" / "README.md").write_text("# gsm8k")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("abc")
    return {"run_dir": str(tmp_path / "run"), "task": {"name": "dataset", "kwargs": {
        "path": "openai/gsm8k", "config": "main", "prompt_field": "question", "answer_field": "answer"}}}


NO_HUB = "the Hub cannot be reached (cannot connect to 127.0.0.1:9 (Connection refused))"


def test_a_hub_dataset_with_no_hub_fails_validate_at_once(tmp_path, monkeypatch):
    """With no network, datasets retried the Hub for about 25 s (23 of them sleeps between its 5 retries; measured:
    `tether validate` 36 s, 12 s under HF_HUB_OFFLINE=1) before the one line; one probe of the endpoint says it."""
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        check_config(load_config(data=hub_dataset_config(tmp_path, monkeypatch, cached=False)), policy=False)
    assert str(info.value) == (f"task.kwargs.path='openai/gsm8k': {NO_HUB} and the data set is in no local cache; "
                               "load it once where the Hub answers, or download its files (hf download --repo-type "
                               "dataset openai/gsm8k --local-dir DIR) and give path: DIR")
    assert time.perf_counter() - start < 5.0


def test_a_hub_dataset_in_datasets_own_cache_is_left_to_the_run_and_a_slow_or_proxied_hub_is_not_refused(
        tmp_path, monkeypatch):
    """datasets falls back to its own Arrow cache (HF_DATASETS_CACHE/org___name), which the first check did not
    look in: it refused a data set the run reads. A slow connection, or one through a proxy, is no proof that the Hub
    is down: the check leaves those to the run, as before the probe."""
    import socket

    from tether.checks.context import hub_unreachable

    cfg = load_config(data=hub_dataset_config(tmp_path, monkeypatch, cached=False))
    (tmp_path / "datasets" / "openai___gsm8k").mkdir(parents=True)  # as datasets names it: the name snake-cased
    assert check_config(cfg, policy=False) == [
        f"task.kwargs.path='openai/gsm8k': {NO_HUB}; the run reads the local cache's copy after the Hub's retries "
        "(HF_HUB_OFFLINE=1 skips them), so its rows, columns and splits are checked when the run loads it"]

    def slow(address, timeout):
        raise TimeoutError

    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:10")  # a new endpoint: probed anew
    monkeypatch.setattr(socket, "create_connection", slow)
    assert hub_unreachable() is None
    def refused(address, timeout):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:11")
    monkeypatch.setattr(socket, "create_connection", refused)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert hub_unreachable() is None  # through a proxy: not probed
    monkeypatch.delenv("HTTPS_PROXY")
    assert hub_unreachable() == "cannot connect to 127.0.0.1:11 (Connection refused)"


def test_only_the_dataset_task_probes_the_hub_for_its_path(tmp_path, monkeypatch):
    """A task of one's own may take a `path` that is no Hub id (s3://...): it was refused when the Hub did not
    answer."""
    from tether.checks.startup import _hub_dataset

    data = hub_dataset_config(tmp_path, monkeypatch, cached=False)
    assert _hub_dataset(load_config(data=data)) == "openai/gsm8k"
    own = {"run_dir": data["run_dir"], "task": {"name": f"{T}:WithPath", "kwargs": {"path": "openai/gsm8k"}}}
    assert _hub_dataset(load_config(data=own)) is None
    assert check_config(load_config(data=own), policy=False) == []


def test_a_cached_hub_dataset_with_no_hub_is_left_to_the_run_with_a_warning(tmp_path, monkeypatch):
    """datasets reads its cached copy after the retries: the run works, so validate passes, saying why it is slow."""
    cfg = load_config(data=hub_dataset_config(tmp_path, monkeypatch, cached=True))
    assert check_config(cfg, policy=False) == [
        f"task.kwargs.path='openai/gsm8k': {NO_HUB}; the run reads the local cache's copy after the Hub's retries "
        "(HF_HUB_OFFLINE=1 skips them), so its rows, columns and splits are checked when the run loads it"]
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # switched off: no probe, as before
    assert check_config(cfg, policy=False) == [
        "task.kwargs.path='openai/gsm8k': a Hub dataset cannot be read offline (HF_HUB_OFFLINE), so its rows, columns "
        "and splits are checked when the run loads it"]


def test_a_missing_reward_argument_is_never_matched_to_one_the_function_already_takes(tmp_path):
    """TRL's accuracy_reward(completions, solution) on rows whose gold column is `answer`: the line ended "did you
    mean 'completions'?", a parameter the function already has."""
    data = jsonl_run(tmp_path, rows_file(tmp_path, 12), val_size=4)
    data["task"]["rewards"] = [{"fn": "tests.rewards.user_rewards:solution_match"}]
    with pytest.raises(ConfigError) as info:
        check_config(load_config(data=data), policy=False)
    assert str(info.value) == ("task.rewards[0].fn: 'solution_match' requires 'solution', which neither the call nor "
                               "a column of the task's rows gives (columns: answer)")


@pytest.mark.parametrize("files, message", [
    ({}, "holds no model: no config.json (nor adapter_config.json); it is empty"),
    ({"config.json": "{}"}, "has no weights (*.safetensors or *.bin); config.json"),
    ({"config.json": "{}", "model.safetensors": "x"}, "has no tokenizer (tokenizer.json, tokenizer_config.json or "
                                                      "tokenizer.model); config.json, model.safetensors"),
])
def test_a_local_model_directory_must_hold_a_model(tmp_path, files, message):
    model = tmp_path / "model"
    model.mkdir()
    for name, text in files.items():
        (model / name).write_text(text)
    cfg = tiny_config(tmp_path, f"model.name={model}")
    with pytest.raises(ConfigError) as err:
        Trainer(cfg)
    assert str(err.value) == f"model.name: {model} {message}" and not Path(cfg.run_dir).exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_a_device_this_machine_lacks_fails_validate():
    with pytest.raises(ConfigError, match=r"^train\.device=cuda: "):
        check_config(tiny_config(Path("x"), "train.device=cuda"), policy=False)


def test_launch_and_batch_arithmetic_are_warnings(tmp_path, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    warnings = check_config(tiny_config(tmp_path, "distributed.strategy=fsdp2", "optim.micro_batch_size=12",
                                        "optim.mini_batches=2"), policy=False)
    assert any(w.startswith("distributed.strategy=fsdp2 runs only under torchrun") for w in warnings)
    assert "optim.micro_batch_size=12 exceeds the 4 rows of a mini-batch" in " ".join(warnings)
    # 8 rows in 3 mini-batches: torch.chunk gives 3, 3 and 2 rows (it said 8 // 3 = 2); in 16: one row each (it said 0)
    for mini_batches, rows in ((3, 3), (16, 1)):
        warnings = check_config(tiny_config(tmp_path, "optim.micro_batch_size=12",
                                            f"optim.mini_batches={mini_batches}"), policy=False)
        assert f"optim.micro_batch_size=12 exceeds the {rows} rows of a mini-batch" in " ".join(warnings)


def test_the_default_micro_batch_size_is_not_warned_about(tmp_path):
    cfg = load_checked_config(data={"run_dir": str(tmp_path / "run"), "task": {"name": "parity"},
                                    "rollout": {"prompts_per_step": 2, "group_size": 2}})
    assert cfg.optim.micro_batch_size > 4  # the default, above the 4 rows of a step
    assert not any("micro_batch_size" in w for w in check_config(cfg, policy=False))


def test_a_missing_input_names_the_command_that_writes_it(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("# tether train c.yaml\n# written by: tether sft warm.yaml\n"
                      f"run_dir: {tmp_path / 'run'}\nmodel: {{name: {tmp_path}/warm/checkpoint}}\n"
                      "task: {name: parity}\n")
    cfg = load_config(config)
    assert cfg.written_by == ["tether sft warm.yaml"]
    out = CliRunner().invoke(app, ["validate", str(config)])
    assert out.exit_code == 2 and out.output.strip() == (
        f"model.name={tmp_path}/warm/checkpoint: not here yet; this config's inputs are written by "
        "`tether sft warm.yaml` (run that first)")


def test_every_shipped_config_that_reads_a_run_names_its_writer():
    """A config whose model is another run's output says which command writes it (`# written by:`)."""
    root = Path(__file__).resolve().parents[2] / "configs"
    unnamed = []
    for path in sorted(root.rglob("*.yaml")):
        text = path.read_text()
        if "run_dir:" in text and "written by:" not in text:
            workload = "task:" in text or "env:" in text
            name = load_command_config(config_command(path), path).model.name if workload else ""
            if name.startswith("runs/"):
                unnamed.append(str(path.relative_to(root)))
    assert unnamed == []


@pytest.mark.parametrize("env", ["ezpoints", "sokoban_visual"])
def test_an_env_that_renders_images_needs_a_vision_language_policy(tmp_path, env):
    """env.name=ezpoints (image observations by default) with a text model passed validate, then train's collector
    raised 'observes images, but the policy ... came with a text tokenizer' as a traceback after the model loaded."""
    data = {"run_dir": str(tmp_path / "run"), "task": None, "env": {"name": env}, "model": {"name": "char-64x1"},
            "train": {"best_metric": "val/success_rate"}}
    with pytest.raises(ConfigError) as err:
        check_config(load_config(data=data))
    assert str(err.value) == (f"env.name={env} observes images (env.kwargs), but model.name=char-64x1 is a text "
                              "model (no vision_config): use a vision-language model, or env.kwargs.observation: text")
    data["env"]["kwargs"] = {"observation": "text"}
    check_config(load_config(data=data))
    data["env"]["kwargs"], data["model"]["name"] = {}, "tiny-qwen2.5-vl"
    check_config(load_config(data=data))


class SlowToBuildEnv:
    """An env whose constructor outlives any reset limit."""

    def __init__(self, *, seconds: float = 1.0) -> None:
        import time

        time.sleep(seconds)


def test_an_env_whose_constructor_refuses_its_kwargs_fails_validate_in_one_line(tmp_path):
    """The example env with env.kwargs.high=-5 passed validate (its class has no check_config), then train wrote its
    run directory, loaded the policy and stopped: 'env guess_number:GuessNumber (constructor): ... raised
    ValueError: high=-5 must be at least 2 ...; no episode can start'."""
    example = Path(__file__).resolve().parents[2] / "examples" / "my_environment" / "config.yaml"
    settings = [f"run_dir={tmp_path / 'run'}", "model.name=char-64x1"]
    check_config(load_config(example, settings))
    result = CliRunner().invoke(app, ["validate", str(example), *settings, "env.kwargs.high=-5"])
    assert result.exit_code == 2 and result.output == ("env.kwargs: building env guess_number:GuessNumber raised "
                                                       "ValueError: high=-5 must be at least 2 and guesses=5 at least "
                                                       "1\n"), result.output
    assert not (tmp_path / "run").exists()
    slow = {"run_dir": str(tmp_path / "run"), "task": None, "model": {"name": "char-64x1"},
            "env": {"name": f"{__name__}:SlowToBuildEnv", "timeout_s": 0.2}}
    with pytest.raises(ConfigError, match=r"^env\.kwargs: building env .*:SlowToBuildEnv timed out after 0\.2s$"):
        check_config(load_config(data=slow))


def templateless_model(path: Path) -> Path:
    """A local char model whose tokenizer has no chat template (config and tokenizer; the weights are never read)."""
    from tether.models.char import char_tokenizer

    tokenizer = char_tokenizer()
    tokenizer.chat_template = None
    tokenizer.save_pretrained(path)
    (path / "model.safetensors").write_text("")
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}))
    return path


def workload_section(kind: str, tmp_path: Path) -> dict:
    """The config sections of a workload ``kind``: a task that generates its prompts, a data set, an env."""
    if kind == "jsonl":
        path = tmp_path / "data.jsonl"
        path.write_text("".join(json.dumps({"prompt": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
        return {"task": {"name": "jsonl", "kwargs": {"path": str(path), "val_size": 1}}}
    if kind == "scripted":
        return {"task": None, "env": {"name": "scripted", "isolation": "thread"},
                "train": {"best_metric": "val/success_rate"}}
    return {"task": {"name": kind}}


@pytest.mark.parametrize("kind", ["parity", "addition", "jsonl", "scripted"])
def test_a_tokenizer_without_a_chat_template_is_a_warning_of_validate_for_every_workload(tmp_path, kind):
    """A task that generates its prompts (parity, addition) or an env: validate said nothing, and the run warned at
    its first prompt, after the model had loaded (a data set: a Python warning while validate counted its prompts).
    Now validate gives the run's warning as one of its lines for every workload, from the tokenizer alone."""
    import warnings

    from tether.models.chat import encode_chat

    model = templateless_model(tmp_path / "model")
    data = {"run_dir": str(tmp_path / "run"), "model": {"name": str(model)}, **workload_section(kind, tmp_path)}
    with pytest.warns(UserWarning) as at_encode:  # the run's own warning, the reference
        from transformers import AutoTokenizer

        encode_chat(AutoTokenizer.from_pretrained(model), "1+1?")
    with warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always")
        found = check_config(load_config(data=data))
    assert [line for line in found if "chat template" in line] == [
        f"model.name={model}: {at_encode[0].message}; set model.chat_template to a Jinja template file"]
    assert not [w for w in raised if "chat template" in str(w.message)]  # once, as a finding, not again at encode
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    data["model"]["chat_template"] = str(template)
    assert not [line for line in check_config(load_config(data=data)) if "chat template" in line]


def test_only_the_first_rank_calls_the_reward_functions_and_the_score(tmp_path, monkeypatch):
    """Every rank runs the checks: under torchrun a paid reward function was called once per rank at every start."""
    import tests.rewards.user_rewards as rewards

    calls = []
    monkeypatch.setattr(rewards, "counted", lambda prompts, completions, **kw: calls.append(1) or [1.0],
                        raising=False)
    for rank, expected in (("1", 0), ("0", 1)):
        monkeypatch.setenv("RANK", rank)
        assert check_config(load_config(data=rewarded_rows(tmp_path, "counted")), policy=False) == []
        assert len(calls) == expected


def test_datasets_arrow_cache_is_found_under_its_snake_cased_name(tmp_path, monkeypatch):
    """datasets keeps HuggingFaceH4/MATH-500 as HuggingFaceH4___math-500: the check looked for the id as written."""
    from tether.checks.startup import _dataset_cached

    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    assert not _dataset_cached("HuggingFaceH4/MATH-500")
    (tmp_path / "HuggingFaceH4___math-500").mkdir()
    assert _dataset_cached("HuggingFaceH4/MATH-500")


def test_a_reward_function_that_uses_math_verify_passes_the_check(tmp_path):
    """A check that called the function in a thread (to bound it) made math-verify raise "doesn't support threaded
    environment": a false warning, and for one's own task's score a refused config."""
    assert check_config(load_config(data=rewarded_rows(tmp_path, "math_verified")), policy=False) == []


def test_a_split_the_task_lacks_is_named_as_val_split(tmp_path):
    """`val.split=trian` was blamed on task.kwargs, the settings that were right."""
    data = {"run_dir": str(tmp_path / "run"), "task": {"name": "parity", "kwargs": {"train_size": 12, "val_size": 4}},
            "val": {"split": "trian"}}
    with pytest.raises(ConfigError, match=r"^val.split='trian': task 'parity' has no split 'trian'; it has: train, "
                                          r"val; did you mean train\?$"):
        check_config(load_config(data=data), policy=False)
