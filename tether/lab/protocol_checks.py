"""What ``tether experiment`` checks before any run starts: each arm's config validates, seeds are distinct, the
endpoint and secondary metrics are ones validation logs, the task's splits exist and never share a prompt, the
seeds reach the test size at a spread measured before registration, and every model and data file an arm reads is
here (:func:`check_protocol`)."""

from __future__ import annotations

import inspect
import math
import re

from tether.checks import check_inputs
from tether.checks.startup import missing_inputs, prerequisite_line
from tether.config import Config, ConfigError, load_config, parse_override
from tether.lab import stats
from tether.lab.protocol import Protocol, arm_config, load_protocol

SINGLE_TURN_VAL_METRICS = ("val/avg@k", "val/pass@k", "val/reward_mean", "val/response_length")
AGENT_VAL_METRICS = ("val/success_rate", "val/avg@k", "val/pass@k", "val/episode_return", "val/turns",
                     "val/invalid_action_frac", "val/hazard_death_frac")
# per hazard flag an env reports (val/fell_in_hole_frac, val/fell_through_ice_frac): env-specific, so a pattern
AGENT_FLAG_METRIC = re.compile(r"val/fell_\w+_frac")
# Validation metrics a larger value of which is not better (lower is, or neither): a label reads a positive
# difference from the baseline as "better", and at=best keeps the checkpoint with the largest train.best_metric
NOT_HIGHER_IS_BETTER = ("val/response_length", "val/turns", "val/invalid_action_frac", "val/hazard_death_frac")


def higher_is_better(metric: str) -> bool:
    return metric not in NOT_HIGHER_IS_BETTER and not AGENT_FLAG_METRIC.fullmatch(metric)


def check_protocol(protocol: Protocol, *, inputs: bool = True) -> str:
    """Everything that can be checked without a model: the seeds' power (:func:`check_power`), arm configs, metric
    names, splits and their overlap, and (``inputs``) the models and data each arm reads (:func:`check_arm_inputs`;
    off to report on runs that exist). Returns :func:`check_power`'s line."""
    power = check_power(protocol)
    metrics = [protocol.endpoint.metric, *protocol.secondary]
    if protocol.endpoint.split == "train":
        raise ConfigError("endpoint.split=train would report on the prompts the arms trained on; use a held-out "
                          "split (e.g. report)")
    if protocol.endpoint.at == "best" and protocol.endpoint.split == "val":
        raise ConfigError("endpoint.split=val with at=best would report on the split that chose the checkpoint; "
                          "use a separate split (e.g. report)")
    check_endpoint_overrides(protocol)
    if not higher_is_better(protocol.endpoint.metric):
        raise ConfigError(f"endpoint.metric={protocol.endpoint.metric}: a larger value is not better, but the labels "
                          "read a positive difference from the baseline as better; use a higher-is-better metric "
                          f"(e.g. val/avg@k, val/success_rate) and list {protocol.endpoint.metric} under secondary")
    for i, r in enumerate(protocol.requires):
        try:
            other = load_protocol(r.protocol)
        except ConfigError as err:
            raise ConfigError(f"requires[{i}].protocol={r.protocol!r}: {err}") from None
        if r.arm not in other.compared():
            raise ConfigError(f"requires[{i}].arm={r.arm!r} is not an arm {r.protocol} compares with its baseline; "
                              f"allowed: {', '.join(other.compared())}")
    configs = {arm: arm_config(protocol, arm, protocol.seeds[0]) for arm in protocol.arms}
    for arm, cfg in configs.items():
        check_endpoint_config(protocol, arm, cfg)
        known = val_metric_names(cfg)
        for metric in metrics:
            if metric not in known and not (cfg.env is not None and AGENT_FLAG_METRIC.fullmatch(metric)):
                raise ConfigError(f"arm {arm!r}: no run logs the metric {metric!r}; validation logs: "
                                  f"{', '.join(known)}")
        if protocol.endpoint.at == "best" and not higher_is_better(cfg.train.best_metric):
            raise ConfigError(f"arm {arm!r}: train.best_metric={cfg.train.best_metric} is not higher-is-better, but "
                              "checkpoints/best keeps its largest value; use e.g. val/avg@k or val/success_rate")
        if protocol.endpoint.at == "best" and cfg.train.best_metric not in known:
            raise ConfigError(f"arm {arm!r}: train.best_metric={cfg.train.best_metric!r} is never logged, so no "
                              f"checkpoint would be chosen; use one of {', '.join(known)}")
        if protocol.endpoint.at == "best" and not cfg.val.every:
            raise ConfigError(f"arm {arm!r}: val.every=0 never validates on the selection split, so endpoint.at=best "
                              "has no checkpoint to read; set val.every or endpoint.at=final")
        check_selection(protocol, arm, cfg)
        if cfg.task is not None:
            check_selection_split(protocol, arm, cfg)
            check_splits(arm, cfg, protocol.endpoint.split)
        else:
            check_env_split(arm, cfg, protocol.endpoint.split)
    if inputs:
        check_arm_inputs(protocol, configs)
    return power


