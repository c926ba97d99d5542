"""FSDP2 over two gloo processes on CPU: the sharded update, rollouts, sharded checkpoints and exact resume.

One spawn of two workers produces every result (about a minute on a loaded 2-core machine, most of it
importing and building models); the tests compare them with the same computations done here in one
process, unsharded.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from tests.distributed.helpers import PROMPTS, SAMPLING, UPDATE, WORLD, fixed_batch, spawn_ranks
from tests.trainer.helpers import tiny_config
from tether.config import ConfigError
from tether.distributed import concat_generations, rank_seed, split_evenly
from tether.distributed.fsdp import gathered
from tether.engine.hf import HFEngine
from tether.models import forward, tiny_model
from tether.models.lora import REFERENCE, BaseModelView, add_lora, reference_parameters
from tether.trainer import Trainer
from tether.trainer.checkpoint import load_state

FSDP = ("distributed.strategy=fsdp2",)
# optim.max_tokens_per_micro_batch: the fixed batch's rows are 2-9 padded tokens long, so in each mini-batch rank 0's
# three rows run one by one and rank 1 pads its two micro-batches with a third
BUDGET = 8
# Resume runs: ARMOR's reference reset after step 2 moves the reference, which the KL term of step 3 then
# reads, so an exact step 3 needs the reference restored from the sharded checkpoint as well.
RESUME = (*FSDP, "algorithm.kl.coef=0.1", "methods.armor={anchors: false, reset: every, tau: 2}")
LORA = ("model.lora.rank=4", "model.lora.alpha=8")
# a metric summed in float32 in another order (ranks, micro-batches): terms of either sign near 0.1 to 1 round to
# ~1e-8 each, so a small total (pg_loss ~4e-3) differs by that much, not by a share of itself
FLOAT32_SUM = 1e-7
COMPARED = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "train/reward_mean")


def make_trainer(cfg, dtype: torch.dtype = torch.float32) -> Trainer:
    model, tok = tiny_model(seed=0)
    return Trainer(cfg, policy=model.to(dtype), tokenizer=tok)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local().clone() if isinstance(t, DTensor) else t.clone()


def flat_params(model) -> torch.Tensor:
    return torch.cat([full(p.detach()).flatten() for p in model.parameters()])


def update_fixed_batch(trainer: Trainer) -> dict[str, Any]:
    """score -> advantages -> update on the fixed batch, moved to the trainer's device as ``train_step`` moves it;
    the last optimiser step's gradients stay."""
    before = flat_params(trainer.policy)
    batch = fixed_batch().to(trainer.device)
    trainer.score(batch)
    trainer.compute_advantages(batch)
    metrics = trainer.update(batch)
    params = [p for p in trainer.policy.parameters() if p.requires_grad]  # all, or a LoRA policy's adapters
    return {"metrics": metrics, "grads": torch.cat([full(p.grad).flatten() for p in params]),
            "params": flat_params(trainer.policy), "before": before,
            "stored": {p.dtype for p in params} | {p.grad.dtype for p in params}}


def run_update(run_dir: Path, *overrides: str) -> dict[str, Any]:
    return update_fixed_batch(make_trainer(tiny_config(run_dir, *UPDATE, *overrides), dtype=torch.float64))


def _mixed_precision(out: Path) -> dict[str, Any]:
    trainer = make_trainer(tiny_config(out / "bf16", *UPDATE, *FSDP, "distributed.param_dtype=bfloat16",
                                       "distributed.reduce_dtype=float32"))
    result = update_fixed_batch(trainer)
    with gathered(trainer.policy):
        result["compute"] = next(trainer.policy.parameters()).dtype
    return result


def shards(trainer: Trainer) -> dict[str, Any]:
    """This rank's parameter shards and optimiser state shards."""
    optim = trainer.optimizer.state_dict()["state"]
    return {"params": [local(p.detach()) for p in trainer.policy.parameters()],
            "optim": {i: {k: local(v) for k, v in s.items()} for i, s in optim.items()}}


