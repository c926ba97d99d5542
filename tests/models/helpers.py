"""Shared pieces of the vision tests: two rendered frames (the ``vlm`` fixture is in tests/conftest.py)."""

from __future__ import annotations

from tether.envs import make_env


def sokoban_frames() -> list:
    """The first frames of visual Sokoban at seeds 0 and 1 (PIL images)."""
    env = make_env("sokoban_visual")
    frames = [env.reset(seed).observation.images[0] for seed in (0, 1)]
    env.close()
    return frames
