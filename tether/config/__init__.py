"""Typed run configuration: YAML files plus dotted command-line overrides, validated before any work.

Every section is a pydantic model with ``extra="forbid"``, so an unknown key, a wrong type or an
out-of-range value stops the run with one :class:`ConfigError` naming the key path, the value and
what is allowed. Method plug-ins bring their own section class (see :mod:`tether.methods`). Each command reads a
schema of its own (:data:`SCHEMAS`). This package imports nothing of tether's but :mod:`tether.errors`: the checks
that need the registries or the machine are :mod:`tether.checks`.

* :mod:`~tether.config.base`: :class:`Section` and :class:`ConfigError`;
* :mod:`~tether.config.sections`: the sections (model, task, env, rollout, algorithm, optim, val, train,
  distributed, sft, logging); :mod:`~tether.config.health`: the health checks' section;
  :mod:`~tether.config.seed_sft`: SEED stage 1's section (``sft`` of ``tether seed-sft``);
* :mod:`~tether.config.schemas`: each command's config (``tether train``'s :class:`Config`, ``tether sft``'s,
  ``tether seed-sft``'s);
* :mod:`~tether.config.loading`: reading, overrides, validation messages, the command a file is for.
"""

from __future__ import annotations

from tether.config.base import (
    ConfigError,
    Section,
)
from tether.config.health import (
    CollapseConfig,
    DegenerateConfig,
    HealthConfig,
    NoSignalConfig,
    ParityConfig,
    RewardAuditConfig,
    RoundTripConfig,
)
from tether.config.loading import (
    COMMAND_LINE,
    SYNTAX_HINTS,
    WRITTEN_BY,
    anchoring_rule,
    apply_overrides,
    config_command,
    config_for_another_command,
    did_you_mean,
    dump_config,
    first_line_command,
    load_command_config,
    load_config,
    migrate_advantage_keys,
    move_saved_keys,
    other_command,
    parse_override,
    read_yaml,
    schema_defaults,
    schema_mismatch,
    string_override,
    validation_lines,
    written_by_lines,
)
from tether.config.schemas import (
    SCHEMAS,
    STAGE_ONE_SEED_KEYS,
    Config,
    RunConfig,
    SeedSFTRunConfig,
    SFTRunConfig,
    SupervisedRunConfig,
)
from tether.config.sections import (
    DEVICE_SPEC,
    DTYPES,
    LLAMA_LINEAR,
    AlgorithmConfig,
    DeviceConfig,
    DistributedConfig,
    EnvConfig,
    KLConfig,
    LoggingConfig,
    LoraSettings,
    ModelConfig,
    OptimConfig,
    OverlongConfig,
    RewardTermConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    SamplingConfig,
    SFTConfig,
    SFTSettings,
    SFTTrainConfig,
    TaskConfig,
    TrainConfig,
    ValConfig,
)
from tether.config.seed_sft import (
    OpenAISettings,
    SkillSFTSettings,
)

__all__ = [
    "COMMAND_LINE",
    "DEVICE_SPEC",
    "DTYPES",
    "LLAMA_LINEAR",
    "SCHEMAS",
    "STAGE_ONE_SEED_KEYS",
    "SYNTAX_HINTS",
    "WRITTEN_BY",
    "AlgorithmConfig",
    "CollapseConfig",
    "Config",
    "ConfigError",
    "DegenerateConfig",
    "DeviceConfig",
    "DistributedConfig",
    "EnvConfig",
    "HealthConfig",
    "KLConfig",
    "LoggingConfig",
    "LoraSettings",
    "ModelConfig",
    "NoSignalConfig",
    "OpenAISettings",
    "OptimConfig",
    "OverlongConfig",
    "ParityConfig",
    "RewardAuditConfig",
    "RewardTermConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "RoundTripConfig",
    "RunConfig",
    "SFTConfig",
    "SFTRunConfig",
    "SFTSettings",
    "SFTTrainConfig",
    "SamplingConfig",
    "Section",
    "SeedSFTRunConfig",
    "SkillSFTSettings",
    "SupervisedRunConfig",
    "TaskConfig",
    "TrainConfig",
    "ValConfig",
    "anchoring_rule",
    "apply_overrides",
    "config_command",
    "config_for_another_command",
    "did_you_mean",
    "dump_config",
    "first_line_command",
    "load_command_config",
    "load_config",
    "migrate_advantage_keys",
    "move_saved_keys",
    "other_command",
    "parse_override",
    "read_yaml",
    "schema_defaults",
    "schema_mismatch",
    "string_override",
    "validation_lines",
    "written_by_lines",
]
