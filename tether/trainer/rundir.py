"""What a training start finds in its run directory, settled before any model loads.

One process writes a run directory at a time (:func:`lock_run_dir`). Where a run starts is
``train.resume`` (:func:`plan_start`): ``auto`` continues from the newest checkpoint that verifies, else
starts at step 0; ``never`` starts at step 0; ``must`` continues or stops. Nothing of an earlier run is
deleted unless ``train.overwrite`` says so: a start at step 0 over an earlier run is refused with one line.
The start prints what it does ("resuming runs/x at step 50", "starting runs/x"). Settings that change what
the run means must match the run being resumed (:data:`MEANING_KEYS`). Metric rows logged after the resumed
step are dropped, so a resumed run's ``metrics.jsonl`` reads as if it had never stopped.

:func:`check_run_dir` is the same decision without touching anything, for ``tether validate``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from tether.config import Config, RunConfig, dump_config, move_saved_keys, read_yaml, schema_defaults
from tether.distributed import DataParallel
from tether.methods import METHODS
from tether.provenance import PROVENANCE, record_provenance
from tether.start import RunDirError, lock_run_dir
from tether.track import TENSORBOARD_DIR, write_text_atomic
from tether.track.progress import status
from tether.trainer.checkpoint import STEP_DIR, CheckpointManager, checkpoint_problem, dir_step

# Settings whose change would make a resumed run a different experiment than the one its checkpoint belongs to
# (the optimiser's restored state would also silently keep the old learning rate). A key covers its sub-keys.
MEANING_KEYS = (
    "seed", "model.name", "model.ref_name", "task", "env", "rollout.prompts_per_step", "rollout.group_size",
    "rollout.max_new_tokens", "rollout.temperature", "rollout.top_p", "rollout.top_k", "rollout.dynamic_sampling",
    "rollout.overlong", "algorithm", "optim.lr", "optim.betas", "optim.weight_decay", "optim.warmup_steps",
    "optim.grad_clip", "optim.mini_batches", "optim.ppo_epochs", "methods", "distributed.strategy",
)

def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay leaves."""
    if not isinstance(data, dict) or (prefix and not data):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


class SettingDefaults(NamedTuple):
    """What a config holds where it does not write a key (:func:`setting_defaults`): ``schema``, its command's
    defaults (nested, JSON values), and ``methods``, the defaults of each method's settings by its name (a config's
    ``methods.<name>`` holds only what it writes)."""

    schema: dict[str, Any]
    methods: dict[str, dict[str, Any]]


def setting_defaults(schema: type[RunConfig], methods: Iterable[str] = ()) -> SettingDefaults:
    """The defaults of a command's ``schema`` and of the ``methods`` a config of it names."""
    return SettingDefaults(schema_defaults(schema),
                           {name: schema_defaults(METHODS[name].Settings) for name in methods if name in METHODS})


def config_defaults(cfg: RunConfig) -> SettingDefaults:
    """:func:`setting_defaults` of ``cfg``'s command and methods."""
    return setting_defaults(type(cfg), getattr(cfg, "methods", {}))


def _fill(data: dict[str, Any], defaults: dict[str, Any]) -> None:
    for key, default in defaults.items():
        if key not in data:
            data[key] = copy.deepcopy(default)
        elif isinstance(data[key], dict) and isinstance(default, dict):
            _fill(data[key], default)


def fill_defaults(config: dict[str, Any], defaults: SettingDefaults) -> dict[str, Any]:
    """A copy of a config (as JSON) with each key it lacks at its default, and a method's at the method's: a setting
    added after a run started is absent from its ``config.yaml``, and the older tether ran as its default does."""
    config = copy.deepcopy(config)
    _fill(config, defaults.schema)
    methods = config.get("methods")
    for name, method in (methods.items() if isinstance(methods, dict) else ()):
        if isinstance(method, dict):
            _fill(method, defaults.methods.get(name, {}))
    return config


def with_defaults(settings: dict[str, Any], defaults: SettingDefaults) -> dict[str, Any]:
    """:func:`fill_defaults` of flat ``settings`` (:func:`flat`), flat."""
    nested: dict[str, Any] = {}
    for key, value in settings.items():
        *parents, last = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return flat(fill_defaults(nested, defaults))


