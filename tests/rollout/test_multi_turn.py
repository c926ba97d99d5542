"""The agent loop, row by row: counts, masks, rewards, ids, penalty, faults, validation, step grouping.

Most tests drive the scripted env with :class:`ScriptedEngine` (exact, known responses) inside a real
Trainer on a tiny random model, so the rows that reach the update are the ones checked here.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tests.rollout.helpers import INVALID, ScriptedEngine, agent_config
from tether import algos
from tether.algos import AdvantageInputs, episode
from tether.errors import EnvFaultError
from tether.rollout.multi_turn import Episode, build_prompt, discounted_returns
from tether.trainer import Trainer

# The plan of ScriptedEngine with 2 tasks x 3 clones (win / invalid-then-win / always wrong, 3 guesses):
# turn 1 has all 6 episodes, turn 2 the invalid and wrong clones, turn 3 the wrong clones.
EPISODE_IDS = [0, 1, 2, 3, 4, 5, 1, 2, 4, 5, 2, 5]
TURNS = [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
GROUPS = [0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1]
VALID = [True, False, True, True, False, True, True, True, True, True, True, True]
WON = [True, True, False, True, True, False, True, False, True, False, False, False]
RETURNS = [1.0 if w else 0.0 for w in WON]


def collect(trainer):
    return trainer.collect()


def test_rows_masks_rewards_and_ids_are_exact(tmp_path, agent_trainer):
    trainer = agent_trainer(agent_config(tmp_path))
    batch, metrics = collect(trainer)
    tok = trainer.tokenizer

    assert trainer.engine.calls == [6, 4, 2]  # one batched call per turn over the live episodes
    assert len(batch) == 12  # one row per active turn
    assert batch.info["episode_id"] == EPISODE_IDS
    assert batch.info["turn"] == TURNS
    assert batch.group_ids.tolist() == GROUPS
    assert batch.info["valid"] == VALID
    assert batch.correct.tolist() == WON
    want = torch.tensor([r - 0.1 * (not v) for r, v in zip(RETURNS, VALID, strict=True)])
    torch.testing.assert_close(batch.rewards, want)  # episode return - penalty on invalid rows

    for i, text in enumerate(batch.info["text"]):
        ids = [*tok(text, add_special_tokens=False).input_ids, tok.eos_token_id]
        n = len(ids)
        assert batch.response_mask[i].tolist() == [1.0] * n + [0.0] * (batch.width - n)
        assert batch.response_ids[i, :n].tolist() == ids
        torch.testing.assert_close(batch.sample_log_probs[i], torch.tensor(
            [-len(text) / 100] * n + [0.0] * (batch.width - n)))
    prompts = [tok.decode(p) for p in batch.prompt_ids]
    assert all("Current observation (step 1)" in p and "Your last" not in p for p in prompts[:6])
    assert f"[Action 1: {INVALID}]" in prompts[6]  # the invalid clone's 2nd turn shows its history

    assert metrics["env/success_rate"] == pytest.approx(4 / 6)
    assert metrics["env/turns"] == pytest.approx(2.0)
    assert metrics["env/invalid_action_frac"] == pytest.approx(2 / 12)
    assert metrics["env/faults"] == 0.0


def test_clones_of_a_task_share_seed_task_and_group(tmp_path, agent_trainer):
    trainer = agent_trainer(agent_config(tmp_path, "rollout.prompts_per_step=3", "rollout.group_size=4"))
    batch, _ = collect(trainer)
    episodes = {e.episode_id: e for e in batch.info["episode"]}
    assert sorted(episodes) == list(range(12))
    by_group: dict[int, list] = {}
    for e in episodes.values():
        by_group.setdefault(e.group_id, []).append(e)
    assert sorted(by_group) == [0, 1, 2] and all(len(g) == 4 for g in by_group.values())
    for group in by_group.values():
        assert len({e.seed for e in group}) == 1 and len({e.task for e in group}) == 1
    assert len({g[0].seed for g in by_group.values()}) == 3  # distinct tasks per step
    assert all(s in trainer.collector.train_seeds for s in {e.seed for e in episodes.values()})
    # the next step continues the ids
    batch2, _ = collect(trainer)
    assert min(batch2.info["episode_id"]) == 12 and min(batch2.group_ids.tolist()) == 3


@pytest.mark.parametrize("penalty", [0.0, 0.25])
def test_invalid_action_penalty(tmp_path, agent_trainer, penalty):
    trainer = agent_trainer(agent_config(tmp_path, f"env.invalid_action_penalty={penalty}"))
    batch, _ = collect(trainer)
    want = torch.tensor([r - penalty * (not v) for r, v in zip(RETURNS, VALID, strict=True)])
    torch.testing.assert_close(batch.rewards, want)


def test_max_turns_truncates_the_episode(tmp_path, agent_trainer):
    trainer = agent_trainer(agent_config(tmp_path, "env.max_turns=2"))
    batch, _ = collect(trainer)
    assert batch.info["turn"] == TURNS[:10]  # the wrong clones stop after 2 of their 3 guesses
    wrong = [e for e in batch.info["episode"] if e.episode_id in (2, 5)]
    assert all(not e.done and not e.won and len(e.turns) == 2 for e in wrong)


def test_a_training_step_uses_the_episode_advantage(tmp_path, agent_trainer):
    trainer = agent_trainer(agent_config(tmp_path))
    before = torch.cat([p.detach().flatten() for p in trainer.policy.parameters()]).clone()
    metrics = trainer.train_step()
    after = torch.cat([p.detach().flatten() for p in trainer.policy.parameters()])
    assert not torch.equal(before, after)
    assert metrics["train/rows"] == 12.0 and torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
    # the advantage the update used, recomputed from the exact rewards
    batch, _ = collect(agent_trainer(agent_config(tmp_path / "again")))
    adv = algos.get_advantage("episode")(AdvantageInputs(batch.rewards, batch.group_ids)).advantages
    assert (adv[torch.tensor(WON)] > 0).all() and (adv[~torch.tensor(WON)] < 0).all()


# -- fault containment ----------------------------------------------------------------------------


def test_env_that_raises_ends_the_episode_failed_and_training_goes_on(tmp_path, agent_trainer):
    cfg = agent_config(tmp_path, "train.steps=2", env={"kwargs": {"turns": 3, "fault": "step_raise", "fault_turn": 2}})
    trainer = agent_trainer(cfg)
    batch, metrics = collect(trainer)
    # the 'win' clones finish on step 1; the others fault on their 2nd step: 2 groups x 2 faults
    assert metrics["env/faults"] == 4.0
    assert batch.info["turn"] == [0] * 6 + [1] * 4
    faulted = {e.episode_id: e for e in batch.info["episode"] if e.fault}
    assert sorted(faulted) == [1, 2, 4, 5]
    assert all(e.done and not e.won and "RuntimeError" in e.fault for e in faulted.values())
    torch.testing.assert_close(batch.rewards, torch.tensor([1.0, -0.1, 0.0, 1.0, -0.1, 0.0, 0.0, 0.0, 0.0, 0.0]))
    metrics = trainer.train_step()  # a full step with faults, and the run goes on
    assert metrics["env/faults"] == 8.0 and trainer.step == 1


def test_env_that_hangs_times_out_as_a_fault(tmp_path, agent_trainer):
    cfg = agent_config(tmp_path, "env.timeout_s=0.2",
                       env={"kwargs": {"turns": 3, "fault": "step_hang", "fault_turn": 1, "hang_s": 1.5}})
    trainer = agent_trainer(cfg)
    metrics = trainer.train_step()
    assert metrics["env/faults"] == 6.0 and metrics["env/success_rate"] == 0.0 and metrics["train/rows"] == 6.0
    lines = [json.loads(x) for x in (tmp_path / "run" / "transcripts.jsonl").read_text().splitlines()]
    assert all("timed out after 0.2s" in ep["fault"] for ep in lines)


def test_reset_faults_are_counted_and_a_batch_where_none_starts_stops(tmp_path, agent_trainer):
    cfg = agent_config(tmp_path, env={"kwargs": {"turns": 3, "fault": "reset_raise"}})
    trainer = agent_trainer(cfg)
    with pytest.raises(EnvFaultError, match=r"^env scripted \(reset\), validation: none of 3 episodes"):
        trainer.collector.validate(trainer.engine, trainer.seed_for("val"))
    assert trainer.collector.faults == 9  # 3 episodes x 3 tries (env.reset_retries=2)
    with pytest.raises(EnvFaultError, match="none of 6 episodes could start"):
        collect(trainer)


# -- validation -------------------------------------------------------------------------------------


def test_validation_gives_success_rate_and_never_shifts_training_ids(tmp_path, agent_trainer):
    plain = agent_trainer(agent_config(tmp_path / "a"))
    want, _ = collect(plain)

    trainer = agent_trainer(agent_config(tmp_path / "b"))
    metrics = trainer.collector.validate(trainer.engine, trainer.seed_for("val"))
    # one episode per held-out seed, kinds win / invalid / wrong: 2 of 3 won
    assert metrics["val/success_rate"] == pytest.approx(2 / 3)
    assert metrics["val/episodes"] == 3.0 and metrics["val/invalid_action_frac"] == pytest.approx(1 / 6)
    assert all(s >= 1_000_000 for s in trainer.collector.val_seeds)  # the held-out split
    got, _ = collect(trainer)
    assert got.info["episode_id"] == want.info["episode_id"]
    assert got.group_ids.tolist() == want.group_ids.tolist()
    assert [e.seed for e in got.info["episode"]] == [e.seed for e in want.info["episode"]]


def test_sampled_validation_plays_each_seed_val_samples_times(tmp_path, agent_trainer):
    trainer = agent_trainer(agent_config(tmp_path, "val.greedy=false", "val.samples=2"))
    metrics = trainer.collector.validate(trainer.engine, trainer.seed_for("val"))
    # episodes [s0, s0, s1, s1, s2, s2] take win / invalid / wrong by position: won 1 1 | 0 1 | 1 0
    assert metrics["val/episodes"] == 6.0
    assert metrics["val/avg@k"] == pytest.approx(4 / 6) and metrics["val/success_rate"] == pytest.approx(4 / 6)
    assert metrics["val/pass@k"] == 1.0
    greedy_trainer = agent_trainer(agent_config(tmp_path / "greedy", "val.samples=2"))
    greedy = greedy_trainer.collector.validate(greedy_trainer.engine, greedy_trainer.seed_for("val"))
    assert greedy["val/episodes"] == 3.0 and greedy["val/pass@k"] == pytest.approx(2 / 3)


def test_validation_samples_with_val_settings_and_no_top_k_as_single_turn_does(tmp_path, agent_trainer):
    """rollout.top_k is training's: the agent loop's validation sampled with it (top_k 5 here), the single-turn
    collector's without it, so val/success_rate and val/avg@k meant other distributions on the two."""
    trainer = agent_trainer(agent_config(tmp_path, "rollout.top_k=5", "rollout.top_p=0.9", "val.greedy=false",
                                         "val.temperature=0.5", "val.samples=2"))
    seen, generate = [], trainer.engine.generate

    def recorded(prompt_ids, params, **kwargs):
        seen.append(params)
        return generate(prompt_ids, params, **kwargs)

    trainer.engine.generate = recorded
    trainer.collector.validate(trainer.engine, trainer.seed_for("val"))
    assert {(p.temperature, p.top_p, p.top_k, p.greedy) for p in seen} == {(0.5, 1.0, 0, False)}


