"""TextWorld: local generation, the cache, splits, rewards, the winning policy."""

from __future__ import annotations

import functools
import multiprocessing
import time

import pytest

from tether.envs import SafeEnv, make_env
from tether.envs.textworld_env import clean_feedback, default_cache_dir, game_file, settings_slug

pytest.importorskip("textworld")


@pytest.fixture
def easy(tw_cache):
    return make_env("textworld", preset="easy", cache_dir=str(tw_cache))


def test_cache_is_reused(easy, tw_cache, monkeypatch):
    path = easy.game_files([0])[0]
    assert path.is_file() and path.parent.name == settings_slug(easy.settings)
    assert str(path).startswith(str(tw_cache))

    def no_compile(*args, **kwargs):
        raise AssertionError("a cached game was compiled again")

    monkeypatch.setattr("tether.envs.textworld_env._compile", no_compile)
    again = make_env("textworld", preset="easy", cache_dir=str(tw_cache))
    assert again.reset(0).info["game_file"] == str(path)


def test_default_cache_dir_follows_tether_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TETHER_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "textworld"
    monkeypatch.delenv("TETHER_CACHE")
    assert default_cache_dir().parts[-3:] == (".cache", "tether", "textworld")


def test_train_and_eval_games_differ(easy):
    train = easy.game_files(easy.train_seeds(1))
    evals = easy.game_files(easy.eval_seeds(1))
    assert train != evals and train[0].read_bytes() != evals[0].read_bytes()


def test_walkthrough_wins_with_sparse_reward(easy):
    first = easy.reset(0)
    assert first.info["walkthrough"] == easy.solution()
    assert "Welcome" not in first.observation and "$$" not in first.observation
    for action in easy.solution():
        step = easy.step(action)
    assert step.done and step.won and step.reward == 1.0 and step.info["score"] == step.info["max_score"]
    assert "RESTART" not in step.observation


def test_non_admissible_command_is_not_sent(easy):
    easy.reset(0)
    step = easy.step("dance wildly")
    assert step.observation == "Nothing happens." and step.info["invalid_action"] and not step.done


@pytest.mark.slow
def test_policy_from_mid_episode_and_score_reward(tw_cache):
    env = make_env("textworld", preset="medium", reward_mode="score", cache_dir=str(tw_cache))
    env.reset(0)
    plan = env.solution()
    assert len(plan) >= 2
    step = env.step(plan[0])
    assert env.solution() == plan[1:] and step.info["intermediate_reward"] == 1
    total = step.reward
    for action in env.solution():
        step = env.step(action)
        total += step.reward
    assert step.won and total == pytest.approx(1.0)


def test_runs_inside_safe_env(tw_cache):
    env = SafeEnv(lambda: make_env("textworld", preset="easy", cache_dir=str(tw_cache)), timeout_s=30.0)
    env.reset(0)
    step = env.step(env.solution()[0])
    assert step.won and env.faults == 0


def test_presets_and_overrides_are_checked(tw_cache):
    with pytest.raises(ValueError, match="unknown textworld preset"):
        make_env("textworld", preset="nightmare")
    with pytest.raises(ValueError, match="only apply to the custom presets"):
        make_env("textworld", preset="cooking-easy", world_size=3)
    env = make_env("textworld", preset="easy", quest_length=2, cache_dir=str(tw_cache))
    assert env.settings["quest_length"] == 2 and settings_slug(env.settings).endswith("world_size1")


def test_clean_feedback():
    raw = ("\n\n  ____ \n |  $$ \n\nWelcome! Find the key.\n\n\n\n-= Attic =-\nAn attic.\n\n"
           ">                     -= Attic =-0/1")
    assert clean_feedback(raw) == "Welcome! Find the key.\n\n-= Attic =-\nAn attic."
    end = "\nYou win.\n\n\n          *** The End ***\n\nYou scored 1 out of a possible 1.\n\nWould you like"
    assert clean_feedback(end) == "You win.\n\n*** The End ***"


def _slow_compile(log, settings, seed, path):
    """A stand-in of textworld's compile: logs each call, takes a while, writes the two files."""
    with open(log, "a") as f:
        f.write(f"{seed}\n")
    time.sleep(0.5)
    path.write_text("z8")
    path.with_suffix(".json").write_text("{}")
    return path


def test_processes_that_want_one_game_compile_it_once(tmp_path, monkeypatch):
    """The clones of a task reset at once: each compiled the same game, and on a loaded machine every reset of
    configs/agents/textworld_grpo.yaml's first step passed its 30 s limit (exit 5, 72 half-written folders left).
    Now one process compiles while the others wait on the game's lock; a killed holder's folder is cleared."""
    log = tmp_path / "compiles.log"
    monkeypatch.setattr("tether.envs.textworld_env._compile", functools.partial(_slow_compile, log))
    settings = {"kind": "custom", "world_size": 1, "nb_objects": 3, "quest_length": 1}
    import textworld

    leftover = tmp_path / "cache" / f"tw-{textworld.__version__}" / settings_slug(settings) / ".tmp-seed7"
    leftover.mkdir(parents=True)
    (leftover / "seed7.z8").write_text("half")  # what a holder killed at the reset limit left
    fork = multiprocessing.get_context("fork")
    with fork.Pool(4) as pool:
        paths = pool.starmap(game_file, [(settings, 7, tmp_path / "cache")] * 4)
    assert log.read_text().split() == ["7"]
    assert len(set(paths)) == 1 and paths[0].read_text() == "z8"
    assert not leftover.exists()
