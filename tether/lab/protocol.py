"""An experiment's protocol (docs/lab.md): the schema of ``PROTOCOL.yaml`` and where each (arm, seed) run lives.

Besides the arms, seeds and endpoint, a protocol states its test size with the derivation (``test_size``) and a
calibration (``calibration``): the movement of the endpoint on the selection split that must be seen before any
comparison runs, so a setting that cannot show an effect of the test size never reaches one.

:mod:`tether.lab.experiment` runs the protocol and :mod:`tether.lab.report` reports it; both read it from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from tether.checks import load_checked_config
from tether.config import (
    Config,
    ConfigError,
    config_for_another_command,
    schema_mismatch,
    string_override,
    written_by_lines,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Arm(_Strict):
    config: str = Field(description="a tether train config (path relative to the working directory)")
    overrides: list[str] = Field(default_factory=list, description="dotted overrides, as on the command line")
    seeds: list[int] | None = Field(None, min_length=1, description="the seeds this arm runs, default the "
                                    "protocol's; only for an arm that is neither the baseline nor compared (a "
                                    "comparison is paired over every seed), e.g. a positive control run on the "
                                    "calibration's seeds")


class Endpoint(_Strict):
    metric: str = Field("val/avg@k", description="a validation metric (what tether eval prints); higher is better, "
                        "as train.best_metric is maximised")
    split: str = Field("report", description="the task split it is measured on; never the selection split 'val' "
                       "when at=best")
    at: Literal["best", "final"] = Field("best", description="best: the checkpoint chosen on the selection split "
                                         "(train.best_metric); final: the last step")
    start_selectable: bool = Field(False, description="at=best may choose the starting checkpoint (step 0); off, "
                                   "every run gets train.best_from_step=1")
    overrides: list[str] = Field(default_factory=list, description="overrides of the endpoint evaluation, e.g. "
                                 "val.samples=8")


class TestSize(_Strict):
    """The smallest effect the study must be able to detect, and where the number comes from."""

    __test__ = False  # not a pytest class

    delta: float = Field(gt=0, description="in endpoint units, absolute")
    derivation: str = Field(min_length=1, description="how delta was obtained, in words")
    paper_relative_gain: float | None = Field(None, gt=0, description="the paper's relative gain (0.16 = +16%)")
    paper_rows: str | None = Field(None, description="the paper's table and rows the gain comes from")
    setting_baseline: float | None = Field(None, gt=0, description="this setting's baseline value the gain is "
                                           "applied to: delta = paper_relative_gain x setting_baseline")
    added_after_registration: str | None = Field(None, description="set when this section was written after the "
                                                 "study was registered: when and why")
    pilot_sd: float | None = Field(None, gt=0, description="the standard deviation over seeds of paired differences "
                                   "(arm - baseline, endpoint units) measured before registration, in this setting: "
                                   "registration refuses seeds whose MDE at it exceeds delta")
    pilot_source: str | None = Field(None, description="where pilot_sd was measured (a pilot, an earlier study)")
    underpowered: str | None = Field(None, description="registers seeds whose MDE at pilot_sd exceeds delta: why the "
                                     "study runs anyway (the report prints it)")

    @model_validator(mode="after")
    def _derived(self) -> TestSize:
        given = [self.paper_relative_gain is not None, self.paper_rows is not None, self.setting_baseline is not None]
        if any(given) and not all(given):
            raise ValueError("paper_relative_gain, paper_rows and setting_baseline go together (all or none)")
        if (self.pilot_sd is None) != (self.pilot_source is None):
            raise ValueError("pilot_sd and pilot_source go together (both or neither)")
        if self.underpowered is not None and self.pilot_sd is None:
            raise ValueError("underpowered acknowledges an MDE above delta at pilot_sd: it needs pilot_sd")
        if all(given):
            derived = self.paper_relative_gain * self.setting_baseline
            if abs(derived - self.delta) > DELTA_ROUNDING:
                raise ValueError(f"delta={self.delta} but paper_relative_gain x setting_baseline = {derived:.4f}")
        return self


DELTA_ROUNDING = 0.005  # how far a stated delta may sit from gain x baseline (rounded to two decimals)


class Calibration(_Strict):
    """What must move the endpoint on the selection split before any comparison runs."""

    kind: Literal["positive_control", "fall", "rise"] = Field(
        description="positive_control: arm minus baseline at the endpoint step; fall: arm's start minus its "
        "endpoint (a collapse study's premise); rise: arm's last step minus its start (never the best step)")
    arm: str | None = Field(None, description="the arm measured (positive_control: required, not the baseline; "
                            "fall, rise: default the baseline)")
    min_movement: float = Field(gt=0, description="the mean movement over seeds it must reach, its 95% interval "
                                "above 0: at least test_size.delta (fall: at least 2 x delta)")
    seeds: list[int] | None = Field(None, min_length=1, description="default: the protocol's seeds")
    why: str = Field(min_length=1, description="why this movement shows the setting can show the test size")
    added_after_registration: str | None = Field(None, description="set when this section was written after the "
                                                 "study was registered: when and why")

    def measured_arm(self, baseline: str) -> str:
        return self.arm or baseline

    def end_at(self, endpoint_at: str) -> str:
        """Where the movement's end is read: the endpoint's checkpoint rule, except a rise's, always the last step.

        With ``at: best`` the best step is the largest of the same noisy selection-split validations the rise would
        read, so its value is biased up (the maximum of k = 8 equal validations with standard error s lies 1.42 s
        above their mean, in expectation): a flat run "rises" by that much. The bias helps only a rise pass: a fall
        read at the maximum shrinks, and a positive control subtracts the baseline's maximum, biased alike. Nothing
        chooses the last step, so its value is unbiased (and a rise that peaked earlier reads smaller: conservative).
        Choosing the step on half of the selection items and reading it on the other half would read near the
        peak, but runs log only each validation's mean, and the trainer chooses checkpoints/best on all items.
        """
        return "final" if self.kind == "rise" else endpoint_at


class Requirement(_Strict):
    """A protocol that must have finished, with a result, before any run of this one: a design's comparison after
    its calibration, say."""

    protocol: str = Field(description="the other protocol's file (relative to the working directory)")
    arm: str = Field(description="an arm that protocol compares with its baseline")
    min_difference: float = Field(description="the mean paired difference arm - baseline of its primary endpoint, "
                                  "on its endpoint split, must reach this")
    why: str = Field(min_length=1, description="what a shortfall means for this protocol")


class Protocol(_Strict):
    name: str
    question: str = Field("", description="what the experiment asks, in one sentence")
    seeds: list[int] = Field(min_length=1)
    arms: dict[str, Arm] = Field(min_length=1)
    baseline: str
    endpoint: Endpoint = Field(default_factory=Endpoint)
    secondary: list[str] = Field(default_factory=list, description="other endpoint metrics, same split and point")
    comparisons: list[str] | None = Field(None, description="arms compared with the baseline (default: all others); "
                                          "Holm's correction runs over them")
    test_size: TestSize
    calibration: Calibration
    run_root: str
    parallel: int = Field(2, ge=1, description="runs at once, one thread each")
    requires: list[Requirement] = Field(default_factory=list, description="finished protocols whose results this "
                                        "one needs before any run (tether.lab.experiment.check_requirements)")
    _written_by: list[str] = PrivateAttr(default_factory=list)

    @property
    def written_by(self) -> list[str]:
        """The commands of the protocol file's ``# written by: COMMAND`` lines: what writes the inputs its arms'
        overrides name (an arm config's own lines name what writes the inputs of that file)."""
        return list(self._written_by)

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
        # each named comparison is one test of Holm's family: the baseline against itself, or an arm twice,
        # would be a test of nothing that still widens every other arm's correction
        if self.baseline in (self.comparisons or ()):
            raise ValueError(f"comparisons name the baseline {self.baseline!r}, which every arm is compared with; "
                             "remove it")
        repeated = sorted({a for a in self.comparisons or () if self.comparisons.count(a) > 1})
        if repeated:
            raise ValueError(f"comparisons name arm(s) {repeated} more than once")
        self._check_arm_seeds()
        self._check_calibration()
        return self

    def _check_arm_seeds(self) -> None:
        for name, arm in self.arms.items():
            if arm.seeds is None:
                continue
            if name == self.baseline or name in self.compared():
                raise ValueError(f"arms.{name}.seeds: the {'baseline' if name == self.baseline else 'compared arm'}"
                                 f" {name!r} runs every seed (its comparisons are paired); remove the field")
            outside = [s for s in arm.seeds if s not in self.seeds]
            if outside or len(set(arm.seeds)) != len(arm.seeds):
                raise ValueError(f"arms.{name}.seeds: {arm.seeds} must be distinct seeds of the protocol's "
                                 f"{self.seeds}")

    def _check_calibration(self) -> None:
        c = self.calibration
        if c.arm is not None and c.arm not in self.arms:
            raise ValueError(f"calibration.arm {c.arm!r} is not an arm; arms: {', '.join(self.arms)}")
        if c.kind == "positive_control" and c.measured_arm(self.baseline) == self.baseline:
            raise ValueError("calibration.kind=positive_control needs calibration.arm, an arm other than the "
                             "baseline (the control is compared with it)")
        least = 2 * self.test_size.delta if c.kind == "fall" else self.test_size.delta
        if c.min_movement < least - 1e-12:
            rule = "2 x test_size.delta: the test size may be at most half the fall" if c.kind == "fall" \
                else "test_size.delta"
            raise ValueError(f"calibration.min_movement={c.min_movement} is below {rule} ({least:g})")
        if c.seeds is not None and len(set(c.seeds)) != len(c.seeds):
            raise ValueError("calibration.seeds repeat a seed")
        outside = [s for s in self.calibration_seeds() if s not in self.seeds]
        if outside:  # an arm runs the protocol's seeds or some of them: no run of such a seed exists
            raise ValueError(f"calibration.seeds {outside} are not among the protocol's seeds {self.seeds}; the "
                             "calibration reads the runs of those seeds")
        for arm in self.calibration_arms():
            short = [s for s in self.calibration_seeds() if s not in self.arm_seeds(arm)]
            if short:
                raise ValueError(f"arms.{arm}.seeds leave out calibration seed(s) {short}, which the calibration "
                                 "trains it on")

    def compared(self) -> list[str]:
        return self.comparisons or [a for a in self.arms if a != self.baseline]

    def arm_seeds(self, arm: str) -> list[int]:
        """The seeds ``arm`` runs: its own ``seeds``, else the protocol's."""
        return self.arms[arm].seeds or self.seeds

    def calibration_seeds(self) -> list[int]:
        return self.calibration.seeds or self.seeds

    def calibration_arms(self) -> list[str]:
        """The arms the calibration trains: the measured arm, and the baseline for a positive control."""
        measured = self.calibration.measured_arm(self.baseline)
        return list(dict.fromkeys([measured, self.baseline] if self.calibration.kind == "positive_control"
                                  else [measured]))


def load_protocol(path: str | Path) -> Protocol:
    """Read and validate a protocol file; one :class:`ConfigError` naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"protocol file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
        protocol = Protocol.model_validate(data)
    except yaml.YAMLError as err:
        raise ConfigError(f"protocol {path}: not valid YAML ({err})") from None
    except ValidationError as err:
        whose = config_for_another_command(path, data, "experiment") \
            if isinstance(data, dict) and schema_mismatch(err) else None
        if whose is not None:
            raise ConfigError(whose) from None
        lines = [f"  {'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors()]
        raise ConfigError(f"protocol {path} is invalid:\n" + "\n".join(lines)) from None
    protocol._written_by = written_by_lines(text)
    return protocol


def arm_config(protocol: Protocol, arm: str, seed: int) -> Config:
    """The validated config of one run; a bad arm is one error naming the arm."""
    a = protocol.arms[arm]
    try:
        return load_checked_config(a.config, [*a.overrides, *run_overrides(protocol, arm, seed)])
    except ConfigError as err:
        raise ConfigError(f"arm {arm!r} ({a.config}): {err}") from None


def run_overrides(protocol: Protocol, arm: str, seed: int) -> list[str]:
    """What the runner adds to an arm's config for one run; part of the config the lock hashes."""
    fixed = [f"seed={seed}", string_override("run_dir", run_dir(protocol, arm, seed)), "train.threads=1",
             "logging.progress=false"]
    if protocol.endpoint.at == "best" and not protocol.endpoint.start_selectable:
        fixed.append("train.best_from_step=1")
    return fixed


def resolved_arm_config(protocol: Protocol, arm: str) -> dict:
    """An arm's validated config with its overrides and the runner's, less what differs between seeds (the
    seed and the run directory): what the lock hashes for the arm."""
    data = arm_config(protocol, arm, protocol.seeds[0]).model_dump(mode="json")
    return {key: value for key, value in data.items() if key not in ("seed", "run_dir")}


def run_dir(protocol: Protocol, arm: str, seed: int) -> Path:
    return Path(protocol.run_root) / arm / f"seed{seed}"
