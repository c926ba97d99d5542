"""Agents on image observations: visual prompts through the collector, and RL steps with tiny VLMs."""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image

from tests.rollout.helpers import agent_config
from tether.envs import IMAGE_PLACEHOLDER, Observation, make_env
from tether.models import load_policy, response_log_probs
from tether.models.vision import VisionPrompt
from tether.rollout.multi_turn import AgentCollector, Episode, build_prompt, prompt_images
from tether.rollout.transcripts import show_transcripts
from tether.trainer import Trainer


def test_prompt_images_follow_the_history_shown():
    env = make_env("ezpoints")
    first = env.reset(0)
    ep = Episode(env=env, task=env.reset(0).task, group_id=0, episode_id=0, seed=0, observation=first.observation,
                 admissible=first.admissible_actions)
    second = env.step("+").observation
    ep.seen.append(ep.observation)
    ep.turns.append({"observation": ep.observation.text, "action": "+"})
    ep.observation = second
    text = build_prompt(ep, history=1, action_format="fmt")
    assert text.count(IMAGE_PLACEHOLDER) == 2 and "Formula: +" in text
    assert prompt_images(ep, 1) == [first.observation.images[0], second.images[0]]
    ep.turns[-1]["action"] = IMAGE_PLACEHOLDER  # model text in the history is escaped
    assert build_prompt(ep, history=1, action_format="fmt").count(IMAGE_PLACEHOLDER) == 2
    assert prompt_images(ep, 0) == [second.images[0]]
    assert build_prompt(ep, history=0, action_format="fmt").count(IMAGE_PLACEHOLDER) == 1


def test_visual_env_with_a_text_model_fails_before_any_rollout(tmp_path, tiny_policy):
    _, tokenizer = tiny_policy
    cfg = agent_config(tmp_path, env={"name": "sokoban_visual", "kwargs": {}})
    with pytest.raises(ValueError, match="observes images, but the policy"):
        AgentCollector(cfg, tokenizer)
    text_cfg = agent_config(tmp_path, env={"name": "sokoban_visual", "kwargs": {"observation": "text"}})
    AgentCollector(text_cfg, tokenizer)  # the text fallback trains a text model


@pytest.mark.parametrize(("model_name", "env_name", "kwargs"), [
    ("tiny-qwen2.5-vl", "sokoban_visual", {"max_solution_steps": 4}),
    ("tiny-idefics3", "ezpoints", {}),
])
def test_one_rl_step_with_a_tiny_vlm_on_a_visual_env(tmp_path, model_name, env_name, kwargs):
    cfg = agent_config(tmp_path, "rollout.prompts_per_step=1", "rollout.group_size=2", "rollout.max_new_tokens=6",
                       "algorithm.entropy_coef=0.01", "env.max_turns=2", "env.history=1",
                       model={"name": model_name}, env={"name": env_name, "kwargs": kwargs})
    policy, processor = load_policy(model_name)
    trainer = Trainer(cfg, policy=policy, tokenizer=processor)
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    metrics = trainer.train_step()
    moved = {n for n, p in trainer.policy.named_parameters() if not torch.equal(before[n], p.detach())}
    assert any("visual" in n or "vision" in n for n in moved)  # the image tower learns too
    assert metrics["env/faults"] == 0.0 and metrics["train/rows"] == 2 * metrics["env/turns"]
    assert all(math.isfinite(metrics[k]) for k in ("actor/pg_loss", "actor/entropy", "env/episode_return"))
    run = tmp_path / "run"
    episode = json.loads((run / "transcripts.jsonl").read_text().splitlines()[0])
    turn = episode["turns"][0]
    assert turn["observation"].count(IMAGE_PLACEHOLDER) == 1 and len(turn["frames"]) == 1
    seen = make_env(env_name, **kwargs).reset(episode["seed"]).observation.images[0]
    with Image.open(run / turn["frames"][0]) as frame:  # the first frame the policy saw, as a PNG
        assert frame.convert("RGB").tobytes() == seen.tobytes()
    assert f"frames: {turn['frames'][0]}" in show_transcripts(run, limit=1)
    show_transcripts(run, html=True, limit=1)
    assert f'<img src="{turn["frames"][0]}"' in (run / "transcripts.html").read_text()