def changed_setting(old: dict[str, Any], new: dict[str, Any], defaults: SettingDefaults,
                    compared: Callable[[str], bool] = lambda key: True) -> tuple[str, Any, Any] | None:
    """The first of the ``compared`` flat keys whose value differs between ``old`` and ``new``, each read with its
    missing keys at their defaults (:func:`with_defaults`), as (key, new value, old value); or None."""
    old, new = with_defaults(old, defaults), with_defaults(new, defaults)
    for key in sorted(set(old) | set(new)):
        if compared(key) and old.get(key) != new.get(key) and not _emptied(key, old, new):
            return key, new.get(key), old.get(key)
    return None


def _emptied(key: str, old: dict[str, Any], new: dict[str, Any]) -> bool:
    """``key`` is an empty mapping on one side (a leaf of :func:`flat`) and a mapping with keys on the other: its
    keys are compared one by one, which names the one that changed."""
    def keys_under(side: dict[str, Any]) -> bool:
        return any(k.startswith(key + ".") for k in side)

    return (old.get(key) == {} and keys_under(new)) or (new.get(key) == {} and keys_under(old))


def is_meaning_key(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in MEANING_KEYS)


def check_resume_settings(cfg: Config, saved_config: Path) -> None:
    """Refuse to resume with a setting of :data:`MEANING_KEYS` changed from the run's ``config.yaml``. That file may
    be an older tether's: its moved keys are read at their new places, its missing ones as their defaults.

    Raises:
        RunDirError: the first changed setting, its two values and the ways out.
    """
    if not saved_config.is_file():
        return
    old = flat(move_saved_keys(_saved_settings(saved_config), "train"))
    new = flat(cfg.model_dump(mode="json"))
    change = changed_setting(old, new, config_defaults(cfg), is_meaning_key)
    if change is not None:
        key, now, was = change
        raise RunDirError(f"{key}: {now!r} differs from {was!r} in the run being resumed ({saved_config}); set it "
                          "back, or set another run_dir (or start afresh over this one: train.resume=never "
                          "train.overwrite=true deletes it)")


def _saved_settings(saved_config: Path) -> dict[str, Any]:
    """The settings a run's ``config.yaml`` records.

    Raises:
        RunDirError: the file is not a YAML mapping (edited by hand, emptied): compared with nothing, every setting
            would read as changed (``'grpo' differs from None``), and a YAML error was a traceback.
    """
    try:
        saved = read_yaml(saved_config.read_text(encoding="utf-8"))
        problem = None if isinstance(saved, dict) else f"holds {type(saved).__name__}, not the run's settings"
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        saved, problem = None, f"line {mark.line + 1 if mark else '?'}: {err.problem or err.context}"
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        saved, problem = None, " ".join(str(err).split())
    if problem is not None:
        raise RunDirError(f"{saved_config} cannot be read ({problem}); it records the settings of the run being "
                          "resumed: repair it, or delete it to resume without comparing settings, or set another "
                          "run_dir (or start afresh over this one: train.resume=never train.overwrite=true deletes it)")
    return saved


# the samples `tether show` reads, one row per sampled group with the 0-based `step` it was sampled in: the rows of
# steps a resumed run replays go, as metric rows do, or the replay would show each of them twice
SAMPLE_LOGS = ("samples.jsonl", "transcripts.jsonl")


