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

:func:`pool_experiments` reports several finished protocols that differ only in their seeds (a replication
registered after the first) as one, over all their seeds.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tether.config import Config, ConfigError
from tether.lab.protocol import Protocol, arm_config, load_protocol, run_dir, run_overrides
from tether.lab.report import write_report

SINGLE_TURN_VAL_METRICS = ("val/avg@k", "val/pass@k", "val/reward_mean", "val/response_length")
AGENT_VAL_METRICS = ("val/success_rate", "val/avg@k", "val/pass@k", "val/episode_return", "val/turns",
                     "val/invalid_action_frac", "val/hazard_death_frac")
# per hazard flag an env reports (val/fell_in_hole_frac, val/fell_through_ice_frac): env-specific, so a pattern
AGENT_FLAG_METRIC = re.compile(r"val/fell_\w+_frac")


# -- checks before any run -----------------------------------------------------------------------


def check_protocol(protocol: Protocol) -> None:
    """Everything that can be checked without a model: arm configs, metric names, splits and their overlap."""
    metrics = [protocol.endpoint.metric, *protocol.secondary]
    if protocol.endpoint.at == "best" and protocol.endpoint.split == "val":
        raise ConfigError("endpoint.split=val with at=best would report on the split that chose the checkpoint; "
                          "use a separate split (e.g. report)")
    for arm in protocol.arms:
        cfg = arm_config(protocol, arm, protocol.seeds[0])
        known = val_metric_names(cfg)
        for metric in metrics:
            if metric not in known and not (cfg.env is not None and AGENT_FLAG_METRIC.fullmatch(metric)):
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
        else:
            check_env_split(arm, cfg, protocol.endpoint.split)


def check_env_split(arm: str, cfg: Config, split: str) -> None:
    """An agent env's endpoint split: ``val`` (its held-out seeds), or a split its ``eval_split`` argument names
    (thin ice: ``report``, seeds disjoint from the ``selection`` seeds validation reads during training)."""
    if split == "val":
        return
    from tether.envs import env_class

    cls = env_class(cfg.env.name)
    if "eval_split" not in inspect.signature(cls).parameters:
        raise ConfigError(f"arm {arm!r}: env {cfg.env.name!r} has one held-out split (val); "
                          f"endpoint.split={split!r} is not one")
    if cfg.env.kwargs.get("eval_split", "selection") == split:
        raise ConfigError(f"arm {arm!r}: env.kwargs.eval_split={split!r} makes training validate on the endpoint "
                          "split; leave validation on the selection split")
    try:
        cls(**{**cfg.env.kwargs, "eval_split": split}).close()
    except (TypeError, ValueError) as err:
        raise ConfigError(f"arm {arm!r}: endpoint.split={split!r}: {err}") from None


def endpoint_split_overrides(cfg: Config, split: str) -> list[str]:
    """How ``tether eval`` reads ``split``: ``val.split`` for a task, ``env.kwargs.eval_split`` for an env."""
    if cfg.env is not None and split != "val":
        return [f"env.kwargs.eval_split={split}"]
    return [f"val.split={split}"]


def val_metric_names(cfg: Config) -> tuple[str, ...]:
    """What validation logs for this config: the fixed metrics and the task's response features, if any."""
    if cfg.task is None:
        return AGENT_VAL_METRICS
    from tether.tasks import make_task

    task = make_task(cfg.task.name, **cfg.task.kwargs)
    describe = getattr(task, "response_features", None)
    if describe is None or not task.val:
        return SINGLE_TURN_VAL_METRICS
    keys = describe(task.val[0], "")
    return SINGLE_TURN_VAL_METRICS + tuple(f"val/{key}/{what}" for key in keys for what in ("share", "accuracy"))


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
        _tether("eval", str(checkpoint), "--config", str(directory / "config.yaml"),
                *endpoint_split_overrides(arm_config(protocol, arm, seed), e.split), "train.threads=1",
                *e.overrides),
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


# -- pooling a replication ------------------------------------------------------------------------

POOLED_FIELDS = ("arms", "baseline", "endpoint", "secondary", "comparisons", "paper_effect")


def pool_protocols(protocols: list[Protocol]) -> Protocol:
    """One protocol over the seeds of ``protocols``, which must agree on everything but name, seeds, run root and
    parallelism (a replication on new seeds); it keeps the first one's run root.

    Raises:
        ConfigError: a field differs (which one, between which protocols), or a seed appears in two of them.
    """
    first = protocols[0]
    for other in protocols[1:]:
        for field in POOLED_FIELDS:
            if getattr(other, field) != getattr(first, field):
                raise ConfigError(f"cannot pool {other.name!r} with {first.name!r}: their {field} differ (only "
                                  "name, seeds, run_root and parallel may)")
    seeds = [s for p in protocols for s in p.seeds]
    shared = sorted({s for s in seeds if seeds.count(s) > 1})
    if shared:
        raise ConfigError(f"cannot pool: seed(s) {shared} are in more than one protocol")
    return first.model_copy(update={"name": " + ".join(p.name for p in protocols), "seeds": seeds})


def pool_experiments(paths: list[str | Path], out: str | Path) -> dict[str, Any]:
    """The report of :func:`pool_protocols` over finished runs, written under ``out``; each protocol must have
    run (its ``protocol.lock.json`` exists), and a run without ``endpoint.json`` is listed as missing."""
    protocols = [load_protocol(p) for p in paths]
    pooled = pool_protocols(protocols).model_copy(update={"run_root": str(out)})
    regs, records, missing = [], [], []
    for protocol, path in zip(protocols, paths, strict=True):
        if not (Path(protocol.run_root) / "protocol.lock.json").is_file():
            raise ConfigError(f"{path}: has not run (no {protocol.run_root}/protocol.lock.json); run it first")
        regs.append(registration(protocol, Path(path)))
        for arm in protocol.arms:
            for seed in protocol.seeds:
                done = run_dir(protocol, arm, seed) / "endpoint.json"
                if done.is_file():
                    records.append(json.loads(done.read_text()))
                else:
                    missing.append(f"{arm}/seed{seed} of {protocol.name}: no endpoint.json")
    reg = {**regs[0], "changed_after_first_run": any(r["changed_after_first_run"] for r in regs), "pooled": regs}
    return write_report(pooled, records, reg, missing)
