"""SEED lab study, precondition checks (issue #21; docs/methods/seed.md, "Evidence, second design"), on selection maps.

1. **Skill-following**: success and thin-ice deaths of the warm start on selection maps, sampled at the rollout
   temperature, without a skill and with the oracle rule (:data:`THIN_ICE_RULE`) in every prompt. The skill must
   cut thin-ice deaths, or the teacher has nothing to distil.
2. **Positive control**: the policy's own rollouts (the stage-2 rollout settings) analysed by the oracle rule
   analyzer, exactly as ``methods.seed.analyzer=rule`` does; per row, the skill's shift of the sampled response's
   log-probability, delta = log pi(a | h + skill) - log pi(a | h), split into *fatal* rows (the action steps on
   ``~``) and *safe* rows. The mechanism needs delta < 0 on fatal rows and delta > 0 on safe ones; if not, the
   comparison is not run. Beside it, *deadly* rows (onto ``~`` or into a visible hole: any move that kills) and
   *alive* rows, since the oracle rule forbids both hazards (docs/methods/seed.md says when this was added), and
   a counterfactual diagnostic, *fork_safe_move*: at every row at a fork (the naive move steps on ``~``), the
   skill's shift of the safe move's log-probability, sampled or not; *fork* and *fork_fatal*: the sampled rows at
   forks, all and those onto ``~``.
3. **Self-analysis**: greedy analyses by the policy of some of those trajectories: parse rate and how many state
   the hidden lesson (:func:`tether.envs.thin_ice.states_lesson`).
4. With ``--own-skills`` (the self-analysis arm, after stage 1): check 2 again with the policy's own greedy
   analysis of every trajectory as the skill, as ``methods.seed.analyzer=policy`` does; trajectories whose
   analysis fails give no rows (their rows get no distillation in training either).
5. **The privileged hint** (``opsd_hint``): check 2's shifts with the hint ``methods.opsd`` gives its teacher (the
   safe walker's plan from the row's state) in place of the skill, on non-ice rows and for the safe move at forks:
   whether the policy reads the calibration's privileged teacher at all.

``gate_third_design`` reads the third design's registered gate from checks 2 and 5
(:func:`tether.lab.seed_third.third_design_gate`).

Usage: python scripts/lab/seed_precheck.py CONFIG [--maps 32] [--copies 4] [--analyses 16] [--own-skills]
       [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch

from tether.config import load_config
from tether.engine.base import SamplingParams, sampling_params
from tether.engine.hf import HFEngine
from tether.envs.thin_ice import at_fork, states_lesson
from tether.lab.seed_third import third_design_gate
from tether.lab.skill_data import response_text
from tether.methods.seed.analyzer import Analysis, episode_analysis_prompt, parse_analysis, success_label
from tether.methods.seed.opsd import hint_section
from tether.methods.seed.prompting import augment_with_skill, insert_after_task_line
from tether.methods.seed.rule_analyzers import THIN_ICE_RULE, Trajectory, rule_analysis, solve_from_observation
from tether.models import encode_chat, load_policy
from tether.rollout.multi_turn import AgentCollector, Episode, build_prompt


def play(collector: AgentCollector, engine: HFEngine, seeds: list[int], copies: int, skill: str | None,
         seed: int) -> tuple[list[Episode], list[dict[str, Any]]]:
    """``copies`` sampled episodes per map, with ``skill`` in every prompt when given."""
    tok = collector.tokenizer
    if skill:
        collector.encode = lambda ep: encode_chat(tok, augment_with_skill(  # type: ignore[method-assign]
            build_prompt(ep, collector.env_cfg.history, collector.action_format), skill))
    episodes = collector.start_episodes(seeds, copies)
    rows = collector.run_episodes(engine, episodes, sampling_params(collector.cfg.rollout), seed)
    collector.__dict__.pop("encode", None)
    return episodes, rows


def outcome(episodes: list[Episode]) -> dict[str, float]:
    n = len(episodes)
    return {"success": sum(e.won for e in episodes) / n,
            "thin_ice_death": sum(e.hazards.get("fell_through_ice", False) for e in episodes) / n,
            "hole_death": sum(e.hazards.get("fell_in_hole", False) for e in episodes) / n, "episodes": n}


@torch.no_grad()
def response_log_prob(model: Any, prompt: list[int], response: list[int]) -> float:
    """log pi(response | prompt), summed over the response tokens."""
    ids = torch.tensor([prompt + response])
    logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).sum())


def safe_kind(before: dict[str, Any], after: dict[str, Any], action: str) -> str:
    """A safe row's kind, from the env's infos before and after its move (:class:`ThinIceEnv`): a move into a
    visible hole, the first move of the safe solver's plan, or another move."""
    if after.get("outcome") == "hole":
        return "safe_into_hole"
    return "safe_on_plan" if before["safe_move"] == action else "safe_other"