def test_trainer_validation_logs_success_rate_and_keeps_the_best(tmp_path, agent_trainer):
    trainer = agent_trainer(agent_config(tmp_path, "val.every=1", "train.steps=1"))
    trainer.fit()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    vals = [x["val/success_rate"] for x in lines if "val/success_rate" in x]
    assert vals == [pytest.approx(2 / 3)] * 2  # before the first step and after it
    assert (tmp_path / "run" / "checkpoints" / "best").is_dir()


# -- GiGPO step grouping ------------------------------------------------------------------------------


def test_discounted_returns():
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([1.0, 1.0], 1.0) == [2.0, 1.0]
    assert discounted_returns([], 0.9) == []


def test_gigpo_adds_the_weighted_step_advantage(tmp_path, agent_trainer):
    cfg = agent_config(tmp_path, "algorithm.advantage=gigpo", "algorithm.advantage_kwargs.step_weight=0.5",
                       "env.step_gamma=0.5")
    trainer = agent_trainer(cfg)
    batch, _ = collect(trainer)
    # step returns: env rewards discounted from each turn on (no penalty); win row 1, invalid clone 0.5 then 1
    assert batch.info["step_return"] == [1.0, 0.5, 0.0, 1.0, 0.5, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    metrics = trainer.compute_advantages(batch)  # the episode advantage plus the step term, in one estimator
    episode_only = episode(AdvantageInputs(batch.rewards, batch.group_ids)).advantages
    episode_only = episode_only[:, None] * batch.response_mask
    # turn 1: the three clones of a task see the same first observation -> one step group of 3
    # (returns 1, 0.5, 0: advantages 1, 0, -1); later observations differ per clone -> singletons, 0
    step = torch.tensor([1.0, 0.0, -1.0] * 2 + [0.0] * 6)
    torch.testing.assert_close(batch.token["advantages"], episode_only + 0.5 * step[:, None] * batch.response_mask,
                               atol=1e-5, rtol=0)
    assert metrics["train/step_group_size"] == pytest.approx((6 * 3 + 6) / 12)


# -- the prompt -------------------------------------------------------------------------------------


def test_build_prompt_layout():
    ep = Episode(env=None, task="Find the exit.", group_id=0, episode_id=0, seed=0, observation="A hall.",
                 admissible=["go north", "look"])
    assert build_prompt(ep, 2, "FORMAT") == ("Your task is to: Find the exit.\n\nCurrent observation (step 1):\n"
                                            "A hall.\n\nAdmissible actions: 'go north', 'look'\n\nFORMAT")
    ep.turns = [{"observation": f"o{i}", "action": f"a{i}"} for i in (1, 2, 3)]
    text = build_prompt(ep, 2, "FORMAT")
    assert "Your last 2 steps:\n[Observation 2: o2]\n[Action 2: a2]\n[Observation 3: o3]\n[Action 3: a3]" in text
    assert "Current observation (step 4)" in text and "o1" not in text
    assert "Your last" not in build_prompt(ep, 0, "FORMAT")
    # an open action space (WebShop) shows the page's available actions instead
    ep.admissible, ep.available = None, ["search[<your query>]", "click[next >]"]
    assert "Available actions: 'search[<your query>]', 'click[next >]'" in build_prompt(ep, 0, "FORMAT")


def test_gigpo_trains_end_to_end(tmp_path, tiny_policy):
    model, tok = tiny_policy
    trainer = Trainer(agent_config(tmp_path, "algorithm.advantage=gigpo", "train.steps=2"), policy=model,
                            tokenizer=tok)
    trainer.use_engine(ScriptedEngine(tok))
    for _ in range(2):
        metrics = trainer.train_step()
        assert metrics["train/step_group_size"] == pytest.approx(2.0)
        assert metrics["train/step_adv_abs_mean"] > 0


def test_each_turn_records_whether_the_engine_cut_it(tmp_path, agent_trainer):
    """``info["truncated"]`` is per turn, the unit ``rollout.max_new_tokens`` cuts: with ``algorithm.mask_truncated``
    only the cut turns leave the loss, and the episode's other turns train on its return."""
    trainer = agent_trainer(agent_config(tmp_path, "algorithm.mask_truncated=true"))
    generate = trainer.engine.generate

    def cut_invalid(prompt_ids, params, **kwargs):  # the invalid clone's first answer hit the limit
        gen = generate(prompt_ids, params, **kwargs)
        return dataclasses.replace(gen, truncated=torch.tensor([INVALID in t for t in gen.texts]))

    trainer.engine.generate = cut_invalid
    batch, _ = collect(trainer)
    assert batch.info["truncated"] == [not v for v in VALID]
    assert trainer.train_step()["train/masked_truncated_frac"] == pytest.approx(2 / 12)


def test_a_training_rollout_shows_its_episodes_as_they_finish(tmp_path, agent_trainer, capsys, monkeypatch):
    """A step's episodes printed nothing until the step's own line: examples/my_environment's first step was 54 s of
    silence on 2 shared cores (its README: about 6 minutes a step). Without a terminal, plain lines: the first count,
    then the last (the scripted plan ends 2 episodes at turn 1, 2 at turn 2, the last 2 at turn 3)."""
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    trainer = agent_trainer(agent_config(tmp_path, "logging.progress=true"))
    collect(trainer)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rollout ")]
    assert [line.split("  ")[0] for line in lines] == ["rollout 2/6 episodes", "rollout 6/6 episodes"]
