"""The Ray engine on a local 2-CPU Ray instance: actors sample exactly what the in-process engine samples.

Ray's start and two actors take 20-40 s on the shared 2-core machine, so they start once: the session's Ray
instance (tests/conftest.py) and one trainer with ``rollout.engine=ray`` (two actors, one CPU each) serve
every test, and the test that trains it runs last.
"""

from __future__ import annotations

import pytest
import torch

from tests.trainer.helpers import tiny_config
from tether.distributed import concat_generations, rank_seed, split_evenly
from tether.engine import Generation, HFEngine, SamplingParams
from tether.engine.ray_engine import RayEngine
from tether.models import tiny_model
from tether.trainer import Trainer

ACTORS = 2
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12, 13]]  # shares of 3 and 2 prompts
SAMPLING = SamplingParams(max_new_tokens=6, top_k=50, stop=("\n",))


@pytest.fixture(scope="module")
def trainer(ray_session, tmp_path_factory, tokenizer):
    """A trainer whose engine is two Ray actors; its policy starts as ``tiny_model(seed=0)``."""
    cfg = tiny_config(tmp_path_factory.mktemp("ray"), "rollout.engine=ray", "train.steps=2",
                      f"rollout.engine_kwargs={{num_actors: {ACTORS}}}")
    model, tok = tiny_model(seed=0, tokenizer=tokenizer)
    trainer = Trainer(cfg, policy=model, tokenizer=tok)
    yield trainer
    for actor in trainer.engine.actors:  # give their CPUs back to the session's other Ray tests
        ray_session.kill(actor)


def in_process(model: torch.nn.Module, tok, seed: int) -> Generation:
    """What the Ray engine must return: an in-process engine run share by share, seeded by actor index."""
    local = HFEngine(model, tok)
    parts = [local.generate(PROMPTS[lo:hi], SAMPLING, seed=rank_seed(seed, i))
             for i, (lo, hi) in enumerate(split_evenly(len(PROMPTS), ACTORS))]
    return concat_generations(parts, local.pad_id)


def assert_same(got: Generation, want: Generation) -> None:
    assert torch.equal(got.response_ids, want.response_ids)
    assert torch.equal(got.response_mask, want.response_mask)
    assert torch.equal(got.sample_log_probs, want.sample_log_probs)
    assert got.texts == want.texts and torch.equal(got.truncated, want.truncated)


def test_the_config_builds_two_ray_actors(trainer):
    assert isinstance(trainer.engine, RayEngine) and len(trainer.engine.actors) == ACTORS


def test_actors_sample_exactly_the_in_process_shares(trainer, tokenizer):
    model, tok = tiny_model(seed=0, tokenizer=tokenizer)
    assert_same(trainer.engine.generate(PROMPTS, SAMPLING, seed=123), in_process(model, tok, 123))


def test_score_splits_rows_across_actors(trainer, tokenizer):
    model, tok = tiny_model(seed=0, tokenizer=tokenizer)
    engine = trainer.engine
    gen = engine.generate(PROMPTS, SAMPLING, seed=7)
    local = HFEngine(model, tok)
    want_lp, want_ent = zip(*(local.score(PROMPTS[lo:hi], gen.response_ids[lo:hi], gen.response_mask[lo:hi],
                                          temperature=0.7, with_entropy=True)
                              for lo, hi in split_evenly(len(PROMPTS), ACTORS)), strict=True)
    lp, ent = engine.score(PROMPTS, gen.response_ids, gen.response_mask, temperature=0.7, with_entropy=True)
    assert torch.equal(lp, torch.cat(want_lp)) and torch.equal(ent, torch.cat(want_ent))
    whole = local.score(PROMPTS, gen.response_ids, gen.response_mask)  # other padding: equal up to float sums
    torch.testing.assert_close(engine.score(PROMPTS, gen.response_ids, gen.response_mask), whole, rtol=0, atol=1e-5)


def test_load_weights_makes_every_actor_sample_the_new_weights(trainer, tokenizer):
    old, tok = tiny_model(seed=0, tokenizer=tokenizer)
    new, _ = tiny_model(seed=1, tokenizer=tokenizer)
    try:
        trainer.engine.load_weights(new.state_dict())
        got = trainer.engine.generate(PROMPTS, SAMPLING, seed=123)
        assert_same(got, in_process(new, tok, 123))
        assert not torch.equal(got.sample_log_probs, in_process(old, tok, 123).sample_log_probs)
    finally:
        trainer.push_weights()  # back to the policy's weights for the next test


def test_two_training_steps_on_ray_actors_keep_them_in_sync(trainer):
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    metrics = trainer.fit()
    for key in ("actor/pg_loss", "actor/grad_norm", "perf/weight_sync_s"):
        assert torch.isfinite(torch.tensor(metrics[key])), key
    assert trainer.step == 2
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.policy.parameters(), strict=True))
    assert_same(trainer.engine.generate(PROMPTS, SAMPLING, seed=5), in_process(trainer.policy, trainer.tokenizer, 5))