def _rollouts(out: Path) -> dict[str, Any]:
    trainer = make_trainer(tiny_config(out / "gen", *FSDP, "algorithm.kl.coef=0.1"))
    result = {"all": trainer.engine.generate(PROMPTS, SAMPLING, seed=123),
              "one": trainer.engine.generate(PROMPTS[:1], SAMPLING, seed=7),  # rank 1 decodes nothing
              "ref": trainer.make_engine(trainer.ref_policy).generate(PROMPTS, SAMPLING, seed=5)}
    models = (trainer.policy, trainer.ref_policy)
    result["resharded"] = all(isinstance(p, DTensor) for m in models for p in m.parameters())
    return result


def _resume(out: Path, *lora: str) -> dict[str, Any]:
    """Three steps straight, and two steps + resume + one, with ARMOR's reference reset after step 2; with
    ``lora``, the policy trains adapters and the reference is its own adapter (docs/lora.md)."""
    name = "lora_" if lora else ""
    straight = make_trainer(tiny_config(out / f"{name}straight", *RESUME, *lora, "train.steps=3"))
    straight_last = straight.fit()
    first = make_trainer(tiny_config(out / f"{name}resumed", *RESUME, *lora, "train.steps=2", "val.every=2"))
    first.fit()  # validates at steps 0 and 2 (does not touch the training state), saves step 2 at the end
    reset = torch.equal(*(flat_params(m) for m in reset_pair(first)))  # ARMOR's reset, shard to shard
    resumed = make_trainer(tiny_config(out / f"{name}resumed", *RESUME, *lora, "train.steps=3"))
    loaded = {"step": resumed.step, "ref_modified": resumed.ref_modified, "reset": reset,
              "saved": shards(first), "loaded": shards(resumed)}
    resumed_last = resumed.fit()
    return {"straight": straight_last, "resumed": resumed_last, **loaded,
            "straight_params": flat_params(straight.policy), "resumed_params": flat_params(resumed.policy),
            "step2_params": flat_params(first.policy)}


def reset_pair(trainer: Trainer) -> tuple[Any, Any]:
    """What an ARMOR reset makes equal: the reference and the policy, or a LoRA run's two adapters."""
    if not isinstance(trainer.ref_policy, BaseModelView):
        return trainer.ref_policy, trainer.policy
    own = dict(trainer.policy.named_parameters())
    return (torch.nn.ParameterList(reference_parameters(trainer.policy).values()),
            torch.nn.ParameterList(own[n.replace(f".{REFERENCE}.", ".default.")]
                                   for n in reference_parameters(trainer.policy)))


def _eapo(out: Path, rank: int) -> dict[str, Any]:
    if rank == 0:  # (transformers writes config.json on rank 0 only)
        prior, tok = tiny_model(seed=1)  # another random model with the same tokenizer
        prior.save_pretrained(out / "prior")
        tok.save_pretrained(out / "prior")
    dist.barrier()
    eapo = {"prior": str(out / "prior"), "threshold": -1.0}  # the gate always opens
    trainer = make_trainer(tiny_config(out / "eapo", *FSDP, algorithm={"policy_loss": "eapo"}, methods={"eapo": eapo}))
    return {"metrics": trainer.train_step(),
            "prior_whole": not any(isinstance(p, DTensor) for p in trainer.methods[0].prior.parameters())}


def _seed(out: Path) -> dict[str, Any]:
    from tests.methods.test_seed_runs import SEED, CannedAnalyzer
    from tests.rollout.helpers import ScriptedEngine, agent_config

    cfg = agent_config(out / "seed", *FSDP, methods={"seed": SEED}, algorithm={"kl": {"coef": 0.01}})
    model, tok = tiny_model(seed=0)
    trainer = Trainer(cfg, policy=model, tokenizer=tok)
    trainer.use_engine(CannedAnalyzer(ScriptedEngine(tok), tok))  # scripted actions, canned skills (no GPU-free JSON)
    return trainer.train_step()


@contextlib.contextmanager
def padded_rows() -> Iterator[None]:
    """Right-padded rows instead of rows packed by prompt: a rank packs its share of the rows, one process the
    whole micro-batch, and HF's float32 RMSNorm rounds sums over differently packed rows differently (1e-8, even
    in float64; tests/models/test_forward.py), so the exact comparisons run both sides padded."""
    can_pack = forward._can_pack
    forward._can_pack = lambda model: False
    try:
        yield
    finally:
        forward._can_pack = can_pack


