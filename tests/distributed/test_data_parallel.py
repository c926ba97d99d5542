"""Two gloo processes on CPU give the single-process update, split rollouts by rank, and share checkpoints.

One spawn of two workers (about 20 s on a loaded 2-core machine) produces every result; the tests
compare them with the same computations done here in one process.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.distributed.helpers import PROMPTS, SAMPLING, UPDATE, WORLD, fixed_batch, spawn_ranks
from tests.trainer.helpers import tiny_config
from tether.distributed import DataParallel, concat_generations, rank_seed, split_evenly
from tether.engine.base import Generation
from tether.engine.hf import HFEngine
from tether.methods import METHODS, method_config
from tether.methods.hooks import MethodSet
from tether.models import tiny_model
from tether.trainer import Trainer
from tether.trainer.checkpoint import CheckpointManager, CheckpointWriteError


def make_trainer(cfg):
    model, tok = tiny_model(seed=0)
    return Trainer(cfg, policy=model, tokenizer=tok)


HAS_PEFT = importlib.util.find_spec("peft") is not None
LORA = ("model.lora.rank=4",)  # adapters only: the reference (kl.coef) is the base with them off


def run_update(run_dir: Path, *overrides: str) -> dict:
    """score -> advantages -> update on the fixed batch; the gradients of the last optimiser step stay."""
    trainer = make_trainer(tiny_config(run_dir, *UPDATE, *overrides))
    batch = fixed_batch()
    trainer.score(batch)
    trainer.compute_advantages(batch)
    metrics = trainer.update(batch)
    trained = [p for p in trainer.policy.parameters() if p.requires_grad]
    grads = torch.cat([p.grad.flatten() for p in trained])
    params = torch.cat([p.detach().flatten() for p in trained])
    return {"metrics": metrics, "grads": grads, "params": params}


def run_distillation_update(run_dir: Path, method: str) -> dict[str, float]:
    """The fixed batch's update with SEED's (or OPSD's) distillation term, on every row but two (no skill, no hint):
    the metrics the step logs from the update and from the methods' ``after_update``."""
    trainer = make_trainer(tiny_config(run_dir, *UPDATE))
    batch = fixed_batch()
    trainer.score(batch)  # before the method joins: its on_score would analyse episodes the fixed batch lacks
    trainer.compute_advantages(batch)
    g = torch.Generator().manual_seed(1)
    batch.token["teacher_log_probs"] = -3.0 * torch.rand(batch.response_mask.shape, generator=g)
    rows = torch.ones(len(batch))
    rows[[1, 4]] = 0.0
    batch.token["seed_mask" if method == "seed" else "opsd_mask"] = rows[:, None] * batch.response_mask
    trainer.methods = MethodSet([METHODS[method](method_config(method, {}))])
    metrics = trainer.update(batch)
    trainer.step += 1
    return {**metrics, **trainer.methods.after_update(trainer.hook_context())}


def failed_save(root: Path, rank: int) -> dict:
    """Step 1 saves; at step 2 rank 1 alone cannot write its file. Every rank must stop with the same line rather
    than wait at the next collective for a rank that has left (the helper's 2-minute timeout fails the test)."""
    checkpoints = CheckpointManager(root, keep_last=2, dp=DataParallel(rank, WORLD))

    def write(directory: Path, fail: bool = False) -> None:
        if fail and rank == 1:
            raise PermissionError(13, "Permission denied", str(directory / "rank1.pt"))
        (directory / f"rank{rank}.pt").write_text("weights")

    checkpoints.save(1, write)
    try:
        checkpoints.save(2, lambda directory: write(directory, fail=True))
    except CheckpointWriteError as err:
        message = str(err)
    else:
        message = None
    DataParallel(rank, WORLD).barrier()  # rank 0 removes the partial directory before anyone looks
    return {"message": message, "listing": sorted(p.name for p in (root / "checkpoints").iterdir()),
            "latest": (root / "checkpoints" / "latest").read_text()}


def _work(rank: int, out: Path) -> dict:
    result = {"failed_save": failed_save(out / "failed_save", rank)}
    result["update"] = run_update(out / "update")
    result["distillation"] = {m: run_distillation_update(out / m, m) for m in ("seed", "opsd")}
    if HAS_PEFT:
        result["lora_update"] = run_update(out / "lora", *LORA)
    trainer = make_trainer(tiny_config(out / "fit", "train.steps=1"))  # fit() is what `tether train` runs
    result["generation"] = trainer.engine.generate(PROMPTS, SAMPLING, seed=123)
    trainer.fit()
    result["fit_params"] = torch.cat([p.detach().flatten() for p in trainer.policy.parameters()])
    resumed = make_trainer(tiny_config(out / "fit", "train.steps=2"))  # rank 0 wrote it, both load it
    result["resumed_step"] = resumed.step
    result["resumed_params"] = torch.cat([p.detach().flatten() for p in resumed.policy.parameters()])
    result["resumed_optim"] = resumed.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    result["trained_optim"] = trainer.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    return result


@pytest.fixture(scope="module")
def two_ranks():
    """Results of both workers, from one ``mp.spawn``."""
    yield from spawn_ranks(_work)


def test_split_evenly_covers_every_row_once():
    assert split_evenly(5, 2) == [(0, 3), (3, 5)]
    assert split_evenly(1, 3) == [(0, 1), (1, 1), (1, 1)]
    assert rank_seed(7, 0) == 7 and rank_seed(7, 1) != 7


def test_concat_generations_pads_to_the_widest():
    a = Generation(torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2), torch.full((1, 2), -1.0), ["a"],
                   torch.tensor([False]), token={"gate_mask": torch.ones(1, 2)})
    b = Generation(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3), torch.full((2, 3), -1.0), ["b", "c"],
                   torch.tensor([True, False]))
    out = concat_generations([a, b], pad_id=9)
    assert out.response_ids.tolist()[0] == [1, 1, 9] and out.response_mask[0].tolist() == [1, 1, 0]
    assert out.texts == ["a", "b", "c"] and out.token["gate_mask"].tolist() == [[1, 1, 0], [0, 0, 0], [0, 0, 0]]


