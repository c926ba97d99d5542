"""Thin ice: seeded maps, solvability around every hazard, traps, splits, and a hazard only a fall reveals."""

from __future__ import annotations

import pytest

from tether.envs import EVAL_SEED_OFFSET, make_env
from tether.envs.thin_ice import (
    GRID_SYMBOLS,
    HOLE,
    THIN,
    ThinIceEnv,
    ahead_view,
    at_fork,
    crosses_thin_ice,
    generate_map,
    generate_monotone_map,
    local_view,
    monotone_plan,
    move_outcomes,
    naive_plan,
    parse_ahead,
    render,
    safe_plan,
    split_of,
    split_seeds,
    states_lesson,
    walk,
    walker_move,
)

SEEDS = [*range(30), *split_seeds("selection", 15), *split_seeds("report", 15)]


def play(env: ThinIceEnv, seed: int, actions: list[str]) -> list:
    """The steps of ``actions`` on ``seed``'s map, up to the end of the episode."""
    env.reset(seed)
    steps = []
    for action in actions:
        steps.append(env.step(action))
        if steps[-1].done:
            break
    return steps


def test_same_seed_same_map_and_seeds_differ():
    assert generate_map(6, 17) == generate_map(6, 17)
    assert ThinIceEnv().reset(17).info["map"] == ThinIceEnv().reset(17).info["map"]
    assert len({tuple(generate_map(6, s)) for s in range(20)}) == 20


@pytest.mark.parametrize("size", [5, 8])  # 6, the default, is in every other test
def test_every_map_has_thin_ice_and_a_safe_path_the_solution_walks(size):
    env = ThinIceEnv(size=size)
    for seed in SEEDS:
        first = env.reset(seed)
        desc = first.info["map"]
        assert len(desc) == size and all(len(row) == size for row in desc)
        assert first.info["thin_ice"], f"seed {seed}: no thin ice"
        plan = env.solution()
        assert plan == safe_plan(desc, 0, 0) and len(plan) <= env.max_turns - 2
        cells = walk((0, 0), plan, size)
        assert all(desc[r][c] not in (HOLE, THIN) for r, c in cells)
        steps = play(env, seed, plan)
        assert steps[-1].done and steps[-1].won and steps[-1].reward == 1.0 and len(steps) == len(plan)


def test_trap_maps_put_thin_ice_on_every_shortest_route():
    env = ThinIceEnv(trap_prob=1.0)
    for seed in range(20):
        info = env.reset(seed).info
        assert info["trap"] and info["optimal_steps"] > info["naive_steps"]
        assert info["naive_falls"]
        steps = play(env, seed, env.naive_solution())
        assert steps[-1].done and steps[-1].info["fell_through_ice"] and not steps[-1].won
    no_traps = ThinIceEnv(trap_prob=0.0)
    for seed in range(20):
        info = no_traps.reset(seed).info
        assert not info["trap"] and info["optimal_steps"] == info["naive_steps"]


def test_trap_share_follows_trap_prob():
    env = ThinIceEnv(trap_prob=0.5)
    assert 30 <= sum(env.reset(s).info["trap"] for s in range(100)) <= 70  # Binomial(100, 0.5) within 4 sd


def test_naive_plan_ignores_thin_ice_and_safe_plan_avoids_it():
    desc = ["SFF",
            "TFF",
            "FFG"]
    assert naive_plan(desc, 0, 0) == ["down", "down", "right", "right"]  # BFS tries left, down, right, up
    assert crosses_thin_ice(desc, naive_plan(desc, 0, 0))
    assert safe_plan(desc, 0, 0) == ["right", "down", "down", "right"]
    assert not crosses_thin_ice(desc, safe_plan(desc, 0, 0))
    assert safe_plan(["STH", "TFF", "HFG"], 0, 0) is None


