"""What a config names must be on this machine: checked before any model loads, one line each, exit code 2."""

from __future__ import annotations

import importlib.util
import json
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.trainer.helpers import tiny_config
from tether.checks import check_config
from tether.checks.context import PROXY_VARIABLES
from tether.checks.machine import check_model
from tether.cli import app
from tether.config import ConfigError, load_config
from tether.tasks.jsonl_task import unparsable_answers
from tether.trainer import Trainer


def jsonl_config(tmp_path: Path, lines: list[str] | None, **kwargs) -> object:
    path = tmp_path / "data.jsonl"
    if lines is not None:
        path.write_text("".join(line + "\n" for line in lines))
    return load_config(data={"run_dir": str(tmp_path / "run"),
                             "task": {"name": "jsonl", "kwargs": {"path": str(path), "val_size": 1, **kwargs}}})


def model_dir(path: Path) -> Path:
    """A directory that passes for a local model (config, weights, tokenizer files; their contents unread)."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (path / name).write_text("{}")
    return path


GOOD = json.dumps({"prompt": "1+1?", "answer": "2"})


@pytest.mark.parametrize("lines, message", [
    (None, r"^task\.kwargs: path: data file '.*data\.jsonl' does not exist"),
    ([], r"data\.jsonl holds no rows"),
    ([GOOD, "{not json"], r"data\.jsonl line 2 is not JSON"),
    ([GOOD, "", "[1, 2]"], r"data\.jsonl line 3 is list, not an object"),
    ([GOOD, json.dumps({"prompt": "3+3?"})], r"data\.jsonl line 2 has no 'answer' field \(fields: prompt\)"),
])
def test_jsonl_data_is_checked_to_the_first_bad_line(tmp_path, lines, message):
    with pytest.raises(ConfigError, match=message):
        check_config(jsonl_config(tmp_path, lines), policy=False)


@pytest.mark.parametrize("overrides, message", [
    (["task.kwargs.path=data/x.jsonl"],
     r"^task\.kwargs: path: data file 'data/x\.jsonl' does not exist \(relative to the working directory {cwd}\)$"),
    (["task.name=dataset", "task.kwargs={path: data/x.jsonl}"],
     r"^task\.kwargs: path: 'data/x\.jsonl' does not exist here \(relative to the working directory {cwd}\), and is "
     r"not a Hub id"),
    (["task.rewards=[{fn: 'tether.rewards:VerlScore', kwargs: {path: rewards/score.py}}]"],
     r"^task\.rewards\[0\]\.kwargs: path: 'rewards/score\.py' is not a file \(relative to the working directory "
     r"{cwd}\): it names the Python file of the function, verl's custom_reward_function\.path$"),
])
def test_a_missing_data_or_reward_file_names_the_working_directory(tmp_path, monkeypatch, overrides, message):
    """Data and reward files are read from the working directory, unlike imports and the chat template (from the
    config file's folder): the message says so."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.jsonl").write_text(GOOD + "\n" + GOOD + "\n")
    cfg = load_config(data={"run_dir": str(tmp_path / "run"),
                            "task": {"name": "jsonl", "kwargs": {"path": str(tmp_path / "data.jsonl"), "val_size": 1}}},
                      overrides=overrides)
    with pytest.raises(ConfigError, match=message.format(cwd=re.escape(str(tmp_path)))):
        check_config(cfg, policy=False)


def test_jsonl_fields_can_be_renamed(tmp_path):
    lines = [json.dumps({"q": "1+1?", "a": "2"}), json.dumps({"q": "2+2?", "a": "4"})]
    check_config(jsonl_config(tmp_path, lines, prompt_field="q", answer_field="a"), policy=False)


@pytest.mark.parametrize("name, message", [
    ("./no/such/checkpoint", r"^model\.name: './no/such/checkpoint' is not a directory here \(relative to the "
                             r"working directory .*\), and is not a Hub id \(org/name\)$"),
    ("org/never-downloaded", r"^model\.name: 'org/never-downloaded' is not in the local Hugging Face cache and "
                             r"HF_HUB_OFFLINE is set"),
])
def test_a_model_that_is_not_here_is_one_line(tmp_path, monkeypatch, name, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError, match=message):
        check_config(tiny_config(tmp_path, f"model.name={name}"))
    check_config(tiny_config(tmp_path, f"model.name={model_dir(tmp_path / 'local')}"))  # a local directory
    for alias in ("smollm2-135m-instruct", "char-64x2", "tiny-64x2"):  # tether's aliases, never built here
        check_config(tiny_config(tmp_path, f"model.name={alias}"))


@pytest.mark.parametrize("key, overrides", [
    ("model.name", ["model.name=runs/run-b"]),
    ("task.kwargs: path", ["task.name=dataset", "task.kwargs={path: runs/run-b}"]),
])
def test_a_missing_path_whose_first_folder_is_here_is_not_read_as_a_hub_id(tmp_path, monkeypatch, key, overrides):
    """``runs/run-b`` (a typo of ``runs/run-a``) reads as a Hub id by its shape: validate said ok and left it to a
    download that failed after the Hub's retries. Its first part is a folder here, so it is a path that is not here."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    model_dir(tmp_path / "runs" / "run-a")
    (tmp_path / "data.jsonl").write_text(GOOD + "\n" + GOOD + "\n")
    cfg = load_config(data={"run_dir": str(tmp_path / "run"),
                            "task": {"name": "jsonl", "kwargs": {"path": "data.jsonl", "val_size": 1}}},
                      overrides=overrides)
    with pytest.raises(ConfigError) as info:
        check_config(cfg, policy=key == "model.name")
    state = "is not a directory" if key == "model.name" else "does not exist"
    assert str(info.value) == (f"{key}: 'runs/run-b' {state} here (relative to the working directory {tmp_path}), and "
                               "is not a Hub id (org/name); did you mean runs/run-a?")


def test_a_cached_hub_model_beside_a_folder_named_as_its_org_is_the_hub_model(tmp_path, monkeypatch):
    """A folder Qwen/ in the working directory made Qwen/Qwen2.5-0.5B-Instruct read as a missing path, though the
    Hub cache holds it and transformers loads it from there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen").mkdir()
    monkeypatch.setattr("tether.checks.machine.hub_file", lambda repo, file: "/cache/config.json")
    assert check_model("model.name", "Qwen/Qwen2.5-0.5B-Instruct") is None
    monkeypatch.setattr("tether.checks.machine.hub_file", lambda repo, file: None)
    with pytest.raises(ConfigError, match=r"^model\.name: 'Qwen/Qwen2\.5-0\.5B-Instruct' is not a directory here"):
        check_model("model.name", "Qwen/Qwen2.5-0.5B-Instruct")


@pytest.mark.parametrize("offline", ["0", "1"])
@pytest.mark.parametrize("name, alias", [
    ("smollm2-135m", "smollm2-135m-instruct"),
    ("SmolLM2-135M-Instruct", "smollm2-135m-instruct"),
    ("smollm2-360m-instruct", "smollm2-135m-instruct"),
    ("tiny-qwen2-vl", "tiny-qwen2.5-vl"),
    ("tiny_64-2", "tiny-64x2"),
])
def test_a_misspelt_alias_gets_the_alias_not_a_hub_download(tmp_path, monkeypatch, offline, name, alias):
    """A one-word name reads as a Hub id: validate said ok online, and train retried the Hub for 25 s and ended in
    a traceback; offline, the message said to download it from the Hub."""
    monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    with pytest.raises(ConfigError, match=rf"^model\.name: '{name}' is not a tether alias, a directory here or a "
                                          rf"cached Hub model; did you mean {re.escape(alias)}\?"):
        check_config(tiny_config(tmp_path, f"model.name={name}"))


def test_a_name_close_to_an_alias_is_taken_when_it_is_a_directory_or_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.chdir(tmp_path)
    model_dir(tmp_path / "smollm2-135m")
    check_config(tiny_config(tmp_path, "model.name=smollm2-135m"))  # the local directory of that name
    monkeypatch.setattr("tether.checks.machine.hub_file", lambda repo, file: "/cache/config.json")
    check_config(tiny_config(tmp_path, "model.name=smollm2-135m-instrct"))  # a Hub model in the cache
    monkeypatch.setattr("tether.checks.machine.hub_file", lambda repo, file: None)
    monkeypatch.setattr("tether.checks.machine.hub_unreachable", lambda: None)  # the Hub answers: no network here
    for hub_id in ("gpt2", "distilgpt2", "HuggingFaceTB/SmolLM2-135M"):  # online, left to download
        check_config(tiny_config(tmp_path, f"model.name={hub_id}"))


def test_a_hub_model_not_cached_with_no_hub_fails_validate_at_once(tmp_path, monkeypatch):
    """With no network, validate said ok and train left the model to a download that retried the Hub (measured:
    `tether train` with model.name=Qwen/Qwen2.5-0.5B-Instruct ended after 30 s with a line from the load). One
    probe of the endpoint (a closed local port here: no network) says it; a cached copy is the run's to read."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr("tether.checks.machine.hub_file", lambda repo, file: None)
    for variable in PROXY_VARIABLES:  # with a proxy, no probe is made
        monkeypatch.delenv(variable, raising=False)
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        check_config(tiny_config(tmp_path, "model.name=org/not-cached"))
    assert str(info.value) == (
        "model.name: 'org/not-cached' is not in the local Hugging Face cache and the Hub cannot be reached (cannot "
        "connect to 127.0.0.1:9 (Connection refused)); connect and download it first (hf download "
        "org/not-cached), or run with HF_HUB_OFFLINE=1 where a cached copy is, or give a local directory")
    assert time.perf_counter() - start < 5.0
    with pytest.raises(ConfigError, match=r"^model\.ref_name: 'org/not-cached' is not in the local Hugging Face "):
        check_config(tiny_config(tmp_path, "model.ref_name=org/not-cached", "algorithm.kl.coef=0.1"))
    monkeypatch.setattr("tether.checks.machine.hub_file", lambda repo, file: "/cache/config.json")
    assert check_model("model.name", "org/cached") is None  # transformers reads the cached copy


def test_train_stops_at_a_misspelt_alias_before_the_run_directory(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\nmodel: {{name: smollm2-135m}}\ntask: {{name: parity}}\n")
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and "did you mean smollm2-135m-instruct?" in result.output
    assert not (tmp_path / "run").exists()


HUB_OS_ERROR = OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them "
                       "in the cached files.\nCheck your internet connection or see how to run the library in "
                       "offline mode at 'https://huggingface.co/docs/transformers/installation#offline-mode'.")


def test_a_model_that_fails_to_load_is_one_line_and_exit_code_2(tmp_path, monkeypatch):
    """What the checks cannot know (a Hub id that does not exist, no network): transformers' OSError was a
    220-line traceback and exit code 1."""
    def unreachable(*args, **kwargs):
        raise HUB_OS_ERROR

    monkeypatch.setattr("tether.trainer.build.load_policy", unreachable)
    config = tmp_path / "c.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\nmodel: {{name: tiny-64x1}}\ntask: {{name: parity}}\n"
                      "logging: {tensorboard: false, progress: false}\n")
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("model.name: 'tiny-64x1' could not be loaded (We couldn't connect to "
                           "'https://huggingface.co' to load the files, and couldn't find them in the cached files.); "
                           "give a tether alias (smollm2-135m-instruct"), line
    assert "Traceback" not in result.output and "offline mode" not in result.output


def test_a_file_system_error_while_loading_is_not_reported_as_a_wrong_name():
    from tether.models.policy import model_load_errors

    for err in (PermissionError(13, "Permission denied", "/home/u/.cache/tether"),
                OSError(28, "No space left on device")):
        with pytest.raises(type(err)) as raised, model_load_errors("model.name", "tiny-64x2"):
            raise err
        assert raised.value is err  # its own message and traceback, not the alias advice
    with pytest.raises(ConfigError) as raised, model_load_errors("model.name", "org/x"):
        raise HUB_OS_ERROR
    assert raised.value.__cause__ is HUB_OS_ERROR  # --debug shows transformers' traceback


def test_the_load_error_names_the_key_and_a_close_alias():
    from tether.models.policy import model_load_error

    line = model_load_error("model.ref_name", "smollm2-135m", HUB_OS_ERROR)
    assert line.startswith("model.ref_name: 'smollm2-135m' could not be loaded (")
    assert "did you mean smollm2-135m-instruct?" in line and "\n" not in line
    assert "hf download org/x)" in model_load_error("methods.eapo.prior", "org/x", HUB_OS_ERROR)


@pytest.mark.parametrize("alias, message", [
    ("char-16x1", r"^model\.name: char-16x1: hidden must be a positive multiple of 64 and layers >= 1$"),
    ("char-64x0", r"^model\.name: char-64x0: hidden must be a positive multiple of 64"),
    ("tiny-100x2", r"^model\.name: tiny-100x2: hidden must split into max\(1, hidden // 32\) heads"),
])
def test_an_alias_of_a_size_that_cannot_be_built_is_one_line_before_any_model_loads(tmp_path, alias, message):
    """The alias's shape was only found wrong when the model was built, after validate had said ok."""
    with pytest.raises(ConfigError, match=message):
        check_config(tiny_config(tmp_path, f"model.name={alias}"))
    for fine in ("char-128x1", "tiny-96x1", "tiny-48x3"):
        check_config(tiny_config(tmp_path, f"model.name={fine}"))


def test_a_reference_that_is_not_here_is_one_line_even_when_the_policy_is_given(tmp_path):
    with pytest.raises(ConfigError, match=r"^model\.ref_name: 'a/b/c' is not a directory here"):
        check_config(tiny_config(tmp_path, "model.ref_name=a/b/c"), policy=False)


def test_a_tracker_that_is_not_installed_is_one_line(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"^logging\.wandb is set but the package 'wandb' is not installed; "
                                          r"pip install -e '\.\[wandb\]'"):
        check_config(tiny_config(tmp_path, "logging.wandb={}"))


def test_train_checks_inputs_before_the_run_directory_is_written(tmp_path):
    cfg = tiny_config(tmp_path, "model.name=./missing-checkpoint")
    with pytest.raises(ConfigError, match=r"^model\.name"):
        Trainer(cfg)
    assert not Path(cfg.run_dir).exists()


def test_validate_and_train_end_with_one_line_and_exit_code_2(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\ntask: {{name: jsonl, kwargs: {{path: {tmp_path}/x.jsonl}}}}\n")
    for command in ("validate", "train"):
        result = CliRunner().invoke(app, [command, str(config)])
        assert result.exit_code == 2, result.output
        assert result.output.strip().count("\n") == 0 and "x.jsonl' does not exist" in result.output
    assert not (tmp_path / "run").exists()


def test_rows_with_an_empty_answer_are_one_warning(tmp_path):
    lines = [GOOD, json.dumps({"prompt": "2+2?", "answer": ""}), json.dumps({"prompt": "3+3?", "answer": None})]
    warnings = check_config(jsonl_config(tmp_path, lines), policy=False)
    assert warnings == [f"task.kwargs: path: 2 of 3 rows checked in {tmp_path / 'data.jsonl'} have an empty 'answer' "
                        "(the first: line 2); they are never scored correct"]


def test_gold_answers_math_verify_cannot_parse_are_one_warning(tmp_path):
    lines = [GOOD, json.dumps({"prompt": "2+2?", "answer": "}"}), json.dumps({"prompt": "3+3?", "answer": "6"}),
             "", json.dumps({"prompt": "4+4?", "answer": "\\boxed{"}), json.dumps({"prompt": "x?", "answer": "x^2+1"})]
    warnings = check_config(jsonl_config(tmp_path, lines), policy=False)
    assert warnings == [f"task.kwargs: path: 2 of 5 gold answers sampled from {tmp_path / 'data.jsonl'} cannot be "
                        "parsed by math-verify (the first: line 2, answer='}'); such rows are scored as faults "
                        "(reward/faults), never correct"]


def test_the_gold_answer_sample_is_spread_over_the_file_and_bounded():
    rows = [(line, {"answer": "}" if line % 2 else "1"}) for line in range(1, 11)]
    assert unparsable_answers(rows, "answer", 5, sample=3) == ([(1, "}"), (5, "}"), (9, "}")], 3)  # lines 1, 5, 9
    assert unparsable_answers(rows, "answer", 5, sample=100, budget_s=-1.0) == ([], 0)  # out of time: stop


def test_the_eapo_prior_must_be_here_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = tiny_config(tmp_path, "algorithm.policy_loss=eapo", "methods.eapo.prior=./no/prior")
    with pytest.raises(ConfigError, match=r"^methods\.eapo\.prior: './no/prior' is not a directory here"):
        check_config(cfg, policy=False)
    with pytest.raises(ConfigError, match=r"^methods\.eapo\.prior: 'org/prior' is not in the local Hugging Face "
                                          r"cache and HF_HUB_OFFLINE is set"):
        check_config(tiny_config(tmp_path, "algorithm.policy_loss=eapo", "methods.eapo.prior=org/prior"),
                     policy=False)
    check_config(tiny_config(tmp_path, "algorithm.policy_loss=eapo", f"methods.eapo.prior={model_dir(tmp_path / 'p')}"),
                 policy=False)


@pytest.mark.parametrize("overrides, package, message", [
    (["logging.tensorboard=true"], "tensorboard", r"^logging\.tensorboard is set but the package 'tensorboard'"),
    (["logging.mlflow={}"], "mlflow", r"^logging\.mlflow is set but the package 'mlflow' is not installed"),
    (["task=null", "env={name: scripted, workers: 2}"], "ray", r"^env\.workers is set but the package 'ray'"),
    (["task=null", "env={name: textworld}"], "textworld", r"^env\.kwargs: textworld env needs textworld: pip install"),
    (["task=null", "env={name: frozenlake}"], "gymnasium", r"^env\.kwargs: frozenlake needs gymnasium: pip install"),
])
def test_an_optional_package_the_config_needs_is_one_line(tmp_path, monkeypatch, overrides, package, message):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else find_spec(name, *a))
    with pytest.raises(ConfigError, match=message):
        check_config(tiny_config(tmp_path, *overrides), policy=False)


def test_responses_longer_than_the_models_context_are_a_warning(tmp_path):
    model = model_dir(tmp_path / "model")
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 32}))
    assert check_config(tiny_config(tmp_path, f"model.name={model}", "rollout.max_new_tokens=16")) == []
    assert check_config(tiny_config(tmp_path, f"model.name={model}", "rollout.max_new_tokens=32")) == [
        f"rollout.max_new_tokens=32 is not below the context of {model} (32 tokens, max_position_embeddings): "
        "prompt and response do not fit"]


