"""Whole RL steps on a simulated second device: models land on it, every tensor that reaches the loss is on it,
and no op meets a tensor left on the host (tests/sim_device.py: ``cpu:0`` plays the GPU, and an op that mixes it
with the host raises as CUDA does).

Each case runs the real trainer with ``train.device`` resolved to the simulated device: GRPO with a KL reference,
old log-probs, entropy, the overlong penalty, validation, a checkpoint and a resume; the KL penalty in the reward;
ARMOR (anchors from the reference engine, resets); EAPO (a prior in lock-step, non-injected baselines, the
quantile threshold); SEED on a multi-turn env with GiGPO's step advantage.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tests.methods.test_seed_runs import SEED, CannedAnalyzer
from tests.rollout.helpers import ScriptedEngine, agent_config
from tests.sim_device import SIM, SimulatedDevice
from tests.trainer.helpers import tiny_config
from tether.trainer import Trainer

pytestmark = pytest.mark.usefixtures("toy_task")  # the toy task of tests/trainer/helpers.py, per test


@pytest.fixture(autouse=True)
def sim_device(monkeypatch):
    """``train.device`` resolves to the simulated device."""
    monkeypatch.setattr("tether.trainer.trainer.resolve_device", lambda spec: SIM)


def check_loss_inputs(trainer: Trainer) -> list[str]:
    """Wrap the policy loss: it fails unless every tensor it receives is on ``trainer.device``; returns the
    names of the tensors it has checked."""
    inner, checked = trainer.policy_loss_fn, []

    def loss(inputs, **kwargs):
        for f in dataclasses.fields(inputs):
            value = getattr(inputs, f.name)
            if isinstance(value, torch.Tensor):
                assert value.device == trainer.device, f"LossInputs.{f.name} is on {value.device}"
                checked.append(f.name)
        return inner(inputs, **kwargs)

    trainer.policy_loss_fn = loss
    return checked


def assert_models_on_the_device(trainer: Trainer, *models: torch.nn.Module) -> None:
    assert trainer.device == SIM
    for model in (trainer.policy, *models):
        assert {t.device for t in [*model.parameters(), *model.buffers()]} == {SIM}


def run_steps(trainer: Trainer, *extra: str) -> dict[str, float]:
    """``trainer.fit()``, checking the loss inputs; ``extra``: optional inputs this case must deliver."""
    checked = check_loss_inputs(trainer)
    metrics = trainer.fit()
    assert {"log_probs", "old_log_probs", "advantages", "response_mask", "behaviour_log_probs", "source",
            *extra} <= set(checked)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.startswith("actor/"))
    return metrics


def test_grpo_with_reference_old_log_probs_validation_and_resume(tmp_path, tiny_policy):
    model, tok = tiny_policy
    overrides = ["algorithm.kl.coef=0.05", "algorithm.entropy_coef=0.01", "optim.ppo_epochs=2",
                 "rollout.overlong.enabled=true", "rollout.overlong.buffer=2", "val.every=1", "train.steps=1"]
    with SimulatedDevice() as sim:
        trainer = Trainer(tiny_config(tmp_path, *overrides), policy=copy.deepcopy(model), tokenizer=tok)
        assert_models_on_the_device(trainer, trainer.ref_policy)
        metrics = run_steps(trainer, "ref_log_probs")
        assert "val/avg@k" in metrics
        resumed = Trainer(tiny_config(tmp_path, *overrides, "train.steps=2"), policy=copy.deepcopy(model),
                          tokenizer=tok)
        assert resumed.step == 1
        assert_models_on_the_device(resumed, resumed.ref_policy)
        assert all(sim.is_on(t) for s in resumed.optimizer.state.values() for k, t in s.items() if k != "step")
        run_steps(resumed, "ref_log_probs")
        assert sim.ops_on_device > 0


def test_kl_penalty_in_the_reward(tmp_path, tiny_policy):
    model, tok = tiny_policy
    with SimulatedDevice():
        trainer = Trainer(tiny_config(tmp_path, "algorithm.kl.coef=0.05", "algorithm.kl.in_reward=true",
                                      "algorithm.advantage=rloo", "optim.mini_batches=2", "train.steps=1"),
                          policy=model, tokenizer=tok)
        assert "reward/kl_penalty" in run_steps(trainer, "ref_log_probs")


def test_armor_anchors_and_resets(tmp_path, tiny_policy):
    model, tok = tiny_policy
    overrides = ["algorithm.policy_loss=armor", "algorithm.advantage=qae", "methods.armor={ref_n: 2, reset: every, "
                 "tau: 1}", "rollout.gen_batch_prompts=2", "rollout.max_gen_batches=20", "optim.mini_batches=2",
                 "train.steps=1"]
    with SimulatedDevice():
        trainer = Trainer(tiny_config(tmp_path, *overrides), policy=model, tokenizer=tok)
        assert_models_on_the_device(trainer, trainer.ref_policy)
        metrics = run_steps(trainer, "ref_log_probs")
        assert metrics["armor/ref_reset"] == 1.0 and "armor/acceptance_rate" in metrics


def test_eapo_prior_injection(tmp_path, tiny_policy):
    model, tok = tiny_policy
    prior = tmp_path / "prior"
    model.save_pretrained(prior)
    tok.save_pretrained(prior)
    eapo = (f"methods.eapo={{prior: {prior}, threshold_mode: quantile, floor: -1.0, mix_lambda: 0.5, budget: 2, "
            "advantage_grouping: non_injected}")
    with SimulatedDevice():
        trainer = Trainer(tiny_config(tmp_path, eapo, "algorithm.policy_loss=eapo", "optim.mini_batches=2",
                                      "train.steps=1"), policy=model, tokenizer=tok)
        (method,) = trainer.methods
        assert_models_on_the_device(trainer, method.prior)
        metrics = run_steps(trainer, "gate_mask", "injected_mask")
        assert metrics["eapo/injected_token_frac"] > 0 and "eapo/clean_baseline_frac" in metrics


def test_seed_on_an_env_with_step_advantages(tmp_path, tiny_policy):
    model, tok = tiny_policy
    cfg = agent_config(tmp_path, "env.step_grouping=true", "algorithm.kl.coef=0.01", "optim.mini_batches=2",
                       methods={"seed": SEED})
    with SimulatedDevice():
        trainer = Trainer(cfg, policy=model, tokenizer=tok)
        trainer.engine = CannedAnalyzer(ScriptedEngine(tok), tok)  # host tensors, as vLLM returns them
        assert_models_on_the_device(trainer, trainer.ref_policy)
        metrics = run_steps(trainer, "ref_log_probs", "teacher_log_probs")
        assert metrics["seed/teacher_rows_frac"] > 0 and "train/step_adv_abs_mean" in metrics
