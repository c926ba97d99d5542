"""An experiment's protocol (docs/lab.md): the schema of ``PROTOCOL.yaml`` and where each (arm, seed) run lives.

:mod:`tether.lab.experiment` runs the protocol and :mod:`tether.lab.report` reports it; both read it from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tether.checks import load_checked_config
from tether.config import Config, ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Arm(_Strict):
    config: str = Field(description="a tether train config (path relative to the working directory)")
    overrides: list[str] = Field(default_factory=list, description="dotted overrides, as on the command line")


class Endpoint(_Strict):
    metric: str = Field("val/avg@k", description="a validation metric (what tether eval prints)")
    split: str = Field("report", description="the task split it is measured on; never the selection split 'val' "
                       "when at=best")
    at: Literal["best", "final"] = Field("best", description="best: the checkpoint chosen on the selection split "
                                         "(train.best_metric); final: the last step")
    overrides: list[str] = Field(default_factory=list, description="overrides of the endpoint evaluation, e.g. "
                                 "val.samples=8")


class Protocol(_Strict):
    name: str
    question: str = Field("", description="what the experiment asks, in one sentence")
    seeds: list[int] = Field(min_length=1)
    arms: dict[str, Arm] = Field(min_length=1)
    baseline: str
    endpoint: Endpoint = Field(default_factory=Endpoint)
    secondary: list[str] = Field(default_factory=list, description="other endpoint metrics, same split and point")
    comparisons: list[str] | None = Field(None, description="arms compared with the baseline (default: all others)")
    paper_effect: float | None = Field(None, gt=0, description="the effect size the claim predicts, in endpoint "
                                       "units; a difference interval inside +-paper_effect is 'no effect of the "
                                       "paper's size'")
    run_root: str
    parallel: int = Field(2, ge=1, description="runs at once, one thread each")

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        repeated = sorted({s for s in seeds if seeds.count(s) > 1})
        if repeated:
            raise ValueError(f"seed(s) {repeated} appear more than once")
        return seeds

    @model_validator(mode="after")
    def _known_arms(self) -> Protocol:
        if self.baseline not in self.arms:
            raise ValueError(f"baseline {self.baseline!r} is not an arm; arms: {', '.join(self.arms)}")
        unknown = [a for a in self.comparisons or () if a not in self.arms]
        if unknown:
            raise ValueError(f"comparisons name unknown arm(s) {unknown}; arms: {', '.join(self.arms)}")
        return self

    def compared(self) -> list[str]:
        return self.comparisons or [a for a in self.arms if a != self.baseline]


def load_protocol(path: str | Path) -> Protocol:
    """Read and validate a protocol file; one :class:`ConfigError` naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"protocol file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
        return Protocol.model_validate(data)
    except yaml.YAMLError as err:
        raise ConfigError(f"protocol {path}: not valid YAML ({err})") from None
    except ValidationError as err:
        lines = [f"  {'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors()]
        raise ConfigError(f"protocol {path} is invalid:\n" + "\n".join(lines)) from None


def arm_config(protocol: Protocol, arm: str, seed: int) -> Config:
    """The validated config of one run; a bad arm is one error naming the arm."""
    a = protocol.arms[arm]
    try:
        return load_checked_config(a.config, [*a.overrides, *run_overrides(protocol, arm, seed)])
    except ConfigError as err:
        raise ConfigError(f"arm {arm!r} ({a.config}): {err}") from None


def run_overrides(protocol: Protocol, arm: str, seed: int) -> list[str]:
    return [f"seed={seed}", f"run_dir={run_dir(protocol, arm, seed)}", "train.threads=1", "logging.progress=false"]


def run_dir(protocol: Protocol, arm: str, seed: int) -> Path:
    return Path(protocol.run_root) / arm / f"seed{seed}"
