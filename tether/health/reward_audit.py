"""Reward audit: tell a response whose answer could not be extracted from a wrong answer and from a scorer fault.

All three get the wrong-answer reward, so the reward curve cannot tell them apart; an extractor that misses the
model's format looks exactly like a model that cannot solve the task (NeMo-RL #3635). Single-turn collectors record
each row's :class:`~tether.tasks.Score` fields in ``batch.info`` (``extracted``, ``fault``); the audit counts them
over on-policy rows. The share of groups whose rewards are all equal (zero advantage: they teach nothing) is
counted for every workload. When the reward is a sum of named terms (a task's ``Score.components``, DAPO's overlong
penalty), each term's share of the reward's absolute mass is logged, so a format bonus or a length penalty that
outweighs correctness shows.
"""

from __future__ import annotations

from collections.abc import Mapping

from tether.rollout.batch import RolloutBatch, zero_variance_groups


def answer_shares(batch: RolloutBatch) -> tuple[dict[str, float], list[int]]:
    """(``no_answer_frac``, ``wrong_answer_frac``, ``fault_frac`` over on-policy rows, positions of the rows
    without an answer); nothing for a batch without extraction records (agent turns).

    A row has *no answer* when the extractor found none and the verifier did not judge it correct anyway (a task
    that needs no extraction may leave ``extracted`` empty on correct rows); *wrong* when an answer was extracted and
    judged wrong; a *fault* when the scorer itself failed.
    """
    on_policy = [i for i, s in enumerate(batch.source.tolist()) if s == 0]
    if "extracted" not in batch.info or not on_policy:
        return {}, []
    correct, extracted, fault = batch.correct.tolist(), batch.info["extracted"], batch.info["fault"]
    missing = [i for i in on_policy if extracted[i] is None and not fault[i] and not correct[i]]
    wrong = [i for i in on_policy if extracted[i] is not None and not fault[i] and not correct[i]]
    n = len(on_policy)
    return {"no_answer_frac": len(missing) / n, "wrong_answer_frac": len(wrong) / n,
            "fault_frac": sum(bool(fault[i]) for i in on_policy) / n}, missing


def component_shares(batch: RolloutBatch) -> dict[str, float]:
    """``component/<name>``: each reward term's share of the absolute reward mass over on-policy rows,
    ``sum_i |c_i| / sum_i sum_c |c_i|`` (the shares sum to 1); nothing when the reward is one term.

    >>> from types import SimpleNamespace
    >>> import torch
    >>> rows = [{"accuracy": 1.0, "format": 0.5}, {"accuracy": 0.0, "format": 0.5}]
    >>> component_shares(SimpleNamespace(info={"reward_components": rows}, source=torch.zeros(2)))
    {'component/accuracy': 0.5, 'component/format': 0.5}
    """
    rows = batch.info.get("reward_components")
    if not rows:
        return {}
    mass: dict[str, float] = {}
    for terms, source in zip(rows, batch.source.tolist(), strict=True):
        if source == 0:
            for name, value in terms.items():
                mass[name] = mass.get(name, 0.0) + abs(value)
    total = sum(mass.values())
    if len(mass) < 2 or total == 0:
        return {}
    return {f"component/{name}": value / total for name, value in sorted(mass.items())}


def reward_audit(batch: RolloutBatch) -> tuple[dict[str, float], list[int]]:
    """(``reward/`` metrics of a training batch, positions of on-policy rows without an answer)."""
    groups = batch.group_ids.unique()
    metrics = {"reward/zero_adv_group_frac": len(zero_variance_groups(batch.rewards, batch.group_ids)) / len(groups)}
    metrics.update({f"reward/{k}": v for k, v in component_shares(batch).items()})
    shares, missing = answer_shares(batch)
    metrics.update({f"reward/{k}": v for k, v in shares.items()})
    return metrics, missing


def audit_summary(metrics: Mapping[str, float], prefix: str = "val/") -> str | None:
    """The audit in one line for people (``tether eval`` prints it), from metrics under ``prefix``; None when the
    metrics hold no audit (agent environments).

    >>> audit_summary({"val/no_answer_frac": 0.25, "val/wrong_answer_frac": 0.5, "val/fault_frac": 0.0,
    ...                "val/component/accuracy": 0.9, "val/component/format": 0.1})
    'reward audit: no answer 25.0%, wrong answer 50.0%, scorer faults 0.0%; reward terms: accuracy 90.0%, format 10.0%'
    """
    answers = [f"{label} {metrics[prefix + key]:.1%}" for key, label in
               (("no_answer_frac", "no answer"), ("wrong_answer_frac", "wrong answer"), ("fault_frac", "scorer faults"))
               if prefix + key in metrics]
    component = prefix + "component/"
    terms = [f"{name[len(component):]} {value:.1%}" for name, value in metrics.items() if name.startswith(component)]
    parts = [", ".join(answers)] if answers else []
    if terms:
        parts.append("reward terms: " + ", ".join(terms))
    return "reward audit: " + "; ".join(parts) if parts else None