def oracle_skills(episodes: list[Episode]) -> dict[int, str]:
    """The oracle rule analyzer's skill per episode (by ``id``), as ``methods.seed.analyzer=rule`` writes it."""
    return {id(ep): parse_analysis(rule_analysis(Trajectory.from_episode(ep), "thin_ice",
                                                 success=success_label(ep.ret) == "success", include_summary=False),
                                   include_summary=False).skill for ep in episodes}


def own_analyses(engine: HFEngine, tok: Any, episodes: list[Episode], max_new_tokens: int) -> list[Analysis]:
    """The policy's own greedy analysis of each episode, parsed, as ``methods.seed.analyzer=policy`` writes it."""
    prompts = [encode_chat(tok, episode_analysis_prompt(e, include_summary=False)) for e in episodes]
    texts: list[str] = []
    for k in range(0, len(prompts), 16):
        texts += engine.generate(prompts[k:k + 16], SamplingParams(max_new_tokens=max_new_tokens, greedy=True),
                                 seed=k).texts
    return [parse_analysis(t, include_summary=False) for t in texts]


def skill_deltas(model: Any, tok: Any, skills: dict[int, str], rows: list[dict[str, Any]], history: int,
                 action_format: str) -> dict[str, Any]:
    """The positive control (module docstring, 2 and 4) with ``skills`` per episode; episodes without one are
    skipped."""
    split: dict[str, list[float]] = {"fatal": [], "safe": []}
    # the issue's own reading of "fatal": any move that ends the episode in death, onto ~ or into a visible hole
    # (added 2026-12-05 after the ahead_balanced3 precheck, beside the pre-registered thin-ice split; a deviation)
    deadly: dict[str, list[float]] = {"deadly": [], "alive": []}
    # diagnostic split of the safe rows: into a hole, the first move of the safe plan, any other move; and,
    # overlapping those, the safe rows at a fork (the naive move would step on ~)
    detail: dict[str, list[float]] = {"safe_into_hole": [], "safe_on_plan": [], "safe_other": [],
                                      "safe_at_fork": []}
    # every sampled row at a fork, and those onto ~ there (the third design's gate, read where the signal acts;
    # added 2026-12-06 before that design's warm start existed)
    fork_rows: dict[str, list[float]] = {"fork": [], "fork_fatal": []}
    # counterfactual, at every fork row whatever was sampled: the shift of the safe move's response. A policy that
    # always steps on ~ without a skill has almost no sampled safe rows at forks, and its sampled safe rows elsewhere
    # sit near log-prob 0, where no skill can raise them; this reads "raises the safe move" where the skill matters
    # (added 2026-12-05, second session, before the joint stage-1 candidates were checked; a diagnostic, not a gate)
    counterfactual: dict[str, list[float]] = {"fork_safe_move": []}
    for r in rows:
        ep, turn = r["episode"], r["turn"]
        t = ep.turns[turn]
        if not t["valid"] or not skills[id(ep)].strip():
            continue
        response = r["response_ids"].tolist()
        # the row's prompt as the agent loop built it: the turns before this one, this turn's observation
        view = Episode(env=None, task=ep.task, group_id=0, episode_id=0, seed=ep.seed, observation=t["observation"],
                       admissible=ep.admissible, turns=ep.turns[:turn])
        message = build_prompt(view, history, action_format)
        plain_prompt = list(r["prompt_ids"])
        skilled_prompt = encode_chat(tok, augment_with_skill(message, skills[id(ep)]))
        student = response_log_prob(model, plain_prompt, response)
        teacher = response_log_prob(model, skilled_prompt, response)
        before, after = ep.infos[turn], ep.infos[turn + 1]  # the env's infos around this row's move
        fork = at_fork(before)
        if fork and (move := before["safe_move"]):
            alt = tok.encode(response_text(move), add_special_tokens=False)
            counterfactual["fork_safe_move"].append(response_log_prob(model, skilled_prompt, alt)
                                                    - response_log_prob(model, plain_prompt, alt))
        fatal = after.get("outcome") == "thin_ice"
        split["fatal" if fatal else "safe"].append(teacher - student)
        if fork:
            fork_rows["fork"].append(teacher - student)
            if fatal:
                fork_rows["fork_fatal"].append(teacher - student)
        kind = None if fatal else safe_kind(before, after, t["action"])
        deadly["deadly" if fatal or kind == "safe_into_hole" else "alive"].append(teacher - student)
        if kind is not None:
            detail[kind].append(teacher - student)
            if fork:
                detail["safe_at_fork"].append(teacher - student)
    return summarise({**split, **deadly, **detail, **fork_rows, **counterfactual})


def summarise(kinds: dict[str, list[float]]) -> dict[str, Any]:
    """Per kind of row: how many, the mean delta, its standard error and the share above 0."""
    out: dict[str, Any] = {}
    for kind, values in kinds.items():
        x = torch.tensor(values or [float("nan")])
        out[kind] = {"rows": len(values), "delta_mean": float(x.mean()),
                     "delta_se": float(x.std() / len(values) ** 0.5) if len(values) > 1 else float("nan"),
                     "frac_positive": float((x > 0).float().mean())}
    return out


