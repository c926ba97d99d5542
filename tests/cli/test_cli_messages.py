"""The CLI's conventions: one line per tether error (a traceback only with --debug) and its exit code, --version,
-h, did-you-mean for unknown keys, YAML syntax hints, `show` on single-turn runs, `plot` on a wrong path,
`config-docs` on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.trainer.helpers import tiny_config
from tether import cli
from tether.config import ConfigError, load_config
from tether.config_docs import DOC_PATH, render_config_docs
from tether.errors import EXIT_CONFIG, EXIT_HEALTH, TetherError
from tether.health import HealthError
from tether.provenance import code_provenance, describe
from tether.trainer import Trainer

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")


def run(*args: str):
    return CliRunner().invoke(cli.app, list(args))


def test_version_and_short_help():
    out = run("--version")
    assert out.exit_code == 0 and out.output.startswith("tether ")
    out = run("-h")
    assert out.exit_code == 0 and "validate" in out.output and "train" in out.output
    assert run("validate", "-h").exit_code == 0


def command_paths(command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand of the CLI, as the words that invoke it (the top level is ``()``)."""
    subcommands = getattr(command, "commands", {})
    return [path, *(p for name, sub in subcommands.items() for p in command_paths(sub, (*path, name)))]


def test_every_commands_help_reads_as_plain_text():
    """Typer prints a command's docstring as its help: `tether validate -h` showed reST's ``literals`` as typed."""
    import typer.main

    paths = command_paths(typer.main.get_command(cli.app))
    assert {("validate",), ("recipe", "armor"), ("seed-sft",)} <= set(paths)
    for path in paths:
        out = run(*path, "-h")
        assert out.exit_code == 0 and "Usage: " in out.output and "``" not in out.output, (path, out.output)


def test_each_command_is_one_sentence_on_one_line_of_the_command_list(monkeypatch):
    """`tether -h` listed validate's whole first paragraph with its docstring's line breaks: one command over five
    rows, broken mid-sentence."""
    monkeypatch.setenv("COLUMNS", "200")
    out = run("-h")
    assert out.exit_code == 0, out.output
    rows = {line.split()[1]: line for line in out.output.splitlines() if line.startswith("│ ") and line.split()[1:]}
    assert rows["validate"].split(" validate ", 1)[1].strip(" │") == (
        "Check a config (names, types, ranges, component settings) and that the files, models and packages it names "
        "are here, without loading any model.")
    assert "first line names" not in out.output  # the rest of the paragraph is validate's own -h
    assert cli.first_sentence("Run it. Then stop (e.g. this).\nMore.") == "Run it."


@pytest.mark.parametrize("override, expected", [
    ("optim.learning_rate=1e-5", "optim.learning_rate: unknown key; did you mean lr? optim allows: betas,"),
    ("rollout.group_sise=4", "rollout.group_sise: unknown key; did you mean group_size?"),
    ("trian.steps=3", "trian: unknown key; did you mean train? the top level allows: algorithm,"),
])
def test_unknown_key_names_the_closest_and_the_allowed_keys(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, [override])
    assert expected in str(err.value)


def test_a_method_section_gets_the_same_suggestions():
    from tether.methods import method_config

    with pytest.raises(ConfigError, match=r"methods.armor.tua: unknown key; did you mean tau\? methods.armor allows"):
        method_config("armor", {"tua": 1.0})


def test_container_values_get_a_syntax_hint():
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, ["logging.wandb=true", "rollout.stop=x"])
    text = str(err.value)
    assert "logging.wandb: Input should be a valid dictionary (got True); write a mapping" in text
    assert "rollout.stop: Input should be a valid list (got 'x'); write a list" in text


def test_errors_are_one_line_with_their_exit_code_and_a_traceback_only_with_debug():
    out = run("validate", QUICKSTART, "optim.lr=-1")
    assert out.exit_code == EXIT_CONFIG and "optim.lr" in out.output and "Traceback" not in out.output
    out = run("--debug", "validate", QUICKSTART, "optim.lr=-1")
    # the traceback, and the error's own exit code: re-raised, it exited 1, a crash's code
    assert out.exit_code == EXIT_CONFIG and "Traceback (most recent call last)" in out.output
    assert "tether.config.base.ConfigError" in out.output or "ConfigError:" in out.output
    assert out.output.rstrip().splitlines()[-1] == "  optim.lr: Input should be greater than 0 (got -1)"


