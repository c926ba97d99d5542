"""Supervised warm start before RL: imitate an environment's solver, or a task's gold answers.

SEED and verl-agent start RL from an SFT checkpoint; this is the CPU-sized version, and it also gives
a model small enough for long single-turn studies on a CPU (docs/methods/armor.md). The pairs:

* an agent config (``env:``): for training seeds of the environment, the solver's trajectory is
  played out (with probability ``--explore`` a uniformly random admissible action is taken instead,
  so the data also covers states off the optimal path; the label is always the solver's action from
  the state actually reached). Every state becomes one pair

      prompt   = the agent loop's own prompt (tether.rollout.multi_turn.build_prompt, same history,
                 same chat template)
      response = "<action>{solver action}</action>" + EOS

* a single-turn config (``task:``, a task that takes ``seed`` and ``train_size``, e.g. reasoning_gym):
  ``--examples`` questions drawn with another seed, none of them in the config's train or val split,

      prompt   = the task's prompt (same template, same system prompt)
      response = --response with {answer} replaced by the gold answer, + EOS

The policy is fine-tuned with a response-only NLL loss. The result is a plain Hugging Face
directory: ``tether train CONFIG model.name=OUT`` continues from it with RL, ``tether eval OUT
--config CONFIG`` measures it.

Usage (docs/agents.md and docs/methods/armor.md have the measured runs):
    python scripts/sft_warm_start.py configs/agents/frozenlake_grpo.yaml --out runs/agents/sft_frozenlake \
        [--model smollm2-135m-instruct | --model tiny --hidden 128 --layers 4] [--episodes 1500] \
        [--steps 400] [--batch 32] [--lr 1e-3] [overrides such as env.history=0]
    python scripts/sft_warm_start.py configs/armor/tiny/stage1_dapo.yaml --out runs/armor_tiny/sft \
        --model tiny --examples 4000 --steps 1500
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from tether.config import Config, load_config
from tether.envs import make_env
from tether.models import encode_chat, load_policy, smollm2_tokenizer, tiny_model
from tether.models.forward import response_log_probs
from tether.rollout.multi_turn import Episode, build_prompt
from tether.tasks import make_task

# reasoning-gym item i of seed s comes from Random(s + i): a seed this far from the config's (and from
# its val seed, 2**30 away) draws other questions; any that still repeat one of the splits are dropped.
SFT_SEED_OFFSET = 2**29


def solver_pairs(cfg: Config, episodes: int, explore: float, seed: int) -> tuple[list[tuple[str, str]], dict]:
    """(prompt, response) pairs from solver trajectories on the first ``episodes`` training seeds."""
    e = cfg.env
    rng = random.Random(seed)
    env = make_env(e.name, **e.kwargs)
    pairs: list[tuple[str, str]] = []
    solved = 0
    try:
        for s in env.train_seeds(episodes):
            reset = env.reset(s)
            ep = Episode(env=env, task=reset.task, group_id=0, episode_id=0, seed=s,
                         observation=reset.observation, admissible=reset.admissible_actions)
            for _ in range(e.max_turns):
                plan = env.solution()
                if not plan:
                    break
                pairs.append((build_prompt(ep, e.history, env.action_format), f"<action>{plan[0]}</action>"))
                action = plan[0]
                if ep.admissible and rng.random() < explore:
                    action = rng.choice(ep.admissible)
                step = env.step(action)
                ep.turns.append({"observation": ep.observation, "response": f"<action>{action}</action>",
                                 "action": action, "valid": True, "reward": step.reward})
                ep.observation = step.observation
                ep.admissible = step.info.get("admissible_actions", ep.admissible)
                if step.done:
                    solved += int(step.info.get("won", False))
                    break
    finally:
        env.close()
    return pairs, {"episodes": episodes, "pairs": len(pairs), "episodes_won": solved}


def task_pairs(cfg: Config, examples: int, response: str) -> tuple[list[tuple[str, str]], dict]:
    """(prompt, response) pairs for ``examples`` task questions outside the config's train and val splits."""
    t = cfg.task
    task = make_task(t.name, **t.kwargs)
    taken = {item.prompt for item in [*task.train, *task.val]}
    seed = t.kwargs.get("seed", 0) + SFT_SEED_OFFSET
    # Twice the questions asked for, so that dropping the ones the splits hold still leaves enough.
    pool = make_task(t.name, **{**t.kwargs, "seed": seed, "train_size": 2 * examples}).train
    items = [item for item in pool if item.prompt not in taken and item.answer is not None][:examples]
    if len(items) < examples:
        raise SystemExit(f"only {len(items)} questions outside the train and val splits (asked for {examples}); "
                         "lower --examples")
    pairs = [(item.prompt, response.replace("{answer}", item.answer)) for item in items]
    return pairs, {"examples": examples, "pairs": len(pairs), "system_prompt": task.system_prompt}


