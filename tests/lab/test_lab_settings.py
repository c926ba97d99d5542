"""Settings the lab added to training: rollout.partial_batches and val.split."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.helpers import tiny_config
from tether.config import ConfigError
from tether.errors import RefillShortfall
from tether.methods.base import Method, MethodSettings
from tether.methods.hooks import MethodSet
from tether.tasks import Score
from tether.trainer import Trainer


def test_partial_batches_train_on_what_survived_instead_of_stopping(tmp_path, tiny_policy):
    model, tok = tiny_policy
    # one reward for every row: every group has zero variance, so dynamic sampling drops all of them
    # (a group_size of 1 would too, but config validation refuses it under grpo: nothing could train)
    def constant_trainer(cfg):
        trainer = Trainer(cfg, policy=model, tokenizer=tok)
        trainer.collector.task.score = lambda item, text: Score(reward=0.0, correct=False, extracted=None)
        return trainer

    strict = tiny_config(tmp_path, "rollout.dynamic_sampling=true", "rollout.max_gen_batches=2",
                         "algorithm.advantage=grpo")
    # the trainer's loop adds the last checkpoint and the settings a resume may change (tests/trainer)
    with pytest.raises(RefillShortfall, match=r"only 0 of rollout\.prompts_per_step=2 groups survived"):
        constant_trainer(strict).train_step()
    lenient = tiny_config(tmp_path, "rollout.dynamic_sampling=true", "rollout.max_gen_batches=2",
                          "rollout.partial_batches=true", f"run_dir={tmp_path / 'b'}")
    metrics = constant_trainer(lenient).train_step()
    assert metrics["rollout/short_batch"] == 1.0 and metrics["rollout/num_gen_batches"] == 2


class DropAll(Method):
    """A method whose filter keeps no row (ARMOR's acceptance, when no group passes)."""

    name = "drop_all"

    def __init__(self) -> None:
        super().__init__(MethodSettings())

    def on_generation(self, batch, ctx):
        return batch.select([]), {}


def test_a_method_filter_that_keeps_nothing_makes_a_step_that_teaches_nothing(tmp_path, tiny_policy):
    """ARMOR's acceptance can drop every group of every generation batch; the step then trains on the rows as
    generated with their group's mean reward (zero advantages) instead of failing on an empty batch."""
    model, tok = tiny_policy
    cfg = tiny_config(tmp_path, "rollout.dynamic_sampling=true", "rollout.max_gen_batches=2",
                      "rollout.partial_batches=true", "algorithm.advantage=grpo")
    trainer = Trainer(cfg, policy=model, tokenizer=tok)
    trainer.collector.task.score = lambda item, text: Score(reward=float(len(text)), correct=False, extracted=None)
    trainer.methods = MethodSet([DropAll()])
    batch, metrics = trainer.collect()
    assert metrics["rollout/short_batch"] == 1.0 and len(batch) > 0
    lengths = torch.tensor([float(len(text)) for text in batch.info["text"]])
    for gid in batch.group_ids.unique():
        rows = batch.group_ids == gid
        assert torch.allclose(batch.rewards[rows], lengths[rows].mean().expand(int(rows.sum())))
    assert trainer.train_step()["rollout/short_batch"] == 1.0


def test_validation_reads_the_configured_split(tmp_path, tiny_policy):
    model, tok = tiny_policy
    task = {"name": "addition", "kwargs": {"digits": 1, "train_size": 4, "val_size": 3, "report_size": 5}}
    for split, prompts in (("val", 3), ("report", 5)):
        cfg = tiny_config(tmp_path, f"val.split={split}", "val.samples=1", f"run_dir={tmp_path / split}", task=task)
        trainer = Trainer(cfg, policy=model, tokenizer=tok)
        seen = []
        original = trainer.collector.generate

        def spy(engine, items, *args, _original=original, _seen=seen, **kwargs):
            _seen.extend(items)
            return _original(engine, items, *args, **kwargs)

        trainer.collector.generate = spy
        trainer.validate()
        assert [i.id for i in seen] == [f"addition/{split}/{k}" for k in range(prompts)]


def test_val_split_of_an_agent_config_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="agent environments have one held-out split"):
        tiny_config(tmp_path, "val.split=report", task=None, env={"name": "frozenlake", "kwargs": {"size": 3}})