def test_every_tether_error_is_caught_with_its_own_exit_code(monkeypatch):
    def failing(cfg):
        raise HealthError("every reward was non-finite")

    monkeypatch.setattr(cli, "_train", failing)
    out = run("train", QUICKSTART)
    assert out.exit_code == EXIT_HEALTH == 3 and out.output.strip() == "every reward was non-finite"
    assert issubclass(ConfigError, TetherError) and ConfigError.exit_code == 2


def test_plot_and_show_on_a_wrong_path_say_so_in_one_line(tmp_path):
    for command in ("plot", "show"):
        out = run(command, str(tmp_path / "nope"))
        assert out.exit_code == EXIT_CONFIG and "not a run directory" in out.output, out.output
        assert "Traceback" not in out.output


def test_a_run_directory_given_as_the_config_names_its_config_yaml(tmp_path):
    """`tether validate runs/q` said "config file 'runs/q' does not exist" of a directory that does."""
    (tmp_path / "config.yaml").write_text("task: {name: parity}\n")
    for command in ("validate", "train", "sft"):
        out = run(command, str(tmp_path))
        assert out.exit_code == EXIT_CONFIG and out.output.strip() == (
            f"config file {str(tmp_path)!r} is a directory, not a YAML file; did you mean {tmp_path / 'config.yaml'}?")


def test_show_of_an_sft_run_says_it_samples_nothing_and_a_limit_below_one_is_refused(tmp_path):
    """`tether show` of a finished SFT run called it "a run before its first step"; `--limit -1` showed all but the
    oldest sample (a Python slice)."""
    (tmp_path / "config.yaml").write_text("# tether sft (the settings this run started with)\nseed: 0\n")
    out = run("show", str(tmp_path))
    assert out.exit_code == EXIT_CONFIG and out.output.strip().endswith(
        "a tether sft run, which samples nothing (its losses are in metrics.jsonl: tether plot)")
    out = run("show", str(tmp_path), "--limit", "-1")
    assert out.exit_code == 2 and "greater than or equal to 1" in out.output


def test_eval_refuses_a_model_name_override_which_its_path_replaced(tmp_path):
    """`tether eval runs/q model.name=other` evaluated runs/q's best and said nothing of the override."""
    out = run("eval", str(tmp_path), "model.name=tiny-32x2")
    assert out.exit_code == EXIT_CONFIG and out.output.strip().startswith(
        f"model.name=tiny-32x2: tether eval evaluates the model it is given as its path ({tmp_path}); give that model "
        "as the path")


def test_show_prints_a_single_turn_runs_samples(tmp_path, tiny_policy):
    cfg = tiny_config(tmp_path, "train.steps=1")
    policy, tokenizer = tiny_policy
    Trainer(cfg, policy=policy, tokenizer=tokenizer).fit()
    out = run("show", cfg.run_dir, "--limit", "1")
    assert out.exit_code == 0, out.output
    header, *samples = out.output.split("\n\n")
    assert header.splitlines()[1].endswith("start: " + describe(code_provenance()))  # this run's one start
    first = samples[0].splitlines()
    assert first[0].startswith("step 1  group ") and " reward " in first[0] and "(task " in first[0]
    assert first[1].startswith("  prompt: ") and first[2].startswith("  completion: ")
    assert len(samples) == 1
    assert run("show", cfg.run_dir, "--html").exit_code == 0
    assert (Path(cfg.run_dir) / "transcripts.html").read_text().count("<h3>") == 2  # one per group of the step