def _work(rank: int, out: Path) -> dict[str, Any]:
    # packed rows under FSDP2: one forward call per micro-batch, so ranks call every layer equally often
    result = {"update_packed": run_update(out / "update_packed", *FSDP)}
    with padded_rows():
        result |= {"update": run_update(out / "update", *FSDP, "train.gradient_checkpointing=true"),
                   "update_no_checkpointing": run_update(out / "update_no_ckpt", *FSDP),
                   # micro-batches by tokens: rank 1 runs fewer and pads (BUDGET)
                   "update_token_budget": run_update(out / "update_budget", *FSDP,
                                                     f"optim.max_tokens_per_micro_batch={BUDGET}"),
                   "lora_update": run_update(out / "lora_update", *FSDP, *LORA)}
    return result | {"rollouts": _rollouts(out), "resume": _resume(out), "bf16": _mixed_precision(out),
                     "eapo": _eapo(out, rank), "seed": _seed(out), "lora_resume": _resume(out, *LORA)}


@pytest.fixture(scope="module")
def two_ranks():
    yield from spawn_ranks(_work)


def test_sharded_update_equals_the_single_process_update_in_float64(two_ranks, tmp_path):
    results, _ = two_ranks
    packed = run_update(tmp_path / "packed")
    for r in results:  # each rank packs its own share of the rows: equal to float32 precision (see padded_rows)
        torch.testing.assert_close(r["update_packed"]["grads"], packed["grads"], rtol=1e-5, atol=1e-7)
        assert not torch.equal(r["update_packed"]["params"], r["update_packed"]["before"])
    with padded_rows():
        single = run_update(tmp_path / "padded")  # replicated, one process, no gradient checkpointing
    for got in [r[key] for r in results for key in ("update", "update_no_checkpointing", "update_token_budget")]:
        torch.testing.assert_close(got["grads"], single["grads"], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(got["params"], single["params"], rtol=1e-9, atol=1e-12)
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):  # summed in float32
            assert got["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-6, abs=FLOAT32_SUM), key


def test_each_rank_decodes_its_share_from_the_gathered_model(two_ranks):
    results, _ = two_ranks
    model, tok = tiny_model(seed=0)
    engine = HFEngine(model, tok)
    for name, prompts, seed in (("all", PROMPTS, 123), ("one", PROMPTS[:1], 7), ("ref", PROMPTS, 5)):
        parts = [engine.generate(prompts[lo:hi], SAMPLING, seed=rank_seed(seed, r))
                 for r, (lo, hi) in enumerate(split_evenly(len(prompts), WORLD)) if hi > lo]
        want = concat_generations(parts, engine.pad_id)
        for r in results:
            got = r["rollouts"][name]
            assert torch.equal(got.response_ids, want.response_ids), name
            torch.testing.assert_close(got.sample_log_probs, want.sample_log_probs)
    assert all(r["rollouts"]["resharded"] for r in results)


def test_sharded_checkpoint_loads_every_shard_and_optimiser_state(two_ranks):
    results, tmp = two_ranks
    for r in results:
        res = r["resume"]
        assert res["step"] == 2 and res["ref_modified"] and res["reset"]
        for saved, loaded in zip(res["saved"]["params"], res["loaded"]["params"], strict=True):
            assert torch.equal(saved, loaded)
        assert res["saved"]["optim"].keys() == res["loaded"]["optim"].keys()
        for i, state in res["saved"]["optim"].items():
            for key, value in state.items():
                assert torch.equal(value, res["loaded"]["optim"][i][key]), (i, key)
    step = tmp / "resumed" / "run" / "checkpoints" / "step_000002"
    files = sorted(p.name for p in (step / "sharded").iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert load_state(step)["sharded_parts"] == ["model", "optim", "ref"]
    assert not list(step.glob("*.safetensors")) and not list(step.parent.glob("*.tmp"))


def test_resume_after_two_steps_equals_three_uninterrupted_steps(two_ranks):
    results, _ = two_ranks
    for r in results:
        res = r["resume"]
        for key in COMPARED:
            assert res["resumed"][key] == pytest.approx(res["straight"][key], rel=1e-6, abs=1e-7), key
        torch.testing.assert_close(res["resumed_params"], res["straight_params"], rtol=0, atol=1e-6)
    assert torch.equal(results[0]["resume"]["resumed_params"], results[1]["resume"]["resumed_params"])


def test_best_checkpoint_is_a_plain_hugging_face_directory(two_ranks):
    results, tmp = two_ranks
    best = tmp / "resumed" / "run" / "checkpoints" / "best"
    assert json.loads((best / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    loaded = AutoModelForCausalLM.from_pretrained(best)
    step = load_state(best)["step"]
    want = flat_params(tiny_model(seed=0)[0]) if step == 0 else results[0]["resume"]["step2_params"]
    assert step in (0, 2)
    torch.testing.assert_close(flat_params(loaded), want, rtol=0, atol=0)


def test_mixed_precision_keeps_float32_shards_and_computes_in_bfloat16(two_ranks):
    results, _ = two_ranks
    for r in results:
        res = r["bf16"]
        assert res["stored"] == {torch.float32} and res["compute"] == torch.bfloat16
        assert not torch.equal(res["params"], res["before"])
        assert all(math.isfinite(res["metrics"][k]) for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"))


def test_eapo_injects_from_a_whole_prior_next_to_the_sharded_policy(two_ranks):
    results, _ = two_ranks
    for r in results:
        res = r["eapo"]
        assert res["prior_whole"] and res["metrics"]["eapo/injected_token_frac"] > 0
        assert math.isfinite(res["metrics"]["actor/pg_loss"]) and math.isfinite(res["metrics"]["actor/grad_norm"])


def test_seed_scores_the_teacher_pass_with_the_sharded_policy(two_ranks):
    results, _ = two_ranks
    for r in results:
        metrics = r["seed"]
        assert metrics["seed/analysis_success_rate"] > 0 and math.isfinite(metrics["actor/pg_loss"])
    assert results[0]["seed"]["actor/pg_loss"] == results[1]["seed"]["actor/pg_loss"]


def test_sharded_lora_update_equals_the_single_process_update_in_float64(two_ranks, tmp_path):
    results, _ = two_ranks
    with padded_rows():  # as for full fine-tuning
        single = run_update(tmp_path, *LORA)
    adapters = add_lora(tiny_model(seed=0)[0], tiny_config(tmp_path / "cfg", *LORA).model.lora)
    assert single["grads"].numel() == sum(p.numel() for n, p in adapters.named_parameters() if ".lora_" in n)
    for r in results:
        got = r["lora_update"]
        torch.testing.assert_close(got["grads"], single["grads"], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(got["params"], single["params"], rtol=1e-9, atol=1e-12)
        assert not torch.equal(got["params"], got["before"])
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):  # summed in float32
            assert got["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-6, abs=FLOAT32_SUM), key


def test_sharded_lora_checkpoints_hold_the_adapters_and_resume_an_armor_reset_exactly(two_ranks):
    from peft import PeftModel
    from torch.distributed.checkpoint import FileSystemReader

    results, tmp = two_ranks
    for r in results:
        res = r["lora_resume"]
        assert res["step"] == 2 and res["ref_modified"] and res["reset"]
        for key in COMPARED:
            assert res["resumed"][key] == pytest.approx(res["straight"][key], rel=1e-6, abs=1e-7), key
        torch.testing.assert_close(res["resumed_params"], res["straight_params"], rtol=0, atol=1e-6)
    step = tmp / "lora_resumed" / "run" / "checkpoints" / "step_000002"
    assert load_state(step)["sharded_parts"] == ["model", "optim", "ref"]
    saved = FileSystemReader(step / "sharded").read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and [k for k in model_keys if ".lora_" not in k or ".default." not in k] == []  # no base
    assert all(f".{REFERENCE}." in k for k in saved if k.startswith("ref."))
    best = tmp / "lora_resumed" / "run" / "checkpoints" / "best"
    assert (best / "adapter_model.safetensors").is_file() and not (best / "config.json").exists()
    loaded = PeftModel.from_pretrained(tiny_model(seed=0)[0], best)
    b_norm = sum(float(p.norm()) for n, p in loaded.named_parameters() if "lora_B" in n)
    assert (b_norm > 0) == (load_state(best)["step"] == 2)  # B starts at zero


def test_fsdp2_without_a_process_group_fails_before_loading_a_model(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ConfigError, match=r"distributed\.strategy=fsdp2 needs torch\.distributed"):
        Trainer(tiny_config(tmp_path, *FSDP))  # would load the default model if it got that far
