"""Skill-following SFT data on thin ice: a policy that already uses a skill in its prompt before RL starts.

SEED's teacher is the policy itself with a hindsight skill after the task line. That teacher is better than the
student only if the policy *follows* skills in context, which the paper's pretrained models do and a randomly
initialised character model does not. This module writes the action warm start that teaches it
(issue #21; the "thin ice" design of shared/research/evidence-audit.md):

* every episode is played on a training map (:mod:`tether.envs.thin_ice`; other splits are refused);
* some episodes carry a correct skill block in every prompt, and their demonstrated actions are the safe
  solver's (around every ``~``). An episode gets a skill iff ``skill_share`` is positive and the share of skilled
  prompts so far is at most ``skill_share``. The decision never looks at the map it is made for, and it keeps the
  share of prompts with a skill within one episode's length of ``skill_share`` (skilled episodes take the detour
  and run to the goal, unskilled ones often end early in the water, so a share of *episodes* would give far more
  skilled prompts);
* the other episodes carry no skill and follow the naive solver, which treats ``~`` as ice, so the warm start
  steps on thin ice as the audit's design wants ("the base treats the hazard as safe");
* the skill, drawn per episode with ``seed``: half the time the oracle rule alone
  (:data:`tether.methods.seed.rule_analyzers.THIN_ICE_RULE`), half the time the oracle analyzer's whole skill for
  the naive solver's trajectory on the same map (:func:`tether.methods.seed.rule_analyzers.analyze_thin_ice`),
  which is the text stage 2's rule analyzer writes, so the teacher's context at stage 2 is one the policy saw in
  SFT.

The skill is per episode, not per prompt, because stage 2 inserts one episode skill into every turn of a
trajectory, and an episode that follows the safe solver from its start visits the states a skilled policy visits.

Record format (one dict per turn; :func:`write_jsonl` writes one JSON object per line):

* ``prompt``: the agent loop's user message for that turn (:func:`tether.rollout.multi_turn.build_prompt` with
  ``history``), with the skill block after the task line when the episode has one
  (:func:`tether.methods.seed.prompting.augment_with_skill`, the same insertion SEED's teacher uses). No chat
  template: the SFT trainer applies it, as for the rollout prompts.
* ``response``: ``<action>{action}</action>``, no EOS (the trainer appends it).
* ``meta``: ``seed``, ``turn``, ``skill`` (the text, or None), ``skill_kind`` (``rule``, ``analysis`` or None),
  ``solver`` (``safe`` or ``naive``), ``action`` (the label), ``fatal`` (the label steps on thin ice),
  ``trap`` (every shortest route through ``~`` on this map crosses thin ice).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import tether.files as files
from tether.envs.thin_ice import ThinIceEnv, split_of
from tether.methods.seed.prompting import augment_with_skill
from tether.methods.seed.rule_analyzers import THIN_ICE_RULE, Trajectory, analyze_thin_ice
from tether.rollout.multi_turn import Episode, build_prompt

Solver = Literal["safe", "naive"]


def response_text(action: str) -> str:
    """The demonstrated response for ``action``."""
    return f"<action>{action}</action>"


def _plan(env: ThinIceEnv, solver: Solver) -> list[str] | None:
    return env.solution() if solver == "safe" else env.naive_solution()


def solver_trajectory(env: ThinIceEnv, seed: int, solver: Solver, *, explore: float = 0.0,
                      rng: random.Random | None = None) -> Trajectory:
    """The whole episode of ``solver`` on ``seed``'s map as a trajectory an analyzer reads; with ``rng``, a random
    admissible move instead of the solver's with probability ``explore`` at each turn."""
    reset = env.reset(seed)
    turns: list[dict[str, Any]] = []
    infos = [reset.info]
    observation, won = reset.observation, False
    while (plan := _plan(env, solver)) and len(turns) < env.max_turns:
        action = plan[0] if rng is None or rng.random() >= explore else rng.choice(env.admissible)
        step = env.step(action)
        turns.append({"observation": observation, "response": response_text(action), "action": action,
                      "valid": True, "reward": step.reward})
        infos.append(step.info)
        observation, won = step.observation, step.won
        if step.done:
            break
    return Trajectory(task=reset.task, turns=turns, final_observation=observation, won=won, ret=float(won),
                      infos=infos)


