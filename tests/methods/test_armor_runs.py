"""ARMOR in the real trainer with a tiny random model: anchors, old log-probs, resets, equivalence to DAPO,
every shipped config, and the two-stage recipe.

The task is a toy whose verifier calls a response correct when the sum of its character codes is even,
so a random model gets mixed groups and mixed reference samples.
"""

from __future__ import annotations

import copy
import weakref
from pathlib import Path

import pytest
import torch

from tests.distributed.helpers import fixed_batch
from tests.engine.helpers import COPY_ENGINE
from tests.trainer.helpers import ANCHORS, update_with_anchors
from tether.config import ConfigError, config_command, load_config
from tether.engine import ENGINES
from tether.recipes.armor import run_two_stage
from tether.tasks.base import Score, TaskItem
from tether.tasks.registry import register_task, unregister_task
from tether.trainer import Trainer
from tether.trainer.checkpoint import load_state

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "armor"
TOY = "armor_toy"

TINY = [f"task.name={TOY}", "task.kwargs={}", "rollout.prompts_per_step=2", "rollout.group_size=4",
        "rollout.max_new_tokens=4", "rollout.gen_batch_prompts=2", "rollout.max_gen_batches=30",
        "rollout.overlong.enabled=false", "optim.micro_batch_size=16", "optim.mini_batches=2",
        "optim.lr=1e-3", "optim.warmup_steps=0", "val.every=0", "train.steps=1", "train.resume=never",
        "train.overwrite=true",
        "train.save_every=0", "logging.tensorboard=false", "logging.progress=false"]


class ToyTask:
    """Prompts ``say <i>``; correct iff the response's character codes sum to an even number."""

    def __init__(self, size: int = 16) -> None:
        self.name, self.system_prompt = TOY, None
        self.train = [TaskItem(prompt=f"say {i}", answer=None, id=f"toy/train/{i}") for i in range(size)]
        self.val = [TaskItem(prompt=f"tell {i}", answer=None, id=f"toy/val/{i}") for i in range(4)]

    def score(self, item: TaskItem, response_text: str) -> Score:
        correct = sum(map(ord, response_text)) % 2 == 0
        return Score(1.0 if correct else -1.0, correct, None)


@pytest.fixture(scope="module", autouse=True)
def toy_task():
    register_task(TOY)(ToyTask)
    yield
    unregister_task(TOY)


@pytest.fixture
def tiny(tiny_policy):
    """(model, tokenizer) of tests/conftest.py: a fresh random 2-layer Llama with the SmolLM2 tokenizer."""
    return tiny_policy


def make_trainer(tiny, tmp_path: Path, overrides: list[str], path: Path | None = None) -> Trainer:
    cfg = load_config(path, [*TINY, f"run_dir={tmp_path}", *overrides])
    model, tokenizer = tiny
    return Trainer(cfg, policy=copy.deepcopy(model), tokenizer=tokenizer)


