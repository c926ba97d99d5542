"""ARMOR plug-in, unit level: group construction, drop rules, metrics, resets, the off-policy IS loss.

Batches are hand-built and the hooks' step context is a stub, so every count here is exact. The runs with a tiny
model (and every config in configs/armor) are in test_armor_runs.py.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tether.algos import LossInputs, ppo
from tether.config import ConfigError
from tether.methods import METHODS, Reference, StepContext, method_config
from tether.methods.armor import (
    Armor,
    ArmorSettings,
    anchor_offpolicy_is,
    attach_anchors,
    drift_metrics,
    on_policy_verdicts,
)
from tether.methods.hooks import MethodSet
from tether.rollout.base import GroupSampler, group_sampler
from tether.rollout.batch import RolloutBatch
from tether.rollout.multi_turn import AgentCollector
from tether.rollout.single_turn import SingleTurnCollector

N_ON = 15  # the paper's on-policy group; the anchor makes 16


def make_batch(groups: dict[int, list[bool]], *, source: int = 0, width: int = 3, tag: str = "on",
               rewards: dict[int, list[float]] | None = None) -> RolloutBatch:
    """Rows of each group in order; ``info["text"]`` names each row ``"<tag> g<gid> #<j>"``."""
    rows = [(gid, ok, j) for gid, oks in groups.items() for j, ok in enumerate(oks)]
    n = len(rows)
    if rewards is None:
        reward_list = [1.0 if ok else -1.0 for _, ok, _ in rows]
    else:
        reward_list = [rewards[gid][j] for gid, _, j in rows]
    return RolloutBatch(
        prompt_ids=[[1, 2, gid] for gid, _, _ in rows],
        response_ids=torch.arange(n * width).view(n, width),
        response_mask=torch.ones(n, width),
        sample_log_probs=torch.full((n, width), -1.0),
        group_ids=torch.tensor([gid for gid, _, _ in rows]),
        rewards=torch.tensor(reward_list),
        correct=torch.tensor([ok for _, ok, _ in rows]),
        source=torch.full((n,), source, dtype=torch.long),
        info={"item": [f"item{gid}" for gid, _, _ in rows],
              "text": [f"{tag} g{gid} #{j}" for gid, _, j in rows], "truncated": [False] * n},
    )


SAMPLING = "on-policy sampling params"  # what the context hands the reference's sampling


class StubCollector:
    """Records generate() calls and answers with reference samples whose correctness is given per group."""

    def __init__(self, ref_correct: dict[int, list[bool]], width: int = 5) -> None:
        self.ref_correct, self.width, self.calls = ref_correct, width, []

    def generate(self, engine, items, n, params, seed, *, group_ids=None, source=0, intervention=None):
        self.calls.append(dict(engine=engine, items=items, n=n, params=params, seed=seed, group_ids=group_ids,
                               source=source))
        return make_batch({g: self.ref_correct[g][:n] for g in group_ids}, source=source, width=self.width,
                          tag="ref")


def stub_context(*, step: int = 0, collector: StubCollector | None = None, policy=None,
                 reference: Reference | None = None) -> StepContext:
    """A step context over stand-ins: the collector's sampler, a named reference, an engine factory that names its
    model."""
    collector = collector or StubCollector({})
    return StepContext(step=step, cfg=SimpleNamespace(seed=0, task=object(), rollout=SimpleNamespace(group_size=N_ON)),
                       device=torch.device("cpu"), run_dir=Path("."), tokenizer=None, policy=policy,
                       reference=reference or Reference("REF"), engine=None, sampling=SAMPLING,
                       sample_groups=collector.generate, log_probs=None, make_engine=lambda model: f"engine({model})")


def stub_method(ref_correct: dict[int, list[bool]], **settings) -> tuple[Armor, StepContext, StubCollector]:
    collector = StubCollector(ref_correct)
    ctx = stub_context(collector=collector)
    method = Armor(ArmorSettings(**settings))
    method.setup(ctx)
    return method, ctx, collector


def mixed(c: int, n: int = N_ON) -> list[bool]:
    """``c`` correct among ``n``, the correct ones in the middle."""
    return [False] * ((n - c) // 2) + [True] * c + [False] * (n - c - (n - c) // 2)


# -- group construction ---------------------------------------------------------------------


def test_group_construction_counts_anchor_choice_and_drop_rules():
    on = make_batch({10: mixed(1), 11: [True] * N_ON, 12: [False] * N_ON, 13: mixed(7), 14: mixed(N_ON - 1)})
    ref_correct = {10: [False, True, True, False], 13: [False] * 4, 14: [True, False, False, True]}
    method, ctx, collector = stub_method(ref_correct)
    out, metrics = method.on_generation(on, ctx)

    # Reference samples were drawn only for groups that passed the on-policy test, ref_n each, tagged 1,
    # with the on-policy sampling parameters and the reference engine.
    (call,) = collector.calls
    assert call["group_ids"] == [10, 13, 14] and call["items"] == ["item10", "item13", "item14"]
    assert call["n"] == 4 and call["source"] == 1
    assert call["params"] == "on-policy sampling params" and call["engine"] == "engine(REF)"

    # Kept: 10 (1 of 15 correct) and 14 (14 of 15); each is 15 on-policy rows then exactly one anchor.
    assert out.group_ids.tolist() == [10] * 16 + [14] * 16
    assert out.source.tolist() == ([0] * 15 + [1]) * 2
    assert out.info["text"][:15] == [f"on g10 #{j}" for j in range(15)]
    assert out.info["text"][15] == "ref g10 #1"  # the first correct reference sample, not #2
    assert out.info["text"][31] == "ref g14 #0"
    assert out.correct[out.source == 1].all()
    assert out.width == 5 and out.response_mask[0].tolist() == [1, 1, 1, 0, 0]  # padded to the anchors

    assert metrics["armor/acceptance_rate"] == pytest.approx(2 / 5)
    assert metrics["armor/drop_all_correct"] == pytest.approx(1 / 5)
    assert metrics["armor/drop_all_wrong"] == pytest.approx(1 / 5)
    assert metrics["armor/drop_no_correct_ref"] == pytest.approx(1 / 5)
    assert metrics["armor/ref_samples"] == 12
    assert metrics["armor/ref_accuracy"] == pytest.approx(4 / 12)


def test_drop_rules_use_the_verifier_not_the_reward():
    # Group 1: mixed correctness under a constant reward (kept). Group 2: all correct, rewards varied by an
    # overlong-style penalty (dropped).
    on = make_batch({1: [True, False, False], 2: [True] * 3},
                    rewards={1: [0.5, 0.5, 0.5], 2: [1.0, 0.7, 0.2]})
    assert on_policy_verdicts(on.correct, on.group_ids, on.source) == {1: "keep", 2: "all_correct"}
    method, ctx, _ = stub_method({1: [True] * 4})
    out, _ = method.on_generation(on, ctx)
    assert out.group_ids.tolist() == [1, 1, 1, 1]


def test_verdicts_count_only_on_policy_rows():
    batch = RolloutBatch.concat([make_batch({5: [True, True]}), make_batch({5: [False]}, source=1)])
    assert on_policy_verdicts(batch.correct, batch.group_ids, batch.source) == {5: "all_correct"}


def test_no_group_passes_gives_an_empty_batch_and_no_reference_call():
    method, ctx, collector = stub_method({})
    out, metrics = method.on_generation(make_batch({1: [True] * 3, 2: [False] * 3}), ctx)
    assert len(out) == 0 and collector.calls == []
    assert metrics["armor/acceptance_rate"] == 0.0 and metrics["armor/ref_samples"] == 0


def test_attach_anchors_without_reference_batch():
    on = make_batch({1: [True, False]})
    out, stats = attach_anchors(on, None, {1: "keep"})
    assert len(out) == 0 and stats["no_correct_ref"] == 1


def test_acceptance_metrics_accumulate_over_generation_batches_of_a_step():
    method, ctx, collector = stub_method({1: [True] * 4, 2: [False, True, False, True], 3: [True] * 4,
                                          4: [False] * 4})
    hooks = MethodSet([method]).generation_hooks(ctx)
    _, first = hooks.on_generation(make_batch({1: [True, False], 2: [True, True]}))
    _, second = hooks.on_generation(make_batch({3: [False, True], 4: [True, False]}))
    assert first["armor/acceptance_rate"] == pytest.approx(1 / 2)
    # the step's, over both batches: 2 of 4 groups accepted (group 4 has no correct reference sample), 12 reference
    # samples of which 4 + 4 are correct; each batch alone says 1/2 then 1/2, and 4/4 then 4/8 of its samples
    assert second["armor/acceptance_rate"] == pytest.approx(2 / 4)
    assert second["armor/drop_all_correct"] == pytest.approx(1 / 4)
    assert second["armor/drop_no_correct_ref"] == pytest.approx(1 / 4)
    assert second["armor/ref_samples"] == 12
    assert second["armor/ref_accuracy"] == pytest.approx(8 / 12)
    seeds = [c["seed"] for c in collector.calls]
    assert seeds[0] != seeds[1]  # each generation batch draws its own reference samples
    ctx = dataclasses.replace(ctx, step=1)
    _, third = MethodSet([method]).generation_hooks(ctx).on_generation(make_batch({5: [True, True]}))
    assert third["armor/acceptance_rate"] == 0.0  # a new step starts new counts


def test_anchors_off_leaves_the_batch_alone():
    method, ctx, collector = stub_method({}, anchors=False)
    on = make_batch({1: [True, False]})
    out, metrics = method.on_generation(on, ctx)
    assert out is on and metrics == {} and collector.calls == []


def test_anchors_need_a_collector_that_samples_groups():
    """Under a collector without ``generate`` (not a GroupSampler) ``ctx.sample_groups`` is None: anchors used to
    call it at the first generation batch, after the models had loaded, and stop with "TypeError: 'NoneType' object
    is not callable"; setup now says what is missing."""
    ctx = dataclasses.replace(stub_context(), sample_groups=None)
    with pytest.raises(ConfigError, match=r"^methods\.armor\.anchors=true samples the reference's groups with the "
                                          r"collector's generate \(tether\.rollout\.base\.GroupSampler\), and "
                                          r"this run's collector has none"):
        Armor(ArmorSettings()).setup(ctx)
    Armor(ArmorSettings(anchors=False)).setup(ctx)  # resets and metrics alone sample nothing