def episode_records(env: ThinIceEnv, seed: int, *, skill: str | None, skill_kind: str | None, history: int,
                    explore: float, rng: random.Random) -> list[dict[str, Any]]:
    """One record per turn of an episode on ``seed``: the safe solver's actions with a skill, else the naive one's.

    With probability ``explore`` a uniformly random move is taken instead of the label (the label stays the
    solver's action from the state reached), so the data also covers states off the solver's path.
    """
    solver: Solver = "safe" if skill else "naive"
    reset = env.reset(seed)
    ep = Episode(env=env, task=reset.task, group_id=0, episode_id=0, seed=seed, observation=reset.observation,
                 admissible=reset.admissible_actions, infos=[reset.info])
    records = []
    while (plan := _plan(env, solver)) and len(ep.turns) < env.max_turns:
        prompt = build_prompt(ep, history, env.action_format)
        meta = {"seed": seed, "turn": len(ep.turns), "skill": skill, "skill_kind": skill_kind, "solver": solver,
                "action": plan[0], "fatal": lands_on_thin_ice(ep, plan[0]), "trap": reset.info["trap"]}
        records.append({"prompt": augment_with_skill(prompt, skill) if skill else prompt,
                        "response": response_text(plan[0]), "meta": meta})
        if take(env, ep, rng.choice(env.admissible) if rng.random() < explore else plan[0]):
            break
    return records


def take(env: ThinIceEnv, ep: Episode, action: str) -> bool:
    """Play ``action``, record the turn on ``ep`` as the agent loop does and move it on; True when the episode
    ended."""
    step = env.step(action)
    ep.turns.append({"observation": ep.observation, "response": response_text(action), "action": action,
                     "valid": True, "reward": step.reward})
    ep.observation = step.observation
    ep.infos.append(step.info)
    return step.done


def lands_on_thin_ice(ep: Episode, action: str) -> bool:
    """Whether ``action`` from the episode's current state steps on ``~``, as the env's latest info says."""
    return ep.infos[-1]["outcomes"].get(action) == "thin_ice"


def correct_skill(env: ThinIceEnv, seed: int, rng: random.Random) -> tuple[str, str]:
    """A correct skill for ``seed``'s map and its kind: the oracle rule, or the oracle analysis of the naive
    solver's trajectory there (a failure when it breaks through, else a success)."""
    if rng.random() < 0.5:
        return THIN_ICE_RULE, "rule"
    traj = solver_trajectory(env, seed, "naive")
    return analyze_thin_ice(traj, traj.won)[1], "analysis"