def perturb(model: torch.nn.Module, seed: int = 1) -> None:
    """Move the reference away from the policy, so anchors and their log-probs can be told apart."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


ARMOR = ["algorithm.policy_loss=armor", "algorithm.loss_kwargs={alpha: 0.75}", "methods.armor={ref_n: 4}"]


def test_anchor_groups_and_old_log_probs_from_the_policy(tiny, tmp_path):
    trainer = make_trainer(tiny, tmp_path, ARMOR)
    perturb(trainer.ref_policy)
    batch, metrics = trainer.collect()
    trainer.score(batch)  # two mini-batches: the trainer computes old log-probs for every row

    gids = batch.group_ids.unique()
    assert len(gids) == 2
    for gid in gids:
        rows = batch.group_ids == gid
        assert int((batch.source[rows] == 0).sum()) == 4 and int((batch.source[rows] == 1).sum()) == 1
        on = rows & (batch.source == 0)
        assert int(batch.correct[on].sum()) in (1, 2, 3)
        assert bool(batch.correct[rows & (batch.source == 1)].all())
    assert 0 < metrics["armor/acceptance_rate"] <= 1
    assert metrics["rollout/num_gen_batches"] >= 1

    anchor, on = batch.source == 1, batch.source == 0
    mask = batch.response_mask
    old, ref = batch.token["old_log_probs"], batch.token["ref_log_probs"]
    sampled = batch.sample_log_probs * mask
    # pi_old of an anchor is the current policy's log-prob of it, not the reference's.
    anchors = batch.select(anchor.nonzero().flatten())
    torch.testing.assert_close(old[anchor], trainer.log_probs(trainer.policy, anchors))
    assert (old[anchor] - ref[anchor]).abs().max() > 1e-2
    # Anchors were sampled from the reference, on-policy rows from the policy (T = 1, no top-p/top-k).
    torch.testing.assert_close(sampled[anchor], ref[anchor], atol=1e-4, rtol=0)
    torch.testing.assert_close(sampled[on], old[on], atol=1e-4, rtol=0)

    drift = trainer.methods[0].on_score(batch, trainer.hook_context())
    on_tokens = mask * on[:, None]
    expected = ((old - ref) * on_tokens).sum() / on_tokens.sum()
    assert drift["armor/kl_on_old"] == pytest.approx(expected.item(), rel=1e-5)


def test_with_lora_anchors_come_from_the_base_with_the_adapters_off(tiny, tmp_path):
    pytest.importorskip("peft", reason="peft is not installed (pip install -e '.[lora]')")
    from tether.models.forward import response_log_probs

    base = copy.deepcopy(tiny[0])
    trainer = make_trainer(tiny, tmp_path, [*ARMOR, "model.lora.rank=4"])
    with torch.no_grad():  # trained adapters: the policy is no longer its base
        for name, p in trainer.policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    batch, _ = trainer.collect()
    trainer.score(batch)
    anchor = batch.source == 1
    assert int(anchor.sum()) == 2
    mask = batch.response_mask
    ref, old = batch.token["ref_log_probs"], batch.token["old_log_probs"]
    want, _ = response_log_probs(base, batch.prompt_ids, batch.response_ids, mask)
    # the reference is the base, to float32 rounding (the two passes batch the rows differently)
    torch.testing.assert_close(ref, want * mask, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close((batch.sample_log_probs * mask)[anchor], ref[anchor], atol=1e-4, rtol=0)
    assert (old[anchor] - ref[anchor]).abs().max() > 1e-2  # scored by the policy, adapters on
    assert trainer.train_step()["armor/anchor_rows"] == 2


def test_with_lora_and_resets_anchors_come_from_the_reference_adapter(tiny, tmp_path):
    pytest.importorskip("peft", reason="peft is not installed (pip install -e '.[lora]')")
    trainer = make_trainer(tiny, tmp_path, [*ARMOR[:2], "methods.armor={ref_n: 4, reset: every, tau: 1}",
                                            "model.lora.rank=4"])
    trainer.train_step()  # the reset after step 1: the reference adapter holds the trained adapters
    batch, _ = trainer.collect()
    trainer.score(batch)
    anchor, mask = batch.source == 1, batch.response_mask
    assert int(anchor.sum()) > 0
    ref, old = batch.token["ref_log_probs"], batch.token["old_log_probs"]
    torch.testing.assert_close(ref, old, atol=1e-6, rtol=0)  # the reference is the policy now
    torch.testing.assert_close((batch.sample_log_probs * mask)[anchor], ref[anchor], atol=1e-4, rtol=0)


def test_single_update_takes_pi_old_of_anchors_from_the_policy(tiny, tmp_path):
    # One optimizer step: the trainer uses the update's own detached forward as pi_old for all rows, so the
    # plain ratio is exactly 1 on anchors too; with pi/pi_ref on anchors (off-policy IS) it is not.
    plain = make_trainer(tiny, tmp_path / "plain", ["optim.mini_batches=1", "methods.armor={}"])
    perturb(plain.ref_policy)
    m = plain.train_step()
    assert m["armor/anchor_rows"] == 2
    assert m["actor/ratio_max"] == 1.0 and m["actor/ppo_kl"] == 0.0
    assert "armor/kl_on_old" in m and "armor/kl_on_ref" in m  # from the update's own forward (no extra pass)

    is_run = make_trainer(tiny, tmp_path / "is", ["optim.mini_batches=1", "methods.armor={}",
                                                 "algorithm.policy_loss=anchor_offpolicy_is"])
    perturb(is_run.ref_policy)
    assert is_run.train_step()["actor/ratio_max"] > 1.0


def test_alpha_one_without_anchors_reproduces_dapo_exactly(tiny, tmp_path):
    dapo = ["algorithm.policy_loss=ppo", "train.steps=2",
            "algorithm.loss_kwargs={clip_low: 0.2, clip_high: 0.28, dual_clip: 10.0}"]
    mixed = ["algorithm.policy_loss=armor", "train.steps=2", "methods.armor={anchors: false}",
             "algorithm.loss_kwargs={alpha: 1.0, clip_low: 0.2, clip_high: 0.28, dual_clip: 10.0}"]
    a, b = make_trainer(tiny, tmp_path / "dapo", dapo), make_trainer(tiny, tmp_path / "armor", mixed)
    assert a.ref_policy is None and b.ref_policy is not None
    for _ in range(2):
        ma, mb = a.train_step(), b.train_step()
        for key in ("actor/pg_loss", "actor/grad_norm", "train/reward_mean", "actor/pg_clipfrac"):
            assert ma[key] == mb[key], key
    for (name, pa), (_, pb) in zip(a.policy.named_parameters(), b.policy.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name


def test_reset_every_step_makes_the_next_reference_the_policy(tiny, tmp_path):
    trainer = make_trainer(tiny, tmp_path, [*ARMOR[:2], "methods.armor={reset: every, tau: 1}"])
    initial = copy.deepcopy(trainer.ref_policy.state_dict())
    trainer.train_step()
    ref, policy = trainer.ref_policy.state_dict(), trainer.policy.state_dict()
    assert all(torch.equal(ref[k], policy[k]) for k in ref)
    assert not all(torch.equal(ref[k], initial[k]) for k in ref)
    assert trainer.ref_modified and load_state(trainer.save())["ref_policy"] is not None  # checkpointed too

    batch, _ = trainer.collect()
    trainer.score(batch)
    torch.testing.assert_close(batch.token["ref_log_probs"], batch.token["old_log_probs"], atol=1e-6, rtol=0)


def test_anchor_engine_with_its_own_weights_follows_resets_and_resumes(tiny, tmp_path, add_entry):
    add_entry(ENGINES, "copy", COPY_ENGINE)  # holds its own weights, as Ray actors and vLLM do
    overrides = [*ARMOR[:2], "methods.armor={reset: every, tau: 1}", "rollout.engine=copy", "train.resume=true"]
    trainer = make_trainer(tiny, tmp_path, overrides)
    ref_engine = trainer.methods[0].ref_engine
    assert ref_engine.model is not trainer.ref_policy
    trainer.train_step()
    trainer.save()
    want = trainer.policy.state_dict()  # the reset made it the reference
    assert all(torch.equal(ref_engine.model.state_dict()[k], want[k]) for k in want)

    resumed = make_trainer(tiny, tmp_path, overrides)  # starts from the initial weights, then the checkpoint's
    got = resumed.methods[0].ref_engine.model.state_dict()
    assert resumed.step == 1 and all(torch.equal(got[k], want[k]) for k in want)


def test_reference_is_bit_identical_without_reset(tiny, tmp_path):
    trainer = make_trainer(tiny, tmp_path, [*ARMOR[:2], "methods.armor={reset: every, tau: 3}"])
    initial = copy.deepcopy(trainer.ref_policy.state_dict())
    for _ in range(2):
        trainer.train_step()
    ref = trainer.ref_policy.state_dict()
    assert all(torch.equal(ref[k], initial[k]) for k in ref)
    assert not trainer.ref_modified


SHIPPED = sorted(p for p in CONFIG_DIR.rglob("*.yaml") if config_command(p) == "train")  # not the SFT warm starts


def test_every_paper_variant_is_shipped():
    names = {p.stem for p in SHIPPED}
    assert {"stage1_dapo", "dapo_continued", "dapo_kl_k3", "dapo_kl_k2", "mix_only", "anchors_plain_ratio",
            "anchors_clip_expansion", "anchors_offpolicy_is", "armor", "armor_qae"} <= names
    assert len([p for p in SHIPPED if p.parent.name == "gpu"]) == 6


@pytest.mark.slow
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_config_loads_and_runs_a_tiny_step(path, tiny, tmp_path):
    load_config(path)  # as shipped
    trainer = make_trainer(tiny, tmp_path, [], path=path)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    metrics = trainer.train_step()
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.policy.parameters(), strict=True))
    if trainer.cfg.methods.get("armor", {}).get("anchors", True) and "armor" in trainer.cfg.methods:
        assert metrics["armor/anchor_rows"] == 2


def test_two_stage_recipe_checks_its_configs(tmp_path):
    base = [f"task.name={TOY}", "task.kwargs={}"]
    stage1 = load_config(None, [*base, f"run_dir={tmp_path}/s1", "val.every=0"])
    stage2 = load_config(None, [*base, f"run_dir={tmp_path}/s2"])
    with pytest.raises(ConfigError, match=r"val\.every"):
        run_two_stage(stage1, stage2)
    stage1 = load_config(None, [*base, f"run_dir={tmp_path}/s1"])
    with pytest.raises(ConfigError, match="ref_name"):
        run_two_stage(stage1, load_config(None, [*base, f"run_dir={tmp_path}/s2", "model.ref_name=x"]))
    with pytest.raises(ConfigError, match="run_dir"):
        run_two_stage(stage1, load_config(None, [*base, f"run_dir={tmp_path}/s1"]))


@pytest.mark.slow
def test_two_stage_recipe_starts_stage_two_from_the_best_checkpoint(tiny, tmp_path, monkeypatch):
    earlier_alive, trainers, init = [], [], Trainer.__init__

    def recording_init(self, *args, **kwargs):
        earlier_alive.append([ref() is not None for ref in trainers])
        trainers.append(weakref.ref(self))
        init(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "__init__", recording_init)
    model, tokenizer = tiny
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    stage1 = load_config(None, [*TINY, f"model.name={tmp_path / 'base'}", f"run_dir={tmp_path}/s1",
                                "train.steps=2", "val.every=1", "val.samples=2", "val.max_prompts=2"])
    stage2 = load_config(None, [*TINY, f"model.name={tmp_path / 'unused'}", f"run_dir={tmp_path}/s2", *ARMOR])
    out = run_two_stage(stage1, stage2)
    best = tmp_path / "s1" / "checkpoints" / "best"
    assert out["best_checkpoint"] == str(best) and out["best_step"] in (0, 1, 2)
    assert out["stage1"]["steps"] == 2 and out["stage2"]["steps"] == 1
    written = load_config(tmp_path / "s2" / "config.yaml")
    assert written.model.name == str(best) and written.model.ref_name is None
    assert earlier_alive == [[], [False]]  # stage 1's trainer (models, optimiser, engines) was freed first
    # again, resuming (TINY starts afresh): both stages ended before, so nothing loads (stage 1 built its trainer,
    # models and all, every time)
    for stage in (stage1, stage2):
        stage.train.resume = "auto"
    again = run_two_stage(stage1, stage2)
    assert len(trainers) == 2 and again["stage1"] == out["stage1"] and again["stage2"]["steps"] == 1


def test_the_losss_kl_metrics_are_over_their_own_tokens_whatever_the_micro_batches(tmp_path, tiny_policy):
    """armor/loss_kl_on_ref is a mean over anchor tokens, armor/loss_kl_on_old over on-policy ones; folded by
    response tokens, every micro-batch without an anchor added its 0 to kl_on_ref (and each anchor alone its 0 to
    kl_on_old): with one row per micro-batch kl_on_ref was -0.078 against -0.319 over the anchor tokens, and
    kl_on_old 0.395 against 0.522 over the on-policy ones (-0.148 and 0.584 with one micro-batch per mini-batch)."""
    batch = fixed_batch()
    mask = batch.response_mask > 0
    anchors = torch.zeros(len(batch), dtype=torch.bool)
    anchors[ANCHORS] = True
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(mask.shape, generator=g, dtype=torch.float64) * 3
    ref = old - torch.rand(mask.shape, generator=g, dtype=torch.float64) * 2 + 0.5
    want = {"armor/loss_kl_on_old": (old - ref)[mask & ~anchors[:, None]].mean(),  # k1 of KL(pi_old || pi_ref)
            "armor/loss_kl_on_ref": (ref - old)[mask & anchors[:, None]].mean()}   # k1 of KL(pi_ref || pi_old)
    for micro in (1, 5):
        got = update_with_anchors(tiny_policy, tmp_path / str(micro), micro, "algorithm.policy_loss=armor",
                                  "algorithm.use_ref=true", old_log_probs=old, ref_log_probs=ref)
        for key, value in want.items():
            assert got[key] == pytest.approx(value.item(), abs=1e-5), (micro, key)