def test_show_heads_the_samples_with_the_code_of_each_start_and_resume(tmp_path):
    """``tether show`` printed the samples alone; ``provenance.json`` said which code made the run only to one who
    opened it. Now a header gives one line per start or resume, first start first."""
    row = {"step": 4, "group": 0, "reward": 1.0, "components": {"task": 1.0}, "correct": True, "prompt": "1+1",
           "completion": "2", "answer": "2", "extracted": "2"}
    (tmp_path / "samples.jsonl").write_text(json.dumps(row) + "\n")
    sample = "\n".join(["step 5  group 0  reward 1 (task 1)  correct", "  prompt: 1+1", "  completion: 2",
                        "  answer: '2'  extracted: '2'"])
    out = run("show", str(tmp_path))
    assert out.exit_code == 0, out.output
    assert out.output == f"code: none recorded (no provenance.json: a run before tether wrote one)\n\n{sample}\n"
    entries = [{"at": "2026-12-01T10:00:00+00:00", "from_step": 0, "tether": "0.1.0", "commit": "1a2b3c4d5e6f",
                "clean": True},
               {"at": "2026-12-02T11:30:00+00:00", "from_step": 40, "tether": "0.2.0", "commit": "9f8e7d6c5b4a",
                "clean": False},
               {"at": "2026-12-03T09:00:00+00:00", "from_step": 80, "tether": "0.2.0", "commit": None}]
    (tmp_path / "provenance.json").write_text(json.dumps(entries))
    out = run("show", str(tmp_path))
    assert out.exit_code == 0, out.output
    assert out.output == "\n".join([
        "code (provenance.json, one line per start or resume):",
        "  2026-12-01T10:00:00+00:00  start: tether 0.1.0 (commit 1a2b3c4d)",
        "  2026-12-02T11:30:00+00:00  resume at step 40: tether 0.2.0 (commit 9f8e7d6c, uncommitted changes)",
        "  2026-12-03T09:00:00+00:00  resume at step 80: tether 0.2.0",
        "", sample, ""])


def test_config_docs_prints_the_reference_and_leaves_the_file():
    before = DOC_PATH.stat().st_mtime_ns
    out = run("config-docs")
    assert out.exit_code == 0 and out.output == render_config_docs()
    assert DOC_PATH.stat().st_mtime_ns == before


def test_sft_warns_that_it_ignores_lora(monkeypatch, tmp_path):
    import tether.recipes.sft

    monkeypatch.setattr(tether.recipes.sft, "run_sft", lambda cfg: {"checkpoint": "x"})
    config = tmp_path / "sft.yaml"
    config.write_text("task: {name: parity}\nmodel: {name: char-64x1}\nsft: {data: task}\n")
    out = run("sft", str(config), "model.lora={rank: 4}", f"run_dir={tmp_path / 'run'}")
    assert out.exit_code == 0, out.output
    assert "warning: tether sft fine-tunes every weight; model.lora applies to tether train only" in out.output


def test_ctrl_c_in_a_command_without_its_own_stop_is_one_line_and_exit_130(tmp_path, monkeypatch):
    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr("tether.trainer.evaluate", interrupted)
    out = run("eval", str(tmp_path / "checkpoint"), "--config", QUICKSTART)
    assert out.exit_code == 130 and out.output.strip() == "tether eval stopped by Ctrl-C (SIGINT)"


def test_eval_of_an_sft_checkpoint_without_a_config_says_to_pass_one(tmp_path):
    """The config found beside an SFT checkpoint is `tether sft`'s (its first line says so): eval asks for the RL
    config of the task to evaluate on instead of reporting sft's keys as unknown to train."""
    from tether.config import SFTRunConfig, config_command, dump_config

    sft = SFTRunConfig.model_validate({"run_dir": str(tmp_path), "task": {"name": "parity"}, "sft": {"data": "task"}})
    (tmp_path / "config.yaml").write_text(dump_config(sft))
    assert config_command(tmp_path / "config.yaml") == "sft"
    (tmp_path / "checkpoint").mkdir()
    out = run("eval", str(tmp_path / "checkpoint"))
    assert out.exit_code == EXIT_CONFIG
    assert "is a `tether sft` config: it names no held-out evaluation" in out.output
    assert f"tether eval {tmp_path / 'checkpoint'} --config CONFIG.yaml" in out.output