def test_splits_never_overlap_and_eval_split_picks_one():
    last_train, first_sel = split_seeds("train", 500_000)[-1], split_seeds("selection", 1)[0]
    last_sel, first_report = split_seeds("selection", 500_000)[-1], split_seeds("report", 1)[0]
    assert last_train < first_sel and last_sel < first_report == EVAL_SEED_OFFSET
    assert [split_of(s) for s in (0, last_train, first_sel, last_sel, first_report)] == [
        "train", "train", "selection", "selection", "report"]
    with pytest.raises(ValueError, match="holds 500000 seeds"):
        split_seeds("train", 500_001)
    assert ThinIceEnv().eval_seeds(3) == split_seeds("selection", 3)
    assert ThinIceEnv(eval_split="report").eval_seeds(3) == split_seeds("report", 3)
    assert ThinIceEnv().reset(first_sel).info["split"] == "selection"


def test_thin_ice_looks_harmless_until_stepped_on():
    env = ThinIceEnv(trap_prob=1.0)
    first = env.reset(5)
    naive = env.naive_solution()
    steps = play(env, 5, naive)
    before = [first.task, first.observation, *(s.observation for s in steps[:-1])]
    for text in before:  # nothing a policy reads before the fall says that ~ is dangerous
        assert not any(word in text.lower() for word in ("thin", "break", "broke", "water"))
    assert "~ snowy ice" in first.task
    r, c = walk((0, 0), naive[:len(steps)], 6)[-1]
    assert first.info["map"][r][c] == THIN and first.observation.split("\n")[r][c] == "~"
    last = steps[-1]
    assert last.done and not last.won and last.reward == 0.0
    assert last.info["fell_through_ice"] and not last.info["fell_in_hole"]
    message, *grid = last.observation.split("\n")
    assert f"~ at row {r + 1}, column {c + 1} was thin ice" in message
    assert grid[r][c] == "X" and "\n".join(grid) == render(first.info["map"], r, c)


def test_hole_and_edge_behave_like_frozenlake():
    env = ThinIceEnv()
    seed = next(s for s in range(200) if generate_map(6, s)[0][1] == HOLE)
    step = play(env, seed, ["right"])[0]
    assert step.done and not step.won and step.info["fell_in_hole"] and not step.info["fell_through_ice"]
    first = env.reset(0)
    step = env.step("up")
    assert step.observation == first.observation and not step.done and not step.info["invalid_action"]


def test_the_character_tokenizer_sees_one_known_token_per_character():
    from tether.models.char import char_tokenizer

    tok = char_tokenizer()
    env = make_env("thin_ice", trap_prob=1.0)
    first = env.reset(3)
    steps = play(env, 3, env.naive_solution())
    assert steps[-1].info["fell_through_ice"]
    for text in (first.task, first.observation, env.action_format, *(s.observation for s in steps)):
        ids = tok(text, add_special_tokens=False).input_ids
        assert len(ids) == len(text) and tok.unk_token_id not in ids
    grid = first.observation.split("\n")
    assert len(grid) == 6 and all(len(row) == 6 and set(row) <= GRID_SYMBOLS for row in grid)


def test_bad_arguments_raise():
    for kwargs in ({"size": 4}, {"hole_p": 0.5}, {"trap_prob": 1.5}, {"eval_split": "train"}):
        with pytest.raises(ValueError):
            ThinIceEnv(**kwargs)


def test_hazard_deaths_and_all_fail_groups_are_counted_from_the_last_step():
    from tether.rollout.multi_turn import Episode, all_fail_share, hazard_deaths

    def episode(won: bool, **flags: bool) -> Episode:
        return Episode(env=None, task="", group_id=0, episode_id=0, seed=0, observation="", admissible=None,
                       won=won, hazards={"fell_in_hole": False, "fell_through_ice": False, **flags})

    eps = [episode(True), episode(False, fell_through_ice=True), episode(False, fell_in_hole=True), episode(False)]
    assert hazard_deaths(eps, "val") == {"val/hazard_death_frac": 0.5, "val/fell_in_hole_frac": 0.25,
                                         "val/fell_through_ice_frac": 0.25}
    assert all_fail_share(eps, 2) == 0.5  # the first group has a win, the second none