def prompt_config(tmp_path: Path, model: str, prompts: list[str], max_new_tokens: int) -> object:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))
    return load_config(data={"run_dir": str(tmp_path / "run"), "model": {"name": model},
                             "rollout": {"max_new_tokens": max_new_tokens},
                             "task": {"name": "jsonl", "kwargs": {"path": str(path), "prompt_template": "{question}",
                                                                  "val_size": 1}}})


def test_a_prompt_that_fills_the_context_stops_before_any_model_loads(tmp_path):
    # char models: one token per character, and the chat template adds 6 ("<s>", "Q:", "\n", "A:")
    prompts = ["1+1?", "x" * 1018, "2+2?"]  # 1024 tokens: the context of every char model
    with pytest.raises(ConfigError) as err:
        check_config(prompt_config(tmp_path, "char-64x1", prompts, 8))
    assert str(err.value) == (
        f"task.kwargs: the prompt at {tmp_path / 'data.jsonl'} line 2 is 1024 tokens with the chat template; the "
        "context of char-64x1 is 1024 tokens (max_position_embeddings), and a prompt must leave room for the "
        "response: shorten or drop it, or use a model with a longer context")
    assert check_config(prompt_config(tmp_path, "char-64x1", ["x" * 1000, "1+1?"], 8)) == []


