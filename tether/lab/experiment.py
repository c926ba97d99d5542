"""``tether experiment PROTOCOL.yaml``: arms x seeds as separate processes, then a report with intervals.

A protocol (docs/lab.md) names the arms (a config plus overrides each), the seeds, the primary endpoint (a
validation metric on a task split, read at the checkpoint chosen on the selection split or at the end), secondary
metrics and the comparisons. The runner

1. checks everything before any run starts: each arm's config validates, seeds are distinct, the endpoint and
   secondary metrics are ones validation logs, the task's splits exist and never share a prompt;
2. runs ``tether train`` once per (arm, seed) in its own process with one thread, as many at once as
   ``parallel`` allows; a run with ``endpoint.json`` is done and skipped, an interrupted one resumes from its
   checkpoint (``train.resume``);
3. evaluates each run's endpoint checkpoint on the endpoint split (``tether eval ... val.split=<split>``);
4. writes ``report.md``, ``report.json`` and ``curves.png`` under ``run_root``: per-seed values, mean and 95%
   interval per arm, paired differences against the baseline, the minimum detectable effect, a label, the
   protocol's hash and commit, and whether the protocol changed after the first run.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tether.checks import load_checked_config
from tether.config import Config, ConfigError

SINGLE_TURN_VAL_METRICS = ("val/avg@k", "val/pass@k", "val/reward_mean", "val/response_length")
AGENT_VAL_METRICS = ("val/success_rate", "val/avg@k", "val/pass@k", "val/episode_return", "val/turns",
                     "val/invalid_action_frac")


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


# -- checks before any run -----------------------------------------------------------------------


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


def check_protocol(protocol: Protocol) -> None:
    """Everything that can be checked without a model: arm configs, metric names, splits and their overlap."""
    metrics = [protocol.endpoint.metric, *protocol.secondary]
    if protocol.endpoint.at == "best" and protocol.endpoint.split == "val":
        raise ConfigError("endpoint.split=val with at=best would report on the split that chose the checkpoint; "
                          "use a separate split (e.g. report)")
    for arm in protocol.arms:
        cfg = arm_config(protocol, arm, protocol.seeds[0])
        known = SINGLE_TURN_VAL_METRICS if cfg.task is not None else AGENT_VAL_METRICS
        for metric in metrics:
            if metric not in known:
                raise ConfigError(f"arm {arm!r}: no run logs the metric {metric!r}; validation logs: "
                                  f"{', '.join(known)}")
        if protocol.endpoint.at == "best" and cfg.train.best_metric not in known:
            raise ConfigError(f"arm {arm!r}: train.best_metric={cfg.train.best_metric!r} is never logged, so no "
                              f"checkpoint would be chosen; use one of {', '.join(known)}")
        if protocol.endpoint.at == "best" and not cfg.val.every:
            raise ConfigError(f"arm {arm!r}: val.every=0 never validates on the selection split, so endpoint.at=best "
                              "has no checkpoint to read; set val.every or endpoint.at=final")
        if cfg.task is not None:
            check_splits(arm, cfg, protocol.endpoint.split)
        elif protocol.endpoint.split != "val":
            raise ConfigError(f"arm {arm!r}: agent environments have one held-out split (val); "
                              f"endpoint.split={protocol.endpoint.split!r} is not one")


def check_splits(arm: str, cfg: Config, endpoint_split: str) -> None:
    """The task's train, selection and endpoint splits exist and share no prompt."""
    from tether.tasks import make_task, task_split

    task = make_task(cfg.task.name, **cfg.task.kwargs)
    names = list(dict.fromkeys(["train", "val", endpoint_split]))
    prompts = {}
    for name in names:
        try:
            prompts[name] = {item.prompt for item in task_split(task, name)}
        except ValueError as err:
            raise ConfigError(f"arm {arm!r}: {err}") from None
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = prompts[a] & prompts[b]
            if shared:
                raise ConfigError(f"arm {arm!r}: splits {a!r} and {b!r} of task {cfg.task.name!r} share "
                                  f"{len(shared)} prompt(s), e.g. {sorted(shared)[0]!r}")


# -- running -------------------------------------------------------------------------------------


def _tether(*args: str) -> list[str]:
    return [sys.executable, "-m", "tether.cli", *args]


