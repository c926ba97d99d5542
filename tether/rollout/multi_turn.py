"""The multi-turn agent loop: one training row per turn, verl-agent style.

Per step, ``prompts_per_step`` tasks are drawn and each is cloned ``group_size`` times (same env
seed, so the clones face the same task and form one advantage group). Every turn, each live
episode gets a prompt built from the task, the last ``history`` (observation, action) pairs and
the current observation; all live episodes are sampled in one batch; the action is parsed from
the response, the environment steps, and the turn becomes a row. The episode's return is put on
every row of the episode, minus a penalty on rows whose action was invalid; the ``episode``
advantage estimator then normalises over all rows of a group.

Every row also carries the tags of GiGPO's step advantage (``algorithm.advantage: gigpo``): the observation it
acted on (``obs_key``) and the discounted env return from its turn on (``step_return``, :func:`discounted_returns`
with ``env.step_gamma``). The trainer makes the advantages from them (:mod:`tether.advantage_inputs`).

Environments run in processes of their own or in threads of this process (``env.isolation``), or in Ray actors
(``env.workers``, :mod:`tether.envs.workers`); the envs of a batch are reset and stepped with one pool call, so
env processes and actors step them in parallel. An environment that raises, hangs or ends its process (or a worker
that dies) ends its episode as failed, the fault is counted in ``env/faults`` and the step goes on. The first fault of
each phase and kind warns and is a row of ``run_dir/health/env_faults.jsonl`` (:data:`FAULT_LOG`, with its
traceback), and a step or validation with faults warns with their count. docs/agents.md has the whole picture.

Visual envs (observations that are :class:`~tether.envs.Observation`) are prompted the same way: the
observation's text, with an image placeholder where each image goes, and the prompt is encoded by the
vision-language model's processor (:func:`tether.models.vision.encode_vision_chat`), so the prompt's
images are those of the observations it shows (the history's, then the current one). docs/vision.md.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from tether.engine.base import SamplingParams, sampling_params
from tether.envs import (
    STATE_KEY,
    Observation,
    escape_placeholders,
    observation_key,
    observation_text,
)
from tether.envs.safe import RETRIED_FAULTS, EnvFault, FaultReport
from tether.envs.workers import make_env_pool, probe_env
from tether.errors import EnvFaultError
from tether.faults import FaultLog
from tether.files import append_jsonl
from tether.models.vision import encode_message, is_processor, observation_images
from tether.rollout.batch import RolloutBatch
from tether.rollout.chunks import generate_in_chunks
from tether.rollout.single_turn import PromptStream, validation_progress
from tether.track.progress import CountProgress

if TYPE_CHECKING:
    from tether.config import Config, EnvConfig
    from tether.rollout.base import GenerationHooks
    from tether.seeding import StepSeeds

FAULT_LOG = Path("health") / "env_faults.jsonl"  # in the run directory: the first fault of each phase and kind


@dataclass
class Episode:
    env: Any  # None once the episode is over (run_episodes closed it)
    task: str
    group_id: int
    episode_id: int
    seed: int
    observation: str | Observation
    admissible: list[str] | None
    turns: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    won: bool = False
    ret: float = 0.0
    fault: str | None = None
    fault_phase: str | None = None  # the call that faulted (FaultReport.phase): constructor, reset, parse_action, step
    available: list[str] | None = None  # page actions of open action spaces (WebShop), for the prompt
    seen: list[str | Observation] = field(default_factory=list)  # each turn's observation, images included
    hazards: dict[str, bool] = field(default_factory=dict)  # the ``fell_*`` flags of the env's last step info
    infos: list[dict[str, Any]] = field(default_factory=list)  # the env's info with each observation: reset, steps


def all_fail_share(episodes: list[Episode], group_size: int) -> float:
    """The share of task groups (``group_size`` consecutive episodes) in which no episode won."""
    groups = [episodes[k:k + group_size] for k in range(0, len(episodes), group_size)]
    return sum(not any(e.won for e in g) for g in groups) / max(len(groups), 1)


def hazard_deaths(episodes: list[Episode], prefix: str) -> dict[str, float]:
    """``{prefix}/hazard_death_frac``: the share of episodes a hazard ended (any ``fell_*`` flag of the env's
    last step info: FrozenLake's holes, thin ice), and ``{prefix}/<flag>_frac`` for every flag the env reports.
    Envs without such flags report a hazard-death share of 0."""
    n = max(len(episodes), 1)
    flags = sorted({k for e in episodes for k in e.hazards})
    out = {f"{prefix}/hazard_death_frac": sum(any(e.hazards.values()) for e in episodes) / n}
    for flag in flags:
        out[f"{prefix}/{flag}_frac"] = sum(e.hazards.get(flag, False) for e in episodes) / n
    return out


def build_prompt(ep: Episode, history: int, action_format: str) -> str:
    """The per-turn user message: task, recent history, current observation, admissible actions, format.

    Envs with an open action space (``admissible_actions`` None) may list the current page's actions
    in ``info["available_actions"]`` (WebShop); they are shown as "Available actions".
    """
    parts = [f"Your task is to: {ep.task}"]
    recent = ep.turns[-history:] if history else []
    if recent:
        start = len(ep.turns) - len(recent) + 1
        # the action is model text: escaped, so the prompt's image placeholders are exactly its images
        lines = [f"[Observation {start + i}: {t['observation']}]\n"
                 f"[Action {start + i}: {escape_placeholders(t['action'])}]" for i, t in enumerate(recent)]
        parts.append(f"Your last {len(recent)} steps:\n" + "\n".join(lines))
    parts.append(f"Current observation (step {len(ep.turns) + 1}):\n{observation_text(ep.observation)}")
    if ep.admissible:
        parts.append("Admissible actions: " + ", ".join(f"'{a}'" for a in ep.admissible))
    elif ep.available:
        parts.append("Available actions: " + ", ".join(f"'{a}'" for a in ep.available))
    parts.append(action_format)
    return "\n\n".join(parts)


def prompt_images(ep: Episode, history: int) -> list[Any]:
    """The images of :func:`build_prompt`'s message, in order: the shown history's, then the current one's."""
    return observation_images([*(ep.seen[-history:] if history else []), ep.observation])


def state_key(ep: Episode, turn: int) -> str:
    """GiGPO's anchor state of ``ep``'s row ``turn``: the key of the observation it acted on, or the env's
    :data:`~tether.envs.STATE_KEY` where that observation added a note to the state (an invalid action's).
    ``ep.infos[turn]`` came with ``ep.seen[turn]`` (the reset's info, then each step's)."""
    return ep.infos[turn].get(STATE_KEY) or observation_key(ep.seen[turn])


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_t = r_t + gamma * G_{t+1}`` over one episode's per-turn env rewards (GiGPO Eq. 5).

    >>> discounted_returns([0.0, 0.0, 1.0], 0.5)
    [0.25, 0.5, 1.0]
    """
    out, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


class AgentCollector:
    """Collects multi-turn episodes of ``cfg.env`` with the trainer's engine; validates by success rate."""

    # the per-row tags of tether.algos.AdvantageInputs its batches carry (info "step_return" and "obs_key")
    advantage_tags: ClassVar[frozenset[str]] = frozenset({"step_returns", "obs_keys"})

    def __init__(self, cfg: Config, tokenizer: Any) -> None:
        if cfg.env is None:
            raise ValueError("AgentCollector needs cfg.env")
        self.cfg, self.env_cfg, self.tokenizer = cfg, cfg.env, tokenizer
        # the first env, built at start under the reset limit: one that hangs stops the run with a message
        self.envs = make_env_pool(cfg.env)
        try:
            probe = probe_env(cfg.env, self.envs)
        except EnvFault as fault:
            raise EnvFaultError(f"env {cfg.env.name} (constructor): {fault}; no episode can start") from None
        if probe.renders_images and not is_processor(tokenizer):
            raise ValueError(f"env {cfg.env.name!r} observes images, but the policy {cfg.model.name!r} came with a "
                             "text tokenizer, not a vision-language processor: use a vision-language model, or "
                             "env.kwargs.observation: text")
        self.train_seeds, self.val_seeds, self.action_format = probe.train_seeds, probe.val_seeds, probe.action_format
        self.stream = PromptStream(len(self.train_seeds), cfg.seed)
        self._next_group = 0
        self._next_episode = 0
        self.faults = 0
        self.fault_log = FaultLog(Path(cfg.run_dir) / FAULT_LOG)

    @classmethod
    def from_config(cls, cfg: Config, tokenizer: Any) -> AgentCollector:
        """The agent loop of ``cfg.env`` (the constructor itself: the env section is all it needs)."""
        return cls(cfg, tokenizer)

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.stream.state_dict(), "next_group": self._next_group,
                "next_episode": self._next_episode, "faults": self.faults}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state["stream"])
        self._next_group, self._next_episode, self.faults = (state["next_group"], state["next_episode"],
                                                             state["faults"])

    # -- episodes ----------------------------------------------------------------------------

    def start_episodes(self, seeds: list[int], copies: int) -> list[Episode]:
        """``copies`` episodes of each seed (one group per seed), their envs made and reset in one pool call."""
        starts = [(seed, self._next_group + g) for g, seed in enumerate(seeds) for _ in range(copies)]
        self._next_group += len(seeds)
        envs = [self.envs.make() for _ in starts]
        episodes = []
        for env, (seed, gid), reset in zip(envs, starts, self.envs.reset_all(envs, [s for s, _ in starts]),
                                           strict=True):
            ep = Episode(env=env, task=reset.task, group_id=gid, episode_id=self._next_episode, seed=seed,
                         observation=reset.observation, admissible=reset.admissible_actions,
                         available=reset.info.get("available_actions"), infos=[reset.info])
            self._next_episode += 1
            for report in reset.info.get(RETRIED_FAULTS, ()):  # tries before the one that ended the reset
                self._count_fault(ep, None, report, ended=False)
            if reset.info.get("fault"):
                ep.done = True
                self._fault(ep, None, reset.info)
            episodes.append(ep)
        return episodes

    def run_episodes(self, engine: Any, episodes: list[Episode], params: SamplingParams, seed: int,
                     intervention: Any = None,
                     on_turn: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
        """Play every episode to the end (or max_turns); return one dict per active turn. ``on_turn(done, total)``
        hears the episodes finished after each generation chunk's steps, and all of them at the end."""
        rows: list[dict[str, Any]] = []
        try:
            for turn in range(self.env_cfg.max_turns):
                live = [ep for ep in episodes if not ep.done]
                if not live:
                    break
                for _, chunk, prompts, gen in generate_in_chunks(engine, live, self.encode, params, (seed, turn),
                                                                 intervention):
                    gen = gen.to("cpu")  # rows are cut from it one by one, and the batch is built on the CPU
                    # parse (against admissible actions) and step every env of the chunk in one pool call
                    outcomes = self.envs.act_all([ep.env for ep in chunk], gen.texts)
                    for j, (ep, outcome) in enumerate(zip(chunk, outcomes, strict=True)):
                        rows.append(self._record(ep, turn, prompts[j], gen, j, outcome))
                    if on_turn is not None:
                        on_turn(sum(ep.done for ep in episodes), len(episodes))
            if on_turn is not None:  # the episodes max_turns ended are finished too
                on_turn(len(episodes), len(episodes))
        finally:
            self.close_episodes(episodes)
        return rows

    def close_episodes(self, episodes: list[Episode]) -> None:
        """Close each episode's env; a finished episode keeps none: its batch may be pickled (a checkpoint of
        rollout.max_staleness's batches in flight), and a process env's pool holds a lock."""
        self.envs.close_all([ep.env for ep in episodes if ep.env is not None])
        for ep in episodes:
            ep.env = None

    def encode(self, ep: Episode) -> list[int]:
        """The token ids of the episode's next prompt (a :class:`~tether.models.vision.VisionPrompt` with images)."""
        text = build_prompt(ep, self.env_cfg.history, self.action_format)
        return encode_message(self.tokenizer, text, prompt_images(ep, self.env_cfg.history))

    def _record(self, ep: Episode, turn: int, prompt: list[int], gen: Any, j: int,
                outcome: tuple[str, bool, Any]) -> dict[str, Any]:
        """Apply one env step to its episode; the turn's training row."""
        text = gen.texts[j]
        action, valid, step = outcome
        # a faulted step judged nothing (a dead worker answers ("", False)): the env's fault is not an invalid action
        valid = valid or bool(step.info.get("fault"))
        ep.seen.append(ep.observation)
        ep.turns.append({"observation": observation_text(ep.observation), "response": text, "action": action,
                         "valid": valid, "reward": step.reward})
        ep.observation, ep.ret = step.observation, ep.ret + step.reward
        ep.infos.append(step.info)
        ep.admissible = step.info.get("admissible_actions", ep.admissible)
        ep.available = step.info.get("available_actions", ep.available)
        ep.done, ep.won = step.done, bool(step.info.get("won", False))
        ep.hazards = {k: bool(v) for k, v in step.info.items() if k.startswith("fell_")}
        if step.info.get("fault"):
            self._fault(ep, turn, step.info)
        n = int(gen.response_mask[j].sum())
        return {"episode": ep, "turn": turn, "prompt_ids": prompt, "response_ids": gen.response_ids[j, :n],
                "sample_log_probs": gen.sample_log_probs[j, :n],
                "token": {k: v[j, :n] for k, v in gen.token.items()}, "valid": valid, "text": text,
                "truncated": bool(gen.truncated[j])}

    def _fault(self, ep: Episode, turn: int | None, info: dict[str, Any]) -> None:
        """Record the fault that ended an episode, and count it (:meth:`_count_fault`)."""
        report = info.get("fault_report") or FaultReport(info["fault"], "step" if turn is not None else "reset",
                                                         "error")  # an env's own info["fault"]: no report
        ep.fault, ep.fault_phase = info["fault"], report.phase
        self._count_fault(ep, turn, report, ended=True)

    def _count_fault(self, ep: Episode, turn: int | None, report: FaultReport, *, ended: bool) -> None:
        """Count a fault of the episode's env (one that ``ended`` it, or a reset's try that a later try
        outlived); the first of its phase and kind warns and is a row of :data:`FAULT_LOG`."""
        self.faults += 1
        name = self.env_cfg.name
        row = {"env": name, "phase": report.phase, "kind": report.kind, "seed": ep.seed, "turn": turn,
               "episode": ep.episode_id, "error": report.message, "traceback": report.traceback}
        at = f"seed {ep.seed}" + ("" if turn is None else f", turn {turn}")
        then = "the episode ends as failed" if ended else "it was tried again with a fresh env (env.reset_retries)"
        self.fault_log.first((report.phase, report.kind), row,
                             f"env {name} faulted in {report.phase} ({at}): {report.message}; {then} and counts in "
                             f"env/faults (later {report.phase} faults of this kind are only counted); the run goes "
                             "on")

    def _warn_faults(self, before: int, episodes: int, when: str, metric: str) -> None:
        """One warning line for a step's (or a validation's) faults, when it had any."""
        if self.faults > before:
            warnings.warn(f"{when}: {self.faults - before} env faults in {episodes} episodes ({metric}; the first of "
                          f"each kind in {Path(self.cfg.run_dir) / FAULT_LOG})", stacklevel=3)

    def to_batch(self, rows: list[dict[str, Any]]) -> RolloutBatch:
        width = max(1, max(len(r["response_ids"]) for r in rows))
        n = len(rows)
        ids = torch.zeros(n, width, dtype=torch.long)
        mask = torch.zeros(n, width)
        logp = torch.zeros(n, width)
        token = {k: torch.zeros(n, width) for k in rows[0]["token"]}
        for i, r in enumerate(rows):
            k = len(r["response_ids"])
            ids[i, :k], mask[i, :k], logp[i, :k] = r["response_ids"], 1.0, r["sample_log_probs"]
            for key in token:
                token[key][i, :k] = r["token"][key]
        penalty = self.env_cfg.invalid_action_penalty
        eps = [r["episode"] for r in rows]
        returns = {id(e): discounted_returns([t["reward"] for t in e.turns], self.env_cfg.step_gamma) for e in eps}
        return RolloutBatch(
            prompt_ids=[r["prompt_ids"] for r in rows], response_ids=ids, response_mask=mask, sample_log_probs=logp,
            group_ids=torch.tensor([e.group_id for e in eps]),
            rewards=torch.tensor([e.ret - penalty * (not r["valid"]) for e, r in zip(eps, rows, strict=True)]),
            correct=torch.tensor([e.won for e in eps]), source=torch.zeros(n, dtype=torch.long), token=token,
            info={"episode_id": [e.episode_id for e in eps], "turn": [r["turn"] for r in rows],
                  "valid": [r["valid"] for r in rows], "text": [r["text"] for r in rows], "episode": eps,
                  # per turn: the engine cuts a turn at rollout.max_new_tokens, never an episode
                  "truncated": [r["truncated"] for r in rows],
                  "obs_key": [state_key(e, r["turn"]) for e, r in zip(eps, rows, strict=True)],
                  "step_return": [returns[id(e)][r["turn"]] for e, r in zip(eps, rows, strict=True)]},
        )

    # -- trainer interface ---------------------------------------------------------------------

    def collect(self, engine: Any, seeds: StepSeeds, hooks: GenerationHooks) -> tuple[RolloutBatch, dict[str, float]]:
        """``prompts_per_step`` training tasks, ``group_size`` episodes each, sampled from ``seeds("rollout")``."""
        r = self.cfg.rollout
        tasks = [self.train_seeds[i] for i in self.stream.take(r.prompts_per_step)]
        before = self.faults
        episodes = self.start_episodes(tasks, r.group_size)
        # a step of several turns per episode takes minutes (examples/my_environment: about 6 on 2 CPU cores), and
        # the step's own line comes only at its end
        # not from rollout.max_staleness's sampling thread: a display started there could outlive the run's own
        shown = self.cfg.logging.progress and threading.current_thread() is threading.main_thread()
        with CountProgress("rollout", len(episodes), "episodes", enabled=shown) as bar:
            rows = self.run_episodes(engine, episodes, sampling_params(r), seeds("rollout"),
                                     intervention=hooks.intervention(), on_turn=bar.update)
        self._warn_faults(before, len(episodes), f"step {seeds.step + 1}", f"env/faults={self.faults} so far")
        if not rows:
            raise no_episode_started(self.env_cfg, episodes, f"step {seeds.step + 1}")
        batch = self.to_batch(rows)
        batch, metrics = hooks.on_generation(batch)
        self.write_transcripts(seeds.step, episodes[::r.group_size])
        metrics.update({
            "env/success_rate": sum(e.won for e in episodes) / len(episodes),
            "env/episode_return": sum(e.ret for e in episodes) / len(episodes),
            "env/turns": sum(len(e.turns) for e in episodes) / len(episodes),
            "env/invalid_action_frac": 1.0 - sum(batch.info["valid"]) / len(batch),
            # groups where GRPO's advantage is zero for every row: SEED's distillation is their only signal
            "env/all_fail_group_frac": all_fail_share(episodes, r.group_size),
            **hazard_deaths(episodes, "env"),
            "env/faults": float(self.faults),
        })
        return batch, metrics

    def validate(self, engine: Any, seed: int) -> dict[str, float]:
        """Play each held-out seed ``val.samples`` times (once with ``val.greedy``): success rate, pass@k and more."""
        v = self.cfg.val
        seeds = self.val_seeds[: v.max_prompts] if v.max_prompts else self.val_seeds
        k = 1 if v.greedy else v.samples
        saved = self._next_group, self._next_episode  # validation must not shift training ids
        faults = self.faults
        episodes = self.start_episodes(seeds, k)
        if all(ep.fault for ep in episodes):
            self.close_episodes(episodes)  # a caller that catches the stop (a notebook, a sweep) keeps no open env
            raise no_episode_started(self.env_cfg, episodes, "validation")
        params = sampling_params(self.cfg.rollout, v)
        with validation_progress(self.cfg, len(episodes), "episodes") as bar:
            rows = self.run_episodes(engine, episodes, params, seed, on_turn=bar.update)
        self._warn_faults(faults, len(episodes), "validation", "val/faults")
        self._next_group, self._next_episode = saved
        n = len(episodes)
        won = torch.tensor([e.won for e in episodes], dtype=torch.float32).view(len(seeds), k)
        success = won.mean().item()
        return {"val/success_rate": success, "val/avg@k": success,
                "val/pass@k": (won.amax(1) > 0).float().mean().item(),
                "val/episode_return": sum(e.ret for e in episodes) / n,
                "val/turns": sum(len(e.turns) for e in episodes) / n,
                "val/invalid_action_frac": sum(not r["valid"] for r in rows) / max(1, len(rows)),
                "val/episodes": float(n), "val/faults": float(self.faults - faults), **hazard_deaths(episodes, "val")}

    def write_transcripts(self, step: int, episodes: list[Episode], limit: int = 4) -> None:
        """The first ``limit`` of ``episodes`` (one per group), sampled in step ``step + 1``, as JSON lines of
        ``run_dir/transcripts.jsonl``, for ``tether show``."""
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return  # one copy of the transcripts, as for single-turn samples
        run_dir = Path(self.cfg.run_dir)
        append_jsonl(run_dir / "transcripts.jsonl",
                     ({"step": step, "episode": ep.episode_id, "group": ep.group_id, "seed": ep.seed, "task": ep.task,
                       "won": ep.won, "return": ep.ret, "fault": ep.fault, "turns": save_frames(run_dir, ep, step),
                       **ep_extra(ep)} for ep in episodes[:limit]))


def no_episode_started(env: EnvConfig, episodes: list[Episode], when: str) -> EnvFaultError:
    """The stop when not one episode of a batch could start: the env, the phase (constructor or reset) and the
    first error, in one line."""
    first = next((ep for ep in episodes if ep.fault), None)
    if first is None:
        return EnvFaultError(f"env {env.name}, {when}: no episode produced a turn ({len(episodes)} started, none "
                             "faulted: every episode ended at its reset)")
    # the phase the env wrapper recorded (FaultReport.phase), not a guess from the message: an error's own text
    # may say "make()"
    return EnvFaultError(f"env {env.name} ({first.fault_phase}), {when}: none of {len(episodes)} episodes could "
                         f"start, each after env.reset_retries={env.reset_retries} retries; the first error: "
                         f"{first.fault}")


def save_frames(run_dir: Path, ep: Episode, step: int) -> list[dict[str, Any]]:
    """The episode's turns for the transcript; a visual observation's images are saved as PNGs under
    ``run_dir/frames`` and its turn lists them (paths relative to ``run_dir``) under ``frames``."""
    turns = []
    for t, (turn, obs) in enumerate(zip(ep.turns, ep.seen, strict=True)):
        if not isinstance(obs, Observation):
            turns.append(turn)
            continue
        paths = [f"frames/s{step}_e{ep.episode_id}_t{t}_{k}.png" for k in range(len(obs.images))]
        (run_dir / "frames").mkdir(exist_ok=True)
        for image, path in zip(obs.images, paths, strict=True):
            image.save(run_dir / path)
        turns.append({**turn, "frames": paths})
    return turns


def ep_extra(ep: Episode) -> dict[str, Any]:
    """Fields methods attach to an episode (SEED's skill), serialised with the transcript."""
    return {k: v for k, v in vars(ep).items() if k.startswith("x_")}