def test_prompt_lengths_are_counted_with_the_configured_chat_template(tmp_path):
    """With ``model.chat_template`` set, train renders prompts with that file's template (build_collector); the check
    counted them with the tokenizer's own, so a prompt the configured template pushes past the context passed it."""
    from tether.models.char import CHAT_TEMPLATE, char_tokenizer
    from tether.models.chat import encode_chat

    template = tmp_path / "long.jinja"  # the char template behind a 100-character preamble
    template.write_text("{{ '" + "p" * 100 + "' }}" + CHAT_TEMPLATE)
    prompt = "x" * 950  # 956 tokens with char-64x1's own template, 1056 with the configured one
    cfg = prompt_config(tmp_path, "char-64x1", [prompt, "1+1?"], 8)
    assert check_config(cfg) == []
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"chat_template": str(template)})})
    rendered = char_tokenizer()
    rendered.chat_template = template.read_text()
    tokens = len(encode_chat(rendered, prompt))  # the reference: the ids train gives the engine
    assert tokens == 1056
    with pytest.raises(ConfigError, match=rf"^task\.kwargs: the prompt at .*data\.jsonl line 1 is {tokens} tokens "):
        check_config(cfg)


def test_the_checks_of_one_config_load_each_tokenizer_once(tmp_path, monkeypatch):
    """The prompt lengths, the reference's tokenizer comparison and the chat template check each loaded the policy's
    tokenizer: 3 loads of it (about 0.1 s each for SmolLM2's) where one serves them all."""
    import tether.models.char as char

    loads = []

    def counting():
        loads.append(1)
        return tokenizer()

    tokenizer = char.char_tokenizer
    monkeypatch.setattr(char, "char_tokenizer", counting)
    cfg = prompt_config(tmp_path, "char-64x1", ["x" * 40, "1+1?"], 8)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"ref_name": "char-128x4"}),
                                 "algorithm": cfg.algorithm.model_copy(update={"use_ref": True})})
    assert check_config(cfg) == []
    assert len(loads) == 2  # the policy's and the reference's
    check_config(cfg)
    assert len(loads) == 4  # each config's checks read the files again: no process-wide cache