def test_fatal_and_safe_deltas_split_rows_by_a_step_onto_thin_ice():
    from types import SimpleNamespace

    import torch

    from tether.methods.seed.plugin import fatal_safe_deltas

    # rows: onto ~, onto ice, into a hole, onto ice without a teacher; each row's info is the env's after its move
    moved = [{"outcome": "thin_ice", "fell_in_hole": False, "fell_through_ice": True},
             {"outcome": "ice", "fell_in_hole": False, "fell_through_ice": False},
             {"outcome": "hole", "fell_in_hole": True, "fell_through_ice": False},
             {"outcome": "ice", "fell_in_hole": False, "fell_through_ice": False}]
    ep = SimpleNamespace(turns=[{"valid": True}] * 4, infos=[{}, *moved])
    batch = SimpleNamespace(info={"episode": [ep] * 4, "turn": [0, 1, 2, 3]})
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])  # the last row has no teacher
    teacher = torch.tensor([[-2.0, -1.0], [-0.5, -9.0], [-1.5, -1.5], [5.0, 5.0]])
    out = fatal_safe_deltas(batch, teacher, torch.full((4, 2), -1.0), mask, "fell_through_ice")
    # deltas per row: (-1) + 0 = -1, 0.5, -0.5 + -0.5 = -1; the hole is safe (not ~) but deadly
    assert out == {"seed/delta_fatal": -1.0, "seed/delta_safe": -0.25, "seed/fatal_rows": 1.0,
                   "seed/delta_deadly": -1.0, "seed/delta_alive": 0.5}


def test_fork_rows_split_the_deltas_by_the_state_each_row_acts_in():
    from types import SimpleNamespace

    import torch

    from tether.methods.seed.plugin import fatal_safe_deltas

    fork = {"outcomes": {"down": "thin_ice", "right": "ice"}, "naive_move": "down", "safe_move": "right"}
    plain = {"outcomes": {"down": "ice", "right": "ice"}, "naive_move": "down", "safe_move": "down"}
    # rows 0-3 act in: a fork (moves onto ~), a fork (turns aside), a plain state, a fork without a teacher
    before = [fork, fork, plain, fork]
    moved = [{"outcome": "thin_ice", "fell_through_ice": True}, {"outcome": "ice", "fell_through_ice": False},
             {"outcome": "ice", "fell_through_ice": False}, {"outcome": "ice", "fell_through_ice": False}]
    episodes = [SimpleNamespace(turns=[{"valid": True}], infos=[b, m]) for b, m in zip(before, moved, strict=True)]
    batch = SimpleNamespace(info={"episode": episodes, "turn": [0, 0, 0, 0]})
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    teacher = torch.tensor([[-4.0, -2.0], [0.0, 1.0], [-1.0, -1.5], [9.0, 9.0]])
    out = fatal_safe_deltas(batch, teacher, torch.full((4, 2), -1.0), mask, "fell_through_ice", at_fork)
    # row deltas: -3 - 1 = -4, 1 + 2 = 3, 0 - 0.5 = -0.5; the fourth row has no teacher and counts nowhere
    assert out["seed/delta_fork"] == pytest.approx(-0.5) and out["seed/fork_rows"] == 2.0
    assert out["seed/delta_fork_safe"] == 3.0 and out["seed/delta_fork_fatal"] == -4.0
    assert out["seed/delta_safe"] == pytest.approx(1.25) and out["seed/delta_fatal"] == -4.0
    without = fatal_safe_deltas(batch, teacher, torch.full((4, 2), -1.0), mask, "fell_through_ice")
    assert not any("fork" in key for key in without)


