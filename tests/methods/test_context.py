"""Method hooks see a StepContext, never the trainer; the loss gets exactly the per-token tensors methods declare;
extra_loss gets the whole mini-batch's totals.

A spy method, registered for these tests only, records every hook call of a real (tiny) training step.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
from typing import Any, ClassVar

import pytest
import torch

from tests.trainer.helpers import tiny_config
from tether.algos import TOKEN_PRODUCERS
from tether.methods import METHODS, Method, MiniBatch, StepContext, register_method
from tether.methods.base import MethodSettings
from tether.trainer import Trainer

HOOKS = ("setup", "intervention", "on_generation", "on_score", "on_advantages", "extra_loss", "after_update")


class Spy(Method):
    """Records each hook's context; adds one declared and one undeclared per-token tensor in on_score."""

    name: ClassVar[str] = "spy"
    loss_tokens: ClassVar[frozenset[str]] = frozenset({"spy_for_loss"})

    def __init__(self, settings: MethodSettings) -> None:
        super().__init__(settings)
        self.calls: list[tuple[str, StepContext]] = []

    def setup(self, ctx: StepContext) -> None:
        self.calls.append(("setup", ctx))

    def intervention(self, ctx: StepContext) -> None:
        self.calls.append(("intervention", ctx))

    def on_generation(self, batch: Any, ctx: StepContext) -> tuple[Any, dict[str, Any]]:
        self.calls.append(("on_generation", ctx))
        return batch, {}

    def on_score(self, batch: Any, ctx: StepContext) -> dict[str, Any]:
        self.calls.append(("on_score", ctx))
        batch.token["spy_for_loss"] = torch.ones_like(batch.response_mask)
        batch.token["spy_private"] = torch.ones_like(batch.response_mask)
        return {}

    def on_advantages(self, batch: Any, ctx: StepContext) -> dict[str, Any]:
        self.calls.append(("on_advantages", ctx))
        return {}

    def extra_loss(self, inputs: Any, micro: Any, ctx: StepContext) -> None:
        self.calls.append(("extra_loss", ctx))
        return None

    def after_update(self, ctx: StepContext) -> dict[str, Any]:
        self.calls.append(("after_update", ctx))
        return {}


@pytest.fixture
def spy_method():
    register_method(Spy)
    yield Spy
    METHODS.unregister(Spy.name)
    TOKEN_PRODUCERS.pop("spy_for_loss", None)


@pytest.fixture
def spied(spy_method, tmp_path, tiny_policy) -> tuple[Trainer, Spy, list]:
    """A trainer with the spy (two mini-batches of two micro-batches) after one step, and the loss inputs it saw."""
    model, tok = tiny_policy
    cfg = tiny_config(tmp_path, "optim.mini_batches=2", "optim.micro_batch_size=2", methods={"spy": {}})
    trainer = Trainer(cfg, policy=copy.deepcopy(model), tokenizer=tok)
    seen, inner = [], trainer.policy_loss_fn

    def loss(inputs, **kwargs):
        seen.append(inputs)
        return inner(inputs, **kwargs)

    trainer.policy_loss_fn = loss
    trainer.train_step()
    (spy,) = trainer.methods
    return trainer, spy, seen


def holds(value: Any, target: Any) -> bool:
    """Whether ``value`` is ``target``, a method bound to it, or a partial over it."""
    if isinstance(value, functools.partial):
        return any(holds(v, target) for v in (value.func, *value.args, *value.keywords.values()))
    return value is target or getattr(value, "__self__", None) is target


def test_every_hook_sees_a_step_context_and_never_the_trainer(spied):
    trainer, spy, _ = spied
    assert {name for name, _ in spy.calls} == set(HOOKS)
    for name, ctx in spy.calls:
        assert type(ctx) is StepContext, name
        assert not hasattr(ctx, "trainer") and not isinstance(ctx, Trainer)
        for field in dataclasses.fields(ctx):
            assert not holds(getattr(ctx, field.name), trainer), f"{name}: ctx.{field.name} reaches the trainer"


def test_the_context_carries_the_step_as_the_hook_sees_it(spied):
    trainer, spy, _ = spied
    steps = {name: {ctx.step for n, ctx in spy.calls if n == name} for name in HOOKS}
    assert steps == {**{name: {0} for name in HOOKS}, "after_update": {1}}  # after the step is counted
    ctx = next(ctx for n, ctx in spy.calls if n == "after_update")
    assert ctx.seed_for("rollout", 3) == trainer.seed_for("rollout", 3)
    assert ctx.policy is trainer.policy and ctx.reference is trainer.reference and ctx.cfg is trainer.cfg


def test_extra_loss_gets_the_whole_mini_batch_and_no_other_hook_does(spied):
    _, spy, seen = spied
    minis = [ctx.mini_batch for n, ctx in spy.calls if n == "extra_loss"]
    assert all(ctx.mini_batch is None for n, ctx in spy.calls if n != "extra_loss")
    assert len(minis) == len(seen) == 4  # 8 rows: 2 mini-batches x 2 micro-batches of 2 rows
    distinct = list({id(m): m for m in minis}.values())
    assert len(distinct) == 2 and all(isinstance(m, MiniBatch) for m in distinct)
    rows = torch.cat([m.rows for m in distinct]).sort().values
    assert rows.tolist() == list(range(8))  # the two mini-batches split the step's rows
    for mini, inputs in zip(minis, seen, strict=True):
        assert mini.num_seqs == len(mini.rows) == len(mini.batch) == inputs.num_seqs
        assert mini.num_tokens == inputs.num_tokens == float(mini.batch.response_mask.sum())
        assert mini.token_sum("spy_for_loss") == mini.num_tokens  # ones on every response token


def test_the_loss_gets_exactly_the_declared_per_token_tensors(spied):
    _, _, seen = spied
    assert all(set(inputs.tokens) == {"spy_for_loss"} for inputs in seen)  # not "spy_private"
    assert TOKEN_PRODUCERS["spy_for_loss"] == ["methods.spy"]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_registered_hook_takes_a_context(name):
    for hook in HOOKS:
        params = list(inspect.signature(getattr(METHODS[name], hook)).parameters)
        assert params[-1] == "ctx", f"methods.{name}.{hook}{params}: hooks take a StepContext named ctx"
