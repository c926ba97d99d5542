"""``tether train | sft | eval | experiment | plot | show | validate | recipe | config-docs``.

Every command ends a :class:`~tether.errors.TetherError` (a bad config, a health stop, an environment fault...)
with its message and its exit code (docs/reliability.md); ``tether --debug COMMAND`` shows the traceback too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import traceback
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from tether.config import (
    Config,
    ConfigError,
    RunConfig,
    config_command,
    first_line_command,
    load_command_config,
    string_override,
)
from tether.errors import TetherError
from tether.processes import end_with_starter
from tether.provenance import history, tether_version


class _TetherGroup(TyperGroup):
    """Catches tether's errors once, for every command and subcommand: one red message and the error's exit
    code; the traceback only under ``--debug``. Ctrl-C in a command that does not stop at a step boundary itself
    (``eval``, ``validate``, ``experiment``...) is one line and exit code 130, as for a training run."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TetherError as err:
            if ctx.params.get("debug"):  # the traceback, and still the error's own exit code: 1 means a crash
                traceback.print_exc()
            typer.secho(str(err), fg=typer.colors.RED, err=True)
            raise typer.Exit(err.exit_code) from None
        except KeyboardInterrupt:
            if ctx.params.get("debug"):
                traceback.print_exc()
            typer.secho(f"tether {ctx.invoked_subcommand} stopped by Ctrl-C (SIGINT)", fg=typer.colors.RED, err=True)
            raise typer.Exit(128 + signal.SIGINT) from None


    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None and command.short_help is None and command.help:
            command.short_help = first_sentence(command.help)
        return command


def first_sentence(help_text: str) -> str:
    """A command's line in ``tether -h``: its help's first sentence, on one line. Typer's rich list prints the whole
    first paragraph with its line breaks, so long ones broke mid-sentence over several rows."""
    paragraph = " ".join(help_text.split("\n\n")[0].split())
    return re.split(r"(?<=\.)\s+(?=[A-Z])", paragraph)[0]


app = typer.Typer(cls=_TetherGroup, add_completion=False, no_args_is_help=True,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="tether: RL for language models. Exit codes: docs/reliability.md.")

Overrides = Annotated[list[str] | None, typer.Argument(help="dotted overrides, e.g. optim.lr=1e-5")]


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"tether {tether_version() or 'unknown (not installed)'}")
        raise typer.Exit()


@app.callback()
def main(debug: Annotated[bool, typer.Option("--debug", help="show the traceback of an error, not one line")]
         = False,
         version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="print tether's version and exit")] = False) -> None:
    """tether: RL for language models. Exit codes: 0 done, 1 crash, 2 bad input, 3 health stop, 4 stopped early
    (resumable), 5 environment fault, 128+N signal N (docs/reliability.md)."""
    end_with_starter()  # a run of `tether experiment` stops when the runner is killed (tether.processes)
    if not debug:
        warnings.formatwarning = one_line_warning
    if not sys.stderr.isatty():
        # a log file gets tether's step lines, not Hugging Face's carriage-returned progress bars (read when
        # huggingface_hub and transformers are imported, which is later)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     line: str | None = None) -> str:
    """A warning as one line, as errors are: ``warning: MESSAGE`` for tether's own (a UserWarning raised in its
    package), else with the category's name (``UserWarning: ...`` from torch or transformers, ``FutureWarning: ...``);
    where it was raised (file, line and source, Python's default) only under ``--debug``."""
    ours = category is UserWarning and Path(filename).resolve().is_relative_to(Path(__file__).resolve().parent)
    return f"{'warning' if ours else category.__name__}: {message}\n"


def _load(config: Path | None, overrides: list[str] | None, data: dict | None = None,
          command: str = "train") -> Any:
    """The config of ``command`` (its own schema, :data:`tether.config.SCHEMAS`), its imports imported."""
    from tether.methods.base import resolve_method_targets
    from tether.user_code import import_user_modules

    cfg = load_command_config(command, config, overrides or [], data=data)
    import_user_modules(cfg.imports)  # the config's own code, before anything looks a name up
    resolve_method_targets(getattr(cfg, "methods", {}))  # tether sft's config has no methods
    return cfg


def _warn_full_fine_tuning(cfg: RunConfig, command: str) -> None:
    """The SFT commands train every weight; a ``model.lora`` section there is read by the RL stage only."""
    if cfg.model.lora is not None:
        typer.secho(f"warning: tether {command} fine-tunes every weight; model.lora applies to tether train only",
                    fg=typer.colors.YELLOW, err=True)


