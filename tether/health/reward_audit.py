"""Reward audit: tell a response whose answer could not be extracted from a wrong answer and from a scorer fault.

All three get the wrong-answer reward, so the reward curve cannot tell them apart; an extractor that misses the
model's format looks exactly like a model that cannot solve the task (NeMo-RL #3635). Single-turn collectors record
each row's :class:`~tether.tasks.Score` fields in ``batch.info`` (``extracted``, ``fault``); the audit counts them
over on-policy rows. The share of groups whose rewards are all equal (zero advantage: they teach nothing) is
counted for every workload.
"""

from __future__ import annotations

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


def reward_audit(batch: RolloutBatch) -> tuple[dict[str, float], list[int]]:
    """(``reward/`` metrics of a training batch, positions of on-policy rows without an answer)."""
    groups = batch.group_ids.unique()
    metrics = {"reward/zero_adv_group_frac": len(zero_variance_groups(batch.rewards, batch.group_ids)) / len(groups)}
    shares, missing = answer_shares(batch)
    metrics.update({f"reward/{k}": v for k, v in shares.items()})
    return metrics, missing
