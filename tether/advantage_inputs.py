"""What an advantage estimator is given, and who gives it: the one join between batches, configs and estimators.

The trainer makes every advantage in one place (``Trainer.compute_advantages``): the configured estimator
(``algorithm.advantage``, ``algorithm.advantage_kwargs``) over :func:`advantage_inputs` of the step's batch.
Collectors and methods never write advantages; they produce per-row *tags* (fields of
:class:`tether.algos.AdvantageInputs`), and say which in a class attribute ``advantage_tags``:

=================  ====================================  ========================================================
tag                from the batch                        produced by
=================  ====================================  ========================================================
``injected``       ``token["injected_mask"]``, any token  ``methods.eapo`` (its sampling intervention)
``step_returns``   ``info["step_return"]``                the agent loop (every ``env`` config)
``obs_keys``       ``info["obs_key"]``                    the agent loop (every ``env`` config)
=================  ====================================  ========================================================

An estimator registered with ``needs`` (``gigpo``, ``clean_baseline``) is refused by :func:`check_advantage` when
the config is read if nothing in that config produces what it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tether.algos import ADVANTAGES, AdvantageInputs
from tether.config import ConfigError

if TYPE_CHECKING:
    from tether.config import Config
    from tether.rollout.batch import RolloutBatch


def advantage_inputs(batch: RolloutBatch) -> AdvantageInputs:
    """The batch's rewards, group ids, sources and whichever tags it carries, on the batch's device."""
    injected = batch.token.get("injected_mask")
    step_returns = batch.info.get("step_return")
    return AdvantageInputs(
        rewards=batch.rewards, group_ids=batch.group_ids,
        injected=None if injected is None else (injected * batch.response_mask).sum(1) > 0,
        step_returns=None if step_returns is None else torch.tensor(step_returns, dtype=torch.float32,
                                                                    device=batch.rewards.device),
        obs_keys=batch.info.get("obs_key"), source=batch.source)


def produced_tags(cfg: Config) -> frozenset[str]:
    """The tags that the config's collector and methods put on every batch."""
    from tether.methods import METHODS
    from tether.rollout.collectors import collector_class

    known = [METHODS[name] for name in cfg.methods if name in METHODS]  # an unknown name is check_methods' to report
    return collector_class(cfg).advantage_tags.union(*(method.advantage_tags for method in known))


def check_advantage(cfg: Config) -> None:
    """Refuse an ``algorithm.advantage`` that needs a tag nothing in ``cfg`` produces, in one line naming the key,
    the value, who would produce the tag and the estimators allowed here.

    Raises:
        ConfigError: the estimator's ``needs`` are not all produced; an unknown name is the caller's to report.
    """
    name = cfg.algorithm.advantage
    have = produced_tags(cfg)
    missing = sorted(ADVANTAGES.needs(name) - have)
    if not missing:
        return
    allowed = ", ".join(sorted(n for n in ADVANTAGES if ADVANTAGES.needs(n) <= have))
    raise ConfigError(f"algorithm.advantage={name} needs the per-row {' and '.join(missing)}, which nothing in this "
                      f"config produces ({'; '.join(_producers(tag) for tag in missing)}); allowed here: {allowed}")


def _producers(tag: str) -> str:
    """Who could produce ``tag``, in config terms: ``injected comes from methods.eapo``."""
    from tether.methods import METHODS
    from tether.rollout.collectors import collector_classes

    who = [f"methods.{name}" for name, method in sorted(METHODS.items()) if tag in method.advantage_tags]
    who += [section for section, collector in collector_classes().items() if tag in collector.advantage_tags]
    return f"{tag} comes from {' or '.join(who) or 'nothing registered'}"