@app.command()
def train(config: Path, overrides: Overrides = None) -> None:
    """Train with a YAML config; metrics go to RUN_DIR/metrics.jsonl and TensorBoard."""
    cfg = _load(config, overrides)
    typer.echo(json.dumps(_train(cfg), indent=2))


def _train(cfg: Config) -> dict:
    """One run's summary; a finished run's without loading anything."""
    from tether.trainer import train_run

    return train_run(cfg)


@app.command("eval")
def evaluate(path: Annotated[Path, typer.Argument(help="a checkpoint, or a run directory (its checkpoints/best)")],
             overrides: Overrides = None,
             config: Annotated[Path | None, typer.Option(help="config with the task/env")] = None) -> None:
    """Evaluate a checkpoint (or a run's best) on the held-out set: avg@k / pass@k, or an env's success rate."""
    named = [o for o in overrides or [] if o.partition("=")[0].strip() == "model.name"]
    if named:  # the path is the model: an override was silently replaced by it
        raise ConfigError(f"{named[0]}: tether eval evaluates the model it is given as its path ({path}); give that "
                          f"model as the path (tether eval MODEL --config {path}/config.yaml, for a run's settings)")
    path = _checkpoint_of(path)
    if config is None and not path.exists():
        raise ConfigError(_no_checkpoint(path))
    run_config = config or _find_run_config(path)
    command = config_command(run_config)
    if config is None and command != "train":
        raise ConfigError(f"{run_config}, the config found beside {path}, is a `tether {command}` config: it names no "
                          f"held-out evaluation; pass the RL config of the task or env to evaluate on: tether eval "
                          f"{path} --config CONFIG.yaml")
    cfg = _load(run_config, [*(overrides or []), string_override("model.name", path),
                             "logging.tensorboard=false"])
    from tether.trainer import evaluate as run_eval

    result = run_eval(cfg)
    if cfg.env is not None:  # agents: name the environment the success rate belongs to
        result = {"env": cfg.env.name, **result}
    from tether.health.reward_audit import audit_summary

    audit = audit_summary(result)
    if audit is not None:  # to stderr: stdout stays one JSON object for scripts (tether experiment reads it)
        typer.echo(audit, err=True)
    typer.echo(json.dumps(result, indent=2))


def _checkpoint_of(path: Path) -> Path:
    """A run directory stands for its checkpoint, as the help says: an RL run's ``checkpoints/best``, an SFT run's
    ``checkpoint``; without this ``tether eval runs/x`` took the run directory as the model and said it "holds no
    model: no config.json". A directory that holds a model itself is that model."""
    if any((path / name).is_file() for name in ("config.json", "adapter_config.json")):
        return path
    if (path / "checkpoints").is_dir():
        return path / "checkpoints" / "best"
    if (path / "checkpoint" / "config.json").is_file():
        return path / "checkpoint"
    if (path / "config.yaml").is_file():  # a run that wrote no model: it went on as model.name, "holds no model"
        raise ConfigError(f"{path} is a run directory that holds no model yet (no checkpoints/, no checkpoint/): it "
                          "stopped before its first save, so it has nothing to evaluate; to evaluate another model "
                          f"with its settings: tether eval MODEL --config {path / 'config.yaml'}")
    return path


def _no_checkpoint(path: Path) -> str:
    """Why ``path``, a run's checkpoint that is not there, cannot be evaluated, and what its folder holds instead:
    without this the path went on as ``model.name`` and the line said it was neither a directory, an alias nor a
    Hub id, which names a key the user never wrote. A run with ``val.every: 0`` never writes ``best``."""
    folder = path.parent
    there = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    line = f"{path} does not exist"
    if there:
        line += f"; {folder} holds: {', '.join(there)}"
    if path.name == "best":
        line += " (best is written when validation runs: val.every > 0)"
    return line + "; or pass a model with --config CONFIG.yaml"


