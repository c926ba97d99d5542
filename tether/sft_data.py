"""The examples of the SFT loop (:mod:`tether.recipes.sft`): where they come from, how they are written and encoded.

Warm starts before RL come from four kinds of data, chosen by ``sft.data``:

* ``task``: a task's demonstrations. A task with an ``sft`` split and a ``demonstration(item)`` method (the
  lab's :class:`~tether.tasks.addition.AdditionTask`) gives its own; any other task (reasoning-gym) gives
  questions outside all its splits (report included), answered by ``sft.response`` with ``{answer}`` filled in
  (the first accepted answer of a list gold: :func:`demonstration_answer`).
* ``jsonl``: ``{"prompt", "response"}`` lines of ``sft.path`` (optionally ``"system"``, and ``"images"``: PNG paths
  relative to the file, one per ``<image>`` placeholder of the prompt), e.g. replayed pairs.
* ``solver``: an agent environment's scripted solver, played on training seeds; every state becomes the
  agent loop's own prompt and the response ``<action>{solver action}</action>``.
* ``rejection``: another model's (``sft.sampler``) correct samples on the task's train split (rejection-sampling
  fine-tuning: the distillation a user tries before RL with a prior), judged by the task with its ``task.rewards``.

An example may carry images (:attr:`Example.images`, SEED's stage 1 on visual envs): its prompt is encoded by the
model's processor with them (:func:`tether.models.vision.encode_vision_chat`), once, when the examples are
encoded, and every forward pass takes the same pixels.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tether.tasks.base import TaskItem, prompt_text

if TYPE_CHECKING:
    from tether.config import SFTConfig, SFTRunConfig

# reasoning-gym item i of seed s comes from Random(s + i): a seed this far from the task's (and from its val
# seed, 2**30 away) draws other questions; any that still repeat one of the splits are dropped.
SFT_SEED_OFFSET = 2**29


@dataclass(frozen=True)
class Example:
    """One demonstration: a user prompt (chat-templated at encoding), an optional system message, a response, and
    the PIL images of the prompt's ``<image>`` placeholders, in order (none for a text prompt)."""

    prompt: str
    response: str
    system: str | None = None
    images: tuple[Any, ...] = ()


def prompt_key(example: Example) -> tuple[str | None, str, tuple[bytes, ...]]:
    """What the model is shown of ``example``: its system message, prompt and images (pixels, as two frames with
    one text differ)."""
    return example.system, prompt_text(example.prompt), tuple(image.tobytes() for image in example.images)


def task_examples(cfg: SFTRunConfig, s: SFTConfig) -> list[Example]:
    """Demonstrations of ``cfg.task`` (module docstring), never from any of its splits (train, val, report)."""
    from tether.tasks import make_task

    task = make_task(cfg.task.name, **cfg.task.kwargs)
    refuse_images(task, s)
    system = task.system_prompt
    if hasattr(task, "demonstration") and getattr(task, "splits", {}).get("sft"):
        items = task.sft_items(s.examples) if hasattr(task, "sft_items") else task.splits["sft"][: s.examples]
        return [Example(item.prompt, task.demonstration(item), system) for item in items]
    want = s.examples or 1000
    # every split: the report split is the endpoint's, and a demonstration of its question gives its answer away
    splits = getattr(task, "splits", None) or {"train": task.train, "val": task.val}
    taken = {prompt_text(item.prompt) for items in splits.values() for item in items}
    seed = cfg.task.kwargs.get("seed", 0) + SFT_SEED_OFFSET
    # Twice the questions asked for, so that dropping the ones the splits hold still leaves enough.
    pool = make_task(cfg.task.name, **{**cfg.task.kwargs, "seed": seed, "train_size": 2 * want}).train
    answered = [(item, demonstration_answer(task, item)) for item in pool if prompt_text(item.prompt) not in taken]
    items = [(item, answer) for item, answer in answered if answer is not None][:want]
    if len(items) < want:
        from tether.config import ConfigError

        raise ConfigError(f"sft.examples={want}: task {cfg.task.name!r} has only {len(items)} questions outside its "
                          "splits; lower sft.examples")
    return [Example(item.prompt, s.response.replace("{answer}", answer), system) for item, answer in items]


def refuse_images(task: Any, s: SFTConfig) -> None:
    """A task whose prompts carry images (a data set's ``image`` column) cannot be demonstrated yet: its examples
    would be the prompts' texts alone, without the images the task is about.

    Raises:
        ConfigError: naming where the images are.
    """
    images = getattr(task, "image_column", None)
    if images is not None:
        from tether.config import ConfigError

        raise ConfigError(f"sft.data={s.data}: the task's prompts carry images ({images}), which tether sft does not "
                          "take from a task yet (only sft.data: solver of a visual env, or tether seed-sft); train "
                          "on them with tether train")