def test_the_single_turn_collector_samples_groups_and_the_agent_loop_does_not():
    single, agent = object.__new__(SingleTurnCollector), object.__new__(AgentCollector)
    assert isinstance(single, GroupSampler) and group_sampler(single) == single.generate
    assert not isinstance(agent, GroupSampler) and group_sampler(agent) is None
    stub = StubCollector({})  # any collector with generate is one
    assert group_sampler(stub) == stub.generate


# -- metrics --------------------------------------------------------------------------------


def test_drift_and_source_metrics_are_token_means_by_source():
    batch = RolloutBatch.concat([make_batch({1: [True, False]}), make_batch({1: [True]}, source=1)])
    batch.response_mask[1, 2] = 0.0  # a padded token must not count
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -50.0], [-4.0, -4.0, -4.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0], [-2.0, -2.0, 0.0], [-1.0, -2.0, -3.0]])
    m = drift_metrics(old, ref, batch.response_mask, batch.source)
    assert m["armor/kl_on_old"] == pytest.approx((0.5 + 0.0 - 1.0 + 1.0 + 1.0) / 5)  # log old - log ref
    assert m["armor/kl_on_ref"] == pytest.approx((3.0 + 2.0 + 1.0) / 3)  # log ref - log old, anchors only

    batch.token["ref_log_probs"], batch.token["old_log_probs"] = ref, old
    method, ctx, _ = stub_method({})
    out = method.on_score(batch, ctx)
    assert out["armor/kl_on_old"] == pytest.approx(m["armor/kl_on_old"])
    assert out["armor/reward_on"] == 0.0 and out["armor/reward_anchor"] == 1.0
    assert out["armor/accuracy_on"] == 0.5 and out["armor/accuracy_anchor"] == 1.0
    assert out["armor/anchor_rows"] == 1.0