def hint_deltas(model: Any, tok: Any, rows: list[dict[str, Any]], history: int, action_format: str) -> dict[str, Any]:
    """The calibration's privileged teacher, read like the skill (check 5): per valid row, the shift that OPSD's
    hint (the safe walker's plan from the row's state, inserted as ``methods.opsd`` inserts it) gives the sampled
    move (``safe``: rows not onto ``~``) and, at fork rows, the safe move whether sampled or not
    (``fork_safe_move``). A policy that never learnt to read the hint's block gives the control nothing to distil."""
    kinds: dict[str, list[float]] = {"safe": [], "fork_safe_move": []}
    for r in rows:
        ep, turn = r["episode"], r["turn"]
        t = ep.turns[turn]
        plan = solve_from_observation("thin_ice", t["observation"], ep.task)
        if not t["valid"] or not plan:
            continue
        view = Episode(env=None, task=ep.task, group_id=0, episode_id=0, seed=ep.seed, observation=t["observation"],
                       admissible=ep.admissible, turns=ep.turns[:turn])
        prompt = build_prompt(view, history, action_format)
        hinted = encode_chat(tok, insert_after_task_line(prompt, hint_section(plan)))
        plain, before = list(r["prompt_ids"]), ep.infos[turn]
        if ep.infos[turn + 1].get("outcome") != "thin_ice":
            response = r["response_ids"].tolist()
            kinds["safe"].append(response_log_prob(model, hinted, response) - response_log_prob(model, plain, response))
        if at_fork(before) and (move := before["safe_move"]):
            alt = tok.encode(response_text(move), add_special_tokens=False)
            kinds["fork_safe_move"].append(response_log_prob(model, hinted, alt) - response_log_prob(model, plain, alt))
    return summarise(kinds)


def self_analysis(engine: HFEngine, tok: Any, episodes: list[Episode], n: int, max_new_tokens: int) -> dict:
    """The module docstring's check 3 on the first ``n`` episodes, failures first."""
    picked = sorted(episodes, key=lambda e: e.won)[:n]
    parsed = own_analyses(engine, tok, picked, max_new_tokens)
    ok = [p for p in parsed if p.ok]
    return {"analyses": len(parsed), "parse_rate": len(ok) / max(len(parsed), 1),
            "correct_rate": sum(states_lesson(p.skill) for p in ok) / max(len(parsed), 1),
            "failures_analysed": sum(not e.won for e in picked),
            "example": ok[0].skill if ok else parsed[0].raw if parsed else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--maps", type=int, default=32)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--analyses", type=int, default=16, help="0: skip check 3")
    ap.add_argument("--analysis-tokens", type=int, default=512, help="greedy analysis budget (characters)")
    ap.add_argument("--model", default=None, help="another checkpoint than the config's model.name")
    ap.add_argument("--own-skills", action="store_true", help="check 4: the control with the policy's own analyses")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = load_config(args.config, [f"model.name={args.model}"] if args.model else [])
    model, tok = load_policy(cfg.model.name)
    model.eval()
    engine = HFEngine(model, tok)
    collector = AgentCollector(cfg, tok)
    seeds = collector.val_seeds[: args.maps]  # the selection split
    plain, rows = play(collector, engine, seeds, args.copies, None, seed=1)
    where = (cfg.env.history, collector.action_format)
    skilled, _ = play(collector, engine, seeds, args.copies, THIN_ICE_RULE, seed=1)
    result = {"config": args.config, "model": cfg.model.name, "maps": len(seeds), "copies": args.copies,
              "no_skill": outcome(plain), "oracle_rule_in_prompt": outcome(skilled),
              "positive_control": skill_deltas(model, tok, oracle_skills(plain), rows, *where)}
    pc = result["positive_control"]
    result["control_passed"] = pc["fatal"]["delta_mean"] < 0 < pc["safe"]["delta_mean"]  # pre-registered
    result["control_passed_deadly"] = pc["deadly"]["delta_mean"] < 0 < pc["alive"]["delta_mean"]
    result["opsd_hint"] = hint_deltas(model, tok, rows, *where)
    result["gate_third_design"] = third_design_gate(pc, result["opsd_hint"])  # configs/lab/seed/third/protocol.yaml
    if args.own_skills:
        own = {id(ep): a.skill if a.ok else "" for ep, a in
               zip(plain, own_analyses(engine, tok, plain, args.analysis_tokens), strict=True)}
        result["own_skills"] = {"analysis_success": sum(bool(v.strip()) for v in own.values()) / len(own),
                                "skill_correct": sum(states_lesson(v) for v in own.values()) / len(own),
                                "control": skill_deltas(model, tok, own, rows, *where)}
    print(json.dumps(result, indent=2), flush=True)
    if args.analyses:  # a warm start without analysis records cannot write one; skip the generation then
        result["self_analysis"] = self_analysis(engine, tok, plain, args.analyses, args.analysis_tokens)
        print(json.dumps(result["self_analysis"], indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