def test_prompts_that_leave_too_little_room_for_the_response_are_a_warning(tmp_path):
    from tether.models.char import char_tokenizer

    model = tmp_path / "model"  # a local checkpoint: config.json and the tokenizer (the weights are never read)
    char_tokenizer().save_pretrained(model)
    (model / "model.safetensors").write_text("")
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    prompts = ["x" * 40, "y" * 30, "1+1?"]  # 46, 36 and 10 tokens
    assert check_config(prompt_config(tmp_path, str(model), prompts, 20)) == [
        f"rollout.max_new_tokens=20: the longest prompt ({tmp_path / 'data.jsonl'} line 1, 46 tokens) leaves 18 "
        f"tokens of the context of {model} (64, max_position_embeddings); 1 of the 3 longest prompts leave less "
        "than max_new_tokens, so their responses run past the context"]
    assert check_config(prompt_config(tmp_path, str(model), prompts, 18)) == []


def test_validate_prints_each_error_and_each_warning_on_one_line(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\ntask: {{name: reasoning_gym, kwargs: {{dataset: chain_summ}}}}\n"
                      "algorithm: {policy_loss: armor, loss_kwargs: {alpha: 1.5}}\n")
    result = CliRunner().invoke(app, ["validate", str(config)])
    assert result.exit_code == 2
    assert [line.split(":")[0] for line in result.output.splitlines()] == ["algorithm.loss_kwargs", "task.kwargs"]
    config.write_text(f"run_dir: {tmp_path / 'run'}\ntask: {{name: parity}}\nmodel: {{name: char-64x1, "
                      "ref_name: char-64x1}\nlogging: {tensorboard: false}\n")
    result = CliRunner().invoke(app, ["validate", str(config)])
    assert result.exit_code == 0, result.output
    assert sorted(result.output.splitlines()) == [
        f"ok: {config} (task parity); would start {tmp_path / 'run'}",
        "warning: model.ref_name='char-64x1' is never loaded: nothing uses a reference (algorithm.kl.coef is 0, "
        "algorithm.use_ref is false, and no method needs one)"]
    assert not (tmp_path / "run").exists()