def test_eval_of_a_checkpoint_that_is_not_there_names_it_and_what_the_run_holds(tmp_path):
    """A run trained with val.every=0 has no checkpoints/best: `tether eval RUN/checkpoints/best` said
    `model.name: '...best' is not a directory here, nor a tether alias ...`, a key the user never wrote."""
    checkpoints = tmp_path / "run" / "checkpoints"
    for name in ("step_000002", "latest"):
        (checkpoints / name).mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text(Path(QUICKSTART).read_text())
    out = run("eval", str(checkpoints / "best"))
    assert out.exit_code == EXIT_CONFIG
    assert out.output.strip() == (f"{checkpoints / 'best'} does not exist; {checkpoints} holds: latest, step_000002 "
                                  "(best is written when validation runs: val.every > 0); or pass a model with "
                                  "--config CONFIG.yaml")
    out = run("eval", str(tmp_path / "nowhere" / "ckpt"))
    assert out.exit_code == EXIT_CONFIG
    assert out.output.strip() == f"{tmp_path / 'nowhere' / 'ckpt'} does not exist; or pass a model with --config " \
                                 "CONFIG.yaml"


def test_eval_of_a_run_directory_evaluates_its_best_checkpoint(tmp_path, monkeypatch):
    """The help says "Evaluate a checkpoint (or a run's best)": `tether eval RUN` went on with RUN as model.name and
    stopped with "model.name: RUN holds no model: no config.json"."""
    seen = []
    monkeypatch.setattr("tether.trainer.evaluate", lambda cfg: seen.append(cfg.model.name) or {})
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "best").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(Path(QUICKSTART).read_text())
    out = run("eval", str(run_dir))
    assert out.exit_code == 0, out.output
    assert seen == [str(run_dir / "checkpoints" / "best")]
    (run_dir / "checkpoints" / "best").rmdir()  # val.every=0: no best, said as for the path written out
    out = run("eval", str(run_dir))
    assert out.exit_code == EXIT_CONFIG
    assert out.output.strip() == (f"{run_dir / 'checkpoints' / 'best'} does not exist (best is written when "
                                  "validation runs: val.every > 0); or pass a model with --config CONFIG.yaml")


def test_eval_of_a_run_that_saved_nothing_says_so_not_model_name(tmp_path):
    """A run stopped before its first save (no checkpoints/): `tether eval RUN` said "model.name: RUN holds no
    model", a key the user never set."""
    (tmp_path / "config.yaml").write_text(Path(QUICKSTART).read_text())
    (tmp_path / "metrics.jsonl").write_text("")
    out = run("eval", str(tmp_path))
    assert out.exit_code == EXIT_CONFIG and out.output.strip() == (
        f"{tmp_path} is a run directory that holds no model yet (no checkpoints/, no checkpoint/): it stopped before "
        f"its first save, so it has nothing to evaluate; to evaluate another model with its settings: tether eval "
        f"MODEL --config {tmp_path / 'config.yaml'}")


def test_eval_of_a_model_directory_is_that_model_and_of_an_sft_run_its_checkpoint(tmp_path):
    """A model directory that also holds a `checkpoints/` folder was taken for a run and swapped for its
    `checkpoints/best`; an SFT run's model is its `checkpoint`."""
    from tether.cli import _checkpoint_of

    model = tmp_path / "model"
    (model / "checkpoints").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    assert _checkpoint_of(model) == model
    sft = tmp_path / "sft"
    (sft / "checkpoint").mkdir(parents=True)
    (sft / "checkpoint" / "config.json").write_text("{}")
    assert _checkpoint_of(sft) == sft / "checkpoint"
    assert _checkpoint_of(tmp_path / "nothing") == tmp_path / "nothing"


def test_warnings_are_one_line_and_progress_bars_stay_out_of_logs(monkeypatch):
    # the CLI sets both for its process; restored here after the in-process run
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    out = run("validate", QUICKSTART, "run_dir=/nonexistent/x")
    assert out.exit_code == 0, out.output
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # CliRunner's stderr is not a terminal
    assert warnings.formatwarning("lr too high", UserWarning, cli.__file__, 7) == "warning: lr too high\n"
    assert warnings.formatwarning("a library's", UserWarning, "/x/y.py", 7) == "UserWarning: a library's\n"
    assert warnings.formatwarning("old key", FutureWarning, cli.__file__, 7) == "FutureWarning: old key\n"


