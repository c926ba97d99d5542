"""Whole RL steps on a second device: models land on it, every tensor that reaches the loss is on it, and no op
meets a tensor left on the host.

Each case runs twice where it can: on the simulated device (tests/sim_device.py: ``cpu:0`` plays the GPU, and an
op that mixes it with the host raises as CUDA does), always; and on the machine's real GPU, when there is one
(``train.device: auto`` resolves to it; CUDA itself raises on mixing). The cases run the real trainer: GRPO with a
KL reference, old log-probs, entropy, the overlong penalty, validation, a checkpoint and a resume; the KL penalty
in the reward; ARMOR (anchors from the reference engine, resets); EAPO (a prior in lock-step, non-injected
baselines, the quantile threshold); SEED on a multi-turn env with GiGPO's step advantage.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator

import pytest
import torch

from tests.methods.test_seed_runs import SEED, CannedAnalyzer
from tests.rollout.helpers import ScriptedEngine, agent_config
from tests.sim_device import SIM, SimulatedDevice
from tests.trainer.helpers import tiny_config
from tether.trainer import Trainer


@dataclasses.dataclass
class Place:
    """Where a case runs: ``device``, and the simulation that tracks it (None on a real GPU)."""

    device: torch.device
    sim: SimulatedDevice | None

    def is_on(self, t: torch.Tensor) -> bool:
        return self.sim.is_on(t) if self.sim is not None else t.device == self.device

    def saw_work(self) -> bool:
        """Ops ran on the device at all (so a pass is not a run that never left the host)."""
        if self.sim is not None:
            return self.sim.ops_on_device > 0
        return torch.cuda.max_memory_allocated(self.device) > 0


@pytest.fixture(params=["simulated", "cuda"])
def place(request, monkeypatch) -> Iterator[Place]:
    """The simulated device (``train.device`` resolves to it), or the real GPU (skipped on a machine without)."""
    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no GPU here; the simulated device runs the same case")
        device, context = torch.device("cuda", 0), contextlib.nullcontext()
    else:
        monkeypatch.setattr("tether.start.resolve_device", lambda spec: SIM)
        device, context = SIM, SimulatedDevice()
    with context as sim:
        yield Place(device, sim)


def check_loss_inputs(trainer: Trainer) -> list[str]:
    """Wrap the policy loss: it fails unless every tensor it receives is on ``trainer.device``; returns the
    names of the tensors it has checked."""
    inner, checked = trainer.policy_loss_fn, []

    def loss(inputs, **kwargs):
        tensors = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)} | dict(inputs.tokens)
        for name, value in tensors.items():
            if isinstance(value, torch.Tensor):
                assert value.device == trainer.device, f"LossInputs {name} is on {value.device}"
                checked.append(name)
        return inner(inputs, **kwargs)

    trainer.policy_loss_fn = loss
    return checked


def assert_models_on_the_device(place: Place, trainer: Trainer, *models: torch.nn.Module) -> None:
    assert trainer.device == place.device
    for model in (trainer.policy, *models):
        assert {t.device for t in [*model.parameters(), *model.buffers()]} == {place.device}


def run_steps(trainer: Trainer, *extra: str) -> dict[str, float]:
    """``trainer.fit()``, checking the loss inputs; ``extra``: optional inputs this case must deliver."""
    checked = check_loss_inputs(trainer)
    metrics = trainer.fit()
    assert {"log_probs", "old_log_probs", "advantages", "response_mask", "behaviour_log_probs", "source",
            *extra} <= set(checked)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.startswith("actor/"))
    return metrics


def test_grpo_with_reference_old_log_probs_validation_and_resume(tmp_path, tiny_policy, place):
    model, tok = tiny_policy
    overrides = ["algorithm.kl.coef=0.05", "algorithm.entropy_coef=0.01", "optim.ppo_epochs=2",
                 "rollout.overlong.enabled=true", "rollout.overlong.buffer=2", "val.every=1", "train.steps=1"]
    trainer = Trainer(tiny_config(tmp_path, *overrides), policy=copy.deepcopy(model), tokenizer=tok)
    assert_models_on_the_device(place, trainer, trainer.ref_policy)
    metrics = run_steps(trainer, "ref_log_probs")
    assert "val/avg@k" in metrics
    resumed = Trainer(tiny_config(tmp_path, *overrides, "train.steps=2"), policy=copy.deepcopy(model), tokenizer=tok)
    assert resumed.step == 1
    assert_models_on_the_device(place, resumed, resumed.ref_policy)
    assert all(place.is_on(t) for s in resumed.optimizer.state.values() for k, t in s.items() if k != "step")
    run_steps(resumed, "ref_log_probs")
    assert place.saw_work()


def test_kl_penalty_in_the_reward(tmp_path, tiny_policy, place):
    model, tok = tiny_policy
    trainer = Trainer(tiny_config(tmp_path, "algorithm.kl.coef=0.05", "algorithm.kl.in_reward=true",
                                  "algorithm.advantage=rloo", "optim.mini_batches=2", "train.steps=1"),
                      policy=model, tokenizer=tok)
    assert "reward/kl_penalty" in run_steps(trainer, "ref_log_probs")
    assert place.saw_work()


def test_armor_anchors_and_resets(tmp_path, tiny_policy, place):
    model, tok = tiny_policy
    overrides = ["algorithm.policy_loss=armor", "algorithm.advantage=qae", "methods.armor={ref_n: 2, reset: every, "
                 "tau: 1}", "rollout.gen_batch_prompts=2", "rollout.max_gen_batches=20", "optim.mini_batches=2",
                 "train.steps=1"]
    trainer = Trainer(tiny_config(tmp_path, *overrides), policy=model, tokenizer=tok)
    assert_models_on_the_device(place, trainer, trainer.ref_policy)
    metrics = run_steps(trainer, "ref_log_probs")
    assert metrics["armor/ref_reset"] == 1.0 and metrics["armor/anchor_rows"] > 0


def test_eapo_prior_injection(tmp_path, tiny_policy, place):
    model, tok = tiny_policy
    prior = tmp_path / "prior"
    model.save_pretrained(prior)
    tok.save_pretrained(prior)
    eapo = f"methods.eapo={{prior: {prior}, threshold_mode: quantile, floor: -1.0, mix_lambda: 0.5, budget: 2}}"
    trainer = Trainer(tiny_config(tmp_path, eapo, "algorithm.policy_loss=eapo", "algorithm.advantage=clean_baseline",
                                  "optim.mini_batches=2",
                                  "train.steps=1"), policy=model, tokenizer=tok)
    (method,) = trainer.methods
    assert_models_on_the_device(place, trainer, method.prior)
    metrics = run_steps(trainer, "gate_mask", "injected_mask")
    assert metrics["eapo/injected_token_frac"] > 0 and "eapo/clean_baseline_frac" in metrics


def test_seed_on_an_env_with_step_advantages(tmp_path, tiny_policy, place):
    model, tok = tiny_policy
    cfg = agent_config(tmp_path, "algorithm.advantage=gigpo", "algorithm.kl.coef=0.01", "optim.mini_batches=2",
                       methods={"seed": SEED})
    trainer = Trainer(cfg, policy=model, tokenizer=tok)
    trainer.use_engine(CannedAnalyzer(ScriptedEngine(tok), tok))  # host tensors, as vLLM returns them
    assert_models_on_the_device(place, trainer, trainer.ref_policy)
    metrics = run_steps(trainer, "ref_log_probs", "teacher_log_probs")
    assert metrics["seed/teacher_rows_frac"] > 0 and "train/step_adv_abs_mean" in metrics
