"""The ``health`` section: the run health checks (docs/health.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from tether.config.base import Section


class ParityConfig(Section):
    """Engine-trainer parity: the engine's recorded log-probs of the sampled tokens against the trainer's."""

    enabled: bool = Field(True, description="compare every step (free: it reuses the old log-probs or the update's "
                          "own forward pass)")
    tolerance: float = Field(0.1, gt=0, description="a token mismatches when its log-prob gap exceeds this (nats)")
    max_mismatch_frac: float = Field(0.05, ge=0, le=1, description="a step is bad when more than this share of "
                                     "its compared tokens mismatch")
    patience: int = Field(3, ge=0, description="consecutive bad steps that stop the run (0: only log)")


class RoundTripConfig(Section):
    """Token round trip: the trained (prompt, response) ids are exactly what the engine was given and sampled."""

    enabled: bool = Field(True, description="refuse to train on a row whose ids or loss mask differ from what the "
                          "engine saw and sampled")


class RewardAuditConfig(Section):
    """No answer extracted vs. a wrong answer vs. a scorer fault, per step (single-turn tasks)."""

    enabled: bool = Field(True, description="count the shares per step, write examples, warn")
    warn_no_answer_frac: float = Field(0.5, ge=0, le=1, description="warn (once per run) when at least this share "
                                       "of rows has no extractable answer and they outnumber the wrong answers")
    examples: int = Field(3, ge=0, description="rows without an answer written per step to "
                          "run_dir/health/no_answer.jsonl")


class CollapseConfig(Section):
    """Over-optimisation guard: validation falls from its peak while the training reward rises."""

    action: Literal["off", "warn", "stop"] = Field(
        "warn", description="what to do on a collapse: off; warn; stop the run (the peak's weights stay in "
        "checkpoints/best). ARMOR from the peak after a collapse: tether recipe armor CONFIG --after-collapse")
    drop: float = Field(0.05, ge=0, description="how far below its peak train.best_metric must be to count")
    patience: int = Field(3, ge=1, description="consecutive validations below peak - drop that make a collapse")

    @field_validator("action", mode="before")
    @classmethod
    def _armor_moved(cls, action: object) -> object:
        if action == "armor":  # the action of earlier versions, now a recipe option (issue 37)
            raise ValueError("'armor' is no longer a health action: ARMOR after a collapse is an option of the ARMOR "
                             "recipe, `tether recipe armor CONFIG --after-collapse` (docs/methods/armor.md); set "
                             "health.collapse.action to warn or stop (or remove it) and run that command")
        return action


class DegenerateConfig(Section):
    """A collapsed policy: entropy at its maximum or near zero, or a gradient norm of exactly 0, step after step."""

    enabled: bool = Field(True, description="log health/degenerate_steps and warn once per run of collapsed steps")
    patience: int = Field(5, ge=1, description="collapsed steps in a row that warn")
    max_entropy_frac: float = Field(0.99, gt=0, le=1, description="an entropy of at least this share of "
                                    "log(vocabulary size), after a step below it, counts as uniform sampling")
    min_entropy: float = Field(1e-3, ge=0, description="an entropy (nats per response token) at most this counts as "
                               "deterministic sampling")


class NoSignalConfig(Section):
    """A run in which nothing trains: every advantage 0 (equal or non-finite rewards, masked rows), step after step."""

    action: Literal["off", "warn", "stop"] = Field("stop", description="after `patience` such steps in a row: stop "
                                                   "the run (exit code 3), warn once, or off")
    patience: int = Field(10, ge=1, description="steps in a row whose every advantage is 0 before the action")

    @field_validator("action", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false


class HealthConfig(Section):
    """Run health checks (docs/health.md)."""

    parity: ParityConfig = Field(default_factory=ParityConfig, description="engine-trainer parity")
    round_trip: RoundTripConfig = Field(default_factory=RoundTripConfig, description="token round trip")
    reward_audit: RewardAuditConfig = Field(default_factory=RewardAuditConfig, description="reward audit")
    collapse: CollapseConfig = Field(default_factory=CollapseConfig, description="over-optimisation guard")
    degenerate: DegenerateConfig = Field(default_factory=DegenerateConfig, description="collapsed-policy warning")
    no_signal: NoSignalConfig = Field(default_factory=NoSignalConfig, description="the nothing-trains stop")