def test_sft_data_is_checked_by_validate_and_sft_and_train_refuses_the_section(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\ntask: {{name: parity}}\nmodel: {{name: char-64x1}}\n"
                      f"logging: {{tensorboard: false}}\nsft: {{data: jsonl, path: {tmp_path / 'pairs.jsonl'}}}\n")
    for command in ("validate", "sft"):
        result = CliRunner().invoke(app, [command, str(config)])
        assert result.exit_code == 2 and result.output.startswith("sft.path: no file"), result.output
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"prompt": "1+1?"}) + "\n")
    result = CliRunner().invoke(app, ["validate", str(config)])
    assert result.exit_code == 2 and "pairs.jsonl line 1 has no 'response' field" in result.output, result.output
    result = CliRunner().invoke(app, ["train", str(config)])  # the sft: section is tether sft's, not train's
    assert result.exit_code == 2 and "sft: a setting of `tether sft`, which `tether train` does not read" in \
        result.output, result.output
    assert not (tmp_path / "run").exists()


def test_sft_jsonl_examples_with_images_for_a_text_policy_are_refused_before_the_run_directory(tmp_path):
    """Found only while encoding, after data/ was written: a ValueError traceback, and the corrected command was
    then refused the run directory ("holds an earlier run with data/ but no sft_state")."""
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"prompt": "<image> what?", "response": "red",
                                                      "images": ["a.png"]}) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\ntask: {{name: parity}}\nmodel: {{name: tiny-64x2}}\n"
                      f"logging: {{tensorboard: false}}\nsft: {{data: jsonl, path: {tmp_path / 'pairs.jsonl'}}}\n")
    for command in ("validate", "sft"):
        result = CliRunner().invoke(app, [command, str(config)])
        assert result.exit_code == 2 and result.output.strip() == (
            f"sft.path: the examples of {tmp_path / 'pairs.jsonl'} carry images, but model.name=tiny-64x2 is a text "
            "model (no vision_config): use a vision-language model (e.g. Qwen/Qwen2.5-VL-3B-Instruct; tiny-qwen2.5-vl "
            "for a smoke run), or examples without images"), result.output
    assert not (tmp_path / "run").exists()
    result = CliRunner().invoke(app, ["validate", str(config), "model.name=tiny-qwen2.5-vl"])
    assert "carry images" not in result.output, result.output