def _one_thread_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def endpoint_checkpoint(directory: Path, at: str) -> Path:
    """``checkpoints/best``, or the step directory ``checkpoints/latest`` names."""
    root = directory / "checkpoints"
    if at == "best":
        return root / "best"
    return root / (root / "latest").read_text().strip()


def run_one(protocol: Protocol, arm: str, seed: int) -> dict[str, Any]:
    """Train (or resume) one run and evaluate its endpoint; ``endpoint.json`` marks it done."""
    directory = run_dir(protocol, arm, seed)
    done = directory / "endpoint.json"
    if done.is_file():
        return json.loads(done.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    a = protocol.arms[arm]
    log = directory / "experiment.log"
    start = time.perf_counter()
    # A run killed before its first checkpoint has nothing to resume: start it afresh (train.resume=true would
    # refuse to write over the earlier run's files, docs/reliability.md).
    fresh = [] if (directory / "checkpoints" / "latest").is_file() else ["train.resume=false"]
    with log.open("a") as out:
        train = subprocess.run(_tether("train", a.config, *a.overrides, *run_overrides(protocol, arm, seed), *fresh),
                               stdout=out, stderr=subprocess.STDOUT, env=_one_thread_env(), check=False)
    if train.returncode != 0:
        raise RuntimeError(f"run {arm}/seed{seed} failed (exit {train.returncode}); see {log}")
    e = protocol.endpoint
    checkpoint = endpoint_checkpoint(directory, e.at)
    evaluation = subprocess.run(
        _tether("eval", str(checkpoint), "--config", str(directory / "config.yaml"), f"val.split={e.split}",
                "train.threads=1", *e.overrides),
        capture_output=True, text=True, env=_one_thread_env(), check=False)
    if evaluation.returncode != 0:
        raise RuntimeError(f"endpoint evaluation of {arm}/seed{seed} failed: {evaluation.stderr[-2000:]}")
    result = json.loads(evaluation.stdout[evaluation.stdout.index("{"):])
    record = {"arm": arm, "seed": seed, "checkpoint": str(checkpoint), "split": e.split,
              "metrics": result, "train_s": round(time.perf_counter() - start, 1)}
    done.write_text(json.dumps(record, indent=2))
    return record


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def protocol_committed(path: Path) -> bool:
    """True when the protocol file is tracked by git and has no uncommitted change."""
    try:
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], capture_output=True, check=False)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(path)], capture_output=True, check=False)
    except OSError:
        return False
    return tracked.returncode == 0 and dirty.returncode == 0


def registration(protocol: Protocol, path: Path) -> dict[str, Any]:
    """The protocol's hash now and at the first run (``run_root/protocol.lock.json``, written once)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    lock = Path(protocol.run_root) / "protocol.lock.json"
    if not lock.is_file():
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_text(json.dumps({"sha256": digest, "commit": git_commit(), "committed": protocol_committed(path),
                                    "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}, indent=2))
    first = json.loads(lock.read_text())
    return {"sha256": digest, "first_run": first, "changed_after_first_run": first["sha256"] != digest,
            "commit_now": git_commit(), "committed_now": protocol_committed(path)}


def run_experiment(path: str | Path, *, report_only: bool = False) -> dict[str, Any]:
    """Check, run what is not done, report. Returns the report's data (also written as ``report.json``)."""
    from tether.lab.report import write_report

    path = Path(path)
    protocol = load_protocol(path)
    check_protocol(protocol)
    reg = registration(protocol, path)
    records: list[dict[str, Any]] = []
    failures: list[str] = []
    if not report_only:
        jobs = [(arm, seed) for seed in protocol.seeds for arm in protocol.arms]  # seed-major: early seeds finish
        with ThreadPoolExecutor(max_workers=protocol.parallel) as pool:
            futures = {pool.submit(run_one, protocol, arm, seed): (arm, seed) for arm, seed in jobs}
            for future, (arm, seed) in futures.items():
                try:
                    records.append(future.result())
                except RuntimeError as err:
                    failures.append(f"{arm}/seed{seed}: {err}")
    else:
        for arm in protocol.arms:
            for seed in protocol.seeds:
                done = run_dir(protocol, arm, seed) / "endpoint.json"
                if done.is_file():
                    records.append(json.loads(done.read_text()))
    return write_report(protocol, records, reg, failures)
