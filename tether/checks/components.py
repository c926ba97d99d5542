"""What a config says, checked against the registries: the advantage and the policy loss (names, and the names, types
and values of their settings), the engine, each method's own check, and combinations that cannot learn or never
save. Values are asked of the registered function itself, on a toy batch, so no estimator, loss or method name is
listed here: a new one is checked by the ``ValueError`` it raises for a bad setting.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from tether.checks.findings import Findings
from tether.checks.kwargs import check_kwarg_types, check_kwargs
from tether.config import Config, ConfigError
from tether.user_code import is_target, resolve_target

# Every metric validation logs (tether/rollout/single_turn.py and multi_turn.py ``validate``): train.best_metric
# must be one, or no best checkpoint is ever saved.
VALIDATION_METRICS = {
    "task": ("val/avg@k", "val/pass@k", "val/reward_mean", "val/reward_faults", "val/response_length",
             "val/no_answer_frac", "val/wrong_answer_frac", "val/fault_frac"),
    "env": ("val/success_rate", "val/avg@k", "val/pass@k", "val/episode_return", "val/turns",
            "val/invalid_action_frac", "val/episodes", "val/faults", "val/hazard_death_frac"),
}
SUSPICIOUS_LR = 0.1  # the 1e3 flattened a policy to uniform in two steps; the lab's largest rate is 3e-3


def needs_reference(cfg: Config) -> bool:
    """Whether a run of ``cfg`` loads a frozen reference model (the trainer asks this too)."""
    from tether.methods import METHODS

    a = cfg.algorithm
    return a.kl.coef > 0 or a.use_ref or any(METHODS[name].needs_ref for name in cfg.methods if name in METHODS)


def runs_on_cpu(cfg: Config) -> bool:
    """Whether the policy lives on the CPU: ``train.device`` cpu, or auto on a machine without CUDA."""
    return cfg.train.device == "cpu" or (cfg.train.device == "auto" and not torch.cuda.is_available())


def _lookup(get: Callable[[str], Any], name: str, key: str) -> Any:
    if is_target(name):  # import it here first, so a typo gets the did-you-mean
        resolve_target(key, name)
    try:
        return get(name)
    except (KeyError, TypeError) as err:  # TypeError: a module:function without the family's signature
        raise ConfigError(f"{key}: {err.args[0]}") from None


def check_advantage(cfg: Config, found: Findings) -> None:
    """The estimator, its settings, and that groups of ``rollout.group_size`` rows can learn under it."""
    from tether import algos
    from tether.advantage_inputs import check_advantage as check_advantage_tags

    a = cfg.algorithm
    fn = _lookup(algos.get_advantage, a.advantage, "algorithm.advantage")
    check_kwargs(fn, a.advantage_kwargs, "algorithm.advantage_kwargs")
    check_kwarg_types(fn, a.advantage_kwargs, "algorithm.advantage_kwargs")
    check_advantage_tags(cfg)
    # Two rows with different rewards, a group each, every tag set: a bad setting raises, and an estimator that
    # needs a group gives both an advantage of 0, which is what every row gets with rollout.group_size 1.
    probe = algos.AdvantageInputs(rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 1]),
                                  injected=torch.tensor([False, False]), step_returns=torch.tensor([1.0, 0.0]),
                                  obs_keys=["a", "b"])
    try:
        adv = fn(probe, **a.advantage_kwargs).advantages
    except ValueError as err:
        raise ConfigError.under("algorithm.advantage_kwargs", err) from None
    if cfg.rollout.group_size == 1 and not adv.any():
        raise ConfigError(f"rollout.group_size: 1 gives every row an advantage of 0 under algorithm.advantage="
                          f"{a.advantage} (a group of one has no baseline), so nothing trains; use 2 or more")


def _toy_loss_inputs(with_ref: bool) -> Any:
    """Two rows of three tokens with every optional field and every method's per-token tensor set (the reference's
    log-probs only ``with_ref``)."""
    from tether.algos import LossInputs

    log_probs = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]])
    zeros = torch.zeros_like(log_probs)
    return LossInputs(log_probs=log_probs, old_log_probs=log_probs - 0.1,
                      advantages=torch.tensor([[1.0], [-1.0]]).expand(2, 3), response_mask=torch.ones_like(log_probs),
                      ref_log_probs=log_probs - 0.2 if with_ref else None, behaviour_log_probs=log_probs - 0.3,
                      source=torch.tensor([0, 1]), num_tokens=6.0, num_seqs=2.0, max_response_len=3,
                      tokens={"gate_mask": zeros, "injected_mask": zeros, "teacher_log_probs": log_probs})


def check_policy_loss(cfg: Config, found: Findings) -> None:
    """The loss, its settings, and that the reference it reads is loaded."""
    from tether import algos
    from tether.algos.types import TOKEN_PRODUCERS
    from tether.methods import METHODS

    a = cfg.algorithm
    fn = _lookup(algos.get_policy_loss, a.policy_loss, "algorithm.policy_loss")
    check_kwargs(fn, a.loss_kwargs, "algorithm.loss_kwargs", skip=("agg",))
    check_kwarg_types(fn, a.loss_kwargs, "algorithm.loss_kwargs")
    try:
        fn(_toy_loss_inputs(with_ref=True), agg=a.loss_agg, **a.loss_kwargs)
    except ValueError as err:
        raise ConfigError.under("algorithm.loss_kwargs", err) from None
    # the per-token tensors reach the loss only from the methods that declare them (Method.loss_tokens)
    added = {t for name in cfg.methods if name in METHODS for t in METHODS[name].loss_tokens}
    for token in sorted(set(_toy_loss_inputs(with_ref=True).tokens) - added):
        toy = _toy_loss_inputs(with_ref=True)
        del toy.tokens[token]
        try:
            fn(toy, agg=a.loss_agg, **a.loss_kwargs)
        except ValueError:
            producers = " or ".join(TOKEN_PRODUCERS.get(token, [])) or "no registered method"
            raise ConfigError(f"algorithm.policy_loss={a.policy_loss} reads the per-token tensor {token}, which no "
                              f"method of this config adds; add {producers}, or use a loss without it "
                              "(e.g. ppo)") from None
    if needs_reference(cfg):
        return
    try:
        fn(_toy_loss_inputs(with_ref=False), agg=a.loss_agg, **a.loss_kwargs)
    except ValueError:  # the only field missing is the reference's log-probs
        users = ", ".join(f"methods.{n}" for n, m in METHODS.items() if m.needs_ref)
        raise ConfigError(f"algorithm.policy_loss={a.policy_loss} reads the reference's log-probs, but this run "
                          "loads no reference; set algorithm.use_ref=true (or algorithm.kl.coef > 0, or one of "
                          f"{users})") from None


def check_engine(cfg: Config, found: Findings) -> None:
    """``rollout.engine`` is registered, its ``engine_kwargs`` are its builder's, and it can run every method and the
    distributed strategy."""
    from tether.engine.registry import ENGINES, engine_builder, engine_entry
    from tether.methods import METHODS

    r = cfg.rollout
    entry = _lookup(engine_entry, r.engine, "rollout.engine")
    if "logprob_chunk_tokens" in r.engine_kwargs:  # the trainer passes train's to the engines that take it
        raise ConfigError("rollout.engine_kwargs.logprob_chunk_tokens: set train.logprob_chunk_tokens instead (one "
                          "setting for every forward that scores log-probs)")
    check_kwargs(engine_builder(r.engine), r.engine_kwargs, "rollout.engine_kwargs")
    check_kwarg_types(engine_builder(r.engine), r.engine_kwargs, "rollout.engine_kwargs")
    if r.engine == "hf" and "decode" in r.engine_kwargs:  # the engine refuses a mode only once the model is loaded
        from tether.engine.hf import check_decode_mode

        try:
            check_decode_mode(r.engine_kwargs["decode"], torch.device("cpu" if runs_on_cpu(cfg) else "cuda"))
        except ValueError as err:
            raise ConfigError.under("rollout.engine_kwargs.decode", err) from None
    actors = r.engine_kwargs.get("num_actors", 1)
    if r.engine == "ray" and actors < 1:  # an int (its type is checked above); RayEngine refuses 0 after the load
        raise ConfigError(f"rollout.engine_kwargs.num_actors={actors!r}: the ray engine's replicas, an int >= 1")
    if cfg.distributed.strategy == "fsdp2" and not entry.shares_policy:
        sharing = ", ".join(n for n, e in ENGINES.items() if e.shares_policy)
        raise ConfigError(f"rollout.engine={r.engine} keeps its own copy of the weights, and pushing a sharded policy "
                          f"to it is not built; with distributed.strategy=fsdp2 use rollout.engine: {sharing}")
    if entry.interventions:
        return
    able = ", ".join(n for n, e in ENGINES.items() if e.interventions)
    for name in cfg.methods:
        if name in METHODS and METHODS[name].needs_intervention:
            raise ConfigError(f"methods.{name} intervenes in sampling at every decoding step, which "
                              f"rollout.engine={r.engine} cannot do; set rollout.engine to one of: {able}")


def check_rollout_correction(cfg: Config, found: Findings) -> None:
    """``rollout.correction``: a registered mode, only the bounds its function takes, values it accepts (asked of
    the function on a toy batch), and a policy loss that applies its weights (``LossInputs.token_weights``)."""
    from tether import algos

    c, a = cfg.rollout.correction, cfg.algorithm
    fn = _lookup(algos.ROLLOUT_CORRECTIONS.__getitem__, c.mode, "rollout.correction.mode")
    takes = [n for n, p in inspect.signature(fn).parameters.items() if p.kind == p.KEYWORD_ONLY]
    for key in c.bounds():
        if key not in takes:
            raise ConfigError(f"rollout.correction.{key}: mode {c.mode} does not take it; it takes: "
                              f"{', '.join(takes) or '(no bound)'}")
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    try:
        fn(old - torch.tensor([[-0.1, 0.2, 0.0]]), torch.ones_like(old), **c.bounds())
    except ValueError as err:
        raise ConfigError(f"rollout.correction ({c.mode}): {err}") from None
    if c.mode == "none":
        return
    toy = _toy_loss_inputs(with_ref=True)
    first_row = torch.tensor([[1.0], [0.0]]).expand_as(toy.log_probs)  # the second row dropped
    try:  # an unknown loss or a bad setting of it is check_policy_loss's error
        loss = partial(algos.get_policy_loss(a.policy_loss), agg=a.loss_agg, **a.loss_kwargs)
        unweighted, none_kept, one_kept = (loss(dataclasses.replace(toy, token_weights=w)).loss
                                           for w in (None, torch.zeros_like(toy.log_probs), first_row))
    except (KeyError, TypeError, ValueError):
        return
    if bool(none_kept != 0) or bool(one_kept == unweighted):
        raise ConfigError(f"rollout.correction.mode={c.mode}: algorithm.policy_loss={a.policy_loss} does not apply "
                          "the correction's weights (LossInputs.token_weights of 0 should remove a token's term); "
                          "use rollout.correction.mode=none with it, or apply inputs.weighted() in the loss")


def check_rollout_dtype(cfg: Config, found: Findings) -> None:
    """``rollout.dtype``: an engine that takes it, a policy the in-process engine can copy, and a warning when the CPU
    has no native bfloat16 (or float16) arithmetic, so the cheaper precision would be the slower one."""
    from tether.engine.hf import native_bfloat16_cpu
    from tether.engine.registry import ENGINES, engine_builder, engine_entry

    r = cfg.rollout
    if "dtype" in r.engine_kwargs:
        raise ConfigError("rollout.engine_kwargs.dtype: set rollout.dtype instead (one precision setting)")
    if r.dtype is None or r.engine not in ENGINES:  # an unknown engine is check_engine's error
        return
    if "dtype" not in inspect.signature(engine_builder(r.engine)).parameters:
        takes = ", ".join(n for n in ENGINES if "dtype" in inspect.signature(engine_builder(n)).parameters)
        raise ConfigError(f"rollout.dtype={r.dtype}: rollout.engine={r.engine} samples in the policy's own dtype; "
                          f"engines that take a sampling dtype: {takes}")
    if engine_entry(r.engine).shares_policy and (cfg.model.lora is not None or cfg.distributed.strategy == "fsdp2"):
        what = "model.lora (the adapters live in the policy module)" if cfg.model.lora is not None \
            else "distributed.strategy=fsdp2 (the policy is sharded)"
        raise ConfigError(f"rollout.dtype={r.dtype} with rollout.engine={r.engine} samples from a copy of the policy "
                          f"in that dtype, which is not built with {what}; unset rollout.dtype")
    on_cpu = runs_on_cpu(cfg)
    if on_cpu and r.dtype == "bfloat16" and native_bfloat16_cpu() is False:
        found.warn("rollout.dtype=bfloat16 on a CPU without native bfloat16 (no avx512_bf16 or amx_bf16 in "
                   "/proc/cpuinfo): bfloat16 arithmetic is emulated there, 4.5x slower than float32 as measured "
                   "with bfloat16 autocast on an AVX2-only CPU (docs/engine.md); unset rollout.dtype")
    if on_cpu and r.dtype == "float16":
        found.warn("rollout.dtype=float16 on the CPU: few CPUs compute float16 natively, so sampling is likely "
                   "slower than in float32 (docs/engine.md); bfloat16 is the CPU's reduced precision")


def check_ignore_eos(cfg: Config, found: Findings) -> None:
    """``rollout.ignore_eos``: single-turn tasks without methods, whose sampling is the rollout's own."""
    if not cfg.rollout.ignore_eos:
        return
    if cfg.env is not None:
        raise ConfigError("rollout.ignore_eos=true with env: a turn of an episode ends at EOS or rollout.stop, "
                          "which ignore_eos switches off; allowed with env: false")
    if cfg.methods:
        raise ConfigError(f"rollout.ignore_eos=true with methods.{next(iter(cfg.methods))}: a method's own sampling "
                          "(anchors, injections, analyses) would still end at EOS; allowed with methods: false")