@pytest.mark.parametrize("kwargs", [{}, {"routes": "monotone", "view": "ahead"}])
def test_the_naive_walker_falls_through_ice_exactly_at_the_first_fork_it_reaches(kwargs):
    assert ThinIceEnv.at_fork is at_fork
    env, falls = ThinIceEnv(**kwargs), 0
    for seed in SEEDS[:40]:
        info = env.reset(seed).info
        for _ in range(env.max_turns):
            if info["naive_move"] is None:
                break
            fork = at_fork(info)
            assert not fork or info["safe_move"] != info["naive_move"]
            step = env.step(info["naive_move"])
            assert step.info["fell_through_ice"] == fork  # the naive move at a fork, and only there, breaks ~
            falls += fork
            info = step.info
            if step.done:
                break
        assert not at_fork(info)  # a finished episode's state is no fork
    assert falls > 0


@pytest.mark.parametrize("kwargs", [{}, {"routes": "monotone", "local_view": True}, {"routes": "monotone",
                                                                                     "view": "ahead"}])
def test_every_step_reports_what_the_move_did_and_what_each_move_would_do(kwargs):
    import random

    assert move_outcomes(["STF", "HFF", "FFG"], 0, 0) == {"left": "edge", "down": "hole", "right": "thin_ice",
                                                          "up": "edge"}
    env, rng, forks = ThinIceEnv(**kwargs), random.Random(0), 0
    for seed in SEEDS[:20]:
        info = env.reset(seed).info
        desc = info["map"]
        for _ in range(env.max_turns):
            assert info["outcomes"] == move_outcomes(desc, *env.position)
            assert info["safe_move"] == (env.solution() or [None])[0]
            assert info["naive_move"] == (env.naive_solution() or [None])[0]
            forks += info["outcomes"].get(info["naive_move"]) == "thin_ice"
            action = rng.choice([*env.admissible, "jump"])
            before, step = env.position, env.step(action)
            r, c = step.info["cell"]
            assert (r, c) == env.position
            assert step.info["outcome"] == ("invalid" if action == "jump" else info["outcomes"][action])
            assert (step.info["outcome"] in ("edge", "invalid")) == ((r, c) == before)
            assert step.info["fell_through_ice"] == (step.info["outcome"] == "thin_ice") == (desc[r][c] == THIN)
            assert step.info["fell_in_hole"] == (step.info["outcome"] == "hole")
            assert step.info["won"] == (step.info["outcome"] == "goal")
            info = step.info
            if step.done:
                assert info["outcomes"] == {} and info["safe_move"] is None is info["naive_move"]
                break
    assert forks > 0


def test_skill_correctness_needs_the_lesson_about_thin_ice():
    from tether.methods.seed.rule_analyzers import THIN_ICE_RULE

    assert ThinIceEnv.states_lesson is states_lesson and ThinIceEnv.hidden_hazard == "fell_through_ice"
    assert states_lesson(THIN_ICE_RULE) and states_lesson("Avoid ~ tiles.")
    assert not states_lesson("Walk right, then down to G.") and not states_lesson("Step on ~.")


# -- monotone maps and the local view (the revised SEED lab setting, docs/methods/seed.md) ----------------------


def test_monotone_plan_turns_aside_from_what_it_avoids_and_stops_when_boxed_in():
    desc = ["SFF", "TFF", "FFG"]  # down first on a tie; ~ below the start
    assert monotone_plan(desc, 0, 0, HOLE) == ["down", "right", "down", "right"]
    assert monotone_plan(desc, 0, 0, HOLE + THIN) == ["right", "down", "down", "right"]
    assert monotone_plan(["SH", "HG"], 0, 0, HOLE) is None
    assert monotone_plan(["SFF", "FFF", "FFG"], 2, 0, HOLE) == ["right", "right"]  # no rows left: right only