def test_a_warning_in_a_real_process_is_one_line_and_debug_keeps_where_it_was_raised(monkeypatch):
    command = [sys.executable, "-m", "tether", "validate", QUICKSTART, "train.resume=false", "run_dir=/nonexistent/x"]
    plain = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                           check=True)
    assert plain.stderr.splitlines()[0].startswith("FutureWarning: train.resume=false is now")
    assert ".py:" not in plain.stderr and len(plain.stderr.splitlines()) == 1
    python_default = warnings.formatwarning
    monkeypatch.setattr(warnings, "formatwarning", python_default)
    assert run("--debug", "validate", QUICKSTART, "run_dir=/nonexistent/x").exit_code == 0
    assert warnings.formatwarning is python_default  # file, line and source, as Python prints them


@pytest.mark.parametrize("name", ["exp #3", "run: 1", "2024", "1e-3"])
def test_eval_evaluates_the_checkpoint_path_as_given(tmp_path, monkeypatch, name):
    """The path went in as the override model.name=PATH, read as YAML: `exp #3` evaluated `exp` (the rest a
    comment), `run: 1` was a mapping and `2024` a number (both refused as model.name)."""
    seen = []
    monkeypatch.setattr("tether.trainer.evaluate", lambda cfg: seen.append(cfg.model.name) or {})
    monkeypatch.chdir(tmp_path)  # a relative path, as typed
    out = run("eval", name, "--config", QUICKSTART)
    assert out.exit_code == 0, out.output
    assert seen == [name]


def test_an_override_value_that_is_not_yaml_is_one_line_with_the_quoted_form():
    """`prompt_template="{q} x"` reaches tether without the shell's quotes: YAML's ParserError was a traceback."""
    out = run("validate", QUICKSTART, "task.kwargs.prompt_template={question} x")
    assert out.exit_code == EXIT_CONFIG and "Traceback" not in out.output, out.output
    assert out.output.strip() == ("override 'task.kwargs.prompt_template={question} x': the value is not valid YAML "
                                  "(expected '<document start>', but found '<scalar>'); to set a string, quote it for "
                                  "YAML inside the shell's quotes: 'task.kwargs.prompt_template=\"{question} x\"'")


@pytest.mark.parametrize(("command", "config", "named"), [
    ("train", "lab/eapo3/protocol.yaml", "an experiment's protocol"),
    ("experiment", "quickstart.yaml", "a `tether train` config"),
    ("train", "agents/frozenlake_sft.yaml", "a `tether sft` config"),
])
def test_a_file_of_another_command_is_one_line_naming_the_command_to_run(command, config, named):
    """`tether train PROTOCOL` printed 11 lines of "unknown key" (arms, seeds, ...), `tether experiment CONFIG` 16 of
    "Field required"; the file's first line (or a protocol's arms and seeds) says whose it is."""
    path = str(Path(QUICKSTART).parent / config)
    out = run(command, path)
    whose = "experiment" if "protocol" in named else named.split("`")[1].split()[1]
    assert out.exit_code == EXIT_CONFIG and out.output.strip() == (
        f"{path} is {named}, which `tether {command}` does not read: run `tether {whose} {path}`")


def test_a_protocol_without_its_first_line_is_known_by_its_arms_and_seeds(tmp_path):
    protocol = tmp_path / "p.yaml"
    protocol.write_text("name: x\nseeds: [0, 1]\narms: {a: {config: c.yaml}}\n")
    out = run("train", str(protocol))
    assert out.exit_code == EXIT_CONFIG and out.output.strip() == (
        f"{protocol} is an experiment's protocol, which `tether train` does not read: run `tether experiment "
        f"{protocol}`")


@pytest.mark.parametrize("override", ["optim.betas=[0.9, 1.5]", "optim.betas=[-0.1, 0.999]"])
def test_adam_betas_outside_0_1_are_refused_before_the_optimiser_is_built(override):
    """torch.optim.AdamW raised 'Invalid beta parameter' (a traceback) at train's start after validate said ok."""
    with pytest.raises(ConfigError, match=r"optim\.betas: each beta must be in \[0, 1\)"):
        load_config(QUICKSTART, [override])
    with pytest.raises(ConfigError, match=r"sft\.betas: each beta must be in \[0, 1\)"):
        from tether.config import load_command_config

        load_command_config("sft", str(Path(QUICKSTART).parent / "agents" / "frozenlake_sft.yaml"),
                            ["sft.betas=[1.0, 0.9]"])