def check_mask_truncated(cfg: Config, found: Findings) -> None:
    """``algorithm.mask_truncated``: some rows must be able to end before ``rollout.max_new_tokens``."""
    if cfg.algorithm.mask_truncated and cfg.rollout.ignore_eos:
        raise ConfigError("algorithm.mask_truncated=true with rollout.ignore_eos=true: every row samples "
                          "rollout.max_new_tokens, so every row would leave the loss and nothing would train; "
                          "set one of them to false")


def check_overlong(cfg: Config, found: Findings) -> None:
    """``rollout.overlong``: DAPO's length penalty, on single-turn rows, its buffer inside the generation budget."""
    o, budget = cfg.rollout.overlong, cfg.rollout.max_new_tokens
    if not o.enabled:
        return
    if cfg.env is not None:
        raise ConfigError("rollout.overlong.enabled=true with env: only single-turn tasks add the overlong penalty, "
                          "so an episode's rows would train without it; allowed with env: false")
    if o.buffer > budget:
        start = budget - o.buffer
        raise ConfigError(f"rollout.overlong.buffer={o.buffer} exceeds rollout.max_new_tokens={budget}: the penalty "
                          f"would start at {start} tokens, so every response pays it (one token: "
                          f"{(1 - start) / o.buffer * o.penalty:.3g}); DAPO's buffer lies inside the budget: set "
                          f"buffer <= {budget}")


