"""Registries, and the contract every registered advantage and policy loss must meet.

The contract tests are parametrised over the registries, so a new entry is covered on registration.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from tether import algos
from tether.algos import (
    ADVANTAGE_TAGS,
    ADVANTAGES,
    POLICY_LOSSES,
    AdvantageInputs,
    AdvantageOutput,
    LossOutput,
    UnknownNameError,
    get_advantage,
    get_policy_loss,
    register_advantage,
    register_policy_loss,
)


@pytest.mark.parametrize(("getter", "registry"),
                         [(get_advantage, ADVANTAGES), (get_policy_loss, POLICY_LOSSES)])
def test_unknown_name_lists_known_names(getter, registry):
    with pytest.raises(KeyError) as err:
        getter("no-such-thing")
    message = str(err.value)
    assert "no-such-thing" in message
    for name in registry:
        assert name in message
    assert isinstance(err.value, ValueError) and isinstance(err.value, UnknownNameError)


def test_expected_names_are_registered():
    assert {"grpo", "dr_grpo", "rloo", "qae", "episode", "gigpo", "clean_baseline"} <= set(ADVANTAGES)
    assert {"ppo", "gspo", "armor", "eapo"} <= set(POLICY_LOSSES)
    assert get_policy_loss("ppo") is algos.ppo
    assert get_advantage("grpo") is algos.grpo


def test_register_lookup_and_duplicate(restore_registries):
    @register_advantage("_test_zero", needs=("injected",))
    def zero(inputs, *, scale: float = 1.0):
        return AdvantageOutput(inputs.rewards * 0 * scale)

    assert get_advantage("_test_zero") is zero
    assert ADVANTAGES.needs("_test_zero") == {"injected"} and ADVANTAGES.needs("grpo") == frozenset()
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("_test_zero")(zero)
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("ppo")(algos.ppo)


def test_registry_fixture_restores(restore_registries):
    POLICY_LOSSES.unregister("ppo")
    assert "ppo" not in POLICY_LOSSES


def test_registry_was_restored():
    # Runs after the test above (file order): the fixture put "ppo" back.
    assert get_policy_loss("ppo") is algos.ppo


def test_bad_signatures_are_refused(restore_registries):
    with pytest.raises(TypeError, match="keyword-only"):
        register_advantage("_bad1")(lambda inputs, eps=1e-6: inputs)
    with pytest.raises(TypeError, match="keyword-only"):
        register_policy_loss("_bad2")(lambda inputs, *, agg="token-mean", alpha: inputs)
    with pytest.raises(TypeError, match="agg"):
        register_policy_loss("_bad3")(lambda inputs, *, clip=0.2: inputs)
    with pytest.raises(TypeError, match="inputs"):
        register_advantage("_bad4")(lambda rewards, group_ids: rewards)
    with pytest.raises(TypeError, match="may need: injected, step_returns, obs_keys"):
        register_advantage("_bad5", needs=("episode_id",))(lambda inputs: inputs)
    assert "_bad1" not in ADVANTAGES and "_bad2" not in POLICY_LOSSES and "_bad5" not in ADVANTAGES


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_policy_loss_meets_the_contract(name, make_inputs):
    fn = get_policy_loss(name)
    params = list(inspect.signature(fn).parameters.values())
    assert params[0].name == "inputs"
    assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in params[1:])
    defaults = {p.name: p.default for p in params[1:]}
    inspect.signature(fn).bind(None, **defaults)  # what the config validator does

    inputs = make_inputs()
    out = fn(inputs, **defaults)
    assert isinstance(out, LossOutput)
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    out.loss.backward()
    assert torch.isfinite(inputs.log_probs.grad).all()
    assert inputs.log_probs.grad.abs().sum() > 0
    assert (inputs.log_probs.grad[inputs.response_mask == 0] == 0).all()  # padding gets no gradient
    assert out.metrics and all("/" in k for k in out.metrics)  # namespaced, e.g. actor/pg_clipfrac
    for key, value in out.metrics.items():
        assert isinstance(value, torch.Tensor) and value.dim() == 0, key
        assert torch.isfinite(value) and not value.requires_grad, key


def tagged(rewards: torch.Tensor, group_ids: torch.Tensor) -> AdvantageInputs:
    """Inputs with every tag set: no row injected, step returns equal to the rewards, one observation per group."""
    return AdvantageInputs(rewards, group_ids, injected=torch.zeros(len(rewards), dtype=torch.bool),
                           step_returns=rewards, obs_keys=[str(g) for g in group_ids.tolist()])


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_every_advantage_meets_the_contract(name):
    fn = get_advantage(name)
    params = list(inspect.signature(fn).parameters.values())
    assert params[0].name == "inputs"
    assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in params[1:])
    assert ADVANTAGES.needs(name) <= set(ADVANTAGE_TAGS)

    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (40,), generator=g).double()
    group_ids = torch.randint(0, 6, (40,), generator=g) * 7 + 100  # sparse, unordered ids
    out = fn(tagged(rewards, group_ids))
    adv = out.advantages
    assert adv.shape == rewards.shape and adv.dtype == rewards.dtype and torch.isfinite(adv).all()
    for key, value in out.metrics.items():
        assert "/" in key and isinstance(value, torch.Tensor) and value.dim() == 0, key
    # A group whose rewards are all equal carries no signal, for every estimator.
    assert (fn(tagged(torch.full((5,), 0.7), torch.zeros(5, dtype=torch.long))).advantages.abs() < 1e-5).all()
    # Invariant to the order of rows.
    perm = torch.randperm(40, generator=g)
    torch.testing.assert_close(fn(tagged(rewards[perm], group_ids[perm])).advantages, adv[perm])


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_every_needed_tag_is_required(name):
    """An estimator that reads a tag it did not declare would pass the config check and fail mid-run."""
    fn = get_advantage(name)
    full = tagged(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 0]))
    for tag in ADVANTAGE_TAGS:
        if tag in ADVANTAGES.needs(name):
            with pytest.raises(ValueError, match=f"needs AdvantageInputs\\.{tag}"):
                fn(dataclasses.replace(full, **{tag: None}))
        else:
            fn(dataclasses.replace(full, **{tag: None}))  # an undeclared tag is never read
