"""End-to-end trainer behaviour on a tiny random model: runs, logs, resumes exactly, fails clearly."""

from __future__ import annotations

import json

import pytest
import torch

from tests.trainer.helpers import tiny_config
from tether.algos import LossOutput
from tether.models import tiny_model
from tether.tasks import Score
from tether.trainer import Trainer
from tether.trainer.step import add_micro_metrics, step_values


def make_trainer(cfg):
    model, tok = tiny_model(seed=0)
    return Trainer(cfg, policy=model, tokenizer=tok)


def test_a_run_with_the_default_tensorboard_sink_logs_its_config_and_its_metrics(tmp_path):
    """The helpers turn TensorBoard off; it is on by default, and its config text once stopped every run at its
    start (torch's version in the provenance, a str subclass yaml.safe_dump cannot write)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(tmp_path, "train.steps=1", "logging.tensorboard=true")
    make_trainer(cfg).fit()
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    assert "actor/pg_loss" in events.Tags()["scalars"]
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "provenance:" in text and f"torch: {torch.__version__}" in text


def params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_a_few_steps_change_the_policy_and_write_metrics(tmp_path):
    cfg = tiny_config(tmp_path, "val.every=2", "train.steps=2")
    trainer = make_trainer(cfg)
    before = params(trainer.policy).clone()
    trainer.fit()
    assert not torch.equal(before, params(trainer.policy))
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [x for x in lines if "actor/pg_loss" in x]
    assert [x["step"] for x in train_rows] == [1, 2]
    for row in train_rows:
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "train/reward_mean"):
            assert key in row and row[key] == row[key]  # present and not NaN
    assert any("val/avg@k" in x for x in lines)
    assert (tmp_path / "run" / "checkpoints" / "best" / "trainer_state.pt").is_file()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2


def strict_json(text: str):
    """``json.loads`` refusing Python's ``NaN``/``Infinity``, which are not JSON (``jq`` and most parsers refuse
    them)."""
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_the_summary_of_a_run_without_validation_is_strict_json(tmp_path):
    """With val.every=0 no best value is ever reached: summary.json and stdout said "val/avg@k": -Infinity."""
    trainer = make_trainer(tiny_config(tmp_path, "val.every=0", "train.steps=1"))
    trainer.fit()
    summary = strict_json((tmp_path / "run" / "summary.json").read_text())
    assert summary == {"steps": 1, "best": {"val/avg@k": None}}
    assert strict_json(json.dumps(trainer.summary())) == summary  # what tether train prints


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    straight = make_trainer(tiny_config(tmp_path / "a", "train.steps=4"))
    straight_metrics = [straight.train_step() for _ in range(4)]

    first = make_trainer(tiny_config(tmp_path / "b", "train.steps=4"))
    for _ in range(2):
        first.train_step()
    first.save()
    resumed = make_trainer(tiny_config(tmp_path / "b", "train.steps=4"))
    assert resumed.step == 2
    resumed_metrics = [resumed.train_step() for _ in range(2)]

    for want, got in zip(straight_metrics[2:], resumed_metrics, strict=True):
        assert got["train/reward_mean"] == want["train/reward_mean"]
        assert got["actor/pg_loss"] == pytest.approx(want["actor/pg_loss"], abs=1e-6)
    torch.testing.assert_close(params(resumed.policy), params(straight.policy), rtol=0, atol=1e-6)


def test_micro_batch_size_does_not_change_the_update(tmp_path):
    """The accumulated gradient is compared, not the weights after Adam: Adam's first step is about
    lr * g / (|g| + eps), so a gradient near eps (1e-8) turns float32 rounding into a visible weight change,
    while a wrongly weighted micro-batch would leave the weights almost as they are (Adam is scale-free).
    Clipping is off for the same reason: it would rescale a wrongly weighted gradient back to norm 1."""
    grads, logged = [], []
    for micro in (2, 8):
        trainer = make_trainer(tiny_config(tmp_path / str(micro), f"optim.micro_batch_size={micro}",
                                           "algorithm.loss_agg=seq-mean-token-mean", "algorithm.kl.coef=0.1",
                                           "optim.grad_clip=1e9"))
        logged.append(trainer.train_step())  # one mini-batch: .grad holds its whole gradient after the step
        grads.append(torch.cat([p.grad.flatten() for p in trainer.policy.parameters()]))
    scale = grads[1].abs().max().item()
    assert scale > 1e-3
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-5 * scale)  # float32 sums: about 5e-7 * scale
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss"):  # logged as mini-batch values, not partial sums
        assert logged[0][key] == pytest.approx(logged[1][key], rel=1e-4, abs=1e-6)


def test_micro_batch_metrics_fold_into_token_means_row_means_sums_and_extrema():
    """Two micro-batches of one mini-batch: A has 1 row and 3 response tokens, all clipped, ratio up to 2, 2 of them
    corrected with weight 1.5; B has 3 rows and 1 token, not clipped, ratio up to 5 and down to 0.5, none corrected
    (its weight mean is 0). Over the mini-batch's 4 tokens 3 are clipped; over its 2 corrected ones the weight is 1.5.
    """
    total = {}
    a = {"actor/pg_clipfrac": 1.0, "actor/ratio_max": 2.0, "armor/mix_ratio_min": 0.9, "armor/anchor_frac": 1.0,
         "actor/pg_loss": 0.3, "rollout_corr/weight_mean": 1.5}
    b = {"actor/pg_clipfrac": 0.0, "actor/ratio_max": 5.0, "armor/mix_ratio_min": 0.5, "armor/anchor_frac": 0.0,
         "actor/pg_loss": -0.1, "rollout_corr/weight_mean": 0.0}
    for values, rows, tokens, corrected in ((a, 1, 3, 2), (b, 3, 1, 0)):
        out = LossOutput(torch.tensor(0.0), values,
                         counts={"armor/anchor_frac": rows, "rollout_corr/weight_mean": corrected})
        add_micro_metrics(total, out, tokens=torch.tensor(float(tokens)))
    got = step_values({k: float(v) for k, v in total.items()}, dict.fromkeys(total, 1))
    assert got == pytest.approx({"actor/pg_clipfrac": 3 / 4, "actor/ratio_max": 5.0, "armor/mix_ratio_min": 0.5,
                                 "armor/anchor_frac": 1 / 4, "actor/pg_loss": 0.2, "rollout_corr/weight_mean": 1.5})


def test_separate_old_log_prob_pass_equals_the_detached_forward(tmp_path):
    """Two mini-batches force a scoring pass; at step start pi_old must equal the trainer's forward."""
    trainer = make_trainer(tiny_config(tmp_path, "optim.mini_batches=2"))
    batch, _ = trainer.collect()
    trainer.score(batch)
    again = trainer.log_probs(trainer.policy, batch)
    torch.testing.assert_close(batch.token["old_log_probs"], again, rtol=0, atol=0)