def check_arm_inputs(protocol: Protocol, configs: dict[str, Config]) -> None:
    """Every model and data file each arm's run reads (``configs``: each arm's resolved config, the calibration's
    arms among them) is here, checked as ``tether validate CONFIG`` checks a config's (:func:`missing_inputs`,
    :func:`tether.checks.check_inputs`): a study whose arm cannot start would train the others first, and lock a
    design whose missing directory, once written, differs from the lock, so that no later invocation could resume it.

    A missing input is named with the commands that write it where they are known: the arm config's
    ``# written by:`` lines for a path its file sets, the protocol's own for one the arm's overrides set (the
    arm config's lines say what writes *its* inputs, not an override's). Those with a known command come first,
    over every arm: running it may write what other arms lack too.

    Raises:
        ConfigError: one line: the arm, each missing ``key=path``, and the commands to run first, or the first
            failed input check of an arm.
    """
    for arm, cfg in configs.items():
        if not (cfg.written_by or protocol.written_by):  # no command to name: check_inputs below says it
            continue
        a = protocol.arms[arm]
        missing = missing_inputs(cfg)
        overridden = {k: v for k, v in missing.items() if set_by_overrides(k, a.overrides)}
        own = {k: v for k, v in missing.items() if k not in overridden}
        for found, commands, whose in ((own, cfg.written_by, f"{a.config}'s"),
                                       (overridden, protocol.written_by, "the protocol's")):
            if found and commands:
                raise ConfigError(f"arm {arm!r}: {prerequisite_line(found, commands, whose)}")
    for arm, cfg in configs.items():
        errors = check_inputs(cfg)
        if errors:
            raise ConfigError(f"arm {arm!r} ({protocol.arms[arm].config}): {errors[0]}")


def set_by_overrides(key: str, overrides: list[str]) -> bool:
    """Whether an override sets the dotted ``key`` or a section holding it (``methods.eapo={prior: ...}`` sets
    ``methods.eapo.prior``)."""
    parts = key.split(".")
    return any(parts[:len(path)] == path for path in (parse_override(o)[0] for o in overrides))


def check_power(protocol: Protocol) -> str:
    """Whether the seeds a comparison pairs over (the protocol's) give a minimum detectable effect
    (:func:`stats.mde`) of at most ``test_size.delta`` at ``test_size.pilot_sd``; one line saying what was read.
    Without ``pilot_sd`` no spread exists before the runs, and the line says the MDE is read after the fact.

    Raises:
        ConfigError: the MDE exceeds delta (or is not defined: one seed) and ``test_size.underpowered`` does not
            acknowledge it; names the seeds that reach delta.
    """
    t, n = protocol.test_size, len(protocol.seeds)
    if t.pilot_sd is None:
        return ("power at registration: not computed (no test_size.pilot_sd, so no spread before the runs); the "
                "report's MDE is read after the fact from the observed spread")
    mde = stats.mde(t.pilot_sd, n)
    read = (f"over {n} seed(s) at test_size.pilot_sd={t.pilot_sd:g} ({t.pilot_source}) the minimum detectable effect "
            f"is {'not defined (one seed)' if math.isnan(mde) else f'{mde:.4f}'}")
    if mde <= t.delta:
        return f"power at registration: {read}, at most delta={t.delta:g}"
    need = stats.seeds_for(t.pilot_sd, t.delta)
    if t.underpowered is None:
        raise ConfigError(f"test_size: {read}, above delta={t.delta:g}: {need} seeds reach it (MDE "
                          f"{stats.mde(t.pilot_sd, need):.4f}); register {need} seeds, or set test_size.underpowered "
                          "to why the study runs anyway")
    return f"power at registration: {read}, above delta={t.delta:g} ({need} seeds reach it); underpowered: " \
           f"{t.underpowered}"