def demonstration_answer(task: Any, item: TaskItem) -> str | None:
    """The answer a demonstration of ``item`` writes for ``{answer}``: the first accepted answer where the task keeps
    a set of them (``task.golds``: jsonl, dataset), since ``item.answer`` is a list gold's Python repr
    (``"['2', 'two']"``); else ``item.answer``. None when the item has no answer (an empty list has none)."""
    if item.answer is None or not hasattr(task, "golds"):
        return item.answer
    accepted = task.golds(item)
    return accepted[0] if accepted else None


def jsonl_examples(s: SFTConfig) -> list[Example]:
    """``{prompt, response[, system, images]}`` lines of ``s.path``; the first bad line is named."""
    from tether.config import ConfigError
    from tether.files import read_jsonl, relative_to_cwd

    path = Path(s.path or "")
    if not path.is_file():
        raise ConfigError(f"sft.path: no file {str(path)!r}{relative_to_cwd(path)}")
    try:
        rows = read_jsonl(path, "sft.path", ("prompt", "response"))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for number, row in enumerate(rows, 1):
        if not isinstance(row["prompt"], str) or not isinstance(row["response"], str):
            raise ConfigError(f"sft.path: {path} row {number}: 'prompt' and 'response' must be strings")
    out = [row_example(row, path.parent) for row in rows]
    if s.examples is not None and s.examples < len(out):
        out = random.Random(s.data_seed).sample(out, s.examples)
    return out


def solver_examples(cfg: SFTRunConfig, s: SFTConfig) -> list[Example]:
    """The env's scripted solver on the first ``s.examples`` (default 1000) training seeds, one example per state."""
    from tether.envs import make_env
    from tether.envs.base import observation_text
    from tether.rollout.multi_turn import Episode, build_prompt, prompt_images

    e = cfg.env
    rng = random.Random(s.data_seed)
    env = make_env(e.name, **e.kwargs)
    out: list[Example] = []
    try:
        for seed in env.train_seeds(s.examples or 1000):
            reset = env.reset(seed)
            episode = Episode(env=env, task=reset.task, group_id=0, episode_id=0, seed=seed,
                              observation=reset.observation, admissible=reset.admissible_actions)
            for _ in range(e.max_turns):
                plan = env.solution()
                if not plan:
                    break
                # the agent loop's prompt: a visual env's frames (history's, then the current one) go with it
                out.append(Example(build_prompt(episode, e.history, env.action_format), f"<action>{plan[0]}</action>",
                                   images=tuple(prompt_images(episode, e.history))))
                action = plan[0]
                if episode.admissible and rng.random() < s.explore:
                    action = rng.choice(episode.admissible)
                step = env.step(action)
                episode.seen.append(episode.observation)
                episode.turns.append({"observation": observation_text(episode.observation),
                                      "response": f"<action>{action}</action>", "action": action, "valid": True,
                                      "reward": step.reward})
                episode.observation = step.observation
                episode.admissible = step.info.get("admissible_actions", episode.admissible)
                if step.done:
                    break
    finally:
        env.close()
    return out


def rejection_examples(cfg: SFTRunConfig, s: SFTConfig, device: torch.device) -> list[Example]:
    """``s.samples_per_prompt`` samples of ``s.sampler`` per training prompt of ``cfg.task`` (sampled as ``rollout``
    says); the correct ones, judged by the task ``tether train`` builds: with ``task.rewards`` (and ``task.score``)
    applied, so a row without a gold answer under ``score: false`` is correct when its reward is positive, and a row
    a reward function faults on is wrong (:class:`~tether.rewards.RewardedTask`)."""
    from tether.engine.base import sampling_params
    from tether.engine.hf import HFEngine
    from tether.models import load_policy
    from tether.models.policy import model_load_errors
    from tether.rewards import build_config_task
    from tether.rollout.single_turn import SingleTurnCollector

    rl = cfg.rl_config()
    task = build_config_task(rl)
    refuse_images(task, s)
    with model_load_errors("sft.sampler", s.sampler):
        sampler, tokenizer = load_policy(s.sampler)
    collector = SingleTurnCollector(task, tokenizer, rl)
    engine = HFEngine(sampler.to(device), tokenizer, bf16_autocast=cfg.model.bf16_autocast,
                      logprob_chunk_tokens=cfg.train.logprob_chunk_tokens)
    items = task.train[: s.examples] if s.examples else task.train
    batch = collector.generate(engine, items, s.samples_per_prompt, sampling_params(rl.rollout), seed=s.data_seed)
    kept = [(item, text) for item, text, ok in zip(batch.info["item"], batch.info["text"], batch.correct.tolist(),
                                                   strict=True) if ok]
    if not kept:
        from tether.config import ConfigError

        raise ConfigError(f"sft.data=rejection: {s.sampler} answered none of {len(batch.info['text'])} samples "
                          "correctly")
    return [Example(item.prompt, text, task.system_prompt) for item, text in kept]


