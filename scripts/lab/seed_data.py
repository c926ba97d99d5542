"""SEED lab study (issue #21): the warm start's SFT data, skill-following actions plus hindsight analyses.

    python scripts/lab/seed_data.py runs/lab/seed/data/sft.jsonl [--episodes 400] [--analyses 300] [--config C]

One file, two kinds of records, both from thin-ice *training* maps only:

* skill-following action records (:func:`tether.lab.skill_data.skill_following_records`): 30% of
  prompts carry a correct skill and follow the safe solver, the rest follow the naive solver that steps on ``~``;
* analysis records: the analyzer prompt of a solver trajectory (the naive solver with random moves, so both
  failures and successes occur) and the oracle rule analyzer's answer as the target. This is stage 1 of the
  paper folded into the warm start (the paper labels the SFT model's own rollouts with an external LLM), so the
  self-analysis arm starts from a policy that can write skills; the episode skill only (no summary), to keep the
  answers the policy writes at every update short.

Why one SFT and not two stages: on the shared 2-core machine a second SFT would cost the study's run time;
docs/methods/seed.md lists it as a deviation.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from tether.config import load_config
from tether.envs.thin_ice import ThinIceEnv
from tether.lab.skill_data import fork_pair_records, skill_following_records, solver_trajectory, write_jsonl
from tether.methods.seed.analyzer import Step, analysis_prompt, success_label
from tether.methods.seed.rule_analyzers import Trajectory, rule_analysis

ENV_KWARGS: dict[str, Any] = {"size": 6, "hole_p": 0.15, "trap_prob": 0.5}  # the first warm start's maps
# training maps never used by the action records (those take the first seeds)
ANALYSIS_SEED_START = 100_000  # the analysis records'
FORK_SEED_START = 200_000  # the fork pairs'


def noisy_trajectory(env: ThinIceEnv, seed: int, explore: float, rng: random.Random) -> Trajectory:
    """The naive solver on ``seed``'s map with a random move with probability ``explore`` at each turn."""
    return solver_trajectory(env, seed, "naive", explore=explore, rng=rng)


def analysis_records(n: int, *, explore: float, seed: int, env_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """``n`` analyzer (prompt, oracle answer) pairs on training maps ``ANALYSIS_SEED_START ..``."""
    env = ThinIceEnv(**env_kwargs)
    rng = random.Random(seed)
    out = []
    for map_seed in range(ANALYSIS_SEED_START, ANALYSIS_SEED_START + n):
        traj = noisy_trajectory(env, map_seed, explore, rng)
        label = success_label(traj.ret)
        steps = [Step(t["observation"], t["response"], t["valid"]) for t in traj.turns]
        out.append({"prompt": analysis_prompt(traj.task, steps, label, include_summary=False),
                    "response": rule_analysis(traj, "thin_ice", success=traj.won, include_summary=False),
                    "meta": {"seed": map_seed, "kind": "analysis", "outcome": label}})
    env.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--episodes", type=int, default=400, help="maps of skill-following action records")
    ap.add_argument("--analyses", type=int, default=0, help="analysis records")
    ap.add_argument("--explore", type=float, default=0.15, help="random-move chance in analysed trajectories")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skill-share", type=float, default=0.3, help="share of prompts with a correct skill")
    ap.add_argument("--fork-maps", type=int, default=0, help="maps of contrastive fork pairs (skill_data.py)")
    ap.add_argument("--off-fork", type=float, default=0.0,
                    help="chance of a pair at a state of the fork maps that is not a fork (skill_data.py)")
    ap.add_argument("--config", help="take the maps' settings from this config's env.kwargs (default: the first "
                                     "warm start's 6x6 shortest-route maps)")
    args = ap.parse_args()
    env_kwargs = load_config(args.config).env.kwargs if args.config else ENV_KWARGS
    actions = skill_following_records(args.episodes, skill_share=args.skill_share, history=0, explore=0.1,
                                      seed=args.seed, env_kwargs=env_kwargs)
    actions += fork_pair_records(range(FORK_SEED_START, FORK_SEED_START + args.fork_maps), seed=args.seed,
                                 off_fork=args.off_fork, env_kwargs=env_kwargs)
    analyses = analysis_records(args.analyses, explore=args.explore, seed=args.seed, env_kwargs=env_kwargs)
    path = write_jsonl(actions + analyses, args.out)
    print(json.dumps({"out": str(Path(path)), "action_records": len(actions),
                      "with_skill": sum(r["meta"]["skill"] is not None for r in actions),
                      "fatal_labels": sum(r["meta"]["fatal"] for r in actions),
                      "fork_records": sum(r["meta"].get("fork", False) for r in actions),
                      "analysis_records": len(analyses),
                      "analysis_failures": sum(r["meta"]["outcome"] == "failure" for r in analyses),
                      "max_prompt_chars": max(len(r["prompt"]) for r in actions + analyses)}))


if __name__ == "__main__":
    main()