def build_model(args: argparse.Namespace) -> tuple[Any, Any]:
    if args.model != "tiny":
        return load_policy(args.model)
    return tiny_model(seed=args.seed, tokenizer=smollm2_tokenizer(), hidden_size=args.hidden,
                      intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=max(1, args.hidden // 32), num_key_value_heads=max(1, args.hidden // 64),
                      initializer_range=0.02)


def encode(tok: Any, pairs: list[tuple[str, str]], system: str | None) -> list[tuple[list[int], list[int]]]:
    return [(encode_chat(tok, p, system=system), [*tok(r, add_special_tokens=False).input_ids, tok.eos_token_id])
            for p, r in pairs]


def batch_loss(model: Any, rows: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean NLL over response tokens only."""
    width = max(len(r) for _, r in rows)
    resp = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width)
    for i, (_, r) in enumerate(rows):
        resp[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1.0
    log_probs, _ = response_log_probs(model, [p for p, _ in rows], resp, mask)
    return -(log_probs * mask).sum() / mask.sum()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="an agent config (its env, history and template are used) or a single-turn "
                                   "config (its task)")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. env.history=0")
    ap.add_argument("--out", help="output directory (a Hugging Face model directory); not with --steps 0")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="model name/path, or 'tiny' (random init)")
    ap.add_argument("--hidden", type=int, default=128, help="tiny model: hidden size")
    ap.add_argument("--layers", type=int, default=4, help="tiny model: decoder layers")
    ap.add_argument("--episodes", type=int, default=1000, help="solver episodes (training seeds 0..N-1)")
    ap.add_argument("--explore", type=float, default=0.3, help="chance of a random action while collecting")
    ap.add_argument("--examples", type=int, default=4000, help="single-turn: questions to imitate")
    ap.add_argument("--response", default="{answer}", help="single-turn: the response, {answer} = gold answer")
    ap.add_argument("--steps", type=int, default=300, help="0: only write --pairs-out")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs-out", help="also write the (prompt, response) pairs here as JSONL, e.g. for SEED's "
                                        "methods.seed.sft.replay_data")
    args = ap.parse_args()
    if (args.steps == 0) != (args.out is None) or (args.steps == 0 and not args.pairs_out):
        ap.error("train with --steps N and --out DIR, or write only the pairs with --steps 0 and --pairs-out FILE")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.time()
    cfg = load_config(args.config, args.overrides)
    if cfg.env is not None:
        pairs, data = solver_pairs(cfg, args.episodes, args.explore, args.seed)
        data["system_prompt"] = None
    else:
        pairs, data = task_pairs(cfg, args.examples, args.response)
    if args.pairs_out:
        Path(args.pairs_out).write_text("".join(json.dumps({"prompt": p, "response": r}) + "\n" for p, r in pairs))
        print(f"{data['pairs']} pairs written to {args.pairs_out}", flush=True)
    if args.steps == 0:
        return
    model, tok = build_model(args)
    rows = encode(tok, pairs, data["system_prompt"])
    print(f"{data['pairs']} pairs; e.g.\n{pairs[0][0]}\n-> {pairs[0][1]}", flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    rng = random.Random(args.seed)
    model.train()
    losses = []
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / 20)  # short warm-up
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = batch_loss(model, rng.sample(rows, min(args.batch, len(rows))), tok.pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 20 == 0 or step == args.steps:
            print(f"step {step} loss {sum(losses[-20:]) / len(losses[-20:]):.4f} ({time.time() - start:.0f}s)",
                  flush=True)
    model.eval()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    summary = {"config": args.config, "overrides": args.overrides, **vars(args), **data,
               "params": sum(p.numel() for p in model.parameters()), "final_loss": losses[-1],
               "loss_curve": losses[::10], "wall_s": round(time.time() - start, 1)}
    (out / "sft.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "loss_curve"}), flush=True)


if __name__ == "__main__":
    main()
