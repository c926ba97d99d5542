"""SEED on thin ice without a model: the oracle rule analyzer and the skill-following SFT records."""

from __future__ import annotations

import re

import pytest

from tether.envs.thin_ice import GOAL, HOLE, THIN, ThinIceEnv, generate_map, parse_ahead, safe_plan, walk
from tether.lab.skill_data import fork_pair_records, response_text, solver_trajectory
from tether.methods.seed.analyzer import parse_analysis
from tether.methods.seed.rule_analyzers import (
    THIN_ICE_RULE,
    Trajectory,
    analyze_thin_ice,
    rule_analysis,
    solve_from_observation,
    thin_ice_tiles,
)

FALL_LINE = "was thin ice: it broke"
TRAP_SEED = 5  # with trap_prob=1.0 every map is a trap; seed 5's naive route breaks through at its first move


def play(env: ThinIceEnv, seed: int, actions: list[str]) -> Trajectory:
    reset = env.reset(seed)
    obs, turns, infos, won = reset.observation, [], [reset.info], False
    for action in actions:
        step = env.step(action)
        turns.append({"observation": obs, "response": response_text(action), "action": action, "valid": True})
        infos.append(step.info)
        obs, won = step.observation, step.won
        if step.done:
            break
    return Trajectory(task=reset.task, turns=turns, final_observation=obs, won=won, ret=float(won), infos=infos)


def stated_plan(skill: str, intro: str) -> list[str]:
    """The comma-separated moves after ``intro`` up to the final full stop."""
    return re.search(re.escape(intro) + r" ([a-z, ]+)\.$", skill).group(1).split(", ")


def assert_safe_route(desc: list[str], plan: list[str]) -> None:
    cells = walk((0, 0), plan, len(desc))
    assert desc[cells[-1][0]][cells[-1][1]] == GOAL
    assert all(desc[r][c] not in (HOLE, THIN) for r, c in cells)


# -- the oracle analyzer -----------------------------------------------------------------------


def test_failure_through_thin_ice_names_the_cell_the_rule_and_the_safe_path():
    env = ThinIceEnv(trap_prob=1.0)
    traj = solver_trajectory(env, TRAP_SEED, "naive")
    desc = env.reset(TRAP_SEED).info["map"]
    r, c = walk((0, 0), [t["action"] for t in traj.turns], len(desc))[-1]
    assert desc[r][c] == THIN and not traj.won
    result = parse_analysis(rule_analysis(traj, "thin_ice", success=False))
    assert result.ok and "broke through thin ice" in result.summary
    assert result.skill.startswith(f"Avoid: stepping on ~: the move '{traj.turns[-1]['action']}' at step "
                                   f"{len(traj.turns) - 1} broke through the ~ at row {r + 1}, column {c + 1}.")
    assert THIN_ICE_RULE in result.skill
    plan = stated_plan(result.skill, "the shortest path around every ~ and O from the start was:")
    assert plan == safe_plan(desc, 0, 0)
    assert_safe_route(desc, plan)


def test_success_states_the_rule_and_the_path_walked():
    env = ThinIceEnv(trap_prob=1.0)
    traj = solver_trajectory(env, TRAP_SEED, "safe")
    assert traj.won
    summary, skill = analyze_thin_ice(traj, True)
    moves = [t["action"] for t in traj.turns]
    assert skill.startswith(THIN_ICE_RULE) and stated_plan(skill, "Path here:") == moves
    assert summary.startswith(f"The agent succeeded in {len(moves)} turns")


def test_a_hole_or_running_out_of_turns_still_teaches_the_rule():
    env = ThinIceEnv()
    seed = next(s for s in range(200) if generate_map(6, s)[0][1] == HOLE)
    summary, skill = analyze_thin_ice(play(env, seed, ["right"]), False)
    assert skill.startswith("Avoid: stepping into a hole O: the move 'right' at step 0 fell in.")
    assert THIN_ICE_RULE in skill and "fell into a hole" in summary
    summary, skill = analyze_thin_ice(play(env, 0, ["up", "left"]), False)
    assert skill.startswith("Avoid: walking off the edge of the map: 2 moves did not move you.")
    assert THIN_ICE_RULE in skill and "ran out of turns" in summary
    assert stated_plan(skill, "from the start was:") == safe_plan(env.reset(0).info["map"], 0, 0)