def test_anchor_advantage_metrics():
    batch = RolloutBatch.concat([make_batch({1: [True, False]}), make_batch({1: [True]}, source=1)])
    batch.token["advantages"] = torch.tensor([[1.0] * 3, [-1.0] * 3, [0.0] * 3])
    method, ctx, _ = stub_method({})
    m = method.on_advantages(batch, ctx)
    assert m == {"armor/anchor_advantage": 0.0, "armor/anchor_zero_adv_frac": 1.0}


def test_anchor_advantage_is_the_mean_over_anchors_of_each_row_token_mean():
    # Two on-policy rows and two anchors of one group, each with its own advantage; anchor 2 has a padded token
    # (advantage 0 there, as after masking), so its row mean is over its 2 real tokens: 0.6, not 0.4.
    batch = RolloutBatch.concat([make_batch({1: [True, False]}), make_batch({1: [True, True]}, source=1)])
    batch.response_mask[2, 2] = 0.0
    batch.token["advantages"] = torch.tensor([[1.0] * 3, [-0.2] * 3, [0.6, 0.6, 0.0], [0.0] * 3])
    method, ctx, _ = stub_method({})
    m = method.on_advantages(batch, ctx)
    # the anchors' row token means are 0.6 and 0 (every row together would give (1 - 0.2 + 0.6 + 0) / 4 = 0.35)
    assert m["armor/anchor_advantage"] == pytest.approx((0.6 + 0.0) / 2, rel=1e-6)
    assert m["armor/anchor_zero_adv_frac"] == pytest.approx(1 / 2)
    # and a batch without anchors logs nothing
    assert method.on_advantages(make_batch({1: [True, False]}), ctx) == {}