def truncate_metrics(path: Path, through_step: int) -> None:
    """Keep the rows of a JSONL log with a ``step`` (``metrics.jsonl``, :data:`SAMPLE_LOGS`) up to ``through_step``:
    the later ones are logged again after a resume. A torn line (a kill mid-write) goes too."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= through_step:
            kept.append(line + "\n")
    write_text_atomic(path, "".join(kept))


def _earlier_run(run_dir: Path, checkpoints: CheckpointManager) -> str | None:
    """What in ``run_dir`` shows an earlier run (step checkpoints, metric rows), or None."""
    steps = checkpoints.step_dirs()
    damaged = [f"{p.name}: {problem}" for p in steps if (problem := checkpoint_problem(p)) is not None]
    if damaged:
        return "damaged checkpoints (" + "; ".join(damaged) + ")"
    if steps:
        return f"checkpoints up to {steps[0].name}"
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size:
        return "metrics.jsonl but no checkpoint"
    return None


def _start_afresh(run_dir: Path, checkpoints: CheckpointManager) -> None:
    """``train.overwrite``: the earlier run's checkpoints, metric rows, ``provenance.json`` and TensorBoard events go,
    so nothing of it is resumed, evaluated or plotted as this run's later (TensorBoard would show the earlier run's
    values beside the new ones at the same steps)."""
    for path in [*checkpoints.step_dirs(), checkpoints.root / "best"]:
        if path.is_dir():
            shutil.rmtree(path)
    (checkpoints.root / "latest").unlink(missing_ok=True)
    for name in ("best.txt", PROVENANCE):
        (run_dir / name).unlink(missing_ok=True)
    for name in ("metrics.jsonl", *SAMPLE_LOGS):
        truncate_metrics(run_dir / name, -1)
    shutil.rmtree(run_dir / TENSORBOARD_DIR, ignore_errors=True)


def check_layout(run_dir: Path) -> None:
    """``run_dir`` can hold a run: not a file, its ``checkpoints`` not a file, writable where it will be created.

    Raises:
        RunDirError: the first problem, with the path.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run_dir {run_dir} is a file, not a directory; move it away or set another run_dir")
    checkpoints = run_dir / "checkpoints"
    if checkpoints.exists() and not checkpoints.is_dir():
        raise RunDirError(f"{checkpoints} is a file, not the run's checkpoint directory; move it away or set "
                          "another run_dir")
    existing = next(p for p in (run_dir, *run_dir.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise RunDirError(f"run_dir {run_dir}: {existing} is not writable; set another run_dir")


def _latest_pointer_problem(checkpoints: CheckpointManager) -> str | None:
    """What is wrong with ``checkpoints/latest`` (garbage, or naming a missing directory), or None. A resume does
    not need it (the newest step directory that verifies is taken), but a broken one is worth a line."""
    pointer = checkpoints.root / "latest"
    if not pointer.is_file():
        return None
    name = pointer.read_text(errors="replace").strip()
    if not STEP_DIR.fullmatch(name):
        return f"{pointer} holds {name[:40]!r}, not a step directory's name; it is ignored"
    if not (checkpoints.root / name).is_dir():
        return f"{pointer} names {name}, which does not exist; it is ignored"
    return None


def plan_start(cfg: Config, checkpoints: CheckpointManager) -> Path | None:
    """Where the run starts under ``train.resume``, deciding only (nothing is written or removed).

    Returns:
        The checkpoint to resume from, or None to start at step 0 (over an earlier run only with
        ``train.overwrite``).

    Raises:
        RunDirError: the layout is wrong (:func:`check_layout`); ``must`` and nothing to resume; a start at step 0
            over an earlier run without ``train.overwrite``; the run being resumed had other settings.
    """
    run_dir, policy = Path(cfg.run_dir), cfg.train.resume
    check_layout(run_dir)
    if (problem := _latest_pointer_problem(checkpoints)) is not None:
        warnings.warn(problem, stacklevel=2)
    start = checkpoints.resumable() if policy != "never" else None
    if start is not None:
        check_resume_settings(cfg, run_dir / "config.yaml")
        return start
    found = _earlier_run(run_dir, checkpoints)
    if policy == "must":
        raise RunDirError(f"train.resume=must but run_dir {run_dir} has no checkpoint to resume"
                          + (f" (it holds {found})" if found else ""))
    if found is not None and not cfg.train.overwrite:
        why = "nothing to resume" if policy == "auto" else "train.resume=never starts at step 0"
        raise RunDirError(f"run_dir {run_dir} holds an earlier run with {found}: {why}; set another run_dir, or "
                          "add train.overwrite=true to delete that run's checkpoints and metrics")
    return None


def start_line(run_dir: Path, start: Path | None, overwrites: bool, *, would: bool = False) -> str:
    """What the start says: "resuming runs/x at step 50", "starting runs/x" (``would``: "would resume ...")."""
    resume, begin = ("would resume", "would start") if would else ("resuming", "starting")
    if start is not None:
        return f"{resume} {run_dir} at step {dir_step(start)}"
    return f"{begin} {run_dir}" + (" (the earlier run in it is deleted: train.overwrite)" if overwrites else "")


def check_run_dir(cfg: Config) -> str:
    """:func:`plan_start` for ``tether validate``: the same checks, nothing touched.

    Returns:
        What a start would do, e.g. "would resume runs/x at step 50".

    Raises:
        RunDirError: what would stop the start.
    """
    run_dir = Path(cfg.run_dir)
    checkpoints = CheckpointManager(run_dir, cfg.train.keep_last)
    if (done := finished_summary(cfg)) is not None:
        return f"{run_dir} is finished at step {done['steps']}: train would do nothing"
    start = plan_start(cfg, checkpoints)
    overwrites = start is None and _earlier_run(run_dir, checkpoints) is not None
    return start_line(run_dir, start, overwrites, would=True)


def finished_summary(cfg: Config) -> dict[str, Any] | None:
    """The summary of the run in ``cfg.run_dir`` when it has run to ``train.steps`` with these settings, else None:
    the same command again has nothing to do, and ``tether train`` says so without loading a model. The checks of
    a resume run first (:func:`plan_start`: a changed setting is refused), and a run a health check stopped early,
    whose summary is written too, is not finished. Under ``torchrun`` the ranks' collective start decides instead.
    """
    run_dir = Path(cfg.run_dir)
    summary_path = run_dir / "summary.json"
    if cfg.train.resume == "never" or not summary_path.is_file() or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return None
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):  # a damaged summary: the resume path writes it again
        return None
    steps = summary.get("steps") if isinstance(summary, dict) else None
    checkpoints = CheckpointManager(run_dir, cfg.train.keep_last)
    newest = checkpoints.step_dirs()[:1]
    # by name first: verifying a checkpoint hashes it, which a run that is not finished leaves to its start
    if not isinstance(steps, int) or steps < cfg.train.steps or [dir_step(d) for d in newest] != [steps]:
        return None
    start = plan_start(cfg, checkpoints)
    return summary if start is not None and dir_step(start) == steps else None


def prepare_run_dir(cfg: Config, checkpoints: CheckpointManager, dp: DataParallel) -> Path | None:
    """Lock and tidy ``cfg.run_dir``, choose where the run starts (:func:`plan_start`), say it, and write its
    ``config.yaml`` and this start's entry of ``provenance.json`` (:func:`~tether.provenance.record_provenance`).

    Collective under ``torchrun`` (rank 0 writes, every rank reads the same choice).

    Returns:
        The checkpoint to resume from, or None to start at step 0.

    Raises:
        RunDirError: the directory is unwritable or used by another process, or holds an earlier run that cannot
            be resumed and may not be overwritten, or the run being resumed had other settings.
    """
    run_dir = Path(cfg.run_dir)
    if cfg.train.resume == "must" and not run_dir.exists():  # a misspelt run_dir: refused before it is made
        raise RunDirError(f"train.resume=must but run_dir {run_dir} has no checkpoint to resume (it does not exist)")
    if dp.is_main:
        try:
            check_layout(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            lock_run_dir(run_dir)
            for tmp in run_dir.glob(".*.tmp.*"):  # write_text_atomic's temporaries, left by a kill
                tmp.unlink()
            checkpoints.recover()
        except OSError as err:
            raise RunDirError(f"run_dir {run_dir}: {err.strerror or err} ({err.filename or run_dir})") from None
    dp.barrier()
    # every rank reads the same directory; rank 0 alone checks, warns and raises
    start = plan_start(cfg, checkpoints) if dp.is_main else (
        checkpoints.resumable(warn=False) if cfg.train.resume != "never" else None)
    if dp.is_main:
        overwrites = start is None and _earlier_run(run_dir, checkpoints) is not None
        if start is not None:
            truncate_metrics(run_dir / "metrics.jsonl", dir_step(start))
            for name in SAMPLE_LOGS:  # sampled in step s + 1: the steps after the checkpoint's are replayed
                truncate_metrics(run_dir / name, dir_step(start) - 1)
        elif overwrites:
            _start_afresh(run_dir, checkpoints)
        status(start_line(run_dir, start, overwrites))
        write_text_atomic(run_dir / "config.yaml", dump_config(cfg))
        record_provenance(run_dir, dir_step(start) if start is not None else 0)
    dp.barrier()
    return start