def env_config(tmp_path: Path, name: str, **kwargs) -> object:
    return load_config(data={"run_dir": str(tmp_path / "run"), "env": {"name": name, "kwargs": kwargs}})


def test_alfworld_data_and_packages_are_checked_before_any_model_loads(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "alfworld" else find_spec(name, *a))
    with pytest.raises(ConfigError) as err:
        check_config(env_config(tmp_path, "alfworld", data_dir=str(tmp_path)), policy=False)
    assert str(err.value) == (
        f"env.kwargs: ALFWorld is not available: no game.tw-pddl files under {tmp_path}/json_2.1.1/train; no "
        f"game.tw-pddl files under {tmp_path}/json_2.1.1/valid_seen; the alfworld package (pip install alfworld). "
        "Set data_dir= or ALFWORLD_DATA to a copy of the folder `alfworld-download` creates (it needs network "
        "access; see docs/environments.md).")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # both packages "installed"
    for split in ("train", "valid_unseen"):
        game = tmp_path / "json_2.1.1" / split / "pick-Book-301" / "trial_T1" / "game.tw-pddl"
        game.parent.mkdir(parents=True)
        game.write_text("{}")
    check_config(env_config(tmp_path, "alfworld", data_dir=str(tmp_path), eval_split="valid_unseen"), policy=False)
    with pytest.raises(ConfigError, match=r"no game\.tw-pddl files under .*valid_seen\. Set data_dir="):
        check_config(env_config(tmp_path, "alfworld", data_dir=str(tmp_path)), policy=False)


