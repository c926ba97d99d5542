"""tether's estimators and losses through verl's registry signatures.

A fake ``core_algos`` always; the real one when verl imports.
"""

from __future__ import annotations

import importlib
import types

import numpy as np
import pytest
import torch

from tether import algos
from tether.algos import LossInputs
from tether.integrations.verl import ADVANTAGES, PREFIX, exact_metrics, register_into_verl


def fake_core_algos() -> types.ModuleType:
    """The two registries with verl 0.9.1's decorator behaviour (the advantage one refuses a different function)."""
    mod = types.ModuleType("fake_core_algos")
    mod.ADV_ESTIMATOR_REGISTRY, mod.POLICY_LOSS_REGISTRY = {}, {}

    def register_adv_est(name):
        def decorator(fn):
            if name in mod.ADV_ESTIMATOR_REGISTRY and mod.ADV_ESTIMATOR_REGISTRY[name] != fn:
                raise ValueError(f"Adv estimator {name} has already been registered")
            mod.ADV_ESTIMATOR_REGISTRY[name] = fn
            return fn
        return decorator

    def register_policy_loss(name):
        def decorator(fn):
            mod.POLICY_LOSS_REGISTRY[name] = fn
            return fn
        return decorator

    mod.register_adv_est, mod.register_policy_loss = register_adv_est, register_policy_loss
    mod.get_adv_estimator_fn = mod.ADV_ESTIMATOR_REGISTRY.__getitem__
    mod.get_policy_loss_fn = mod.POLICY_LOSS_REGISTRY.__getitem__
    return mod


def real_core_algos():
    try:
        return importlib.import_module("verl.trainer.ppo.core_algos")
    except Exception as err:  # ImportError, or a dependency of verl failing at import
        pytest.skip(f"verl does not import here ({type(err).__name__}: {err}); verl 0.9.1 needs ray, omegaconf, "
                    "tensordict, hydra-core, codetiming ... (it imported on CPU with those in a side directory)")


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(5)[None] < torch.tensor([5, 3, 4, 2, 5, 1])[:, None]).float()
    rewards = torch.zeros(6, 5)
    rewards[torch.arange(6), mask.sum(1).long() - 1] = torch.rand(6, generator=g)  # verl: reward on the last token
    lp = torch.randn(6, 5, generator=g) * 0.1 - 1
    return rewards, mask, np.array(["a", "a", "a", "b", "b", "b"], dtype=object), lp, g


class Cfg:
    def __init__(self, **info):
        self.global_batch_info = info


@pytest.fixture(params=["fake", "real"])
def core(request):
    mod = fake_core_algos() if request.param == "fake" else real_core_algos()
    yield mod
    for registry in (mod.ADV_ESTIMATOR_REGISTRY, mod.POLICY_LOSS_REGISTRY):  # leave verl as we found it
        for name in [n for n in registry if str(n).startswith(PREFIX)]:
            del registry[name]


def test_registers_every_name_and_twice_is_fine(core):
    names = register_into_verl(core)
    assert names == [PREFIX + n for n in ("grpo", "dr_grpo", "rloo", "qae", "episode", "armor", "eapo", "seed_opd")]
    register_into_verl(core, hparams={"qae": {"quantile": 0.5}})
    with pytest.raises(ValueError, match="not a tether name"):
        register_into_verl(core, hparams={"ppo2": {}})
    with pytest.raises(ValueError, match="unknown setting"):
        register_into_verl(core, hparams={"armor": {"alpah": 0.9}})


@pytest.mark.parametrize("name", ADVANTAGES)
def test_advantage_adapter_equals_tether(core, name):
    register_into_verl(core)
    rewards, mask, index, _, _ = batch()
    adv, returns = core.get_adv_estimator_fn(PREFIX + name)(token_level_rewards=rewards, response_mask=mask,
                                                           index=index, config=None)
    want = algos.get_advantage(name)(algos.AdvantageInputs(rewards.sum(-1), torch.tensor([0, 0, 0, 1, 1, 1])))
    want = want.advantages
    torch.testing.assert_close(adv, want[:, None] * mask)
    assert torch.equal(adv, returns)


def test_armor_adapter_equals_tether_with_verl_global_normalisers(core):
    register_into_verl(core, hparams={"armor": {"alpha": 0.875}})
    _, mask, _, old, g = batch()
    lp = (old + 0.05 * torch.randn(6, 5, generator=g)).requires_grad_()
    ref = old - 0.1
    adv = torch.randn(6, 5, generator=g) * mask
    fn = core.get_policy_loss_fn(PREFIX + "armor")
    with pytest.raises(ValueError, match="ref_log_probs"):  # verl's own loss call does not pass it
        fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask.bool(), config=Cfg())
    # a worker that passes the reference: dp_size 2, global tokens 40 -> tether's loss x 2, as verl's agg_loss
    loss, metrics = fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask.bool(),
                       loss_agg_mode="token-mean", config=Cfg(dp_size=2, batch_num_tokens=40), ref_log_prob=ref)
    want = algos.armor(LossInputs(lp, old, adv, mask, ref_log_probs=ref, num_tokens=40), alpha=0.875)
    torch.testing.assert_close(loss, 2 * want.loss)
    loss.backward()
    assert lp.grad is not None and torch.isfinite(lp.grad).all()
    assert all(k.startswith("actor/") and isinstance(v, float) for k, v in metrics.items())