def skill_following_records(episodes: int, *, skill_share: float = 0.3, history: int = 0, explore: float = 0.0,
                            seed: int = 0, seeds: Sequence[int] | None = None,
                            env_kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Skill-following SFT records (module docstring) for ``episodes`` thin-ice training maps.

    Args:
        episodes: how many maps (one episode each).
        skill_share: the target fraction of prompts that carry a skill block (whole episodes carry one).
        history: previous (observation, action) pairs in the prompt; use the RL config's ``env.history``.
        explore: probability of a random move instead of the label (off-path states).
        seed: draws which episodes carry a skill, the skill texts and the exploration.
        seeds: the maps; default the first ``episodes`` training seeds. Seeds outside the train split raise.
        env_kwargs: :class:`~tether.envs.thin_ice.ThinIceEnv` arguments (use the RL config's ``env.kwargs``).

    Returns:
        ``{"prompt", "response", "meta"}`` per turn, episodes in seed order.
    """
    if not 0.0 <= skill_share <= 1.0:
        raise ValueError(f"skill_share must be in [0, 1], got {skill_share}")
    env = ThinIceEnv(**(env_kwargs or {}))
    maps = list(seeds) if seeds is not None else env.train_seeds(episodes)
    if len(maps) != episodes:
        raise ValueError(f"{episodes} episodes need as many seeds, got {len(maps)}")
    held_out = [s for s in maps if split_of(s) != "train"]
    if held_out:
        raise ValueError(f"SFT data must come from training maps; seeds {held_out[:5]} are held out")
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    with_skill = 0
    for map_seed in maps:
        below = skill_share > 0 and with_skill <= skill_share * len(records)
        skill, kind = correct_skill(env, map_seed, rng) if below else (None, None)
        batch = episode_records(env, map_seed, skill=skill, skill_kind=kind, history=history, explore=explore,
                                rng=rng)
        records += batch
        with_skill += len(batch) if skill else 0
    env.close()
    return records


def fork_pair_records(maps: Sequence[int], *, history: int = 0, explore: float = 0.2, seed: int = 0,
                      off_fork: float = 0.0, env_kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Contrastive records at *forks*, the states where the naive solver's next move steps on ``~``: each fork
    gives two records of the same state, without a skill (the naive solver's move) and with a correct skill (the
    safe solver's move). The skill changes the label only there, so the plain records of
    :func:`skill_following_records` teach it rarely (a few percent of their prompts); these pairs teach exactly
    that contrast. States come from the naive solver's walk with a random move with probability ``explore``;
    ``meta`` as there, plus ``fork`` (True at a fork).

    ``off_fork`` is the chance of the same pair at a state that is not a fork, where both solvers agree. Without
    them every skilled record of this data is a fork, and a model can learn "with a skill, take the other move"
    instead of reading the tile (the ahead_sft3 warm start did, docs/methods/seed.md)."""
    if not 0.0 <= off_fork <= 1.0:
        raise ValueError(f"off_fork must be in [0, 1], got {off_fork}")
    env = ThinIceEnv(**(env_kwargs or {}))
    held_out = [s for s in maps if split_of(s) != "train"]
    if held_out:
        raise ValueError(f"SFT data must come from training maps; seeds {held_out[:5]} are held out")
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    for map_seed in maps:
        skill, kind = correct_skill(env, map_seed, rng)
        reset = env.reset(map_seed)
        ep = Episode(env=env, task=reset.task, group_id=0, episode_id=0, seed=map_seed,
                     observation=reset.observation, admissible=reset.admissible_actions, infos=[reset.info])
        while (naive := env.naive_solution()) and len(ep.turns) < env.max_turns:
            safe = env.solution()
            fork = bool(safe) and lands_on_thin_ice(ep, naive[0])
            # draw only when asked, so off_fork=0 keeps the data of the runs before the option byte-identical
            if safe and (fork or (off_fork > 0 and rng.random() < off_fork)):
                prompt = build_prompt(ep, history, env.action_format)
                for text, action, solver in ((prompt, naive[0], "naive"),
                                             (augment_with_skill(prompt, skill), safe[0], "safe")):
                    meta = {"seed": map_seed, "turn": len(ep.turns), "skill": skill if solver == "safe" else None,
                            "skill_kind": kind if solver == "safe" else None, "solver": solver, "action": action,
                            "fatal": fork and solver == "naive", "trap": reset.info["trap"], "fork": fork}
                    records.append({"prompt": text, "response": response_text(action), "meta": meta})
            explored = rng.choice(env.admissible) if not fork and rng.random() < explore else None
            action = safe[0] if fork else explored or naive[0]  # at a fork, around the ~ to reach any later fork
            if take(env, ep, action):
                break
    env.close()
    return records


def write_jsonl(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """``records`` as JSON lines (``prompt``, ``response``, ``meta``); returns the path."""
    return files.write_jsonl(path, records)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m tether.lab.skill_data OUT.jsonl [--episodes N] [--skill-share S] [--history H]
    [--explore E] [--seed K]``: write the records and print their counts."""
    import argparse

    ap = argparse.ArgumentParser(description="thin-ice skill-following SFT records as JSONL")
    ap.add_argument("out")
    ap.add_argument("--episodes", type=int, default=300)
    ap.add_argument("--skill-share", type=float, default=0.3)
    ap.add_argument("--history", type=int, default=0, help="the RL config's env.history")
    ap.add_argument("--explore", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    records = skill_following_records(args.episodes, skill_share=args.skill_share, history=args.history,
                                      explore=args.explore, seed=args.seed)
    path = write_jsonl(records, args.out)
    skilled = sum(r["meta"]["skill"] is not None for r in records)
    fatal = sum(r["meta"]["fatal"] for r in records)
    print(json.dumps({"out": str(path), "records": len(records), "with_skill": skilled, "fatal_labels": fatal}))


if __name__ == "__main__":
    main()
