"""Reward audit: no answer, wrong answer and scorer faults counted apart; examples written; one warning."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from typer.testing import CliRunner

from tests.trainer.helpers import tiny_config
from tether.cli import app
from tether.health import reward_audit
from tether.rollout.batch import RolloutBatch
from tether.tasks import Score, TaskItem
from tether.tasks.registry import register_task, unregister_task
from tether.trainer import Trainer

MUTE = "audit_mute"
COMPOSITE = "audit_composite"


class MuteTask:
    """A task whose extractor never finds an answer: every row is wrong for want of one."""

    name, system_prompt = MUTE, None

    def __init__(self) -> None:
        self.train = [TaskItem(prompt=f"Add {i} and 1.", answer=str(i + 1), id=f"mute/train/{i}") for i in range(4)]
        self.val = [TaskItem(prompt="Add 9 and 1.", answer="10", id="mute/val/0")]

    def score(self, item: TaskItem, response_text: str) -> Score:
        return Score(reward=0.0, correct=False, extracted=None)


class CompositeTask:
    """A composite reward: ``accuracy`` (1 for an even-length response, as the parity task) plus a constant
    ``format`` bonus of 0.5."""

    name, system_prompt = COMPOSITE, None

    def __init__(self) -> None:
        self.train = [TaskItem(prompt=f"Say {i}.", answer=None, id=f"composite/train/{i}") for i in range(4)]
        self.val = [TaskItem(prompt="Say 9.", answer=None, id="composite/val/0")]

    def score(self, item: TaskItem, response_text: str) -> Score:
        even = float(len(response_text) % 2 == 0)
        return Score(reward=even + 0.5, correct=bool(even), extracted=response_text,
                     components={"accuracy": even, "format": 0.5})


@pytest.fixture(scope="module", autouse=True)
def audit_tasks():
    register_task(MUTE)(MuteTask)
    register_task(COMPOSITE)(CompositeTask)
    yield
    unregister_task(MUTE)
    unregister_task(COMPOSITE)


def batch(rewards, group_ids, correct, extracted, fault, source, components=None) -> RolloutBatch:
    n = len(rewards)
    info = {"extracted": extracted, "fault": fault}
    if components is not None:
        info["reward_components"] = components
    return RolloutBatch(prompt_ids=[[1]] * n, response_ids=torch.zeros(n, 1, dtype=torch.long),
                        response_mask=torch.ones(n, 1), sample_log_probs=torch.zeros(n, 1),
                        group_ids=torch.tensor(group_ids), rewards=torch.tensor(rewards),
                        correct=torch.tensor(correct), source=torch.tensor(source), info=info)


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


def test_each_reward_term_gets_its_share_of_the_absolute_reward_mass():
    terms = [{"accuracy": 1.0, "format": 0.5, "overlong": -0.5}, {"accuracy": 0.0, "format": 0.5, "overlong": 0.0},
             {"accuracy": 1.0, "format": 0.0, "overlong": -1.0}]  # the last row is an anchor: not counted
    b = batch(rewards=[1.0, 0.5, 0.0], group_ids=[0, 0, 0], correct=[True, False, True], extracted=["a"] * 3,
              fault=[False] * 3, source=[0, 0, 1], components=terms)
    metrics, _ = reward_audit(b)
    # masses over the two on-policy rows: accuracy 1, format 1, |overlong| 0.5, of 2.5
    assert {k: v for k, v in metrics.items() if "component" in k} == {
        "reward/component/accuracy": 0.4, "reward/component/format": 0.4, "reward/component/overlong": 0.2}
    one_term = batch(rewards=[1.0, 0.0], group_ids=[0, 0], correct=[True, False], extracted=["a"] * 2,
                     fault=[False] * 2, source=[0, 0], components=[{"task": 1.0}, {"task": 0.0}])
    assert not any("component" in k for k in reward_audit(one_term)[0])  # a one-term reward has no shares


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
    assert not any(k.startswith("reward/component/") for k in metrics)  # one term: nothing to share
    assert "no_answer.jsonl" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second step logs the share but does not warn again
        trainer.train_step()
    lines = [json.loads(x) for x in (tmp_path / "run" / "health" / "no_answer.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 1, 2, 2]  # the steps metrics.jsonl logs them under
    assert lines[0]["item"].startswith("mute/train/") and lines[0]["answer"] is not None and lines[0]["prompt"]
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
    metrics = trainer.collector.validate(trainer.engine, trainer.seed_for("val"))  # what `tether eval` prints
    assert (metrics["val/no_answer_frac"], metrics["val/wrong_answer_frac"], metrics["val/fault_frac"]) == (1, 0, 0)


def test_a_composite_reward_is_audited_in_training_validation_and_eval(tmp_path, tiny_policy):
    model, tok = tiny_policy
    cfg = tiny_config(tmp_path, f"task.name={COMPOSITE}", "train.steps=1", "rollout.overlong.enabled=true",
                      "rollout.overlong.buffer=6")  # every non-empty response of 6 tokens at most is penalised
    trainer = Trainer(cfg, policy=model, tokenizer=tok)
    metrics = trainer.train_step()
    shares = {k: v for k, v in metrics.items() if k.startswith("reward/component/")}
    assert set(shares) == {"reward/component/accuracy", "reward/component/format", "reward/component/overlong"}
    assert sum(shares.values()) == pytest.approx(1.0) and shares["reward/component/overlong"] > 0
    # accuracy is 1 on correct rows, format 0.5 on every row: their masses are in the ratio accuracy / 0.5
    assert shares["reward/component/accuracy"] / shares["reward/component/format"] == \
        pytest.approx(metrics["train/accuracy"] / 0.5)
    val = trainer.collector.validate(trainer.engine, trainer.seed_for("val"))
    assert {"val/component/accuracy", "val/component/format", "val/component/overlong"} <= set(val)
    trainer.save()
    runner = CliRunner()
    out = runner.invoke(app, ["eval", str(trainer.checkpoints.latest()), "val.max_prompts=1"])
    assert out.exit_code == 0, out.output
    assert "val/component/format" in json.loads(out.stdout)  # stdout stays JSON
    assert "reward audit: no answer 0.0%" in out.stderr and "reward terms: accuracy" in out.stderr