@pytest.mark.parametrize("bf16", [True, False])
def test_the_first_pass_of_an_update_in_mini_batches_is_exactly_on_policy(tmp_path, bf16):
    """pi_old is scored in the update's micro-batches: 8 rows, 2 shuffled mini-batches of 4, micro-batches of 3 and
    1. Scored in other groups (row order, 3 + 3 + 2), a row's log-probs moved with its neighbours by up to 1e-2
    under bf16 autocast (1e-6 in float32), so the first ratio of an on-policy batch was not 1."""
    trainer = make_trainer(tiny_config(tmp_path, "optim.mini_batches=2", "optim.micro_batch_size=3",
                                       f"model.bf16_autocast={str(bf16).lower()}"))
    passes, loss = [], trainer.policy_loss_fn

    def spy(inputs, **kwargs):
        out = loss(inputs, **kwargs)
        passes.append((inputs.log_probs.detach(), inputs.old_log_probs, out.metrics))
        return out

    trainer.policy_loss_fn = spy
    trainer.train_step()
    assert len(passes) == 4  # two micro-batches per mini-batch
    for log_probs, old, metrics in passes[:2]:  # the first mini-batch: the weights pi_old was scored with
        assert (log_probs != 0).any()
        assert torch.equal(log_probs, old)
        assert metrics["actor/ppo_kl"].item() == 0.0 and metrics["actor/pg_clipfrac"].item() == 0.0
    assert any(not torch.equal(log_probs, old) for log_probs, old, _ in passes[2:])  # after one optimiser step


