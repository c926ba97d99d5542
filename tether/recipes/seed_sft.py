"""SEED stage 1, hindsight-skill SFT: teach the policy to analyse its own trajectories (seed.md Sec. 1.1).

1. Roll out the base policy on ``tasks`` training tasks, ``rollouts_per_task`` times each (the agent loop of
   tether, :class:`tether.rollout.multi_turn.AgentCollector`).
2. Label every trajectory with an external analyzer: ``rule`` (tether's offline analyzers,
   :mod:`tether.methods.seed.rule_analyzers`) or ``openai`` (an OpenAI-compatible endpoint,
   :mod:`tether.methods.seed.openai_analyzer`). The prompt is the stage-2 analyzer prompt; records whose answer
   parsed with a non-empty skill are kept (no behavioural validation, as the code).
3. Split 90/10 with a seeded shuffle; fine-tune on (chat-templated analyzer prompt -> ``json.dumps`` of the
   parsed fields + EOS) with NLL on response tokens only, token-mean over each optimiser batch. A text prompt is
   left-truncated to ``analysis_context_length`` tokens, as stage 2 truncates it (not in the paper's code, whose
   stage 1 drops examples over its max length instead; the two agree whenever prompts fit).
   On a visual env the prompt is the authors' ``seed_visual`` variant, as at stage 2: each step's observation is an
   ``<image>`` slot, filled with the episode's frames, one per step; the record carries the frames, and the SFT
   encodes each prompt with them through the policy's processor (:mod:`tether.recipes.sft`).
4. Save ``run_dir/checkpoint`` (``save_pretrained`` + tokenizer; :func:`tether.models.load_policy` loads it): the
   stage-2 actor, analyzer and KL reference. A stopped SFT resumes from ``run_dir/sft_state`` without rolling out
   again (:func:`run_skill_sft`).

Run it with ``tether seed-sft CONFIG [key=value ...]``; the config's schema is
:class:`~tether.config.SeedSFTRunConfig`: settings are the top-level ``sft`` of the config
(:class:`~tether.config.SkillSFTSettings`), the analyzer prompt options, which stage 2 shares, are ``methods.seed``.
Stage 2 is the ``seed`` method in ``tether train``.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tether.config import Config, ConfigError, SeedSFTRunConfig, SkillSFTSettings, load_command_config
from tether.engine.base import SamplingParams, sampling_params
from tether.engine.hf import HFEngine
from tether.files import read_jsonl, write_jsonl
from tether.methods import method_config
from tether.methods.seed.analyzer import Analysis, analysis_target, episode_analysis_prompt, parse_analysis
from tether.methods.seed.rule_analyzers import Trajectory, rule_analysis
from tether.models.vision import encode_message, has_images, observation_images
from tether.recipes.sft import SFTSession, written_examples
from tether.rollout.multi_turn import AgentCollector
from tether.seeding import step_seed
from tether.sft_data import Example, row_example, write_examples
from tether.splits import split_train_val

# -- 1. rollouts -----------------------------------------------------------------------------------


def rollout_episodes(cfg: Config, policy: Any, tokenizer: Any, s: SkillSFTSettings,
                     engine: Any = None) -> list[Any]:
    """Play ``s.tasks`` training tasks ``s.rollouts_per_task`` times each with ``policy`` (or with ``engine``, a
    :class:`~tether.engine.base.RolloutEngine`); the finished episodes.

    Each episode gets ``x_solution``, the env's own solution from its start state (TextWorld's walkthrough...).
    """
    collector = AgentCollector(cfg, tokenizer)
    if s.tasks > len(collector.train_seeds):
        raise ConfigError(f"sft.tasks={s.tasks} exceeds env.train_tasks={len(collector.train_seeds)}; "
                          "raise env.train_tasks or lower the SFT tasks")
    engine = engine or HFEngine(policy, tokenizer, bf16_autocast=cfg.model.bf16_autocast,
                                logprob_chunk_tokens=cfg.train.logprob_chunk_tokens)
    params = sampling_params(cfg.rollout)
    if s.temperature is not None:  # stage 1's own rollout temperature
        params = dataclasses.replace(params, temperature=s.temperature)
    seeds = collector.train_seeds[:s.tasks]
    episodes = []
    for k in range(0, len(seeds), s.rollout_batch_tasks):
        batch = collector.start_episodes(seeds[k:k + s.rollout_batch_tasks], s.rollouts_per_task)
        for ep in batch:
            ep.x_solution = None if ep.done else ep.env.solution()
        collector.run_episodes(engine, batch, params, seed=step_seed(cfg.seed, 0, "", k))
        episodes += batch
    return episodes


# -- 2. labels -------------------------------------------------------------------------------------


def label_episodes(episodes: list[Any], env_name: str, s: SkillSFTSettings, *, threshold: float = 1.0,
                   include_summary: bool = True, analyzer: Any = None) -> list[dict[str, Any]]:
    """One record per trajectory with at least one turn: prompt, outcome, the analyzer's answer, ``ok``, and
    ``images``, the frames of the prompt's ``<image>`` slots (PIL; none for a text env).

    Args:
        analyzer: for ``s.analyzer == "openai"``, an object with ``analyze(prompt) -> Analysis`` (default: an
            :class:`~.openai_analyzer.OpenAIAnalyzer` from ``s.openai``); unused for ``rule``.
    """
    played = [ep for ep in episodes if ep.turns]
    prompts = [episode_analysis_prompt(ep, threshold=threshold, include_summary=include_summary) for ep in played]
    outcomes = ["success" if ep.ret >= threshold else "failure" for ep in played]
    if s.analyzer == "rule":
        results = [parse_analysis(rule_analysis(Trajectory.from_episode(ep), env_name, success=o == "success",
                                                include_summary=include_summary), include_summary=include_summary)
                   for ep, o in zip(played, outcomes, strict=True)]
    else:
        if analyzer is None:
            from tether.methods.seed.openai_analyzer import OpenAIAnalyzer

            o = s.openai
            analyzer = OpenAIAnalyzer(base_url_env=o.base_url_env, model_env=o.model_env, api_key_env=o.api_key_env,
                                      max_completion_tokens=o.max_completion_tokens, parse_retries=o.parse_retries,
                                      api_retries=o.api_retries, timeout=o.timeout_s, include_summary=include_summary)
        with ThreadPoolExecutor(max_workers=s.openai.workers) as pool:
            results = list(pool.map(analyzer.analyze, prompts))
    return [{"task": ep.task, "outcome": o, "return": ep.ret, "won": ep.won, "turns": len(ep.turns), "prompt": p,
             "response": analysis_target(r.summary, r.skill, include_summary=include_summary) if r.ok else None,
             "ok": r.ok, "error": r.error, "skill": r.skill, "analyzer": s.analyzer,
             "images": observation_images(ep.seen)}
            for ep, o, p, r in zip(played, outcomes, prompts, results, strict=True)]


# -- 3. response-only SFT --------------------------------------------------------------------------


def load_replay(s: SkillSFTSettings) -> list[Example]:
    """The ``replay_data`` pairs (``replay_examples`` of them when set); checked before any model loads."""
    if s.replay_data is None:
        return []
    path = Path(s.replay_data)
    if not path.is_file():
        raise ConfigError(f"sft.replay_data: no file {path}")
    try:
        pairs = read_jsonl(path, "sft.replay_data", ("prompt", "response"))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if s.replay_examples is not None and s.replay_examples < len(pairs):
        pairs = random.Random(s.data_seed).sample(pairs, s.replay_examples)
    return [row_example(pair, path.parent) for pair in pairs]


def to_examples(records: list[dict]) -> list[Example]:
    """``{prompt, response[, images]}`` records as examples of tether's SFT loop (the analyzer prompt is a user
    message, with the episode's frames when it has image slots)."""
    return [Example(r["prompt"], r["response"], images=tuple(r.get("images", ()))) for r in records]