def test_training_rows_carry_their_images(tmp_path):
    cfg = agent_config(tmp_path, "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
                       "env.max_turns=2", "env.history=1", env={"name": "sokoban_visual", "kwargs": {}})
    policy, processor = load_policy("tiny-qwen2.5-vl")
    trainer = Trainer(cfg, policy=policy, tokenizer=processor)
    batch, _ = trainer.collect()
    assert all(isinstance(p, VisionPrompt) for p in batch.prompt_ids)
    for i, turn in enumerate(batch.info["turn"]):
        grids = batch.prompt_ids[i].pixels["image_grid_thw"]
        assert len(grids) == min(turn, 1) + 1  # history 1: the last frame, then the current one
    episode = batch.info["episode"][0]
    assert isinstance(episode.seen[0], Observation)
    assert batch.select([1, 0]).prompt_ids[1] is batch.prompt_ids[0]  # selection keeps the pixels


def test_opsd_on_images_is_refused_before_any_rollout(tmp_path):
    from tether.config import ConfigError

    with pytest.raises(ConfigError, match=r"methods\.opsd with env\.name=sokoban_visual: no solver reads"):
        agent_config(tmp_path, env={"name": "sokoban_visual", "kwargs": {}}, methods={"opsd": {}})
    cfg = agent_config(tmp_path, env={"name": "sokoban", "kwargs": {}}, methods={"opsd": {}})
    policy, processor = load_policy("tiny-idefics3")  # text observations, but a policy that reads images
    with pytest.raises(ConfigError, match=r"methods\.opsd on a vision-language policy is not built"):
        Trainer(cfg, policy=policy, tokenizer=processor)


def test_seed_analyses_with_the_frames_and_rescores_on_the_same_pixels(tmp_path):
    from tether.methods.seed.plugin import teacher_prompts, teacher_scores
    from tether.methods.seed.prompting import augment_with_skill

    cfg = agent_config(tmp_path, "rollout.prompts_per_step=1", "rollout.group_size=2", "rollout.max_new_tokens=4",
                       "env.max_turns=2", "env.history=1", env={"name": "sokoban_visual", "kwargs": {}},
                       methods={"seed": {"analysis_max_new_tokens": 4}})
    policy, processor = load_policy("tiny-qwen2.5-vl")
    trainer = Trainer(cfg, policy=policy, tokenizer=processor)
    calls = []
    generate = trainer.engine.generate
    trainer.engine.generate = lambda prompts, *a, **k: calls.append(prompts) or generate(prompts, *a, **k)
    batch, metrics = trainer.collect()
    analysis = calls[-1]  # after the turns, one analysis prompt per trajectory
    episodes = list({id(e): e for e in batch.info["episode"]}.values())
    assert len(analysis) == len(episodes) and "seed/analysis_success_rate" in metrics
    for prompt, ep in zip(analysis, episodes, strict=True):  # seed_visual: one frame per step
        assert len(prompt.images) == len(ep.turns) and prompt.message.count(IMAGE_PLACEHOLDER) == len(ep.turns)
    rows, prompts, lost = teacher_prompts(batch, processor, ["Push the box <image> left."] * len(batch),
                                          augment_with_skill)
    assert rows == list(range(len(batch))) and lost == 0
    for i, prompt in zip(rows, prompts, strict=True):
        assert prompt.pixels_key == batch.prompt_ids[i].pixels_key  # the same frames, processed the same way
        assert "Push the box [image] left." in prompt.message and len(prompt) > len(batch.prompt_ids[i])
    teacher, row_mask, _ = teacher_scores(trainer.hook_context(), batch, ["Push the box <image> left."] * len(batch),
                                          augment_with_skill)
    alone, _ = response_log_probs(trainer.policy, prompts[:1], batch.response_ids[:1], batch.response_mask[:1])
    torch.testing.assert_close(teacher[:1], alone, atol=2e-5, rtol=1e-4)  # the teacher pass took the pixels
    assert bool(row_mask.all())
    assert math.isfinite(trainer.train_step()["actor/pg_loss"])
