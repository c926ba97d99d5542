"""SingleTurnCollector.collect against hand-planned generations: DAPO's overlong shaping on each row's own length,
the dynamic-sampling refill (which groups survive, which are kept, when it stops) and its metrics.

A :class:`PlanEngine` returns, call by call, rows of planned (response length, reward); the task reads the reward
back from the text, so every expected value below is written out by hand.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.trainer.helpers import tiny_config
from tether.engine.base import Generation, sampling_params
from tether.errors import RefillShortfall
from tether.methods.base import Method, MethodSettings
from tether.methods.hooks import MethodSet
from tether.rollout.base import NoHooks
from tether.rollout.single_turn import SingleTurnCollector
from tether.seeding import StepSeeds
from tether.tasks import Score, TaskItem
from tether.tasks.parity import ParityTask


class PlanEngine:
    """Call ``k`` returns ``plan[k]``: one (length, reward) per row; the text is the reward, the tokens are 7s."""

    def __init__(self, plan: list[list[tuple[int, float]]]) -> None:
        self.plan, self.calls = plan, 0

    def generate(self, prompt_ids, params, *, seed=None, intervention=None) -> Generation:
        rows = self.plan[self.calls]
        self.calls += 1
        assert len(rows) == len(prompt_ids)
        width = max(length for length, _ in rows)
        mask = torch.zeros(len(rows), width)
        for i, (length, _) in enumerate(rows):
            mask[i, :length] = 1.0
        return Generation(response_ids=(7 * mask).long(), response_mask=mask, sample_log_probs=-0.5 * mask,
                          texts=[repr(float(reward)) for _, reward in rows],
                          truncated=torch.tensor([length == params.max_new_tokens for length, _ in rows]))


class ReadBackTask(ParityTask):
    """The reward is the number the response says; a reward of 1 is correct."""

    def score(self, item, response_text):
        reward = float(response_text)
        return Score(reward=reward, correct=reward == 1.0, extracted=response_text)


def collect(tmp_path, tokenizer, plan, *overrides, hooks=None):
    cfg = tiny_config(tmp_path, "rollout.max_new_tokens=10", *overrides)
    collector = SingleTurnCollector(ReadBackTask(train_size=12), tokenizer, cfg)
    engine = PlanEngine(plan)
    batch, metrics = collector.collect(engine, StepSeeds(0, 0), hooks or NoHooks())
    return batch, metrics, engine.calls


def groups_of(rewards_by_group: list[list[float]], length: int = 3) -> list[tuple[int, float]]:
    return [(length, r) for group in rewards_by_group for r in group]


# -- overlong shaping -------------------------------------------------------------------------------------------

LENGTHS = [3, 6, 7, 8, 9, 10, 10, 1]
TASK_REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
# L_max 10, buffer 4, penalty 0.5: 0 up to 6 tokens, then -0.5 * (L - 6) / 4, each row by its own length
PENALTIES = [0.0, 0.0, -0.125, -0.25, -0.375, -0.5, -0.5, 0.0]


def test_overlong_penalty_is_added_to_each_row_by_its_own_response_length(tmp_path, tokenizer):
    plan = [list(zip(LENGTHS, TASK_REWARDS, strict=True))]
    batch, _, _ = collect(tmp_path, tokenizer, plan, "rollout.overlong.enabled=true", "rollout.overlong.buffer=4",
                          "rollout.overlong.penalty=0.5")
    assert batch.response_mask.sum(1).tolist() == LENGTHS
    assert batch.rewards.tolist() == [1.0, 0.0, 0.875, -0.25, -0.375, 0.5, 0.5, 0.0]
    assert [c["task"] for c in batch.info["reward_components"]] == TASK_REWARDS
    assert [c["overlong"] for c in batch.info["reward_components"]] == PENALTIES
    assert batch.correct.tolist() == [r == 1.0 for r in TASK_REWARDS]  # shaping never changes correctness


def test_without_overlong_shaping_the_reward_is_the_tasks(tmp_path, tokenizer):
    batch, _, _ = collect(tmp_path, tokenizer, [list(zip(LENGTHS, TASK_REWARDS, strict=True))])
    assert batch.rewards.tolist() == TASK_REWARDS
    assert all(set(c) == {"task"} for c in batch.info["reward_components"])


# -- dynamic sampling: refill, keep, metrics ------------------------------------------------------------------------

DAPO = ("rollout.dynamic_sampling=true", "rollout.group_size=2", "rollout.prompts_per_step=2")


def test_refill_counts_surviving_groups_and_keeps_the_first_prompts_per_step(tmp_path, tokenizer):
    # three prompts per generation batch: groups 0-2, then 3-5; zero-variance groups (0, 2, 4) are dropped
    plan = [groups_of([[1, 1], [1, 0], [0, 0]]), groups_of([[0, 1], [1, 1], [1, 0]]),
            groups_of([[0, 1], [0, 1], [0, 1]])]
    batch, metrics, calls = collect(tmp_path, tokenizer, plan, *DAPO, "rollout.gen_batch_prompts=3",
                                    "rollout.max_gen_batches=4")
    assert calls == 2  # 1 survivor, then 3: enough for 2
    assert batch.group_ids.tolist() == [1, 1, 3, 3]  # group 5 survived too, beyond prompts_per_step
    assert batch.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert metrics["rollout/num_gen_batches"] == 2
    assert metrics["rollout/kept_groups_frac"] == 3 / 6  # survivors over prompts generated, not rows
    assert metrics["rollout/short_batch"] == 0.0
    assert metrics["rollout/accuracy_all"] == pytest.approx(7 / 12, abs=1e-6)  # every generated row, before the filter


def test_a_batch_filled_exactly_is_not_short(tmp_path, tokenizer):
    plan = [groups_of([[1, 0], [0, 0]]), groups_of([[1, 1], [0, 1]]), groups_of([[0, 1], [0, 1]])]
    batch, metrics, calls = collect(tmp_path, tokenizer, plan, *DAPO, "rollout.max_gen_batches=3")
    assert calls == 2
    assert batch.group_ids.tolist() == [0, 0, 3, 3]
    assert metrics["rollout/short_batch"] == 0.0 and metrics["rollout/kept_groups_frac"] == 2 / 4


def test_partial_batches_train_on_the_survivors_only(tmp_path, tokenizer):
    plan = [groups_of([[1, 1], [0, 1]]), groups_of([[0, 0], [1, 1]])]
    batch, metrics, calls = collect(tmp_path, tokenizer, plan, *DAPO, "rollout.max_gen_batches=2",
                                    "rollout.partial_batches=true")
    assert calls == 2
    assert batch.group_ids.tolist() == [1, 1] and batch.rewards.tolist() == [0.0, 1.0]
    assert metrics["rollout/short_batch"] == 1.0 and metrics["rollout/num_gen_batches"] == 2
    assert metrics["rollout/kept_groups_frac"] == 1 / 4


def test_a_shortfall_without_partial_batches_names_the_survivors(tmp_path, tokenizer):
    plan = [groups_of([[1, 1], [0, 1]]), groups_of([[0, 0], [1, 1]])]
    with pytest.raises(RefillShortfall, match=r"only 1 of rollout\.prompts_per_step=2 groups survived"):
        collect(tmp_path, tokenizer, plan, *DAPO, "rollout.max_gen_batches=2")


class RewardProbe(Method):
    """A user method whose generation metrics describe each generation batch it is given, not the step."""

    name = "probe"
    generation_totals = frozenset({"probe/rows"})

    def __init__(self) -> None:
        super().__init__(MethodSettings())

    def on_generation(self, batch, ctx):
        return batch, {"probe/reward_mean": batch.rewards.mean().item(), "probe/reward_max": batch.rewards.max().item(),
                       "probe/reward_min": batch.rewards.min().item(), "probe/rows": float(len(batch))}


def test_generation_metrics_of_a_method_describe_every_generation_batch_of_the_step(tmp_path, tokenizer):
    # the first generation batch is all zero-variance groups (filtered out), the second fills the step
    plan = [groups_of([[2.0, 2.0], [0.25, 0.25]]), groups_of([[1.0, 0.0], [0.0, 1.0]])]
    hooks = MethodSet([RewardProbe()]).generation_hooks(SimpleNamespace(step=0))
    batch, metrics, calls = collect(tmp_path, tokenizer, plan, *DAPO, "rollout.max_gen_batches=2", hooks=hooks)
    assert calls == 2 and batch.group_ids.tolist() == [2, 2, 3, 3]
    generated = torch.tensor([r for rows in plan for _, r in rows], dtype=torch.float64)  # every row, both batches
    assert metrics["probe/reward_mean"] == pytest.approx(generated.mean().item())  # 0.8125, not the last batch's 0.5
    assert metrics["probe/reward_max"] == generated.max().item() == 2.0
    assert metrics["probe/reward_min"] == generated.min().item() == 0.0
    assert metrics["probe/rows"] == len(generated) == 8  # a declared total sums over the batches


# -- prompts ------------------------------------------------------------------------------------------------------


class NoIdTask:
    """A user task as docs/tasks.md writes one, but leaving ``TaskItem.id`` at its default: ids are optional."""

    name, system_prompt = "no-ids", "Answer with one word."

    def __init__(self) -> None:
        self.train = [TaskItem(f"What is the capital of {country}?", None) for country in ("France", "Peru", "Chad")]
        self.val = [TaskItem("What is the capital of Japan?", None)]

    def score(self, item, response_text):
        return Score(reward=0.0, correct=False, extracted=None)


class EchoEngine:
    """One token per row; records the prompts it was given."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []

    def generate(self, prompt_ids, params, *, seed=None, intervention=None) -> Generation:
        self.prompts += prompt_ids
        n = len(prompt_ids)
        return Generation(response_ids=torch.full((n, 1), 7), response_mask=torch.ones(n, 1),
                          sample_log_probs=torch.zeros(n, 1), texts=["x"] * n, truncated=torch.zeros(n, dtype=bool))


def test_each_item_is_sampled_from_its_own_prompt_whatever_its_id(tmp_path, tokenizer):
    task = NoIdTask()
    collector = SingleTurnCollector(task, tokenizer, tiny_config(tmp_path))
    engine = EchoEngine()
    items = [*task.train, *task.val]
    batch = collector.generate(engine, items, 2, sampling_params(collector.cfg.rollout), seed=0)
    want = [tokenizer.apply_chat_template([{"role": "system", "content": task.system_prompt},
                                           {"role": "user", "content": item.prompt}],
                                          add_generation_prompt=True, tokenize=True, return_dict=False)
            for item in items for _ in range(2)]
    assert engine.prompts == want
    assert batch.prompt_ids == want