def test_plan_from_any_observation_matches_the_env():
    env = ThinIceEnv()
    for seed in range(5):
        obs = env.reset(seed).observation
        for action in env.solution()[:-1]:
            assert solve_from_observation("thin_ice", obs) == env.solution()
            obs = env.step(action).observation
    assert thin_ice_tiles("no grid here") is None


def test_the_ahead_line_gives_the_safe_walkers_next_move_as_the_plan():
    # OPSD's hint on the ahead view: the line shows no map, so the plan is the next move of the safe walker
    env = ThinIceEnv(routes="monotone", view="ahead", trap_prob=1.0)
    checked = 0
    for seed in range(20):
        obs = env.reset(seed).observation
        while (plan := env.solution()) and len(plan) > 1:
            assert solve_from_observation("thin_ice", obs) == plan[:1]
            checked += 1
            obs = env.step(plan[0]).observation
    assert checked > 50


@pytest.mark.parametrize("kwargs", [{}, {"routes": "monotone", "view": "ahead"}])
def test_the_naive_trajectory_carries_the_envs_report_of_the_fatal_move(kwargs):
    env = ThinIceEnv(trap_prob=1.0, **kwargs)
    traj = solver_trajectory(env, TRAP_SEED, "naive")
    assert len(traj.infos) == len(traj.turns) + 1 and traj.infos[0] == env.reset(TRAP_SEED).info
    assert [i["outcome"] for i in traj.infos[1:]] == ["ice"] * (len(traj.turns) - 1) + ["thin_ice"]
    assert fork_pair_records([TRAP_SEED], env_kwargs={"trap_prob": 1.0, **kwargs})


def test_the_thin_ice_analyzer_refuses_a_trajectory_without_the_envs_infos():
    traj = solver_trajectory(ThinIceEnv(trap_prob=1.0), TRAP_SEED, "naive")
    traj.infos = traj.infos[:1]
    with pytest.raises(ValueError, match=r"\d+ turns and 1 infos, expected"):
        analyze_thin_ice(traj, False)



def test_the_ahead_view_analysis_names_the_deadly_move_and_no_edge_it_cannot_see():
    # the ahead line repeats on many cells: an unchanged line is not a move off the map (the old reading said so)
    ahead = {"routes": "monotone", "view": "ahead"}
    env = ThinIceEnv(trap_prob=1.0, **ahead)
    traj = solver_trajectory(env, TRAP_SEED, "naive")
    assert not traj.won and FALL_LINE in traj.final_observation
    _, skill = analyze_thin_ice(traj, False)
    last = traj.turns[-1]["action"]
    assert skill.startswith(f"Avoid: stepping on ~: the move '{last}' at step {len(traj.turns) - 1} broke through")
    assert "edge" not in skill and THIN_ICE_RULE in skill
    desc = env.reset(TRAP_SEED).info["map"]
    r, c = walk((0, 0), [t["action"] for t in traj.turns], len(desc))[-1]
    assert f"at row {r + 1}, column {c + 1}" in skill and desc[r][c] == THIN
    env = ThinIceEnv(trap_prob=0.0, **ahead)
    for seed in range(300):
        reset = env.reset(seed)
        first = parse_ahead(reset.observation)[0]
        if first[1] == "O":
            break
    traj = play(env, seed, [first[0]])
    _, skill = analyze_thin_ice(traj, False)
    assert skill.startswith(f"Avoid: stepping into a hole O: the move '{first[0]}' at step 0 fell in.")
    lines = [t["observation"] for t in solver_trajectory(env, 0, "safe").turns]
    assert len(set(lines)) < len(lines)  # repeated lines: the case the edge clause misread
    assert "edge" not in analyze_thin_ice(solver_trajectory(env, 0, "safe"), True)[1]

def test_the_thin_ice_arms_differ_only_in_run_dir_and_method():
    from pathlib import Path

    from tether.config import load_config

    root = Path(__file__).resolve().parents[2] / "configs" / "seed" / "thin_ice"
    dumps = {name: load_config(root / f"{name}.yaml").model_dump(mode="json") for name in ("grpo", "seed", "grpo_opsd")}
    for dump in dumps.values():
        assert dump["env"]["name"] == "thin_ice" and dump["env"]["val_tasks"] >= 256
        dump.pop("run_dir")
    assert set(dumps["seed"]["methods"]) == {"seed"} and set(dumps["grpo_opsd"]["methods"]) == {"opsd"}
    assert not dumps["grpo"]["methods"]
    for dump in dumps.values():
        dump.pop("methods")
    assert dumps["grpo"] == dumps["seed"] == dumps["grpo_opsd"]