# -- settings and reference resets ----------------------------------------------------------


def test_settings_defaults_and_registration():
    assert METHODS["armor"] is Armor and Armor.needs_ref
    s = method_config("armor", {})
    assert (s.anchors, s.ref_n, s.reset, s.tau, s.until_step) == (True, 4, "none", None, None)


@pytest.mark.parametrize(("settings", "field"), [
    ({"reset": "every"}, "tau"),
    ({"reset": "until"}, "until_step"),
    ({"tau": 5}, "tau"),
    ({"reset": "every", "tau": 5, "until_step": 9}, "until_step"),
    ({"ref_n": 0}, "ref_n"),
    ({"anchor": True}, "anchor"),  # extra keys are refused
    ({"reset": "sometimes"}, "reset"),
])
def test_settings_errors_name_the_key(settings, field):
    with pytest.raises(ConfigError, match=rf"methods\.armor\.{field}"):
        method_config("armor", settings)


@pytest.mark.parametrize(("settings", "steps"), [
    ({}, []),
    ({"reset": "every", "tau": 3}, [3, 6, 9]),
    ({"reset": "every", "tau": 1}, list(range(1, 11))),
    ({"reset": "until", "until_step": 4}, [1, 2, 3, 4]),  # the 8B run: every step until 180, then frozen
    ({"reset": "until", "until_step": 7, "tau": 2}, [2, 4, 6]),
])
def test_reset_schedules(settings, steps):
    s = ArmorSettings(**settings)
    assert [t for t in range(1, 11) if s.resets_at(t)] == steps


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_reset_copies_the_policy_in_place_and_the_reference_is_frozen_between_resets():
    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 3)
    ref = copy.deepcopy(policy).requires_grad_(False)
    ref_tensors = [p.data_ptr() for p in ref.parameters()]
    reference = Reference(ref)
    method = Armor(ArmorSettings(anchors=False, reset="every", tau=2))
    method.setup(stub_context(policy=policy, reference=reference))
    snapshot = _weights(ref)
    history = []
    for step in range(1, 6):
        with torch.no_grad():
            policy.weight.add_(0.1)  # the update of this step
        history.append(method.after_update(stub_context(step=step, policy=policy, reference=reference)))
        if step % 2 == 0:
            assert _equal(_weights(ref), _weights(policy))
            snapshot = _weights(ref)
        else:
            assert _equal(_weights(ref), snapshot) and not _equal(_weights(ref), _weights(policy))
    assert [p.data_ptr() for p in ref.parameters()] == ref_tensors  # copied in place, not aliased
    assert not any(p.requires_grad for p in ref.parameters())
    assert reference.moved  # the trainer now checkpoints it
    assert [m["armor/ref_reset"] for m in history] == [0, 1, 0, 1, 0]
    assert [m["armor/ref_age"] for m in history] == [1, 0, 1, 0, 1]
    restored = Armor(ArmorSettings(anchors=False))
    restored.load_state_dict(method.state_dict())
    assert (restored.resets, restored.last_reset) == (2, 4)