def test_a_webshop_checkout_and_its_data_are_checked_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.delenv("WEBSHOP_DIR", raising=False)
    with pytest.raises(ConfigError, match=r"^env\.kwargs: WebShop is not available: pass webshop_dir= or set "
                                          r"WEBSHOP_DIR"):
        check_config(env_config(tmp_path, "webshop"), policy=False)
    with pytest.raises(ConfigError, match=rf"^env\.kwargs: WebShop is not available: missing {tmp_path}/web_agent_site"
                                          r"/envs/web_agent_text_env\.py, .*items_shuffle_1000\.json, .*indexes_1k "
                                          r"\(run WebShop's setup\.sh"):
        check_config(env_config(tmp_path, "webshop", webshop_dir=str(tmp_path)), policy=False)
    for part in ("web_agent_site/envs/web_agent_text_env.py", "data/items_shuffle_1000.json",
                 "data/items_human_ins.json", "search_engine/indexes_1k/"):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / part).mkdir() if part.endswith("/") else (tmp_path / part).write_text("")
    monkeypatch.setenv("WEBSHOP_DIR", str(tmp_path))
    check_config(env_config(tmp_path, "webshop"), policy=False)


@pytest.mark.parametrize("env", ["ezpoints", "sokoban_visual"])
def test_visual_envs_need_pillow_only_for_images(tmp_path, monkeypatch, env):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "PIL" else find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"^env\.kwargs: image observations need Pillow: pip install"):
        check_config(env_config(tmp_path, env), policy=False)
    check_config(env_config(tmp_path, env, observation="text"), policy=False)