def test_two_process_update_equals_the_single_process_update(two_ranks, tmp_path):
    results, _ = two_ranks
    single = run_update(tmp_path)
    for r in results:
        got = r["update"]
        torch.testing.assert_close(got["grads"], single["grads"], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(got["params"], single["params"], rtol=0, atol=1e-5)
        # every actor/ metric, token means (pg_clipfrac, ppo_kl) and maxima (ratio_max) included: summed over the
        # ranks, a maximum was the sum of the ranks' ones
        assert got["metrics"].keys() == single["metrics"].keys()
        for key in (k for k in single["metrics"] if k.startswith("actor/")):
            assert got["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-4, abs=1e-6), key
    assert torch.equal(results[0]["update"]["params"], results[1]["update"]["params"])  # replicas stay equal


def test_seed_and_opsd_metrics_are_over_every_ranks_tokens(two_ranks, tmp_path):
    """SEED's and OPSD's distillation metrics are means over the update's active tokens (docs/methods/seed.md). Each
    rank runs its share of the micro-batches, so their sums must be added over the ranks like the actor/ ones; kept in
    the method and flushed in after_update, rank 0 logged the means over its own share."""
    results, _ = two_ranks
    for method in ("seed", "opsd"):
        single = run_distillation_update(tmp_path / method, method)
        keys = [k for k in single if k.startswith("seed/")]
        assert len(keys) >= 3 and single[f"seed/{'opd' if method == 'seed' else 'opsd'}_delta_mean"] > 0.1
        for r in results:
            for key in keys:
                assert r["distillation"][method][key] == pytest.approx(single[key], rel=1e-4, abs=1e-6), (method, key)


def test_logged_token_means_and_maxima_are_the_mini_batchs_whatever_the_micro_batches(tmp_path):
    """The fixed batch's responses have 1 to 6 tokens. With one micro-batch per mini-batch each actor/ metric is the
    docs/metrics.md formula over the mini-batch's response tokens ((1/T) sum_{i,t} for pg_clipfrac and ppo_kl; the
    max over them for ratio_max); split into micro-batches it must stay so. Weighted by rows, a micro-batch of short
    responses counted as much as one of long ones: with one row per micro-batch ppo_kl was 0.068 against -0.013 and
    ratio_max, a mean of the micro-batches' maxima, 2.0 against 3.9 (optim.lr=0.05)."""
    whole = run_update(tmp_path / "whole", "optim.micro_batch_size=5", "optim.lr=0.05")["metrics"]  # 5-row minis
    assert whole["actor/pg_clipfrac"] > 0 and whole["actor/ratio_max"] > 1.5  # the second mini-batch moved off 1
    for micro in (1, 2):
        got = run_update(tmp_path / str(micro), f"optim.micro_batch_size={micro}", "optim.lr=0.05")["metrics"]
        for key in (k for k in whole if k.startswith("actor/")):
            assert got[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), (micro, key)


@pytest.mark.skipif(not HAS_PEFT, reason="peft is not installed (pip install -e '.[lora]')")
def test_two_process_lora_update_equals_the_single_process_update(two_ranks, tmp_path):
    results, _ = two_ranks
    single = run_update(tmp_path, *LORA)
    for r in results:
        got = r["lora_update"]
        torch.testing.assert_close(got["grads"], single["grads"], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(got["params"], single["params"], rtol=0, atol=1e-5)
        assert got["metrics"]["actor/kl_loss"] == pytest.approx(single["metrics"]["actor/kl_loss"], rel=1e-4)
    assert torch.equal(results[0]["lora_update"]["params"], results[1]["lora_update"]["params"])


def test_each_rank_samples_its_share_with_its_own_seed(two_ranks):
    results, _ = two_ranks
    full = results[0]["generation"]
    assert torch.equal(full.response_ids, results[1]["generation"].response_ids)  # every rank gets all rows
    model, tok = tiny_model(seed=0)
    engine = HFEngine(model, tok)
    parts = [engine.generate(PROMPTS[lo:hi], SAMPLING, seed=rank_seed(123, r))
             for r, (lo, hi) in enumerate(split_evenly(len(PROMPTS), WORLD))]
    want = concat_generations(parts, engine.pad_id)
    assert torch.equal(full.response_ids, want.response_ids)
    torch.testing.assert_close(full.sample_log_probs, want.sample_log_probs)
    assert full.texts == want.texts


def test_rank_zero_checkpoint_resumes_on_every_rank(two_ranks):
    results, tmp = two_ranks
    for r in results:
        assert r["resumed_step"] == 1
        assert torch.equal(r["resumed_params"], results[0]["fit_params"])
        assert torch.equal(r["resumed_optim"], r["trained_optim"])
    lines = (tmp / "fit" / "run" / "metrics.jsonl").read_text().splitlines()
    assert len([x for x in lines if "actor/pg_loss" in x]) == 1  # rank 0 alone logged the step


def test_a_checkpoint_write_that_fails_on_one_rank_stops_every_rank_with_one_line(two_ranks):
    results, tmp = two_ranks
    partial = tmp / "failed_save" / "checkpoints" / "step_000002.tmp"
    want = (f"cannot write checkpoint {partial / 'rank1.pt'}: Permission denied; the checkpoints written before are "
            "intact (free space or fix permissions, then run again to resume) (rank 1 of 2)")
    for r in results:
        assert r["failed_save"]["message"] == want
        assert r["failed_save"]["listing"] == ["latest", "step_000001"]  # the partial step_000002.tmp is gone
        assert r["failed_save"]["latest"] == "step_000001"