def parse_rate(model: Any, tokenizer: Any, records: list[dict], *, max_new_tokens: int, context_length: int,
               include_summary: bool = True, bf16_autocast: bool = False) -> tuple[float, list[Analysis]]:
    """Fraction of ``records`` whose prompt the model answers (greedily) with a parseable, non-empty skill."""
    if not records:
        return math.nan, []
    prompts = [encode_message(tokenizer, r["prompt"], r.get("images", ())) for r in records]
    # left truncation, as at stage 2; never through a visual prompt's image tokens
    prompts = [p if has_images([p]) else p[-context_length:] for p in prompts]
    engine = HFEngine(model, tokenizer, bf16_autocast=bf16_autocast)
    gen = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, greedy=True))
    results = [parse_analysis(t, include_summary=include_summary) for t in gen.texts]
    return sum(r.ok for r in results) / len(results), results


# -- 4. the pipeline -------------------------------------------------------------------------------


def rollout_and_label(cfg: SeedSFTRunConfig, run_dir: Path, policy: Any, tokenizer: Any, *, analyzer: Any = None,
                      engine: Any = None) -> None:
    """Steps 1-3 of a fresh run: roll out, label, split; the records and the train and val pairs go to
    ``run_dir/data``, which the SFT reads (fresh or resumed)."""
    seed, s = method_config("seed", cfg.methods.get("seed", {})), cfg.sft
    episodes = rollout_episodes(cfg.rl_config(), policy, tokenizer, s, engine)
    records = label_episodes(episodes, cfg.env.name, s, threshold=seed.success_threshold,
                             include_summary=seed.include_summary, analyzer=analyzer)
    # the frames are saved once, with the train and val pairs below; a record counts them
    write_jsonl(run_dir / "data" / "records.jsonl", [{**r, "images": len(r["images"])} for r in records])
    # int(n x val_fraction) records held out, as SEED's code cuts them (tether sft rounds to the nearest)
    kept = [r for r in records if r["ok"]]
    train_records, val_records = split_train_val(kept, s.val_fraction, s.data_seed, rounding="floor")
    for name, part in (("train", train_records), ("val", val_records)):
        write_examples(run_dir / "data" / f"{name}.jsonl", to_examples(part))
    if not train_records:
        raise RuntimeError(f"no parseable analyzer record among {len(records)} trajectories; see "
                           f"{run_dir / 'data' / 'records.jsonl'}")