def sft_examples(cfg: SFTRunConfig, device: torch.device | None = None) -> list[Example]:
    """The examples ``cfg.sft.data`` names (checked before any model loads)."""
    from tether.config import ConfigError

    s = cfg.sft
    if s.data == "jsonl":
        return jsonl_examples(s)
    if s.data == "rejection":
        if cfg.task is None:
            raise ConfigError("sft.data=rejection samples a task's train prompts: the config needs task: ...")
        return rejection_examples(cfg, s, device or torch.device("cpu"))
    if s.data == "solver":
        if cfg.env is None:
            raise ConfigError("sft.data=solver plays an environment's solver: the config needs env: ...")
        return solver_examples(cfg, s)
    if cfg.task is None:
        raise ConfigError("sft.data=task needs task: ... (use data=solver for an env)")
    return task_examples(cfg, s)


def row_example(row: dict[str, Any], root: Path) -> Example:
    """The example of a ``{prompt, response[, system, images]}`` row; ``images`` are PNG paths under ``root``."""
    images = []
    for name in row.get("images", ()):
        from PIL import Image  # here: text rows need no Pillow

        with Image.open(root / name) as image:
            images.append(image.convert("RGB"))
    return Example(row["prompt"], row["response"], row.get("system"), tuple(images))


def write_examples(path: Path, examples: list[Example]) -> None:
    """``{prompt, response[, system, images]}`` lines: what ``sft.data=jsonl`` (and SEED's ``replay_data``) read.

    Images go to ``frames/`` beside the file as PNGs (lossless: they read back pixel for pixel), and a row
    lists their paths relative to the file's folder.
    """
    from tether.files import write_jsonl

    rows = []
    for i, e in enumerate(examples):
        row: dict[str, Any] = {"prompt": e.prompt, "response": e.response, **({"system": e.system} if e.system else {})}
        if e.images:
            (path.parent / "frames").mkdir(parents=True, exist_ok=True)
            row["images"] = [f"frames/{path.stem}-{i}-{k}.png" for k in range(len(e.images))]
            for name, image in zip(row["images"], e.images, strict=True):
                image.save(path.parent / name)
        rows.append(row)
    write_jsonl(path, rows)


def encode_examples(examples: list[Example], tokenizer: Any, max_length: int,
                    prompt_tokens: int | None = None) -> tuple[list[tuple[list[int], list[int]]], int]:
    """(chat-templated prompt ids, response ids + EOS) per example; drops those over ``max_length``.

    ``prompt_tokens`` keeps only the last that many ids of a text prompt (left truncation, as SEED's stage 2 cuts
    its analyzer prompts, so stage 1 trains on the prompts the analyzer will see); a prompt with images is never
    cut.

    ``tokenizer`` may be a vision-language model's processor: an example with images then gets a
    :class:`~tether.models.vision.VisionPrompt`, its ids with the processed pixels.

    Raises:
        ValueError: an example has images and ``tokenizer`` is a text tokenizer, or images and a system message.
    """
    from tether.models.vision import text_tokenizer

    text = text_tokenizer(tokenizer)
    out, dropped = [], 0
    for ex in examples:
        prompt = encode_prompt(tokenizer, ex)
        if prompt_tokens is not None and not ex.images:
            prompt = prompt[-prompt_tokens:]
        response = [*text(ex.response, add_special_tokens=False).input_ids, text.eos_token_id]
        if len(prompt) + len(response) > max_length:
            dropped += 1
            continue
        out.append((prompt, response))
    return out, dropped


def encode_prompt(tokenizer: Any, ex: Example) -> list[int]:
    """The chat-templated prompt of ``ex``: with its images through the processor, else as text."""
    from tether.models import encode_chat
    from tether.models.vision import encode_vision_chat, is_processor

    if not ex.images:
        return encode_chat(tokenizer, ex.prompt, system=ex.system)
    if not is_processor(tokenizer):
        raise ValueError("an SFT example carries images, but the model came with a text tokenizer: use a "
                         "vision-language model (its processor encodes the images)")
    if ex.system is not None:
        raise ValueError("an SFT example with images takes no system message (its prompt is one user message)")
    return encode_vision_chat(tokenizer, ex.prompt, ex.images)