def _find_run_config(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if (candidate / "config.yaml").is_file():
            return candidate / "config.yaml"
    raise ConfigError(f"no config.yaml in {path} or its parents; pass --config")


@app.command()
def plot(run_dir: Path) -> None:
    """Write PNG curves of a run's metrics into RUN_DIR/plots."""
    from tether.track import plot_run

    if not (run_dir / "metrics.jsonl").is_file():
        raise ConfigError(f"{run_dir} has no metrics.jsonl: not a run directory (tether train, sft and seed-sft write "
                          "one into their run_dir)")
    for p in plot_run(run_dir):
        typer.echo(str(p))


@app.command()
def show(run_dir: Path, html: Annotated[bool, typer.Option(help="write RUN_DIR/transcripts.html")] = False,
         limit: Annotated[int, typer.Option(min=1, help="the newest N samples or episodes")] = 3) -> None:
    """Print which code made the run (each start and resume), then sampled episodes turn by turn (agents) or samples
    (single-turn tasks: prompt, completion, reward per component), or write them as HTML."""
    from tether.rollout.transcripts import show_transcripts

    shown = show_transcripts(run_dir, html=html, limit=limit)  # first: a path that is no run is one line
    typer.echo(f"{history(run_dir)}\n\n{shown}")


recipe_app = typer.Typer(help="Multi-stage recipes.")
app.add_typer(recipe_app, name="recipe")


StageOverrides = Annotated[list[str] | None, typer.Option(help="KEY=VALUE override of that stage, repeatable")]


@recipe_app.command("armor")
def recipe_armor(stage1: Path, stage2: Annotated[Path | None, typer.Argument()] = None,
                 stage1_override: StageOverrides = None, stage2_override: StageOverrides = None,
                 after_collapse: Annotated[bool, typer.Option(
                     help="no STAGE2: stage 1 ends at a collapse of its validation, then ARMOR from the peak for "
                          "the steps left, in RUN_DIR/armor")] = False) -> None:
    """ARMOR's two stages: DAPO with validation, then ARMOR from its best checkpoint (policy = reference)."""
    from tether.checks import run_checks
    from tether.recipes.armor import run_after_collapse, run_two_stage

    if after_collapse == (stage2 is not None):
        raise ConfigError("tether recipe armor takes STAGE1 STAGE2, or one config with --after-collapse (stage 2 "
                          "is then derived from it); got " + ("both" if after_collapse else "neither"))
    first = _load(stage1, stage1_override)
    run_checks(first)
    if after_collapse:
        result = run_after_collapse(first)
    else:
        second = _load(stage2, stage2_override)
        run_checks(second, policy=False)  # its policy is the checkpoint stage 1 will write
        result = run_two_stage(first, second)
    typer.echo(json.dumps(result, indent=2, default=str))


@app.command()
def sft(config: Path, overrides: Overrides = None) -> None:
    """Supervised warm start (the config's sft: section): task demonstrations, a JSONL file or an env's solver."""
    cfg = _load(config, overrides, command="sft")
    from tether.recipes.sft import run_sft

    _warn_full_fine_tuning(cfg, "sft")
    summary = run_sft(cfg)
    typer.echo(json.dumps(summary, indent=2, default=str))


@app.command()
def experiment(protocol: Annotated[Path, typer.Argument(
                   help="the protocol file; with --from-published, a published study's folder")],
               report_only: Annotated[bool, typer.Option(help="only (re)write the report from finished runs")] = False,
               pool: Annotated[list[Path] | None, typer.Option(
                   help="a finished replication of PROTOCOL on other seeds (repeatable): report them together")] = None,
               into: Annotated[Path | None, typer.Option(help="with --pool: where the pooled report goes")] = None,
               allow_dirty: Annotated[bool, typer.Option(
                   help="run although the code's tree has uncommitted changes (the report says so)")] = False,
               publish: Annotated[Path | None, typer.Option(
                   help="a finished study: copy its report, per-seed table and lock here (docs/results/<study>)")]
               = None,
               from_published: Annotated[bool, typer.Option(
                   help="PROTOCOL is a published study's folder: rewrite its report in place from its report.json "
                        "alone, by today's rules (no run folder is read, nothing runs)")] = False,
               ) -> None:
    """Run a pre-registered protocol (calibration first, then arms x seeds, separate processes, resumable) and write
    its report."""
    from tether.lab.experiment import code_state, pool_experiments, run_experiment
    from tether.lab.report import publish_report, rebuild_published

    if pool and into is None:
        raise ConfigError("--pool needs --into DIR, the directory of the pooled report")
    given = [flag for flag, value in (("--report-only", report_only), ("--pool", pool), ("--into", into),
                                      ("--publish", publish), ("--allow-dirty", allow_dirty)) if value]
    if from_published and given:
        raise ConfigError(f"--from-published rewrites a published report from its report.json alone: it takes no "
                          f"{', '.join(given)} (nor any of --report-only, --pool, --into, --publish, --allow-dirty)")
    if from_published:
        data, root = rebuild_published(protocol, code_state()), protocol
    else:
        data = pool_experiments([protocol, *pool], into) if pool else run_experiment(
            protocol, report_only=report_only, allow_dirty=allow_dirty)
        if publish is not None:
            publish_report(data, publish)
        root = Path(data["protocol"]["run_root"])
    typer.echo((root / "report.md").read_text())
    if data["failures"]:
        raise typer.Exit(1)


@app.command("seed-sft")
def seed_sft(config: Path, overrides: Overrides = None) -> None:
    """SEED stage 1: roll out, label trajectories with an analyzer, response-only SFT -> a checkpoint."""
    cfg = _load(config, overrides, command="seed-sft")
    from tether.recipes.seed_sft import run_skill_sft

    _warn_full_fine_tuning(cfg, "seed-sft")
    summary = run_skill_sft(cfg)
    typer.echo(json.dumps(summary, indent=2, default=str))


@app.command("config-docs")
def config_docs(check: Annotated[bool, typer.Option(help="only say whether docs/config.md is current (exit 1 if not)")]
                = False,
                write: Annotated[bool, typer.Option(help="(re)write docs/config.md of this source tree instead of "
                                                    "printing")] = False) -> None:
    """Print the reference of every config key (Markdown, from the schema); --write updates docs/config.md."""
    from tether.config_docs import DOC_PATH, render_config_docs

    if check:
        if not DOC_PATH.is_file() or DOC_PATH.read_text(encoding="utf-8") != render_config_docs():
            typer.secho(f"{DOC_PATH} is out of date: run `tether config-docs --write`", fg=typer.colors.RED,
                        err=True)
            raise typer.Exit(1)
    elif write:
        DOC_PATH.write_text(render_config_docs(), encoding="utf-8")
        typer.echo(str(DOC_PATH))
    else:
        typer.echo(render_config_docs(), nl=False)


@app.command()
def validate(config: Path, overrides: Overrides = None) -> None:
    """Check a config (names, types, ranges, component settings) and that the files, models and packages it names
    are here, without loading any model. The schema is that of the command the file's first line names
    ('# tether sft ...'), else sft's for a config with an 'sft:' section, else train's. An experiment's protocol
    ('# tether experiment ...') gets the checks tether experiment runs before its first run."""
    # the docstring is the help text Typer prints, so it is written as plain text, not reST
    from tether.checks import run_checks
    from tether.checks.machine import probe_endpoints
    from tether.trainer.rundir import check_run_dir

    if first_line_command(config) == "experiment":
        typer.echo(_validate_protocol(config, overrides))
        return
    command = config_command(config)
    cfg = _load(config, overrides, command=command)
    run_checks(cfg)
    for line in probe_endpoints(cfg):  # servers the run will call: validate only, a start must not wait on them
        typer.echo(f"warning: {line}", err=True)
    workload = "task " + cfg.task.name if cfg.task else "env " + cfg.env.name
    if command != "train":
        from tether.recipes.sft_state import check_sft_run_dir

        typer.echo(f"ok: {config} (tether {command}, {workload}); {check_sft_run_dir(cfg)}")
        return
    start = check_run_dir(cfg)  # the run directory as `tether train` would find it: layout, resume, settings
    typer.echo(f"ok: {config} ({workload}); {start}")


def _validate_protocol(path: Path, overrides: list[str] | None) -> str:
    """The ok line of an experiment's protocol that passes :func:`tether.lab.protocol_checks.check_protocol`."""
    from tether.lab.protocol import load_protocol
    from tether.lab.protocol_checks import check_protocol

    if overrides:
        raise ConfigError(f"{path} is an experiment's protocol (its first line names `tether experiment`): it takes "
                          f"no overrides ({overrides[0]}); an arm's go in arms.NAME.overrides")
    protocol = load_protocol(path)
    power = check_protocol(protocol)
    e = protocol.endpoint
    return (f"ok: {path} (tether experiment protocol: {len(protocol.arms)} arms x {len(protocol.seeds)} seeds, "
            f"endpoint {e.metric} at {e.at} on split {e.split}; each arm's config checked as `tether experiment` "
            f"checks it before its first run); {power}")


if __name__ == "__main__":
    app()