def test_monotone_maps_trap_the_naive_walker_only_and_the_safe_walker_wins():
    env = ThinIceEnv(routes="monotone", size=6)
    traps = 0
    for seed in SEEDS:
        first = env.reset(seed)
        desc, safe, naive = first.info["map"], env.solution(), env.naive_solution()
        assert first.info["thin_ice"] and len(safe) == 10 and set(safe) <= {"down", "right"}
        assert first.info["trap"] == crosses_thin_ice(desc, naive) == first.info["naive_falls"]
        assert not crosses_thin_ice(desc, safe) and (safe == naive) != first.info["trap"]
        steps = play(env, seed, safe)
        assert steps[-1].won and len(steps) == 10
        if first.info["trap"]:
            traps += 1
            assert play(env, seed, naive)[-1].info["fell_through_ice"]
    assert 0 < traps < len(SEEDS)
    assert generate_monotone_map(6, 17) == generate_monotone_map(6, 17) != generate_map(6, 17)


def test_the_local_view_names_each_side_and_the_goal_distance_and_follows_the_player():
    env = ThinIceEnv(routes="monotone", local_view=True)
    first = env.reset(3)
    board, view = first.observation.rsplit("\n", 1)
    assert board == render(first.info["map"], 0, 0)
    assert view == local_view(first.info["map"], 0, 0)
    desc = ["SFH", "TFF", "FFG"]
    assert local_view(desc, 0, 0) == "Around you: left edge, down ~, right _, up edge. Goal: 2 down, 2 right."
    assert local_view(desc, 1, 1) == "Around you: left ~, down _, right _, up _. Goal: 1 down, 1 right."
    step = env.step(env.solution()[0])
    assert step.observation.endswith(local_view(first.info["map"], *env.position))
    assert "Around you" not in ThinIceEnv(routes="monotone").reset(3).observation


def test_monotone_and_local_view_arguments_are_checked():
    with pytest.raises(ValueError, match="routes must be"):
        ThinIceEnv(routes="bfs")
    with pytest.raises(ValueError, match="size must be >= 5"):
        ThinIceEnv(size=4)
    assert ThinIceEnv(size=4, routes="monotone").reset(0).info["map"][0][0] == "S"
    with pytest.raises(ValueError, match="local_view must be"):
        ThinIceEnv.check_config(local_view="yes")


def test_the_ahead_view_decides_both_walkers_next_move_by_one_lookup():
    assert ahead_view(["SFH", "TFF", "FFG"], 0, 0) == "Ahead: down ~, then right _."
    assert ahead_view(["SFH", "TFF", "FFG"], 2, 1) == "Ahead: right G, then down edge."
    assert parse_ahead("It broke.\nAhead: right G, then down edge.") == [("right", "G"), ("down", "edge")]
    assert parse_ahead("P__\n___") is None
    assert walker_move([("down", "~"), ("right", "O")], "O~") is None
    env = ThinIceEnv(routes="monotone", view="ahead")
    checked = 0
    for seed in SEEDS:
        first = env.reset(seed)
        assert first.observation == ahead_view(first.info["map"], 0, 0)
        obs = first.observation
        while env.solution():
            assert walker_move(parse_ahead(obs), "O~") == env.solution()[0]
            if env.naive_solution():
                assert walker_move(parse_ahead(obs), "O") == env.naive_solution()[0]
            checked += 1
            obs = env.step(env.solution()[0]).observation
        assert env.position == (5, 5)
    assert checked > 5 * len(SEEDS)


def test_the_ahead_view_needs_monotone_routes_and_no_local_line():
    with pytest.raises(ValueError, match="view must be"):
        ThinIceEnv.check_config(view="board")
    with pytest.raises(ValueError, match="view 'ahead' needs routes: monotone"):
        ThinIceEnv.check_config(view="ahead")
    with pytest.raises(ValueError, match="local_view=True"):
        ThinIceEnv.check_config(view="ahead", routes="monotone", local_view=True)
