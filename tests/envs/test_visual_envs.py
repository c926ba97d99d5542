"""Visual envs: Sokoban frames and EZPoints (tether/envs/sokoban_visual.py, tether/envs/ezpoints.py)."""

from __future__ import annotations

import random

import pytest

from tether.envs import IMAGE_PLACEHOLDER, Observation, make_env, observation_key
from tether.envs.ezpoints import ACTIONS, draw_cards, evaluate
from tether.envs.sokoban import level_from_text
from tether.envs.sokoban_visual import COLOURS, render_frame


def test_observation_checks_placeholders_and_compares_pixels():
    from PIL import Image

    red, blue = Image.new("RGB", (4, 4), "red"), Image.new("RGB", (4, 4), "blue")
    with pytest.raises(ValueError, match="one <image> per image"):
        Observation("no placeholder", (red,))
    a, b = Observation(f"{IMAGE_PLACEHOLDER} x", (red,)), Observation(f"{IMAGE_PLACEHOLDER} x", (red.copy(),))
    assert a == b and hash(a) == hash(b)
    assert a != Observation(f"{IMAGE_PLACEHOLDER} x", (blue,))  # same text, other pixels
    assert observation_key(a) != observation_key(Observation(f"{IMAGE_PLACEHOLDER} x", (blue,)))
    assert observation_key("plain") == "plain"


def test_sokoban_frame_draws_each_cell_in_its_colour():
    level = level_from_text("#####\n#PXO#\n#####")
    frame = render_frame(level, cell_px=10)
    assert frame.size == (50, 30) and frame.mode == "RGB"
    assert frame.getpixel((5, 5)) == COLOURS["wall"]
    assert frame.getpixel((15, 15)) == COLOURS["player"]  # centre of the player's cell
    assert frame.getpixel((25, 15)) == COLOURS["box"]
    assert frame.getpixel((35, 15)) == COLOURS["floor"]  # a target is an outline: its centre is floor
    assert frame.getpixel((31, 15)) == COLOURS["target"]  # the outline, one pixel in


def test_visual_sokoban_frames_follow_the_text_game():
    image_env, text_env = make_env("sokoban_visual"), make_env("sokoban_visual", observation="text")
    first = image_env.reset(4)
    assert first.observation.text == IMAGE_PLACEHOLDER and first.observation.images[0].size == (168, 168)
    assert text_env.reset(4).observation == make_env("sokoban").reset(4).observation
    frames = [first.observation]
    for action in image_env.solution():
        step, text_step = image_env.step(action), text_env.step(action)
        assert (step.reward, step.done) == (text_step.reward, text_step.done)
        frames.append(step.observation)
    assert step.won and step.reward > 1.0  # shaped reward, as SEED trains with
    assert len({f.key for f in frames}) == len(frames)  # every move changes the picture
    bad = make_env("sokoban_visual")
    bad.reset(4)
    invalid = bad.step("jump")
    assert invalid.info["invalid_action"] and invalid.observation.text.startswith("Invalid action 'jump'")
    assert invalid.observation.images[0].tobytes() == first.observation.images[0].tobytes()


@pytest.mark.parametrize("seed", range(200))
def test_ezpoints_cards_can_always_make_12(seed):
    values = [10 if r in "JQK" else int(r) for r, _ in draw_cards(random.Random(seed))]
    assert min(values) >= 2 and max(values) <= 10
    assert sum(values) == 12 or values[0] * values[1] == 12


def test_ezpoints_formula_evaluation():
    assert evaluate(["3", "*", "4"]) == 12 and evaluate(["2", "+", "5", "*", "2"]) == 12
    assert evaluate(["3", "*"]) is None and evaluate(["3", "4"]) is None and evaluate(["3", "+", " "]) is None


def _ezpoints(seed: int) -> tuple[object, list[int]]:
    env = make_env("ezpoints", observation="text")
    env.reset(seed)
    return env, env.values


def test_ezpoints_win_pays_10_and_ends():
    env, values = _ezpoints(3)
    assert sorted(values) == [5, 7]
    for action in ["7", "+", "5"]:
        step = env.step(action)
        assert (step.reward, step.done) == (0.0, False)
    assert step.observation.endswith("Formula: 7 + 5")
    step = env.step("=")
    assert (step.reward, step.done, step.won) == (10.0, True, True)


def test_ezpoints_wrong_formula_and_unused_card_lose():
    env, _values = _ezpoints(3)
    env.step("5")
    step = env.step("=")  # evaluates to 5, and a card is unused
    assert (step.reward, step.done, step.won) == (-1.0, True, False)
    env.reset(3)
    for action in ["5", "*", "7"]:
        env.step(action)
    assert env.step("=").reward == -1.0  # 35


def test_ezpoints_illegal_number_poisons_the_formula_like_gym_cards():
    env, _values = _ezpoints(3)
    step = env.step("9")  # no card shows a 9
    assert (step.reward, step.done, step.info["invalid_action"]) == (-1.0, False, False)
    assert env.formula == [" "] and env.solution() is None
    env.reset(3)
    env.step("5")
    env.step("+")
    assert env.step("5").reward == -1.0  # the only 5 is used already


def test_ezpoints_long_formula_ends_with_minus_one():
    env, _ = _ezpoints(3)
    for action in ["5", "+", "7", "+", "5", "+"]:
        env.step(action)
    step = env.step("7")
    assert (step.reward, step.done, step.won) == (-1.0, True, False)


def test_ezpoints_image_observation_has_the_cards_and_the_formula_text():
    env = make_env("ezpoints")
    first = env.reset(3)
    assert first.observation.text == f"{IMAGE_PLACEHOLDER}\nFormula:" and first.admissible_actions == ACTIONS
    step = env.step("5")
    assert step.observation.text.endswith("Formula: 5")
    assert step.observation.images[0].tobytes() == first.observation.images[0].tobytes()  # the cards stay
    assert make_env("ezpoints").reset(4).observation != first.observation


@pytest.mark.parametrize("name", ["sokoban_visual", "ezpoints"])
def test_an_action_that_looks_like_a_placeholder_adds_no_image_slot(name):
    env = make_env(name)
    env.reset(0)
    step = env.step(IMAGE_PLACEHOLDER)  # echoed in the "invalid action" note, escaped
    assert step.info["invalid_action"] and "'[image]'" in step.observation.text
    assert step.observation.text.count(IMAGE_PLACEHOLDER) == len(step.observation.images) == 1