# Keys that move where validation reads: the endpoint split is endpoint.split, never an evaluation override
SPLIT_KEYS = ("val.split", "env.kwargs.eval_split")


def check_endpoint_overrides(protocol: Protocol) -> None:
    """No endpoint override names the split, itself or a section holding it (``val={split: val}``): the
    evaluation's own ``val.split=<endpoint.split>`` comes first, so ``val.split=val`` there would read the endpoint
    on the selection split while the report says ``report``. Nor the model: ``tether eval`` evaluates the
    checkpoint the endpoint rule chose, and refuses a ``model.name``."""
    for override in protocol.endpoint.overrides:
        try:
            parse_override(override)
        except ConfigError as err:
            raise ConfigError(f"endpoint.overrides: {err}") from None
        if any(set_by_overrides(key, [override]) for key in SPLIT_KEYS):
            raise ConfigError(f"endpoint.overrides: {override!r} sets the split the endpoint is read on; set "
                              "endpoint.split instead")
        if set_by_overrides("model.name", [override]):
            raise ConfigError(f"endpoint.overrides: {override!r} sets the model; the endpoint is read from each "
                              "run's checkpoint (endpoint.at)")


def check_endpoint_config(protocol: Protocol, arm: str, cfg: Config) -> None:
    """The config ``tether eval`` reads an arm's endpoint with (:func:`evaluation_overrides`) validates: an override
    it refuses failed each run's evaluation, after all the training."""
    try:
        load_config(data=cfg.model_dump(mode="json"), overrides=evaluation_overrides(protocol, cfg))
    except ConfigError as err:
        raise ConfigError(f"endpoint.overrides (the evaluation of arm {arm!r}): {err}") from None


def evaluation_overrides(protocol: Protocol, cfg: Config) -> list[str]:
    """What ``tether eval`` adds to a run's config to read the endpoint: the endpoint split, one thread, then
    ``endpoint.overrides``."""
    return [*endpoint_split_overrides(cfg, protocol.endpoint.split), "train.threads=1", *protocol.endpoint.overrides]


def check_selection_split(protocol: Protocol, arm: str, cfg: Config) -> None:
    """Training validates on ``val.split`` (the selection split): with ``at: best`` it must not be the endpoint
    split, or checkpoints/best (and health.collapse's stop) would be chosen on the prompts the endpoint reports."""
    if protocol.endpoint.at == "best" and cfg.val.split == protocol.endpoint.split:
        raise ConfigError(f"arm {arm!r}: val.split={cfg.val.split} makes training validate, and choose "
                          f"checkpoints/best, on the endpoint split {protocol.endpoint.split!r}; leave val.split on "
                          "the selection split (val)")


def check_selection(protocol: Protocol, arm: str, cfg: Config) -> None:
    """The selection-split validations the endpoint rule and the calibration read exist."""
    e = protocol.endpoint
    if e.at == "best" and not e.start_selectable and cfg.val.every > cfg.train.steps:
        raise ConfigError(f"arm {arm!r}: val.every={cfg.val.every} > train.steps={cfg.train.steps} validates only "
                          "the starting policy, which endpoint.at=best may not choose (endpoint.start_selectable)")
    if arm not in protocol.calibration_arms():
        return
    if not cfg.val.every:
        raise ConfigError(f"arm {arm!r} is calibrated on the selection split but val.every=0 never validates there")
    if protocol.calibration.end_at(e.at) == "final" and cfg.train.steps % cfg.val.every:
        raise ConfigError(f"arm {arm!r} is calibrated at its last step, which val.every={cfg.val.every} does not "
                          f"validate (train.steps={cfg.train.steps}); make train.steps a multiple of val.every")


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
    """The task's train, selection (``val.split``, which training validates on) and endpoint splits exist and share
    no prompt."""
    from tether.tasks import make_task, task_split

    task = make_task(cfg.task.name, **cfg.task.kwargs)
    names = list(dict.fromkeys(["train", cfg.val.split, endpoint_split]))
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
