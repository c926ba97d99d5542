"""Thin-ice SFT data for the lab's warm starts (tether/lab/skill_data.py): skill-following records and fork pairs."""

from __future__ import annotations

import json

import pytest

from tether.envs.thin_ice import THIN, ThinIceEnv, naive_plan, parse_ahead, safe_plan, walk
from tether.lab.skill_data import (
    fork_pair_records,
    main,
    response_text,
    skill_following_records,
    solver_trajectory,
    write_jsonl,
)
from tether.methods.seed.prompting import augment_with_skill
from tether.methods.seed.rule_analyzers import THIN_ICE_RULE, analyze_thin_ice, thin_ice_tiles


def lands_on_thin_ice(observation: str, action: str) -> bool:
    """Whether ``action`` steps on ``~`` on the map an observation shows: a reading of the text, the reference the
    env's reported outcomes are checked against."""
    desc, cell = thin_ice_tiles(observation)
    r, c = walk(cell, [action], len(desc))[-1]
    return desc[r][c] == THIN


def current_tiles(prompt: str) -> tuple[list[str], tuple[int, int]]:
    """The map and player cell of a record's current observation (the last grid of the prompt)."""
    current = prompt.split("Current observation (step ")[1].split("\n\n")[0]
    return thin_ice_tiles(current.split("\n", 1)[1])


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return skill_following_records(30, skill_share=0.3, seed=1)


def test_records_are_deterministic_and_hit_the_skill_share(records):
    assert skill_following_records(30, skill_share=0.3, seed=1) == records
    assert skill_following_records(30, skill_share=0.3, seed=2) != records
    with_skill = sum(r["meta"]["skill"] is not None for r in records)
    longest = max(r["meta"]["turn"] for r in records) + 1
    assert abs(with_skill - 0.3 * len(records)) <= longest
    assert {r["meta"]["skill_kind"] for r in records} == {None, "rule", "analysis"}
    assert all(r["meta"]["skill"] is None for r in skill_following_records(5, skill_share=0.0))


def test_the_action_follows_the_skill_when_present_and_the_naive_solver_otherwise(records):
    env = ThinIceEnv()
    for r in records:
        tiles, (row, col) = current_tiles(r["prompt"])
        meta, skill = r["meta"], r["meta"]["skill"]
        plan = (safe_plan if skill else naive_plan)(tiles, row, col)
        assert r["response"] == f"<action>{plan[0]}</action>" == response_text(meta["action"])
        assert env.parse_action(r["response"]) == (meta["action"], True)
        r2, c2 = walk((row, col), plan[:1], len(tiles))[-1]
        assert meta["fatal"] == (tiles[r2][c2] == THIN)
        if skill:
            plain = r["prompt"].replace(f"\n\n{augment_with_skill('', skill)}", "", 1)
            assert r["prompt"] == augment_with_skill(plain, skill) and not meta["fatal"]
            assert THIN_ICE_RULE in skill and meta["solver"] == "safe"
        else:
            assert "Episode-Level Skill" not in r["prompt"] and meta["solver"] == "naive"
    assert any(r["meta"]["fatal"] for r in records)  # the warm start does step on thin ice without a skill


def test_analysis_skills_are_the_oracle_analysis_of_the_naive_route(records):
    env = ThinIceEnv()
    for r in records:
        if r["meta"]["skill_kind"] == "analysis":
            traj = solver_trajectory(env, r["meta"]["seed"], "naive")
            assert r["meta"]["skill"] == analyze_thin_ice(traj, traj.won)[1]
        elif r["meta"]["skill_kind"] == "rule":
            assert r["meta"]["skill"] == THIN_ICE_RULE


def test_history_and_exploration_keep_labels_from_the_state_reached():
    recs = skill_following_records(6, skill_share=0.5, history=2, explore=0.5, seed=3)
    assert any("Your last 2 steps:" in r["prompt"] for r in recs)
    for r in recs:
        tiles, cell = current_tiles(r["prompt"])
        plan = (safe_plan if r["meta"]["skill"] else naive_plan)(tiles, *cell)
        assert r["meta"]["action"] == plan[0]


def test_held_out_maps_are_refused_and_records_round_trip(tmp_path, records):
    with pytest.raises(ValueError, match="training maps"):
        skill_following_records(1, seeds=[500_000])
    with pytest.raises(ValueError, match="skill_share"):
        skill_following_records(1, skill_share=1.5)
    path = write_jsonl(records[:3], tmp_path / "data" / "sft.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == records[:3]


def test_command_writes_the_records(tmp_path, capsys):
    main([str(tmp_path / "sft.jsonl"), "--episodes", "4", "--skill-share", "0.5", "--seed", "7"])
    written = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert written == skill_following_records(4, skill_share=0.5, seed=7)
    assert json.loads(capsys.readouterr().out)["records"] == len(written)


def test_fork_pairs_are_one_state_with_and_without_a_skill_and_only_the_skill_turns_aside():
    kwargs = {"routes": "monotone", "local_view": True, "trap_prob": 1.0}
    records = fork_pair_records(range(40), seed=3, env_kwargs=kwargs)
    assert records and len(records) % 2 == 0 and records == fork_pair_records(range(40), seed=3, env_kwargs=kwargs)
    for plain, skilled in zip(records[::2], records[1::2], strict=True):
        assert plain["meta"]["fork"] and skilled["meta"]["fork"] and plain["meta"]["skill"] is None
        assert skilled["prompt"] == augment_with_skill(plain["prompt"], skilled["meta"]["skill"])
        observation = plain["prompt"].split("Current observation")[1]
        assert lands_on_thin_ice(observation.split(":\n", 1)[1], plain["meta"]["action"])
        assert not lands_on_thin_ice(observation.split(":\n", 1)[1], skilled["meta"]["action"])
        assert plain["response"] == response_text(plain["meta"]["action"]) != skilled["response"]
    with pytest.raises(ValueError, match="held out"):
        fork_pair_records([600_000], env_kwargs=kwargs)


def test_off_fork_pairs_add_skilled_records_where_the_skill_changes_nothing():
    # Without them every skilled record is a fork, and "with a skill, take the other move" fits the data
    kwargs = {"routes": "monotone", "view": "ahead", "trap_prob": 0.5}
    forks = fork_pair_records(range(60), seed=3, env_kwargs=kwargs)
    both = fork_pair_records(range(60), seed=3, off_fork=1.0, env_kwargs=kwargs)
    off = [r for r in both if not r["meta"]["fork"]]
    assert forks and off and len(off) % 2 == 0
    for plain, skilled in zip(off[::2], off[1::2], strict=True):
        assert skilled["prompt"] == augment_with_skill(plain["prompt"], skilled["meta"]["skill"])
        assert plain["meta"]["action"] == skilled["meta"]["action"]  # both walkers agree off a fork
        assert not plain["meta"]["fatal"] and not skilled["meta"]["fatal"]
    first_move = [r["meta"]["action"] == parse_ahead(r["prompt"].split("\n\nAdmissible")[0])[0][0] for r in off]
    assert 0 < sum(first_move) < len(off)  # mostly the listed move, the other one where it is blocked
    assert fork_pair_records(range(60), seed=3, off_fork=0.0, env_kwargs=kwargs) == forks
    with pytest.raises(ValueError, match="off_fork"):
        fork_pair_records(range(2), off_fork=1.5, env_kwargs=kwargs)
