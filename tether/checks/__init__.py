"""Every check that needs no model, run by ``tether validate`` and at the start of ``train``, ``eval``, ``sft``,
``seed-sft`` and each stage of a recipe, before a model loads or the run directory is written.

* :mod:`tether.config` reads a config and checks its schema (keys, types, ranges); of tether it imports only
  :mod:`tether.errors`.
* What the config says, against the registries (:mod:`~tether.checks.components`, :mod:`~tether.checks.workload`):
  component names and settings, each method's ``check_config``, the task's or environment's ``check_config``.
* What it names on this machine (:mod:`~tether.checks.machine`): models, data files, packages, the engine;
  inputs an earlier command writes are named with that command (``# written by:`` lines of the config).
* What ``tether train`` would otherwise find only after its model loads (:mod:`~tether.checks.startup`): the task
  built from its data (a Hub data set after one short probe of the Hub), each reward function called once on its
  first training row (by the first rank), a local model directory's contents, the device, the
  launch, the batch arithmetic.
* In ``tether validate`` only (:func:`~tether.checks.machine.probe_endpoints`): whether the servers the config calls
  (an LLM judge's, ``tether seed-sft``'s analyzer) answer, as warning lines; a start does not wait on those.

Each error is one line (key, value, what is allowed); :func:`check_config` runs every check and raises one
:class:`~tether.config.ConfigError` holding all of them. Legal but suspicious settings are warning lines.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tether.checks.components import CONFIG_CHECKS, TRAINING_CONFIG_CHECKS
from tether.checks.context import shared_tokenizers
from tether.checks.findings import Findings
from tether.checks.kwargs import check_kwarg_types, check_kwargs
from tether.checks.machine import check_model, check_models, check_workload_inputs, machine_checks
from tether.checks.startup import check_model_dirs, check_prerequisites, startup_checks
from tether.checks.workload import check_workload
from tether.config import (
    Config,
    ConfigError,
    RunConfig,
    SeedSFTRunConfig,
    SFTConfig,
    SFTRunConfig,
    SupervisedRunConfig,
    load_command_config,
)
from tether.methods.base import resolve_method_targets
from tether.user_code import import_user_modules

__all__ = ["Findings", "check_config", "check_inputs", "check_kwarg_types", "check_kwargs", "check_model",
           "load_checked_config", "run_checks"]


def _run(checks: tuple, cfg: Config, found: Findings) -> list[str]:
    errors = []
    for check in checks:
        try:
            check(cfg, found)
        except ConfigError as err:
            errors.append(str(err))
    return errors


def prerequisites(policy: bool, training: bool, sft: SFTConfig | None) -> Callable[[Config, Findings], None]:
    """:func:`~tether.checks.startup.check_prerequisites` as a check of the machine phase."""
    def check(cfg: Config, found: Findings) -> None:
        check_prerequisites(cfg, found, policy=policy, training=training, sft=sft)

    return check


def check_config(cfg: RunConfig, *, machine: bool = True, policy: bool = True, training: bool = True) -> list[str]:
    """Run the checks; return the warning lines.

    Args:
        cfg: a config that passed :func:`tether.config.load_command_config`, of any command: an SFT command's is
            checked as its :meth:`~tether.config.SupervisedRunConfig.rl_config` (what its rollouts read), plus the
            data of ``tether sft``'s ``sft`` section.
        machine: also check that what it names is on this machine (after the config checks pass, since those
            say whether the names mean anything).
        policy: check ``model.name`` too (False when the caller brings the policy).
        training: also the checks about training alone, such as the batch arithmetic's warnings and the methods'
            own checks, and of the models those the training loads: the reference and the methods' (False for
            ``tether eval``, which samples with the policy alone: a warning that its settings change nothing there
            would be noise, and a run's moved reference would refuse the evaluation of its checkpoint).

    Raises:
        ConfigError: one line per failed check.
    """
    sft = cfg.sft if isinstance(cfg, SFTRunConfig) else None
    skills = cfg.sft if isinstance(cfg, SeedSFTRunConfig) else None
    if isinstance(cfg, SupervisedRunConfig):
        cfg = cfg.rl_config()
    import_user_modules(cfg.imports)  # what they register is what the checks below look up
    resolve_method_targets(cfg.methods)  # methods: {"my_module:MyMethod": {...}}
    found = Findings()
    errors = _run((*CONFIG_CHECKS, *(TRAINING_CONFIG_CHECKS if training else ()), check_workload), cfg, found)
    with shared_tokenizers():  # the machine and startup checks read the policy's tokenizer up to three times
        if machine and not errors:
            # a missing input an earlier command writes is named with that command, instead of what is missing
            errors = _run((prerequisites(policy, training, sft),), cfg, found) or \
                _run(machine_checks(policy=policy, training=training, sft=sft, skills=skills), cfg, found)
        if machine and not errors:  # what train would otherwise find after its model loads (tether.checks.startup)
            errors = _run(startup_checks(policy=policy, training=training), cfg, found)
    if errors:
        raise ConfigError("\n".join(errors))
    return found.warnings


# What a run reads from this machine, of the machine and startup phases of check_config: each model an alias, a
# cached Hub id or a directory holding a model; the task's or environment's data
INPUT_CHECKS = (check_models, check_workload_inputs, check_model_dirs)


def check_inputs(cfg: Config) -> list[str]:
    """:data:`INPUT_CHECKS` alone, for a config whose other checks passed (an experiment's arm,
    :mod:`tether.lab.protocol_checks`): an env whose package is missing is refused here (its module must import);
    the other packages, the tokenizers and the device are each run's own start to check.
    Returns the error lines, one per failed check (none: every input is here)."""
    return _run(INPUT_CHECKS, cfg, Findings())


def run_checks(cfg: RunConfig, *, policy: bool = True, training: bool = True) -> None:
    """:func:`check_config` with the machine checks, its warnings printed to stderr (by the first rank only)."""
    warnings = check_config(cfg, policy=policy, training=training)
    if os.environ.get("RANK", "0") == "0":
        for line in warnings:
            print(f"warning: {line}", file=sys.stderr)


def load_checked_config(path: str | Path | None = None, overrides: list[str] | None = None,
                        data: dict | None = None, command: str = "train") -> Any:
    """:func:`tether.config.load_command_config` plus the checks of what the config says (not the machine's)."""
    cfg = load_command_config(command, path, overrides, data)
    check_config(cfg, machine=False)
    return cfg
