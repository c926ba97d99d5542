"""Each command's config, one schema each (:data:`SCHEMAS`): ``tether train``'s RL :class:`Config`, and the
schemas of ``tether sft`` and ``tether seed-sft``, which share its top-level keys and workload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, model_validator

from tether.config.base import Section
from tether.config.health import HealthConfig
from tether.config.sections import (
    AlgorithmConfig,
    DistributedConfig,
    EnvConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    SamplingConfig,
    SFTConfig,
    SFTTrainConfig,
    TaskConfig,
    TrainConfig,
    ValConfig,
)
from tether.config.seed_sft import SkillSFTSettings


class RunConfig(Section):
    """What every command's config starts with: the seed, the run directory, the policy, the workload."""

    imports: list[str] = Field(default_factory=list, description="Python modules (my_pkg.rewards) or .py files "
                               "(relative to the config file's folder; set on the command line, to the working "
                               "directory) imported before any check, so the tasks, "
                               "environments, reward functions, estimators, losses and methods they register are "
                               "known (docs/tasks.md)")
    seed: int = Field(0, description="run seed: sampling seeds are functions of (seed, step, purpose)")
    run_dir: str = Field("runs/default", description="where config.yaml, metrics, checkpoints and logs go")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the policy and its reference")
    task: TaskConfig | None = Field(None, description="single-turn workload (set this or env)")
    env: EnvConfig | None = Field(None, description="multi-turn agent workload (set this or task)")
    # the commands that write this config's inputs, from its "# written by: COMMAND" lines (tether.checks.startup)
    _written_by: list[str] = PrivateAttr(default_factory=list)
    # the folder of the config file it was read from (None: built from data), for the message about a data path
    # that is beside the config file but not in the working directory (tether.checks.workload)
    _config_dir: Path | None = PrivateAttr(None)

    def __eq__(self, other: object) -> bool:
        """Configs are equal when their settings are: the file one was read from (its private attributes, its
        ``# written by:`` lines and folder) is not a setting, so a run's ``config.yaml`` read back equals the config
        that wrote it."""
        if not isinstance(other, RunConfig):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # mutable, as pydantic models are

    @property
    def written_by(self) -> list[str]:
        """Commands that write the checkpoints or data this config reads, as its ``# written by:`` lines say."""
        return list(self._written_by)

    @property
    def config_dir(self) -> Path | None:
        """The absolute folder of the config file this was read from, or None (built from a dict)."""
        return self._config_dir

    @model_validator(mode="before")
    @classmethod
    def _task_limit_with_a_task(cls, data: Any) -> Any:
        """``task.timeout_s`` set on an env run makes a ``task`` section of that key alone, which read as a task
        without a name ("task.name: Field required"): say which limits an env run has instead."""
        task = data.get("task") if isinstance(data, dict) else None
        if isinstance(task, dict) and set(task) == {"timeout_s"} and data.get("env") is not None:
            raise ValueError("task.timeout_s limits a task's own scoring, and this run has an env, not a task: an "
                             "env's calls are limited by env.timeout_s and env.reset_timeout_s")
        return data

    @model_validator(mode="after")
    def _one_workload(self) -> RunConfig:
        if (self.task is None) == (self.env is None):
            raise ValueError("set exactly one of 'task' (single-turn) or 'env' (multi-turn agent)")
        return self


class Config(RunConfig):
    """``tether train`` (and ``eval``, ``recipe``): the RL run."""

    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="sampling of training batches")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="advantage, loss, KL, "
                                       "entropy")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="optimiser and batch cutting")
    val: ValConfig = Field(default_factory=ValConfig, description="validation on held-out prompts")
    train: TrainConfig = Field(default_factory=TrainConfig, description="the run: steps, checkpoints, device")
    distributed: DistributedConfig = Field(default_factory=DistributedConfig, description="layout over the "
                                           "ranks of a torchrun launch")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="metric sinks")
    health: HealthConfig = Field(default_factory=HealthConfig, description="run health checks (docs/health.md)")
    methods: dict[str, dict[str, Any]] = Field(default_factory=dict, description="plug-in name -> its settings")


class SupervisedRunConfig(RunConfig):
    """The sections ``tether sft`` and ``tether seed-sft`` share: where they run, how they sample, what they log."""

    rollout: SamplingConfig = Field(default_factory=SamplingConfig, description="how the policy samples, where the "
                                    "command samples")
    train: SFTTrainConfig = Field(default_factory=SFTTrainConfig, description="where the command runs; resuming "
                                  "an earlier run in run_dir")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="metric sinks")

    def rl_config(self) -> Config:
        """This config's sections in an RL :class:`Config`, every other section at its default: the collectors
        that roll the policy out and the checks of :mod:`tether.checks` read that."""
        cfg = Config.model_validate(self.model_dump(exclude={"sft"}))
        cfg._written_by, cfg._config_dir = self.written_by, self.config_dir
        return cfg


class SFTRunConfig(SupervisedRunConfig):
    """``tether sft``: supervised fine-tuning on the data ``sft`` names."""

    sft: SFTConfig = Field(description="the data and the hyperparameters")


# The methods.seed keys stage 1 reads: the analyzer prompt's options (tether.methods.seed.SeedSettings), which both
# stages share; the other keys are stage 2's.
STAGE_ONE_SEED_KEYS = ("analysis_max_new_tokens", "analysis_context_length", "include_summary", "success_threshold")


class SeedSFTRunConfig(SupervisedRunConfig):
    """``tether seed-sft``: SEED's stage 1 on an agent environment (``env``); its settings are ``sft``, and the
    analyzer prompt options it shares with stage 2 are ``methods.seed`` (docs/methods/seed.md)."""

    sft: SkillSFTSettings = Field(description="stage 1: the rollouts, the analyzer that labels them, the SFT")
    methods: dict[str, dict[str, Any]] = Field(default_factory=dict, description="seed: the SEED method's "
                                               "settings that stage 2 shares (the analyzer prompt's options: "
                                               f"{', '.join(STAGE_ONE_SEED_KEYS)})")

    @model_validator(mode="after")
    def _seed_on_an_env(self) -> SeedSFTRunConfig:
        if self.env is None:
            raise ValueError("tether seed-sft rolls out an agent: set env (not task)")
        if set(self.methods) - {"seed"}:
            raise ValueError(f"methods: tether seed-sft reads methods.seed only, got {', '.join(sorted(self.methods))}")
        stage_two = [key for key in self.methods.get("seed", {}) if key not in STAGE_ONE_SEED_KEYS]
        if stage_two:
            raise ValueError(f"methods.seed.{', methods.seed.'.join(stage_two)}: settings of stage 2 (`tether "
                             "train`), which `tether seed-sft` does not read: of methods.seed it reads "
                             f"{', '.join(STAGE_ONE_SEED_KEYS)} only; stage 1's own settings are under sft")
        return self


# The schema of each command's config; `tether eval` and `tether recipe` read train's.
SCHEMAS: dict[str, type[RunConfig]] = {"train": Config, "sft": SFTRunConfig, "seed-sft": SeedSFTRunConfig}