def check_rollout_staleness(cfg: Config, found: Findings) -> None:
    """``rollout.max_staleness > 0``: one process, no method, a correction for the stale samples."""
    k = cfg.rollout.max_staleness
    if k == 0:
        return
    why = {"armor": "its anchors and reference resets act on the trainer's current step",
           "eapo": "its injections run in lock-step with the current policy's decoding",
           "seed": "it re-scores rows with the current policy"}
    if cfg.methods:
        name = next(iter(cfg.methods))
        raise ConfigError(f"rollout.max_staleness={k} with methods.{name}: a method's hooks run against the trainer's "
                          f"current state, not the weights that sampled a stale batch"
                          f"{' (' + why[name] + ')' if name in why else ''}; allowed with methods: 0")
    if cfg.rollout.correction.mode == "none":
        raise ConfigError(f"rollout.max_staleness={k}: stale samples are off-policy; set rollout.correction.mode "
                          "(tis, seq_is, mask_token, mask_seq_mean, mask_geo_mean, icepop), or max_staleness 0")
    if cfg.distributed.strategy == "fsdp2" or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(f"rollout.max_staleness={k} runs the rollouts in a thread of one process; under torchrun "
                          "(several ranks, or fsdp2) use 0")


def check_refill(cfg: Config, found: Findings) -> None:
    """A step's generation batches can fill ``rollout.prompts_per_step`` groups: without ``partial_batches``, fewer
    than that in ``max_gen_batches`` batches of ``gen_batch_prompts`` stops the run at its first step."""
    r = cfg.rollout
    most = (r.gen_batch_prompts or r.prompts_per_step) * r.max_gen_batches
    if cfg.task is not None and not r.partial_batches and most < r.prompts_per_step:
        raise ConfigError(f"rollout.gen_batch_prompts={r.gen_batch_prompts} x rollout.max_gen_batches="
                          f"{r.max_gen_batches} = {most} prompts a step at most, fewer than rollout.prompts_per_step="
                          f"{r.prompts_per_step}, so the first step stops; raise either, or set "
                          "rollout.partial_batches=true")