def test_eapo_and_seed_adapters_take_their_tensors(core):
    register_into_verl(core)
    _, mask, _, old, g = batch(1)
    lp = old.clone().requires_grad_()
    adv = torch.randn(6, 5, generator=g) * mask
    gate = (torch.rand(6, 5, generator=g) > 0.7).float() * mask
    eapo = core.get_policy_loss_fn(PREFIX + "eapo")
    loss, _ = eapo(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask, config=Cfg(),
                   rollout_log_probs=old - 0.2 * gate, gate_mask=gate)
    want = algos.eapo(LossInputs(lp, old, adv, mask, behaviour_log_probs=old - 0.2 * gate, tokens={"gate_mask": gate}))
    torch.testing.assert_close(loss, want.loss)
    seed = core.get_policy_loss_fn(PREFIX + "seed_opd")
    loss, metrics = seed(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask, config=Cfg(),
                         teacher_log_probs=old + 0.3)
    torch.testing.assert_close(loss, algos.seed_opd_loss(lp, old + 0.3, mask).loss)
    assert "actor/seed_opd_gate_mean" in metrics
    with pytest.raises(NotImplementedError, match="importance weights"):
        seed(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask, rollout_is_weights=torch.ones(6, 5),
             teacher_log_probs=old)


def verl_fold(calls: list[dict[str, float]]) -> dict[str, float]:
    """verl's fold of the loss metrics: each micro-batch's appended to a list per key (``append_to_dict``), then the
    plain mean of each list, or its max / min where the key holds ``max`` / ``min`` (``reduce_metrics``)."""
    lists: dict[str, list[float]] = {}
    for metrics in calls:
        for k, v in metrics.items():
            lists.setdefault(k, []).append(v)
    return {k: float(np.max(v) if "max" in k else np.min(v) if "min" in k else np.mean(v)) for k, v in lists.items()}


def test_subset_means_and_ratios_through_verls_fold_are_tethers_over_the_whole_batch(core):
    """Six one-row micro-batches, two of them ARMOR anchors, folded as verl folds them. ARMOR's kl_on_ref is a mean
    over anchor tokens and EAPO's is_ess a ratio over the weights: verl's plain mean over micro-batches counted each
    anchor-free micro-batch's 0 and averaged six one-weight ESS values of 1. Through exact_metrics they must be the
    loss's values on the whole batch in one call."""
    register_into_verl(core)
    _, mask, _, old, g = batch(2)
    lp = old + 0.05 * torch.randn(6, 5, generator=g)
    adv = torch.randn(6, 5, generator=g) * mask
    source, ref = torch.tensor([0, 1, 0, 0, 1, 0]), old - 0.3 * torch.rand(6, 5, generator=g)
    gate = (torch.rand(6, 5, generator=g) > 0.5).float() * mask
    behaviour = old - 0.5 * torch.rand(6, 5, generator=g) * gate
    cases = {"armor": ("armor/loss_kl_on_ref", dict(ref_log_prob=ref, source=source)),
             "eapo": ("eapo/is_ess", dict(rollout_log_probs=behaviour, gate_mask=gate))}
    for name, (metric, tensors) in cases.items():
        fn = core.get_policy_loss_fn(PREFIX + name)
        cfg = Cfg(dp_size=1, batch_num_tokens=float(mask.sum()), global_batch_size=6)
        calls = [fn(old_log_prob=old[[i]], log_prob=lp[[i]], advantages=adv[[i]], response_mask=mask[[i]],
                    config=cfg, **{k: v[[i]] for k, v in tensors.items()})[1] for i in range(6)]
        whole = fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask, config=cfg, **tensors)[1]
        direct = algos.get_policy_loss(name)(LossInputs(
            lp, old, adv, mask, ref_log_probs=ref, source=source if name == "armor" else None,
            behaviour_log_probs=behaviour, tokens={"gate_mask": gate})).metrics[metric].item()
        key = "actor/" + metric.replace("/", "_")
        assert direct not in (0.0, 1.0) and whole.get(key, direct) == pytest.approx(direct, rel=1e-6)
        got = exact_metrics(verl_fold(calls), fn)
        assert got[key] == pytest.approx(direct, rel=1e-5), name
