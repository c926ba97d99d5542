"""Reward audit: no answer, wrong answer and scorer faults counted apart; examples written; one warning."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from tests.trainer.helpers import tiny_config
from tether.health import reward_audit
from tether.rollout.batch import RolloutBatch
from tether.tasks import Score, TaskItem
from tether.tasks.registry import register_task, unregister_task
from tether.trainer import Trainer

MUTE = "audit_mute"


class MuteTask:
    """A task whose extractor never finds an answer: every row is wrong for want of one."""

    name, system_prompt = MUTE, None

    def __init__(self) -> None:
        self.train = [TaskItem(prompt=f"Add {i} and 1.", answer=str(i + 1), id=f"mute/train/{i}") for i in range(4)]
        self.val = [TaskItem(prompt="Add 9 and 1.", answer="10", id="mute/val/0")]

    def score(self, item: TaskItem, response_text: str) -> Score:
        return Score(reward=0.0, correct=False, extracted=None)


@pytest.fixture(scope="module", autouse=True)
def mute_task():
    register_task(MUTE)(MuteTask)
    yield
    unregister_task(MUTE)


def batch(rewards, group_ids, correct, extracted, fault, source) -> RolloutBatch:
    n = len(rewards)
    return RolloutBatch(prompt_ids=[[1]] * n, response_ids=torch.zeros(n, 1, dtype=torch.long),
                        response_mask=torch.ones(n, 1), sample_log_probs=torch.zeros(n, 1),
                        group_ids=torch.tensor(group_ids), rewards=torch.tensor(rewards),
                        correct=torch.tensor(correct), source=torch.tensor(source),
                        info={"extracted": extracted, "fault": fault})


def test_no_answer_wrong_answer_and_faults_are_counted_apart():
    b = batch(rewards=[1.0, 0.0, 0.0, 0.0, 0.0, 1.0], group_ids=[0, 0, 0, 1, 1, 1],
              correct=[True, False, False, False, False, True],
              extracted=["4", None, "5", None, "7", None],
              fault=[False, False, False, True, False, False],
              source=[0, 0, 0, 0, 0, 1])  # the last row is an anchor: not the policy's answer
    metrics, missing = reward_audit(b)
    assert missing == [1]  # row 3 has no answer too, but its scorer faulted
    assert metrics == {"reward/zero_adv_group_frac": 0.0, "reward/no_answer_frac": 1 / 5,
                       "reward/wrong_answer_frac": 2 / 5, "reward/fault_frac": 1 / 5}


def test_groups_with_equal_rewards_are_counted_for_any_workload():
    b = batch(rewards=[1.0, 1.0, 0.0, 1.0, 0.5, 0.5], group_ids=[0, 0, 1, 1, 2, 2], correct=[False] * 6,
              extracted=[None] * 6, fault=[False] * 6, source=[0] * 6)
    del b.info["extracted"], b.info["fault"]  # an agent batch: no extraction
    assert reward_audit(b) == ({"reward/zero_adv_group_frac": pytest.approx(2 / 3)}, [])


def test_a_run_whose_answers_cannot_be_extracted_warns_once_and_keeps_examples(tmp_path, tiny_policy):
    model, tok = tiny_policy
    trainer = Trainer(tiny_config(tmp_path, f"task.name={MUTE}", "health.reward_audit.examples=2"), policy=model,
                      tokenizer=tok)
    with pytest.warns(UserWarning, match=r"no answer could be extracted from 100% of the responses") as caught:
        metrics = trainer.train_step()
    assert metrics["reward/no_answer_frac"] == 1.0 and metrics["reward/wrong_answer_frac"] == 0.0
    assert metrics["reward/zero_adv_group_frac"] == 1.0
    assert "no_answer.jsonl" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second step logs the share but does not warn again
        trainer.train_step()
    lines = [json.loads(x) for x in (tmp_path / "run" / "health" / "no_answer.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 1, 2, 2]  # the steps metrics.jsonl logs them under
    assert lines[0]["item"].startswith("mute/train/") and lines[0]["answer"] is not None
    assert isinstance(lines[0]["response"], str) and isinstance(lines[0]["truncated"], bool)


def test_the_audit_can_be_switched_off(tmp_path, tiny_policy):
    model, tok = tiny_policy
    trainer = Trainer(tiny_config(tmp_path, f"task.name={MUTE}", "health.reward_audit.enabled=false"), policy=model,
                      tokenizer=tok)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = trainer.train_step()
    assert not any(k.startswith("reward/no_answer") for k in metrics)
    assert not (tmp_path / "run" / "health").exists()


def test_validation_and_eval_tell_no_answer_from_wrong_answers(tmp_path, tiny_policy):
    model, tok = tiny_policy
    trainer = Trainer(tiny_config(tmp_path, f"task.name={MUTE}"), policy=model, tokenizer=tok)
    metrics = trainer.collector.validate(trainer)  # what `tether eval` prints
    assert (metrics["val/no_answer_frac"], metrics["val/wrong_answer_frac"], metrics["val/fault_frac"]) == (1, 0, 0)
