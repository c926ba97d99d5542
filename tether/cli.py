"""``tether train | sft | eval | experiment | plot | show | validate | recipe | config-docs``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from tether.config import Config, ConfigError, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="tether: RL for language models.")

Overrides = Annotated[list[str] | None, typer.Argument(help="dotted overrides, e.g. optim.lr=1e-5")]


@contextmanager
def _config_errors() -> Iterator[None]:
    """A ConfigError -- from the file, or from a check that needs the machine (train.device, a strategy's
    launch) -- ends the command with its one red line and exit code 2, not a traceback."""
    try:
        yield
    except ConfigError as err:
        typer.secho(str(err), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def _load(config: Path | None, overrides: list[str] | None, data: dict | None = None) -> Config:
    from tether.user_code import import_user_modules

    with _config_errors():
        cfg = load_config(config, overrides or [], data=data)
        import_user_modules(cfg.imports)  # the config's own code, before anything looks a name up
        return cfg


@app.command()
def train(config: Path, overrides: Overrides = None) -> None:
    """Train with a YAML config; metrics go to RUN_DIR/metrics.jsonl and TensorBoard."""
    cfg = _load(config, overrides)
    from tether.health import HealthError
    from tether.trainer.stop import TrainingStopped

    try:
        with _config_errors():  # e.g. a checkpoint the disk has no room for: one line naming path and cause
            summary = _train(cfg)
    except TrainingStopped as stop:  # a signal (after a checkpoint), or updates that stayed non-finite
        typer.secho(str(stop), fg=typer.colors.RED, err=True)
        raise typer.Exit(stop.exit_code) from None
    except HealthError as failure:  # a health check's verdict, with its causes: a message, not a traceback
        typer.secho(str(failure), fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(summary, indent=2))


def _train(cfg: Config) -> dict:
    """One run's summary; under ``health.collapse.action=armor``, stage 1's and, after a collapse, stage 2's."""
    if cfg.health.collapse.action == "armor":
        from tether.armor_after_collapse import train_with_armor_after_collapse

        return train_with_armor_after_collapse(cfg)
    from tether.trainer import Trainer

    trainer = Trainer(cfg)
    trainer.fit()
    return trainer.summary()


@app.command("eval")
def evaluate(path: Path, overrides: Overrides = None,
             config: Annotated[Path | None, typer.Option(help="config with the task/env")] = None) -> None:
    """Evaluate a checkpoint (or a run's best) on the held-out set: avg@k / pass@k, or an env's success rate."""
    run_config = config or _find_run_config(path)
    cfg = _load(run_config, [*(overrides or []), f"model.name={path}", "train.resume=false",
                             "logging.tensorboard=false"])
    from tether.trainer import evaluate as run_eval

    with _config_errors():
        result = run_eval(cfg)
    if cfg.env is not None:  # agents: name the environment the success rate belongs to
        result = {"env": cfg.env.name, **result}
    from tether.health.reward_audit import audit_summary

    audit = audit_summary(result)
    if audit is not None:  # to stderr: stdout stays one JSON object for scripts (tether experiment reads it)
        typer.echo(audit, err=True)
    typer.echo(json.dumps(result, indent=2))