# -- the off-policy IS ablation loss ---------------------------------------------------------


def test_anchor_offpolicy_is_uses_pi_ref_as_old_on_anchors_only():
    # Row 0 on-policy: r = 1.1 / 1 (inside the clip), A = 1 -> loss -1.1, gradient -1.1.
    # Row 1 anchor:    r = pi / pi_ref = 0.5 / 0.25 = 2 -> clipped at 1.28, A = 1 -> loss -1.28, no gradient.
    # (Its pi_old = 0.5 would have given r = 1.) Token mean over the two tokens.
    f64 = dict(dtype=torch.float64)
    log_probs = torch.tensor([[math.log(1.1)], [math.log(0.5)]], **f64, requires_grad=True)
    inputs = LossInputs(log_probs=log_probs, old_log_probs=torch.tensor([[0.0], [math.log(0.5)]], **f64),
                        advantages=torch.ones(2, 1, **f64), response_mask=torch.ones(2, 1, **f64),
                        ref_log_probs=torch.tensor([[-7.0], [math.log(0.25)]], **f64),
                        source=torch.tensor([0, 1]))
    out = anchor_offpolicy_is(inputs)
    assert out.loss.item() == pytest.approx((-1.1 - 1.28) / 2)
    out.loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-1.1 / 2], [0.0]], **f64))
    assert out.metrics["actor/pg_clipfrac"].item() == pytest.approx(0.5)


def test_anchor_offpolicy_is_is_ppo_without_anchors_or_with_ref_equal_old():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 5, generator=g, dtype=torch.float64) - 0.1
    base = dict(log_probs=old + 0.3 * torch.randn(4, 5, generator=g, dtype=torch.float64), old_log_probs=old,
                advantages=torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, 5),
                response_mask=torch.ones(4, 5, dtype=torch.float64))
    dapo = ppo(LossInputs(**base), clip_low=0.2, clip_high=0.28, dual_clip=10.0).loss
    no_anchor = LossInputs(**base, ref_log_probs=old - 1.0, source=torch.zeros(4, dtype=torch.long))
    ref_is_old = LossInputs(**base, ref_log_probs=old, source=torch.tensor([0, 1, 0, 1]))
    assert torch.equal(anchor_offpolicy_is(no_anchor).loss, dapo)
    assert torch.equal(anchor_offpolicy_is(ref_is_old).loss, dapo)
    with pytest.raises(ValueError, match="source"):
        anchor_offpolicy_is(LossInputs(**base, ref_log_probs=old))


def test_anchors_get_zero_masks_for_what_an_intervention_recorded_on_policy():
    on = make_batch({1: [True, False]})
    on.token["gate_mask"] = torch.ones(2, 3)
    on.info["episode"] = ["a", "b"]
    method, ctx, _ = stub_method({1: [True] * 4})
    out, _ = method.on_generation(on, ctx)
    assert out.token["gate_mask"].tolist() == [[1, 1, 1, 0, 0]] * 2 + [[0] * 5]
    assert out.info["episode"] == ["a", "b", None]
