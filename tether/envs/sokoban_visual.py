"""Visual Sokoban: the text Sokoban's levels and rules, observed as an RGB frame (SEED's visual Sokoban).

SEED (and verl-agent, which it builds on) trains Qwen2.5-VL on gym-sokoban's 6x6, one-box rooms rendered
with ``render_mode="rgb_array"``, 15 steps, gym-sokoban's shaped reward. This env reuses
:mod:`tether.envs.sokoban` for levels, moves, rewards and the solver (one :class:`SokobanEnv` inside) and
only changes what the policy sees: a frame drawn with PIL, ``cell_px`` pixels per cell. The default 28
pixels per cell is one Qwen2.5-VL token per cell (14-pixel patches merged 2x2).

Colours (flat, so a small vision tower can tell them apart): wall dark grey, floor light grey, target a
red square outline, box brown, box on target green, player a blue disc (on a target: the outline stays).

``observation="text"`` returns the text grid instead (the same observation :class:`SokobanEnv` gives),
for debugging a run without a vision model.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from tether.envs.base import (
    IMAGE_PLACEHOLDER,
    NEEDS_PILLOW,
    STATE_KEY,
    EnvReset,
    EnvStep,
    Observation,
    escape_placeholders,
    eval_seeds,
    observation_key,
    require_pillow,
    train_seeds,
)
from tether.envs.sokoban import LEGEND as TEXT_LEGEND
from tether.envs.sokoban import SokobanEnv, render

MIN_CELL_PX = 4  # a smaller cell has no room for the box's inner square
COLOURS = {"wall": (64, 64, 64), "floor": (200, 200, 200), "target": (200, 40, 40), "box": (150, 100, 40),
           "box_on_target": (40, 160, 60), "player": (40, 80, 220)}

LEGEND = ("The image shows the room from above: dark grey cells are walls, light grey cells are floor, "
          "red outlines are targets, brown squares are boxes, green squares are boxes on a target and "
          "the blue disc is you.")


def render_frame(level: Any, cell_px: int = 28) -> Any:
    """The level as an RGB ``PIL.Image`` of ``width * cell_px`` by ``height * cell_px`` pixels."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (level.width * cell_px, level.height * cell_px), COLOURS["wall"])
    draw = ImageDraw.Draw(image)
    inset = max(1, cell_px // 8)
    for r in range(level.height):
        for c in range(level.width):
            cell = (r, c)
            if cell not in level.floor:
                continue
            x, y = c * cell_px, r * cell_px
            box = (x, y, x + cell_px - 1, y + cell_px - 1)
            inner = (x + inset, y + inset, x + cell_px - 1 - inset, y + cell_px - 1 - inset)
            draw.rectangle(box, fill=COLOURS["floor"])
            if cell in level.targets:
                draw.rectangle(inner, outline=COLOURS["target"], width=max(1, cell_px // 10))
            if cell in level.boxes:
                draw.rectangle(inner, fill=COLOURS["box_on_target" if cell in level.targets else "box"])
            if cell == level.player:
                draw.ellipse(inner, fill=COLOURS["player"])
    return image


class VisualSokobanEnv:
    """Sokoban observed as an image (module docstring); rules, rewards and solver of :class:`SokobanEnv`.

    Args:
        observation: "image" (an :class:`~tether.envs.base.Observation` with one frame) or "text"
            (the text grid, for debugging).
        cell_px: pixels per cell of the frame.
        reward_mode: "shaped" (gym-sokoban's, as SEED trains with) or "sparse".
        **level_kwargs: :class:`SokobanEnv`'s level settings (height, width, num_boxes, min/max_solution_steps).
    """

    name = "sokoban_visual"
    max_turns = 15
    action_format = SokobanEnv.action_format
    train_seeds = staticmethod(train_seeds)
    eval_seeds = staticmethod(eval_seeds)

    @staticmethod
    def check_config(*, observation: str = "image", cell_px: int = 28, reward_mode: str = "shaped",
                     **level_kwargs: Any) -> None:
        """The settings the constructor refuses, the level's included, checked before any model loads."""
        if observation not in ("image", "text"):
            raise ValueError(f"observation must be 'image' or 'text', got {observation!r}")
        if cell_px < MIN_CELL_PX:
            raise ValueError(f"cell_px must be >= {MIN_CELL_PX}, got {cell_px}")
        SokobanEnv.check_config(reward_mode=reward_mode, **level_kwargs)

    @staticmethod
    def check_inputs(*, observation: str = "image", **_: Any) -> None:
        """Pillow is here when the frames are drawn (``tether validate`` and the start of a run ask)."""
        if observation == "image" and importlib.util.find_spec("PIL") is None:
            raise ValueError(NEEDS_PILLOW)

    def __init__(self, *, observation: str = "image", cell_px: int = 28, reward_mode: str = "shaped",
                 height: int = 6, width: int = 6, num_boxes: int = 1, min_solution_steps: int = 2,
                 max_solution_steps: int = 10) -> None:
        self.check_config(observation=observation, cell_px=cell_px)  # the level's settings: SokobanEnv's own
        if observation == "image":
            require_pillow()
        self.observation, self.cell_px = observation, cell_px
        self.inner = SokobanEnv(height=height, width=width, num_boxes=num_boxes,
                                min_solution_steps=min_solution_steps, max_solution_steps=max_solution_steps,
                                reward_mode=reward_mode)

    @property
    def renders_images(self) -> bool:
        """True when observations carry images (the collector then needs a vision-language processor)."""
        return self.observation == "image"

    def reset(self, seed: int) -> EnvReset:
        first = self.inner.reset(seed)
        task = first.task.replace(TEXT_LEGEND, LEGEND) if self.observation == "image" else first.task
        return EnvReset(observation=self._observe(), task=task, admissible_actions=first.admissible_actions,
                        info=first.info)

    def step(self, action: str) -> EnvStep:
        step = self.inner.step(action)
        obs, info = self._observe(), step.info
        if info["invalid_action"]:
            info = {**info, STATE_KEY: observation_key(obs)}  # this env's observation, pixels included
            note = f"Invalid action '{escape_placeholders(action)}'; the valid actions are up, down, left, right."
            obs = (Observation(f"{note}\n{obs.text}", obs.images) if isinstance(obs, Observation)
                   else f"{note}\n{obs}")
        return EnvStep(observation=obs, reward=step.reward, done=step.done, info=info)

    def _observe(self) -> str | Observation:
        assert self.inner.level is not None
        if self.observation == "text":
            return render(self.inner.level)
        return Observation(IMAGE_PLACEHOLDER, (render_frame(self.inner.level, self.cell_px),))

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        return self.inner.parse_action(response_text)

    def solution(self) -> list[str] | None:
        return self.inner.solution()

    def close(self) -> None:
        self.inner.close()

