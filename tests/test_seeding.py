"""Sampling seeds (tether/seeding.py): every engine call of a run gets its own seed, wherever the tuple lands."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.rollout.helpers import ScriptedEngine, seed_sft_config
from tests.trainer.helpers import tiny_config
from tether.engine.base import sampling_params
from tether.engine.hf import HFEngine
from tether.recipes.seed_sft import rollout_episodes
from tether.rollout import chunks
from tether.rollout.chunks import GENERATE_ROWS
from tether.seeding import SEED_BITS, derive_seed, rank_seed, step_seed
from tether.trainer.build import build_collector


def agent_call_seeds(run_seed: int, steps: int, rows: int, turns: int, val_rows: int) -> list[int]:
    """The engine seeds of an agent run as AgentCollector hands them out: per step, every turn's chunks of the
    rollout; every 5th step, validation's."""
    seeds = []
    for step in range(steps):
        for purpose, n in (("rollout", rows), ("val", val_rows if step % 5 == 0 else 0)):
            base = step_seed(run_seed, step, purpose)
            seeds += [derive_seed(base, turn, start) for turn in range(turns) for start in range(0, n, GENERATE_ROWS)]
    return seeds


def dapo_call_seeds(run_seed: int, steps: int, rows: int, gen_batches: int) -> list[int]:
    """The engine seeds of a single-turn run with refills: every generation batch's chunks, ARMOR's reference
    samples of each batch, EAPO's injection generators (one per engine call) and validation every 10th step."""
    seeds = []
    for step in range(steps):
        for k in range(gen_batches):
            for purpose in ("rollout", "armor/ref", "eapo"):
                base = step_seed(run_seed, step, purpose, k)
                seeds += [derive_seed(base, c if purpose == "eapo" else start)
                          for c, start in enumerate(range(0, rows, GENERATE_ROWS))]
        if step % 10 == 0:
            base = step_seed(run_seed, step, "val")
            seeds += [derive_seed(base, start) for start in range(0, 30 * 16, GENERATE_ROWS)]
    return seeds


def test_every_engine_call_of_a_run_gets_its_own_seed_in_the_engines_range():
    # FrozenLake GiGPO (16 prompts x 8, 10 turns, 32 x 8 validation) and DAPO (128 x 16, 4 generation batches),
    # 200 steps each, run seeds 0-2 pooled: replicate runs of a study share no seed either
    seeds = [s for run in range(3) for s in (*agent_call_seeds(run, 200, 16 * 8, 10, 32 * 8),
                                              *dapo_call_seeds(run, 200, 128 * 16, 4))]
    assert len(seeds) == 3 * (200 * 10 * 2 + 40 * 10 * 4 + 200 * 4 * 3 * 32 + 20 * 8) == 247_680
    assert len(set(seeds)) == len(seeds)
    assert min(seeds) >= 0 and max(seeds) < 2**SEED_BITS
    assert max(seeds) > 2**(SEED_BITS - 1)  # the whole range is used, not a block near 0
    torch.Generator().manual_seed(max(seeds))  # the HF engine's generator takes it


def test_the_old_linear_offsets_collisions_now_differ():
    # seed + turn * 1009 + start: turn t + 1's first chunk and turn t's chunk at row 1009
    assert derive_seed(7, 1, 0) != derive_seed(7, 0, 1009)
    # seed-sft's batches (k: the first task) + row offset: k=0 rows 64-127 and k=64 rows 0-63 had seed 64
    assert derive_seed(step_seed(0, 0, "", 0), 0, 64) != derive_seed(step_seed(0, 0, "", 64), 0, 0)
    # refills: generation batch 0's second chunk and batch 64's first had seed_for("rollout", 0) + 64
    assert derive_seed(step_seed(0, 3, "rollout", 0), 64) != derive_seed(step_seed(0, 3, "rollout", 64), 0)
    # the parts' types count: (1, 2) and ("1", 2) are different tuples
    assert derive_seed(1, 2) != derive_seed("1", 2)


def test_a_ranks_seed_is_a_hash_of_the_calls_seed_and_the_rank():
    # seed + rank * 1_000_000_007: rank 1 of the call seeded s had the seed of rank 0 of the call seeded s + that
    s = step_seed(0, 3, "rollout")
    assert rank_seed(s + 1_000_000_007, 0) == s + 1_000_000_007 != rank_seed(s, 1)
    assert rank_seed(s, 0) == s  # one rank, or one Ray actor, samples what the unsharded engine samples
    assert [rank_seed(s, r) for r in (1, 2, 3)] == [derive_seed(s, "rank", r) for r in (1, 2, 3)]
    seeds = {rank_seed(step_seed(run, step, "rollout"), r) for run in range(3) for step in range(50) for r in range(8)}
    assert len(seeds) == 3 * 50 * 8 and max(seeds) < 2**SEED_BITS


class SeedRecorder(ScriptedEngine):
    """The scripted engine, recording each call's seed and row count."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.seeds: list[int] = []

    def generate(self, prompt_ids, params, *, seed=None, intervention=None):
        self.seeds.append(seed)
        return super().generate(prompt_ids, params, seed=seed, intervention=intervention)


def test_seed_sft_batches_of_more_than_64_rows_give_every_engine_call_its_own_seed(tmp_path, tokenizer):
    """With batches of 64 tasks x 2 rollouts (128 rows, two chunks), the old ``step_seed(seed, 0, "", k) +
    turn * 1009 + start`` gave the batch of task 64 the seeds of the batch of task 0's second chunk, turn by turn
    (measured: 2 of the 8 calls' seeds repeated, one per turn)."""
    cfg = seed_sft_config(tmp_path, "env.train_tasks=128", "env.max_turns=2", "sft.tasks=128",
                          "sft.rollouts_per_task=2", "sft.rollout_batch_tasks=64")
    engine = SeedRecorder(tokenizer)
    episodes = rollout_episodes(cfg.rl_config(), None, tokenizer, cfg.sft, engine=engine)
    assert len(episodes) == 256 and engine.calls[:2] == [64, 64]  # each batch's first turn: two chunks of 64
    assert len(engine.seeds) == 8 and len(set(engine.seeds)) == 8


def test_the_rows_of_a_group_split_over_engine_calls_still_sample_differently(tiny_policy, monkeypatch, tmp_path):
    """A group of 8 cut into two engine calls of 4 (GENERATE_ROWS at 4): each call has its own seed, and the rows
    of one call their own draws of its generator, so no two rows of the group repeat one another."""
    model, tok = tiny_policy
    monkeypatch.setattr(chunks, "GENERATE_ROWS", 4)
    collector = build_collector(tiny_config(tmp_path, "rollout.max_new_tokens=8"), tok)
    params = sampling_params(collector.cfg.rollout)
    batch = collector.generate(HFEngine(model, tok), collector.task.train[:1], 8, params, seed=5)
    rows = [tuple(r[m.bool()].tolist()) for r, m in zip(batch.response_ids, batch.response_mask, strict=True)]
    assert len(set(rows)) == 8, rows


@pytest.mark.parametrize("parts", [(0,), (0, 0, "rollout", 0), (2**61, -3, "val", 10**6)])
def test_derive_seed_is_a_pure_function_of_its_parts(parts):
    assert derive_seed(*parts) == derive_seed(*parts) and 0 <= derive_seed(*parts) < 2**SEED_BITS