def run_skill_sft(config: str | Path | SeedSFTRunConfig, overrides: list[str] | None = None, *, policy: Any = None,
                  tokenizer: Any = None, analyzer: Any = None, engine: Any = None) -> dict[str, Any]:
    """Stage 1 end to end: rollouts, labels, split, SFT, ``run_dir/checkpoint``.

    A stopped run resumes as ``tether sft`` does (:mod:`tether.recipes.sft_state`, ``train.resume``): from
    ``run_dir/sft_state``, on the records and pairs the run wrote (no rollout again), with the parse rate before SFT
    and the rollout time it measured; a finished run is left as it is.

    Args:
        config: a config path (with ``overrides``) or a loaded :class:`~tether.config.SeedSFTRunConfig`; its
            ``model`` is the base policy, ``run_dir`` the output directory, ``sft`` the settings, ``methods.seed``
            the analyzer prompt's options.
        overrides: dotted ``key=value`` overrides for a config path.
        policy, tokenizer: use these instead of loading ``model.name`` (tests).
        analyzer: an ``analyze(prompt) -> Analysis`` object for ``sft.analyzer: openai`` (tests).
        engine: roll out with this engine instead of the policy's own (tests).

    Returns:
        The summary also written to ``run_dir/sft_summary.json``: counts (trajectories, successes, kept,
        train/val examples, dropped), losses, parse rates before/after, the checkpoint path, the seconds of the
        rollouts (``rollout_s``) and of the whole run (``wall_s``, :meth:`~tether.recipes.sft.SFTSession.train`).

    Files in ``run_dir``: ``config.yaml``, ``data/records.jsonl`` (every labelled trajectory; ``images`` counts its
    frames), ``data/train.jsonl`` / ``data/val.jsonl`` (prompt, response, and on a visual env ``images``: the frames
    under ``data/frames/``), ``metrics.jsonl`` (``sft/*``), ``sft_state/`` while the SFT runs, ``checkpoint/``,
    ``summary.json`` (the tracker's copy of the summary); the steps besides the rollouts and labels are ``tether
    sft``'s (:class:`~tether.recipes.sft.SFTSession`)."""
    cfg = config if not isinstance(config, (str, Path)) else load_command_config("seed-sft", config, overrides or [])
    seed = method_config("seed", cfg.methods.get("seed", {}))
    s = cfg.sft
    session = SFTSession(cfg, policy=policy, tokenizer=tokenizer)
    replay = load_replay(s)  # a bad replay file stops the run before its directory is written, as a bad config does
    if (finished := session.open()) is not None:
        return finished
    session.load_policy()  # before the rollouts encode a prompt: stage 1 trains on the prompts stage 2 gives
    start = time.perf_counter()
    if session.fresh:
        rollout_and_label(cfg, session.run_dir, session.policy, session.tokenizer, analyzer=analyzer, engine=engine)
    t_rollout = time.perf_counter() - start
    train_ex, val_ex = written_examples(session.run_dir)
    # the analyzer prompts stage 2 gives the policy: left-truncated to analysis_context_length (replay is shorter)
    data = session.encode(train_ex + replay, val_ex, seed.analysis_context_length)
    probe = [{"prompt": e.prompt, "images": e.images} for e in (val_ex or train_ex)[:s.eval_examples]]
    rate_kwargs = dict(max_new_tokens=seed.analysis_max_new_tokens, context_length=seed.analysis_context_length,
                       include_summary=seed.include_summary, bf16_autocast=cfg.model.bf16_autocast)
    state = session.state
    if session.fresh:  # measured once, on the base policy; a resume keeps the numbers (train_sft restores them)
        before = parse_rate(session.policy, session.tokenizer, probe, **rate_kwargs)[0] if s.eval_examples \
            else math.nan
        state.extra = {"parse_rate_before": before, "rollout_s": t_rollout}

    def summarize(losses: dict[str, float]) -> dict[str, Any]:
        after, answers = parse_rate(session.policy, session.tokenizer, probe, **rate_kwargs) if s.eval_examples \
            else (math.nan, [])
        records = read_jsonl(session.run_dir / "data" / "records.jsonl", "data/records.jsonl")
        return {
            "trajectories": len(records), "successes": sum(r["outcome"] == "success" for r in records),
            "kept": sum(r["ok"] for r in records), "train_examples": len(data.train),
            "replay_examples": len(replay), "val_examples": len(data.val), "dropped_too_long": data.dropped,
            "parse_rate_before": state.extra["parse_rate_before"], "parse_rate_after": after,
            "probe_examples": len(probe), **losses, "rollout_s": state.extra["rollout_s"],
            "example_answers_after": [a.raw for a in answers[:3]],
        }

    return session.train(data, summarize)
