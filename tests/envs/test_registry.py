"""make_env / ENVS / register_env."""

from __future__ import annotations

import pytest

from tether.envs import ENVS, SafeEnv, env_class, make_env, make_safe_env, register_env
from tether.envs.scripted import ScriptedEnv


@pytest.fixture
def restore_registry():
    with ENVS.restored():
        yield


def test_builtin_names():
    assert {"scripted", "sokoban", "frozenlake", "thin_ice", "textworld", "alfworld", "webshop"} <= set(ENVS)


def test_unknown_name_lists_registered_names():
    with pytest.raises(ValueError, match=r"unknown env 'sokobn'.*frozenlake.*sokoban"):
        make_env("sokobn")


def test_unknown_kwarg_names_it_and_the_allowed_ones():
    """A misspelt keyword gets the guess a misspelt config key gets (it got none: `szie` listed the four)."""
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) boxes; did you mean num_boxes\? "
                                        r"allowed: height, width, num_boxes"):
        make_env("sokoban", boxes=2)
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) colour; allowed: height"):  # nothing near: no guess
        make_env("sokoban", colour="red")
    with pytest.raises(TypeError, match="unknown keyword"):
        make_safe_env("scripted", timeout_s=1.0, colour="red")


def test_kwargs_reach_the_constructor():
    env = make_env("scripted", words=("kiwi",), turns=1)
    assert isinstance(env, ScriptedEnv) and env.reset(3).info["secret"] == "kiwi"


def test_register_env(restore_registry):
    register_env("scripted2", "tether.envs.scripted:ScriptedEnv")
    assert env_class("scripted2") is ScriptedEnv
    with pytest.raises(ValueError, match="already registered"):
        register_env("scripted2", "tether.envs.scripted:ScriptedEnv")
    with pytest.raises(ValueError, match="module:Class"):
        register_env("bad", "tether.envs.scripted.ScriptedEnv")


def test_make_safe_env():
    env = make_safe_env("scripted", timeout_s=5.0, turns=1)
    assert isinstance(env, SafeEnv) and env.name == "scripted"
    assert env.train_seeds(2) == [0, 1]  # env extras read through the wrapper