def test_the_kl_term_is_exactly_zero_while_the_reference_is_the_policy(tmp_path):
    """Reference log-probs are scored in the update's micro-batches too: at step 1 the reference equals the policy,
    and under bf16 autocast the k3 term was about 1e-6, not 0, with the reference scored in row order."""
    trainer = make_trainer(tiny_config(tmp_path, "optim.micro_batch_size=3", "model.bf16_autocast=true",
                                       "algorithm.kl.coef=0.1", "algorithm.kl.estimator=k3"))
    assert trainer.train_step()["actor/kl_loss"] == 0.0


def test_kl_term_needs_and_gets_a_frozen_reference(tmp_path):
    trainer = make_trainer(tiny_config(tmp_path, "algorithm.kl.coef=0.1", "algorithm.kl.estimator=k3"))
    ref_before = params(trainer.ref_policy).clone()
    metrics = trainer.train_step()
    assert "actor/kl_loss" in metrics
    assert torch.equal(ref_before, params(trainer.ref_policy))
    assert not any(p.requires_grad for p in trainer.ref_policy.parameters())


def test_dynamic_sampling_gives_up_with_a_clear_error(tmp_path):
    cfg = tiny_config(tmp_path, "rollout.dynamic_sampling=true", "rollout.max_gen_batches=2")
    trainer = make_trainer(cfg)
    trainer.collector.task.score = lambda item, text: Score(reward=0.0, correct=False, extracted=None)
    with pytest.raises(RuntimeError, match="max_gen_batches=2"):
        trainer.train_step()


def test_dapo_overlong_penalty_and_dynamic_sampling_keep_only_informative_groups(tmp_path):
    cfg = tiny_config(tmp_path, "rollout.dynamic_sampling=true", "rollout.max_gen_batches=6",
                      "rollout.overlong.enabled=true", "rollout.overlong.buffer=2")
    trainer = make_trainer(cfg)
    batch, metrics = trainer.collect()
    assert len(batch.group_ids.unique()) == 2
    for gid in batch.group_ids.unique():
        rewards = batch.rewards[batch.group_ids == gid]
        assert (rewards != rewards[0]).any()
    assert metrics["rollout/num_gen_batches"] >= 1


def test_accuracy_all_counts_every_sampled_row_before_the_filters(tmp_path):
    trainer = make_trainer(tiny_config(tmp_path, "rollout.dynamic_sampling=true", "rollout.max_gen_batches=6"))
    scored = []

    def by_group(item, text):
        """Groups of 4 rows in sampling order: all right, then one of four right, then all wrong, repeating."""
        row, group = len(scored) % 4, len(scored) // 4
        correct = (group % 3 == 0) or (group % 3 == 1 and row == 0)
        scored.append(correct)
        return Score(reward=float(correct), correct=correct, extracted=None)

    trainer.collector.task.score = by_group
    batch, metrics = trainer.collect()
    # three generation batches of two groups: right / mixed, wrong / right, mixed / wrong -> 10 of 24 rows
    assert metrics["rollout/num_gen_batches"] == 3 and len(scored) == 24
    assert metrics["rollout/accuracy_all"] == pytest.approx(10 / 24)
    assert batch.correct.float().mean().item() == pytest.approx(0.25)  # the two mixed groups DAPO kept


def test_actor_lr_is_the_rate_each_update_of_the_step_used(tmp_path):
    # warm-up lr x min(1, (s + 1) / 4) at optimiser step s; two mini-batches: steps 0-1, then 2-3
    trainer = make_trainer(tiny_config(tmp_path, "optim.warmup_steps=4", "optim.mini_batches=2", "train.steps=3",
                                       "optim.micro_batch_size=2"))
    logged = [trainer.train_step()["actor/lr"] for _ in range(3)]
    assert logged == pytest.approx([1e-3 * (1 + 2) / 8, 1e-3 * (3 + 4) / 8, 1e-3], rel=1e-12)


def test_a_reference_with_another_tokenizer_is_refused_where_it_loads(tmp_path):
    # the KL reads the reference's log-probs at the policy's token ids: char-64x1's characters are not tiny-64x1's
    from tether.config import ConfigError

    cfg = tiny_config(tmp_path, "model.name=char-64x1", "model.ref_name=tiny-64x1", "algorithm.kl.coef=0.01")
    with pytest.raises(ConfigError, match=r"^model\.ref_name: .*tiny-64x1.*must use the policy's tokenizer"):
        Trainer(cfg)
