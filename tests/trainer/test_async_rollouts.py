"""rollout.max_staleness: batches sampled k steps ahead in a background thread, by the weights of their step minus k,
with the prompts and seeds of a synchronous run; k = 0 is the synchronous trainer; a resume with batches in flight
continues exactly; what cannot run stale is refused before any model loads."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from tests.trainer.helpers import tiny_config
from tether.config import ConfigError
from tether.models.forward import response_log_probs
from tether.rollout.asynchronous import VERSION, AsyncCollector
from tether.trainer import Trainer

# lr 0.05 moves the tiny policy far in a step: parity would judge the staleness itself (it only logs here)
ASYNC = ("rollout.max_staleness=1", "rollout.correction.mode=tis", "optim.lr=0.05", "train.steps=4",
         "health.parity.patience=0")


def make(tmp_path, tiny_policy, *overrides):
    model, tok = tiny_policy
    return Trainer(tiny_config(tmp_path, *overrides), policy=copy.deepcopy(model), tokenizer=tok)


def consumed(trainer):
    """Record each batch the trainer takes from its collector, and the thread that sampled it."""
    batches, threads = [], []
    inner_collect = trainer.collector.inner.collect if isinstance(trainer.collector, AsyncCollector) \
        else trainer.collector.collect

    def sampled(engine, seeds, hooks):
        threads.append(threading.current_thread().name)
        return inner_collect(engine, seeds, hooks)

    collect = trainer.collector.collect

    def taken(engine, seeds, hooks):
        batch, metrics = collect(engine, seeds, hooks)
        batches.append((batch, metrics))
        return batch, metrics

    if isinstance(trainer.collector, AsyncCollector):
        trainer.collector.inner.collect = sampled
    trainer.collector.collect = taken
    return batches, threads


def params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_staleness_zero_is_the_synchronous_trainer(tmp_path, tiny_policy):
    default = make(tmp_path / "a", tiny_policy, "train.steps=2")
    zero = make(tmp_path / "b", tiny_policy, "train.steps=2", "rollout.max_staleness=0")
    assert not isinstance(zero.collector, AsyncCollector) and zero.engine.model is zero.policy
    for _ in range(2):
        want, got = default.train_step(), zero.train_step()
        assert {k: v for k, v in got.items() if not k.startswith("perf/")} == \
            {k: v for k, v in want.items() if not k.startswith("perf/")}
    assert torch.equal(params(default.policy), params(zero.policy))


def test_each_batch_is_sampled_a_step_ahead_by_the_weights_of_its_step_minus_k(tmp_path, tiny_policy):
    sync = make(tmp_path / "sync", tiny_policy, *ASYNC[1:])
    stale = make(tmp_path / "stale", tiny_policy, *ASYNC)
    assert stale.engine.model is not stale.policy  # the engine samples from weights of its own
    sync_batches, _ = consumed(sync)
    batches, threads = consumed(stale)
    versions = [params(stale.policy).clone()]
    for _ in range(4):
        sync.train_step()
        stale.train_step()
        versions.append(params(stale.policy).clone())
    # step 0 is sampled in the trainer's thread; steps 1-3 by the job started at the step before
    assert threads[0] == threading.current_thread().name and all(t.startswith("tether-rollout") for t in threads[1:])
    for step, ((batch, metrics), (sync_batch, _)) in enumerate(zip(batches, sync_batches, strict=True)):
        assert batch.info[VERSION] == [max(step - 1, 0)] * len(batch)
        assert metrics["rollout/staleness"] == min(step, 1)
        assert batch.prompt_ids == sync_batch.prompt_ids  # the prompts (and seeds) of its step, as in a sync run
    # the log-probs recorded at step 2 are those of the weights after step 1's update (version 1), not version 2
    batch = batches[2][0]
    model = copy.deepcopy(stale.policy)
    for version, close in ((1, True), (2, False)):
        torch.nn.utils.vector_to_parameters(versions[version], model.parameters())
        with torch.no_grad():
            lp, _ = response_log_probs(model, batch.prompt_ids, batch.response_ids, batch.response_mask)
        assert torch.allclose(lp, batch.sample_log_probs * batch.response_mask, atol=1e-4) == close


def test_a_lora_policy_sampling_ahead_pushes_its_adapters_to_the_engine_copy(tmp_path, tiny_policy):
    """The in-process engine samples ahead from a copy of the LoRA module: every update must reach that copy. The
    push was skipped for LoRA with the in-process engine (it assumed the engine runs the policy module itself), so
    the copy sampled with the initial weights forever (0.078 off after one step, 0.31 after three) while
    ``rollout/staleness`` logged 1."""
    pytest.importorskip("peft", reason="peft is not installed (pip install -e '.[lora]')")
    from tether.models.lora import serving_state_dict

    trainer = make(tmp_path, tiny_policy, *ASYNC, "model.lora.rank=8", "model.lora.alpha=16")
    assert trainer.engine.model is not trainer.policy
    initial = params(trainer.engine.model).clone()
    for _ in range(2):
        trainer.train_step()
        want, got = serving_state_dict(trainer.policy), serving_state_dict(trainer.engine.model)
        assert want.keys() == got.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), key
    assert not torch.equal(params(trainer.engine.model), initial)


def test_a_resume_with_a_batch_in_flight_continues_exactly(tmp_path, tiny_policy):
    straight = make(tmp_path / "a", tiny_policy, *ASYNC)
    want = [straight.train_step() for _ in range(4)]
    first = make(tmp_path / "b", tiny_policy, *ASYNC)
    for _ in range(2):
        first.train_step()
    first.save()  # the batch of step 2, sampled by version 1, is in the checkpoint
    resumed = make(tmp_path / "b", tiny_policy, *ASYNC)
    assert resumed.step == 2 and [s for s, *_ in resumed.collector.pending] == [2]
    got = [resumed.train_step() for _ in range(2)]
    for w, g in zip(want[2:], got, strict=True):
        assert g["train/reward_mean"] == w["train/reward_mean"] and g["actor/pg_loss"] == w["actor/pg_loss"]
        assert g["rollout/staleness"] == 1.0
    assert torch.equal(params(resumed.policy), params(straight.policy))


@pytest.mark.parametrize(("before", "after", "stalenesses"), [
    # train.steps 4 -> 6, k = 2: the step-3 checkpoint holds the batch of step 3 (version 1) and none of step 4,
    # past the old last step; it is sampled at the resume (version 3), and step 5's job starts at step 3
    (("rollout.max_staleness=2", "train.steps=4"), ("rollout.max_staleness=2", "train.steps=6"), [2.0, 1.0, 2.0]),
    # k 1 -> 2, saved at step 2: step 3's batch is sampled at the resume (version 2), then k = 2 holds
    (("rollout.max_staleness=1", "train.steps=6"), ("rollout.max_staleness=2", "train.steps=6"), [1.0, 1.0, 2.0]),
    # k 2 -> 1, saved at step 2: the checkpointed batch of step 3 (version 1) is dropped, step 2's job resamples it;
    # the batch of step 2 (version 0) would be 2 steps stale under k = 1: it is sampled again at the resume
    (("rollout.max_staleness=2", "train.steps=6"), ("rollout.max_staleness=1", "train.steps=6"), [0.0, 1.0, 1.0]),
])
def test_a_resume_with_more_steps_or_another_staleness_fills_the_pipeline(tmp_path, tiny_policy, before, after,
                                                                         stalenesses):
    """A resume may raise train.steps and change max_staleness (neither changes what the run means): the batches in
    flight then do not cover steps s .. s + k - 1. The collector took the head of the queue as it was, so the first
    step past the checkpoint raised 'the batch in hand is for step 5, the trainer is at step 4' (more steps) or
    trained the wrong step's batch. A lowered max_staleness trained the checkpoint's batch 2 steps stale under
    max_staleness 1 (rollout/staleness 2.0 at the first step)."""
    common = ("rollout.correction.mode=tis", "optim.lr=0.05", "health.parity.patience=0")
    first = make(tmp_path, tiny_policy, *common, *before)
    saved_at = 3 if "train.steps=4" in before else 2
    for _ in range(saved_at):
        first.train_step()
    first.save()
    resumed = make(tmp_path, tiny_policy, *common, *after)
    assert resumed.step == saved_at
    batches, _ = consumed(resumed)
    got = [resumed.train_step()["rollout/staleness"] for _ in range(3)]
    assert got == stalenesses
    for step, (batch, _) in enumerate(batches, start=saved_at):
        assert batch.info[VERSION] == [step - int(stalenesses[step - saved_at])] * len(batch)


@pytest.mark.parametrize(("overrides", "match"), [
    (("rollout.max_staleness=2",), r"rollout.max_staleness=2: stale samples are off-policy; set "
                                   r"rollout.correction.mode"),
    (("rollout.max_staleness=1", "rollout.correction.mode=tis", "methods.armor={}"),
     r"rollout.max_staleness=1 with methods.armor: .* \(its anchors and reference resets act on the trainer's "
     r"current step\); allowed with methods: 0"),
    (("rollout.max_staleness=1", "rollout.correction.mode=tis", "distributed.strategy=fsdp2"),
     r"under torchrun \(several ranks, or fsdp2\) use 0"),
])
def test_what_cannot_run_stale_is_refused_before_any_model_loads(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        tiny_config(tmp_path, *overrides)


@pytest.mark.parametrize(("overrides", "data", "match"), [
    (("rollout.ignore_eos=true", "task=null", "env.name=frozenlake"), {},
     r"^rollout.ignore_eos=true with env: a turn of an episode ends at EOS or rollout.stop, which ignore_eos "
     r"switches off; allowed with env: false$"),
    (("rollout.ignore_eos=true", "methods.armor={}"), {},
     r"^rollout.ignore_eos=true with methods.armor: a method's own sampling \(anchors, injections, analyses\) would "
     r"still end at EOS; allowed with methods: false$"),
])
def test_ignore_eos_where_something_else_samples_is_refused_before_any_model_loads(tmp_path, overrides, data, match):
    with pytest.raises(ConfigError, match=match):
        tiny_config(tmp_path, *overrides, **data)


def test_ignore_eos_reaches_the_training_rollouts_only(tmp_path, tiny_policy):
    model, tok = tiny_policy
    trainer = Trainer(tiny_config(tmp_path, "rollout.ignore_eos=true", "rollout.max_new_tokens=5"),
                      policy=copy.deepcopy(model), tokenizer=tok)
    batch, _ = trainer.collect()
    assert batch.response_mask.shape[1] == 5 and batch.response_mask.all()


def test_an_agent_run_with_a_batch_in_flight_saves_and_resumes_exactly(tmp_path, tiny_policy):
    """The batch in flight that a checkpoint holds keeps its episodes (SEED and GiGPO read them), which kept their
    closed envs: under env.isolation=process each held its pool and the pool's lock, so the first save stopped the
    run with `cannot pickle '_thread.lock' object`."""
    from tests.rollout.helpers import agent_config

    model, tok = tiny_policy
    overrides = (*ASYNC, "env.isolation=process", "rollout.prompts_per_step=1", "rollout.group_size=2",
                 "rollout.max_new_tokens=4", "env.max_turns=2")

    def make_agent(where):
        return Trainer(agent_config(where, *overrides), policy=copy.deepcopy(model), tokenizer=tok)

    straight = make_agent(tmp_path / "a")
    want = [straight.train_step() for _ in range(3)]
    first = make_agent(tmp_path / "b")
    first.train_step()
    first.save()
    resumed = make_agent(tmp_path / "b")
    assert resumed.step == 1 and [s for s, *_ in resumed.collector.pending] == [1]
    got = [resumed.train_step() for _ in range(2)]
    for w, g in zip(want[1:], got, strict=True):
        assert g["train/reward_mean"] == w["train/reward_mean"] and g["actor/pg_loss"] == w["actor/pg_loss"]
    assert torch.equal(params(resumed.policy), params(straight.policy))
