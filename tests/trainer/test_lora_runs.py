"""LoRA in the real trainer on a tiny random Llama: the direction of its update, checkpoints of adapters alone,
exact resume, a reference that is the base, and the combinations refused before any model loads."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft", reason="peft is not installed (pip install -e '.[lora]')")

from tests.trainer.helpers import tiny_config
from tether.checks import check_config
from tether.config import LLAMA_LINEAR, ConfigError, load_config
from tether.models.forward import response_log_probs
from tether.models.lora import ADAPTER_WEIGHTS, REFERENCE, BaseModelView, reference_parameters, serving_state_dict
from tether.trainer import Trainer

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

LORA = ["model.lora.rank=8", "model.lora.alpha=16"]


def make_trainer(tiny_policy, cfg):
    model, tok = tiny_policy
    return Trainer(cfg, policy=copy.deepcopy(model), tokenizer=tok)


def target_delta(tiny_policy, tmp_path, *overrides: str) -> torch.Tensor:
    """The change of every attention and MLP projection after one RL step (adapters merged), flattened."""
    before = tiny_policy[0].state_dict()
    trainer = make_trainer(tiny_policy, tiny_config(tmp_path, "rollout.prompts_per_step=4", *overrides))
    trainer.train_step()
    after = serving_state_dict(trainer.policy)
    keys = [k for k in before if any(f".{t}." in k for t in LLAMA_LINEAR)]
    return torch.cat([(after[k] - before[k]).flatten() for k in keys])


def test_full_rank_lora_moves_the_weights_in_the_direction_of_full_fine_tuning(tiny_policy, tmp_path):
    # Rank = the layer width (64) and alpha = rank (scale 1) at the full learning rate: the adapters can express any
    # update, and start where full fine-tuning does (B = 0), on the same rollouts. Adam's first step is the
    # gradient's sign per coordinate; LoRA's is the sign per coordinate of B's gradient G A^T, times A, which
    # points along G itself, so the two agree in direction, not to the last coordinate (cosine(G, sign G) is
    # about 0.8 for a Gaussian G). Rank 2 can follow only two directions of each layer's update.
    full = target_delta(tiny_policy, tmp_path / "full")
    lora = target_delta(tiny_policy, tmp_path / "lora", "model.lora.rank=64", "model.lora.alpha=64")
    low = target_delta(tiny_policy, tmp_path / "low", "model.lora.rank=2", "model.lora.alpha=2")
    cosine = torch.nn.functional.cosine_similarity
    full_rank, rank_two = cosine(full, lora, dim=0).item(), cosine(full, low, dim=0).item()
    assert full_rank > 0.3  # measured 0.45; a random direction of these ~90k weights gives about 0.003
    assert full_rank > 2 * rank_two  # measured 0.10


def test_checkpoints_hold_the_adapters_alone_and_resume_exactly(tiny_policy, tmp_path):
    def config(where):
        return tiny_config(where, *LORA, "algorithm.kl.coef=0.1", "optim.mini_batches=2", "train.steps=4")

    straight = make_trainer(tiny_policy, config(tmp_path / "a"))
    straight_metrics = [straight.train_step() for _ in range(4)]

    first = make_trainer(tiny_policy, config(tmp_path / "b"))
    for _ in range(2):
        first.train_step()
    saved = first.save()
    assert (saved / ADAPTER_WEIGHTS).is_file() and not (saved / "model.safetensors").exists()
    resumed = make_trainer(tiny_policy, config(tmp_path / "b"))
    assert resumed.step == 2
    resumed_metrics = [resumed.train_step() for _ in range(2)]

    for want, got in zip(straight_metrics[2:], resumed_metrics, strict=True):
        assert got["train/reward_mean"] == want["train/reward_mean"]
        assert got["actor/pg_loss"] == pytest.approx(want["actor/pg_loss"], abs=1e-6)
        assert got["actor/kl_loss"] == pytest.approx(want["actor/kl_loss"], abs=1e-6)
    for (name, want), got in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().values(),
                                 strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=name)


def test_the_reference_is_the_untrained_base_without_a_copy(tiny_policy, tmp_path):
    base = copy.deepcopy(tiny_policy[0])
    trainer = make_trainer(tiny_policy, tiny_config(tmp_path, *LORA, "algorithm.kl.coef=0.1", "train.steps=2"))
    assert isinstance(trainer.ref_policy, BaseModelView) and trainer.ref_policy.policy is trainer.policy
    assert len(trainer.optimizer.param_groups[0]["params"]) == 2 * 7 * 2  # A and B of 7 projections x 2 layers
    for _ in range(2):
        trainer.train_step()
    batch, _ = trainer.collect()
    trainer.score(batch)
    want = trainer.log_probs(base, batch)  # the base in the trainer's micro-batches: the same rounding
    torch.testing.assert_close(batch.token["ref_log_probs"], want, rtol=0, atol=0)
    policy = trainer.log_probs(trainer.policy, batch)
    assert (policy - batch.token["ref_log_probs"]).abs().max() > 1e-4  # the adapters trained


def test_armor_resets_move_the_lora_reference_into_its_own_adapter_and_resume_exactly(tiny_policy, tmp_path):
    # reset after the updates of steps 2 and 4: steps 1-2 read the base, steps 3-4 the policy after step 2, so an
    # exact resume at step 2 needs the reference adapter from the checkpoint
    def config(where):
        return tiny_config(where, *LORA, "algorithm.kl.coef=0.1", "algorithm.policy_loss=armor", "train.steps=4",
                           "methods.armor={anchors: false, reset: every, tau: 2}")

    base = copy.deepcopy(tiny_policy[0])
    straight = make_trainer(tiny_policy, config(tmp_path / "a"))
    view = straight.ref_policy
    assert isinstance(view, BaseModelView) and view.policy is straight.policy and view.adapter == REFERENCE
    reference = reference_parameters(straight.policy)
    assert reference and not any(p.requires_grad for p in reference.values())
    assert len(straight.optimizer.param_groups[0]["params"]) == 2 * 7 * 2  # the trained adapters alone

    def reference_base_policy(trainer):
        batch, _ = trainer.collect()
        trainer.score(batch)
        mask = batch.response_mask
        base_lp, _ = response_log_probs(base, batch.prompt_ids, batch.response_ids, mask)
        return batch.token["ref_log_probs"], base_lp * mask, trainer.log_probs(trainer.policy, batch)

    straight.train_step()
    ref, base_lp, policy = reference_base_policy(straight)  # no reset yet: base + a zero adapter is the base
    # base_lp is one forward over the batch, ref the trainer's in the update's micro-batches: float32 rounding of
    # log-probs near -10 differs in the last bits (1.9e-6 seen), hence the relative tolerance
    torch.testing.assert_close(ref, base_lp, rtol=1e-6, atol=1e-6)
    assert (policy - ref).abs().max() > 1e-4
    straight.train_step()  # the reset after step 2
    assert straight.ref_modified
    ref, base_lp, policy = reference_base_policy(straight)
    torch.testing.assert_close(ref, policy, rtol=0, atol=1e-6)  # the reference is now the policy...
    assert (ref - base_lp).abs().max() > 1e-4  # ...no longer the base
    snapshot = {n: p.detach().clone() for n, p in reference.items()}
    straight.train_step()  # no reset after step 3
    assert all(torch.equal(p, snapshot[n]) for n, p in reference.items())
    straight.train_step()  # reset after step 4
    assert not all(torch.equal(p, snapshot[n]) for n, p in reference.items())

    uninterrupted = make_trainer(tiny_policy, config(tmp_path / "b"))  # the probes above drew rollouts: a new run
    want_metrics = [uninterrupted.train_step() for _ in range(4)]
    first = make_trainer(tiny_policy, config(tmp_path / "c"))
    for _ in range(2):
        first.train_step()
    first.save()
    resumed = make_trainer(tiny_policy, config(tmp_path / "c"))
    assert resumed.step == 2 and resumed.ref_modified
    resumed_metrics = [resumed.train_step() for _ in range(2)]
    for want, got in zip(want_metrics[2:], resumed_metrics, strict=True):
        assert got["actor/kl_loss"] == pytest.approx(want["actor/kl_loss"], abs=1e-6)
        assert got["actor/pg_loss"] == pytest.approx(want["actor/pg_loss"], abs=1e-6)
    for (name, want_p), got_p in zip(uninterrupted.policy.state_dict().items(), resumed.policy.state_dict().values(),
                                     strict=True):
        torch.testing.assert_close(got_p, want_p, rtol=0, atol=1e-6, msg=name)


def test_lora_settings_are_validated(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.lora\.rank"):
        tiny_config(tmp_path, "model.lora.rank=0")
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules"):
        tiny_config(tmp_path, "model.lora.target_modules=[]")
    with pytest.raises(ConfigError, match=r"model\.lora\.dropout"):
        tiny_config(tmp_path, "model.lora.dropout=0.1")  # not a setting: the policy runs in eval mode
    cfg = tiny_config(tmp_path, *LORA, "model.name=tiny-64x2")
    assert check_config(cfg) == []  # the default targets are the layers of tether's Llama aliases
    cfg = tiny_config(tmp_path, *LORA, "model.name=tiny-64x2", "model.lora.target_modules=[q_proj, c_attn]")
    with pytest.raises(ConfigError, match="c_attn name no linear layer of tiny-64x2"):
        check_config(cfg)


@pytest.mark.parametrize("vlm", ["tiny-idefics3", "tiny-qwen2.5-vl"])
def test_lora_targets_of_a_vision_language_policy_are_checked_too(tmp_path, vlm):
    """A VLM alias (or a local VLM) was left to PEFT: validate said ok, train died in NoMatchingPeftModuleError."""
    from tether.checks.machine import check_lora_targets

    cfg = load_config(CONFIGS / "agents" / "ezpoints_grpo.yaml", [f"model.name={vlm}", "model.lora={}",
                                                                   f"run_dir={tmp_path}"])
    check_lora_targets(cfg, None)  # the default targets: the language model's projections
    bad = load_config(CONFIGS / "agents" / "ezpoints_grpo.yaml", [f"model.name={vlm}", f"run_dir={tmp_path}",
                                                                   "model.lora.target_modules=[q_proj, nope_proj]"])
    with pytest.raises(ConfigError, match=f"^model.lora.target_modules: nope_proj name no linear layer of {vlm}; "):
        check_lora_targets(bad, None)


def test_a_missing_peft_is_named_before_any_model_loads(tmp_path, monkeypatch):
    cfg = load_config(data={"task": {"name": "parity"}, "model": {"name": "tiny-64x2", "lora": {}},
                            "logging": {"tensorboard": False}, "run_dir": str(tmp_path)})
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(ConfigError, match=r"model\.lora is set but the package 'peft' is not installed"):
        check_config(cfg)


def test_an_engine_with_its_own_weights_samples_with_the_merged_adapters(tiny_policy, tmp_path, add_entry):
    from tests.engine.helpers import PLAIN_COPY_ENGINE
    from tether.engine import ENGINES

    add_entry(ENGINES, "plain_copy", PLAIN_COPY_ENGINE)  # a plain model of its own, as a Ray actor
    trainer = make_trainer(tiny_policy, tiny_config(tmp_path, *LORA, "rollout.engine=plain_copy", "train.steps=3"))
    for _ in range(2):
        metrics = trainer.train_step()
    own = trainer.engine.model.state_dict()
    merged = serving_state_dict(trainer.policy)
    assert own.keys() == merged.keys()
    assert all(torch.equal(own[k], merged[k]) for k in own)
    assert metrics["health/logprob_mismatch_frac"] == 0.0  # step 2 sampled with step 1's merged weights


def test_gradient_checkpointing_gives_the_same_adapters(tiny_policy, tmp_path):
    runs = [make_trainer(tiny_policy, tiny_config(tmp_path / str(on), *LORA, f"train.gradient_checkpointing={on}"))
            for on in (False, True)]
    for trainer in runs:
        trainer.train_step()
    plain, checkpointed = (dict(t.policy.named_parameters()) for t in runs)
    for name, p in plain.items():
        if ".lora_" in name:
            torch.testing.assert_close(checkpointed[name], p, rtol=0, atol=1e-6, msg=name)
    assert any(p.abs().sum() > 0 for n, p in plain.items() if "lora_B" in n)


@pytest.mark.parametrize("written,resumed,holds", [
    ([], LORA, r"full weights \(a run without model\.lora wrote it\), and this run sets model\.lora"),
    (LORA, [], r"LoRA adapters alone \(a run with model\.lora wrote it\), and this run sets no model\.lora"),
    (LORA, ["model.lora.rank=4", "model.lora.alpha=8"],
     r"the saved adapters do not fit this model's \(model\.lora differs from the run that wrote them\): size mismatch "
     r"for \S+: copying a param with shape torch\.Size\(\[8, 64\]\) from checkpoint, the shape in current model is "
     r"torch\.Size\(\[4, 64\]\)"),
])
def test_a_checkpoint_of_other_lora_settings_is_one_line(tiny_policy, tmp_path, written, resumed, holds):
    """Once a run's config.yaml is deleted, a resume compares no settings (the Trainer built here reads none): a
    checkpoint of the other kind of weights, or of adapters of another rank, was a traceback from PEFT or from a Hub
    download of a folder that is not a model."""
    make_trainer(tiny_policy, tiny_config(tmp_path, *written, "train.steps=1")).fit()
    with pytest.raises(ConfigError, match=rf"^\S+step_000001\b.*{holds}.*; resume with the settings of the run that "
                                          r"wrote it .* or set another run_dir .*\)$"):
        make_trainer(tiny_policy, tiny_config(tmp_path, *resumed, "train.steps=2"))