REFILL_KEYS = ("dynamic_sampling", "gen_batch_prompts", "max_gen_batches", "partial_batches")


def check_refill_with_env(cfg: Config, found: Findings) -> None:
    """DAPO's dynamic sampling and refill (``REFILL_KEYS``) are the single-turn collector's: with ``env:`` the agent
    collector plays ``rollout.prompts_per_step`` tasks once a step and reads none of them, so a value other than the
    default would be silently ignored."""
    if cfg.env is None:
        return
    r, fields = cfg.rollout, type(cfg.rollout).model_fields
    changed = [key for key in REFILL_KEYS if getattr(r, key) != fields[key].default]
    if changed:
        values = ", ".join(f"rollout.{key}={_yaml_value(getattr(r, key))}" for key in changed)
        raise ConfigError(f"{values} with env: DAPO's dynamic sampling and refill act on single-turn tasks only; an "
                          "agent step plays rollout.prompts_per_step tasks once and never filters or refills, so the "
                          "setting would do nothing; leave it unset with env:")


def _yaml_value(value: Any) -> str:
    """A setting's value as a config spells it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_methods(cfg: Config, found: Findings) -> None:
    """Each ``methods.<name>`` names a method and its section fits the method's settings; at most one of them
    intervenes in sampling (the MethodSet's rule, which otherwise stops the first generation)."""
    from tether.methods import METHODS, method_config
    from tether.methods.base import Method

    for name, section in cfg.methods.items():
        method_config(name, section)
    intervening = [name for name in cfg.methods if METHODS[name].intervention is not Method.intervention]
    if len(intervening) > 1:
        raise ConfigError(f"methods {' and '.join(intervening)} each intervene in sampling (Method.intervention); "
                          "at most one method of a run may")


def check_method_settings(cfg: Config, found: Findings) -> None:
    """Each method's own check of the config: about training alone, since validation runs no method (``tether eval``
    of an ARMOR run said the anchors' warnings)."""
    from tether.methods import METHODS, method_config

    for name, section in cfg.methods.items():
        try:
            settings = method_config(name, section)
        except ConfigError:  # an unknown name or a section that does not fit: check_methods says it
            continue
        for line in METHODS[name].check_config(settings, cfg):
            found.warn(line)


def check_saving(cfg: Config, found: Findings) -> None:
    """Validation can pick a best checkpoint: the split exists for the workload, and the metric is one it logs."""
    if cfg.env is not None and cfg.val.split != "val":
        raise ConfigError(f"val.split={cfg.val.split!r}: agent environments have one held-out split, val")
    logged = VALIDATION_METRICS["task" if cfg.task is not None else "env"]
    if cfg.val.every and cfg.train.best_metric not in logged:
        kind = "not a validation metric" if not cfg.train.best_metric.startswith("val/") else "never logged"
        raise ConfigError(f"train.best_metric: {cfg.train.best_metric!r} is {kind}, so no best checkpoint would "
                          f"ever be saved; validation logs: {', '.join(logged)}")


def warn_suspicious(cfg: Config, found: Findings) -> None:
    """Legal settings that are most likely a mistake: one warning line each."""
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size  # single-turn; an agent's turns make more rows
    most_rows = rows * (cfg.env.max_turns if cfg.env is not None else 1)
    if cfg.optim.mini_batches > most_rows:
        found.warn(f"optim.mini_batches={cfg.optim.mini_batches} exceeds the {most_rows} rows a step has at most "
                   "(rollout.prompts_per_step x rollout.group_size" + (" x env.max_turns" if cfg.env else "") +
                   "), so a step makes fewer optimiser steps than asked: one per row")
    if cfg.optim.lr > SUSPICIOUS_LR:
        found.warn(f"optim.lr={cfg.optim.lr} is far above the rates that fine-tune a language model (1e-7 to 1e-2); "
                   "steps this large collapse the policy")
    if cfg.train.steps and cfg.val.every > cfg.train.steps:
        found.warn(f"val.every={cfg.val.every} exceeds train.steps={cfg.train.steps}: validation runs only before "
                   "the first step, so checkpoints/best stays the initial policy")
    if cfg.model.ref_name is not None and not needs_reference(cfg):
        found.warn(f"model.ref_name={cfg.model.ref_name!r} is never loaded: nothing uses a reference "
                   "(algorithm.kl.coef is 0, algorithm.use_ref is false, and no method needs one)")


CONFIG_CHECKS = (check_advantage, check_policy_loss, check_rollout_correction, check_rollout_dtype,
                 check_ignore_eos, check_mask_truncated, check_overlong, check_rollout_staleness, check_engine,
                 check_refill, check_refill_with_env, check_methods, check_saving)
# of the config checks, those about training alone: `tether eval` of a run's config trains nothing
TRAINING_CONFIG_CHECKS = (warn_suspicious, check_method_settings)