@pytest.mark.parametrize("sft, message", [
    # parity has no demonstrations and no seed: sft crashed with a traceback after validate said ok
    ("{data: task}", "sft.data=task: task 'parity' has no demonstrations and does not take seed and train_size"),
    ("{data: solver}", "sft.data=solver plays an environment's solver: the config needs env: ..."),
])
def test_sft_data_that_the_workload_cannot_give_is_refused_by_validate_and_sft(tmp_path, sft, message):
    config = tmp_path / "c.yaml"
    config.write_text(f"# tether sft c.yaml\nrun_dir: {tmp_path / 'run'}\ntask: {{name: parity}}\n"
                      f"model: {{name: char-64x1}}\nlogging: {{tensorboard: false}}\nsft: {sft}\n")
    for command in ("validate", "sft"):
        result = CliRunner().invoke(app, [command, str(config)])
        assert result.exit_code == 2 and result.output.startswith(message), result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "run").exists()


def test_a_reference_or_prior_with_another_tokenizer_is_refused_by_validate(tmp_path, tiny_policy):
    """model.ref_name (or EAPO's prior) with another tokenizer than the policy's passed tether validate; train
    refused it only where the reference loaded, after the policy had. The tokenizers alone are compared now: the
    char models' 100 characters against the SmolLM2 tokenizer of the tiny models and of a local directory."""
    policy = tmp_path / "policy"
    model, tokenizer = tiny_policy
    model.save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    eapo = ["algorithm.policy_loss=eapo", "algorithm.advantage=clean_baseline"]
    refused = (("model.ref_name", policy, "char-64x1", ["algorithm.kl.coef=0.01"], "(100 vs 49152 tokens",
                "the KL reads the reference's log-probs at the policy's token ids"),
               ("methods.eapo.prior", "char-64x1", "tiny-64x1", eapo, "(49152 vs 100 tokens",
                "injection swaps single tokens between the two models"))
    for key, mine, theirs, settings, sizes, why in refused:
        with pytest.raises(ConfigError) as err:
            check_config(tiny_config(tmp_path, f"model.name={mine}", f"{key}={theirs}", *settings))
        line = str(err.value)
        assert line.startswith(f"{key}: the tokenizer of '{theirs}' differs from the policy's {sizes}; e.g. [")
        assert why in line and "\n" not in line
    for mine, theirs in (("char-64x1", "char-128x4"), (policy, "tiny-64x1")):  # one tokenizer, other models
        check_config(tiny_config(tmp_path, f"model.name={mine}", f"model.ref_name={theirs}"))


def test_a_missing_chat_template_file_names_the_nearest_file_of_its_folder(tmp_path, monkeypatch):
    """A mistyped ``model.chat_template`` said only that it is not a file; models and data sets named the nearest
    entry of the folder (``tether.files.nearest_path_guess``), and so does it now."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "chatml.jinja").write_text("{{ messages[0]['content'] }}")
    cfg = jsonl_config(tmp_path, [GOOD, GOOD])
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"chat_template": "templates/chatm.jinja"})})
    with pytest.raises(ConfigError, match=r"^model.chat_template: 'templates/chatm.jinja' is not a file .*"
                                          r"; did you mean templates/chatml.jinja\?$"):
        check_config(cfg, policy=False)