def _find_run_config(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if (candidate / "config.yaml").is_file():
            return candidate / "config.yaml"
    raise typer.BadParameter(f"no config.yaml in {path} or its parents; pass --config")


@app.command()
def plot(run_dir: Path) -> None:
    """Write PNG curves of a run's metrics into RUN_DIR/plots."""
    from tether.track import plot_run

    for p in plot_run(run_dir):
        typer.echo(str(p))


@app.command()
def show(run_dir: Path, html: Annotated[bool, typer.Option(help="write RUN_DIR/transcripts.html")] = False,
         limit: int = 3) -> None:
    """Print sampled episodes turn by turn (agents), or write them as HTML."""
    from tether.rollout.transcripts import show_transcripts

    typer.echo(show_transcripts(run_dir, html=html, limit=limit))


recipe_app = typer.Typer(help="Multi-stage recipes.")
app.add_typer(recipe_app, name="recipe")


StageOverrides = Annotated[list[str] | None, typer.Option(help="KEY=VALUE override of that stage, repeatable")]


@recipe_app.command("armor")
def recipe_armor(stage1: Path, stage2: Path, stage1_override: StageOverrides = None,
                 stage2_override: StageOverrides = None) -> None:
    """ARMOR's two stages: DAPO with validation, then ARMOR from its best checkpoint (policy = reference)."""
    from tether.checks import run_checks
    from tether.recipes.armor import run_two_stage

    first, second = _load(stage1, stage1_override), _load(stage2, stage2_override)
    with _config_errors():
        run_checks(first)
        run_checks(second, policy=False)  # its policy is the checkpoint stage 1 will write
        result = run_two_stage(first, second)
    typer.echo(json.dumps(result, indent=2, default=str))


@app.command()
def sft(config: Path, overrides: Overrides = None) -> None:
    """Supervised warm start (the config's sft: section): task demonstrations, a JSONL file or an env's solver."""
    cfg = _load(config, overrides)
    from tether.checks import run_checks
    from tether.sft import run_sft

    with _config_errors():
        run_checks(cfg, sft=True)
        summary = run_sft(cfg)
    typer.echo(json.dumps(summary, indent=2, default=str))


@app.command()
def experiment(protocol: Path,
               report_only: Annotated[bool, typer.Option(help="only (re)write the report from finished runs")] = False,
               pool: Annotated[list[Path] | None, typer.Option(
                   help="a finished replication of PROTOCOL on other seeds (repeatable): report them together")] = None,
               into: Annotated[Path | None, typer.Option(help="with --pool: where the pooled report goes")] = None,
               allow_dirty: Annotated[bool, typer.Option(
                   help="run although the code's tree has uncommitted changes (the report says so)")] = False,
               publish: Annotated[Path | None, typer.Option(
                   help="a finished study: copy its report, per-seed table and lock here (docs/results/<study>)")]
               = None,
               ) -> None:
    """Run a pre-registered protocol (calibration first, then arms x seeds, separate processes, resumable) and write
    its report."""
    from tether.lab.experiment import pool_experiments, run_experiment
    from tether.lab.report import publish_report

    with _config_errors():
        if pool and into is None:
            raise ConfigError("--pool needs --into DIR, the directory of the pooled report")
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
    cfg = _load(config, overrides)
    from tether.checks import run_checks
    from tether.distributed import resolve_device
    from tether.recipes.seed_sft import run_skill_sft

    with _config_errors():
        resolve_device(cfg.train.device)  # the machine first: a missing GPU is the error to report
        run_checks(cfg)
        summary = run_skill_sft(cfg)
    typer.echo(json.dumps(summary, indent=2, default=str))


@app.command("config-docs")
def config_docs(check: Annotated[bool, typer.Option(help="only say whether docs/config.md is current (exit 1 if not)")]
                = False) -> None:
    """Write docs/config.md, the reference of every config key, from the schema."""
    from tether.config_docs import DOC_PATH, render_config_docs

    if not check:
        DOC_PATH.write_text(render_config_docs(), encoding="utf-8")
        typer.echo(str(DOC_PATH))
    elif not DOC_PATH.is_file() or DOC_PATH.read_text(encoding="utf-8") != render_config_docs():
        typer.secho(f"{DOC_PATH} is out of date: run `tether config-docs`", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)


@app.command()
def validate(config: Path, overrides: Overrides = None) -> None:
    """Check a config (names, types, ranges, component settings) and that the files, models and packages it names
    are here, without loading any model."""
    from tether.checks import run_checks

    cfg = _load(config, overrides)
    with _config_errors():
        run_checks(cfg, sft=True)
    typer.echo(f"ok: {config} ({'task ' + cfg.task.name if cfg.task else 'env ' + cfg.env.name})")


if __name__ == "__main__":
    app()
