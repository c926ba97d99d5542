"""EAPO plug-in (reconstructed; docs/methods/eapo.md): gate, injection, behaviour log-probs, trainer.

The loss itself is tested in tests/algos/test_eapo_on_cpu.py; here the rollout side and its hand-off to it.
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from tether.algos import LossInputs, eapo, ppo
from tether.algos.eapo_gate import LN2, gate_statistic, js_divergence, mixture_log_probs, scheduled_lambda
from tether.config import ConfigError
from tether.engine import HFEngine, SamplingParams
from tether.methods import METHODS, method_config
from tether.methods.eapo import PriorInjection
from tether.models import tiny_model
from tether.models.forward import response_log_probs
from tether.models.policy import check_vocabulary

PROMPTS = [[1, 4093, 198, 1780, 314, 216, 39], [1, 4093, 198, 57, 2, 198, 1, 520, 9531, 198], [1, 520, 9531]]
SAMPLE = SamplingParams(max_new_tokens=10, temperature=0.8)


def perturbed(model, scale: float = 0.05, seed: int = 1):
    """A copy of ``model`` with Gaussian noise on every weight: a prior close to, but not equal to, it."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out.requires_grad_(False)


def injection(prior, *, gate="js", threshold=-1.0, mix_lambda=1.0, budget=100, params=SAMPLE, seed=0):
    return PriorInjection(prior, gate=gate, threshold=threshold, mix_lambda=mix_lambda, budget=budget,
                          params=params, seed=seed)


class Spy:
    """Wraps an intervention and keeps what the engine gave it and what it answered, per step."""

    def __init__(self, inner) -> None:
        self.inner, self.steps = inner, []

    def start(self, prompt_ids):
        self.inner.start(prompt_ids)

    def step(self, policy_log_probs, active):
        decision = self.inner.step(policy_log_probs, active)
        self.steps.append((policy_log_probs.clone(), decision))
        return decision

    def advance(self, tokens):
        self.inner.advance(tokens)

    def finish(self):
        return self.inner.finish()


def assert_same_generation(a, b):
    for name in ("response_ids", "response_mask", "sample_log_probs", "truncated"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.texts == b.texts


# -- pure math ------------------------------------------------------------------------------------


def test_gate_statistics_hand_values():
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]).log()
    q = torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.25, 0.25, 0.25, 0.25]]).log()
    torch.testing.assert_close(js_divergence(p, q), torch.tensor([LN2, 0.0]))  # disjoint / identical
    torch.testing.assert_close(gate_statistic("entropy", p, q), torch.tensor([LN2, math.log(4)]))
    # max |log q - log p| over tokens both allow: none shared in row 0 -> inf; equal in row 1 -> 0
    assert gate_statistic("max_log_ratio", p, q).tolist() == [math.inf, 0.0]
    a = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64)
    b = torch.tensor([[0.2, 0.2, 0.6]], dtype=torch.float64)
    m = (a + b) / 2
    expected = 0.5 * (a * (a / m).log()).sum() + 0.5 * (b * (b / m).log()).sum()
    torch.testing.assert_close(js_divergence(a.log(), b.log()), expected[None])
    torch.testing.assert_close(gate_statistic("max_log_ratio", a.log(), b.log()), torch.tensor([math.log(6)],
                               dtype=torch.float64))
    with pytest.raises(ValueError, match="gate must be one of"):
        gate_statistic("kl", p, q)


def test_mixture_log_probs_is_log_of_the_mixture():
    g = torch.Generator().manual_seed(0)
    p = torch.randn(3, 7, generator=g, dtype=torch.float64).log_softmax(-1)
    q = torch.randn(3, 7, generator=g, dtype=torch.float64).log_softmax(-1)
    for lam in (0.0, 0.3, 1.0):
        torch.testing.assert_close(mixture_log_probs(p, q, lam), ((1 - lam) * p.exp() + lam * q.exp()).log())
    assert mixture_log_probs(p, q, 1.0) is q and mixture_log_probs(p, q, 0.0) is p


def test_scheduled_lambda():
    assert scheduled_lambda(0.8, "constant", 500, 10) == 0.8
    assert [scheduled_lambda(1.0, "cosine", s, 10) for s in (0, 10, 20)] == [1.0, 0.0, 0.0]
    assert scheduled_lambda(0.5, "cosine", 5, 10) == pytest.approx(0.25)


def test_settings_are_validated():
    assert "eapo" in METHODS
    s = method_config("eapo", {"prior": "runs/x/checkpoints/best"})
    assert (s.gate, s.threshold_mode, s.mix_lambda, s.budget) == ("js", "fixed", 1.0, 4)
    assert (s.schedule, s.prior_temperature) == ("constant", None)
    with pytest.raises(ConfigError, match=r"methods\.eapo\.budgt"):
        method_config("eapo", {"prior": "p", "budgt": 3})
    with pytest.raises(ConfigError, match=r"methods\.eapo\.threshold: .*ln 2"):
        method_config("eapo", {"prior": "p", "threshold": 0.7})
    with pytest.raises(ConfigError, match=r"methods\.eapo\.floor: .*ln 2"):
        method_config("eapo", {"prior": "p", "threshold_mode": "quantile"})
    method_config("eapo", {"prior": "p", "gate": "entropy", "threshold_mode": "quantile"})  # MENTOR's 1.5
    with pytest.raises(ConfigError, match=r"methods\.eapo\.mix_lambda"):
        method_config("eapo", {"prior": "p", "mix_lambda": 1.5})
    with pytest.raises(ConfigError, match=r"methods\.eapo\.prior"):
        method_config("eapo", {})


WHY = "the prior must use the policy's tokenizer"


def test_vocabulary_mismatch_is_a_clear_error(tiny_policy, tokenizer):
    model, tok = tiny_policy
    small, _ = tiny_model(seed=1, tokenizer=tokenizer, vocab_size=1000)
    with pytest.raises(ValueError, match=r"1000-token output layer.*must use the policy's tokenizer"):
        check_vocabulary(model, tok, small, tok, "methods.eapo.prior", "small", WHY)
    other_tok = copy.deepcopy(tokenizer)
    other_tok.add_tokens(["<brand_new_token>"])
    with pytest.raises(ValueError, match="tokenizer of 'other' differs"):
        check_vocabulary(model, tok, model, other_tok, "methods.eapo.prior", "other", WHY)
    check_vocabulary(model, tok, perturbed(model), tok, "methods.eapo.prior", "same", WHY)


# -- rollouts on the HF engine -------------------------------------------------------------------


@pytest.mark.parametrize("knob", [{"budget": 0}, {"mix_lambda": 0.0}, {"threshold": 10.0}])
def test_budget_0_lambda_0_or_closed_gate_gives_bit_identical_rollouts(tiny_policy, knob):
    model, tok = tiny_policy
    engine = HFEngine(model, tok)
    plain = engine.generate(PROMPTS, SAMPLE, seed=3)
    hook = injection(perturbed(model), **{"threshold": -1.0, **knob})
    guided = engine.generate(PROMPTS, SAMPLE, seed=3, intervention=hook)
    assert_same_generation(plain, guided)
    assert guided.token["gate_mask"].sum() == 0 and guided.token["injected_mask"].sum() == 0
    assert guided.token["gate_mask"].shape == plain.response_ids.shape
    assert hook.passive == ("threshold" not in knob)  # budget 0 / lambda 0: the prior never even runs


@pytest.mark.parametrize("mix_lambda", [1.0, 0.5])
def test_stored_behaviour_log_probs_are_log_mu(tiny_policy, mix_lambda):
    model, tok = tiny_policy
    prior = perturbed(model, scale=0.1)
    engine = HFEngine(model, tok)
    spy = Spy(injection(prior, threshold=0.0, mix_lambda=mix_lambda, budget=4))
    gen = engine.generate(PROMPTS, SAMPLE, seed=11, intervention=spy)
    gated, mask = gen.token["gate_mask"] > 0, gen.response_mask > 0
    assert gated.any() and (gated & mask).sum() < mask.sum()  # some gated, some not
    tokens = gen.response_ids
    for t, (policy_lp, decision) in enumerate(spy.steps):
        own = policy_lp.gather(1, tokens[:, t:t + 1]).squeeze(1)
        stored = gen.sample_log_probs[:, t]
        # exactly what was returned as behaviour (or the policy itself off-gate)
        behaviour = decision.behaviour_log_probs if decision is not None else policy_lp
        expected = behaviour.gather(1, tokens[:, t:t + 1]).squeeze(1).masked_fill(~mask[:, t], 0.0)
        assert torch.equal(stored, expected)
        off = mask[:, t] & ~gated[:, t]
        assert torch.equal(stored[off], own[off])
    # and the behaviour at gated tokens is log((1 - lambda) pi_old + lambda pi_prior) of the sampled token,
    # pi_prior recomputed by a plain full forward of the prior (its own KV cache matched the engine's padding)
    own = torch.stack([lp.gather(1, tokens[:, t:t + 1]).squeeze(1) for t, (lp, _) in enumerate(spy.steps)], 1)
    prior_lp, _ = response_log_probs(prior, PROMPTS, tokens, gen.response_mask, temperature=0.8)
    policy_part = own + math.log1p(-mix_lambda) if mix_lambda < 1 else torch.full_like(own, -math.inf)
    mu = torch.logaddexp(policy_part, prior_lp + math.log(mix_lambda))
    torch.testing.assert_close(gen.sample_log_probs[gated & mask], mu[gated & mask], rtol=0, atol=2e-5)


def test_identical_prior_gives_all_weights_one(tiny_policy):
    model, tok = tiny_policy
    engine = HFEngine(model, tok)
    spy = Spy(injection(copy.deepcopy(model).requires_grad_(False), threshold=-1.0, budget=100))
    gen = engine.generate(PROMPTS, SAMPLE, seed=2, intervention=spy)
    mask = gen.response_mask
    assert torch.equal(gen.token["injected_mask"], mask)  # every token came from the prior
    sampled_old = torch.stack([lp.gather(1, gen.response_ids[:, t:t + 1]).squeeze(1) * mask[:, t]
                               for t, (lp, _) in enumerate(spy.steps)], 1)
    # mu is pi_old bit for bit (the prior's forward is the policy's), so rho = 1 exactly ...
    assert torch.equal(gen.sample_log_probs, sampled_old)
    scored = engine.score(PROMPTS, gen.response_ids, mask, temperature=SAMPLE.temperature)
    adv = torch.randn(3, 1).expand_as(mask).contiguous()
    for correction in ("seq_gated", "token"):
        for old, tol in ((sampled_old, 0.0), (scored, 1e-4)):  # ... and ~1 against a fresh scoring pass
            inputs = LossInputs(log_probs=old.clone().requires_grad_(), old_log_probs=old, advantages=adv,
                                response_mask=mask, behaviour_log_probs=gen.sample_log_probs,
                                tokens={k: gen.token[k] for k in ("gate_mask", "injected_mask")})
            out = eapo(inputs, correction=correction)
            assert abs(out.metrics["eapo/is_weight_mean"] - 1) <= tol
            assert abs(out.metrics["eapo/is_weight_max"] - 1) <= tol


def test_gate_does_not_depend_on_the_sampled_token(tiny_policy):
    model, tok = tiny_policy
    prior = perturbed(model, scale=0.005)  # top-2 sets mostly agree, so JS spreads over (0, ln 2)
    engine = HFEngine(model, tok)
    params = SamplingParams(max_new_tokens=5, top_k=2)  # 2 candidates per step: prefixes are often shared
    prompts = [PROMPTS[0]] * 16
    probe = engine.generate(prompts, params, seed=0, intervention=injection(prior, params=params))
    threshold = float(probe.token["eapo_gate_stat"].median())
    # different engine seeds (the sampling RNG), the same intervention seed; lambda = 1, so the
    # injection count, like the gate, is a function of the prefix
    runs = [engine.generate(prompts, params, seed=s,
                            intervention=injection(prior, params=params, threshold=threshold, seed=9))
            for s in (0, 1, 2)]
    gate_of: dict[tuple, float] = {}
    shared = 0
    for gen in runs:
        assert 0 < gen.token["gate_mask"].mean() < 1
        for i in range(len(prompts)):
            for t in range(gen.response_ids.shape[1]):
                prefix = tuple(gen.response_ids[i, :t].tolist())
                g = float(gen.token["gate_mask"][i, t])
                shared += prefix in gate_of
                assert gate_of.setdefault(prefix, g) == g, f"gate differs after the same prefix {prefix}"
    assert shared > 100 and len(gate_of) > 20  # many comparisons, many distinct prefixes
    assert not all(torch.equal(r.response_ids, runs[0].response_ids) for r in runs)


@pytest.mark.parametrize("mix_lambda", [1.0, 0.5])
def test_injected_count_never_exceeds_the_budget(tiny_policy, mix_lambda):
    model, tok = tiny_policy
    engine = HFEngine(model, tok)
    hook = injection(perturbed(model), threshold=-1.0, mix_lambda=mix_lambda, budget=3)
    gen = engine.generate(PROMPTS * 4, SAMPLE, seed=4, intervention=hook)
    injected, gated = gen.token["injected_mask"], gen.token["gate_mask"]
    assert (injected.sum(1) <= 3).all() and (injected <= gated).all()
    if mix_lambda == 1.0:
        assert (injected.sum(1) == 3).all() and torch.equal(injected, gated)  # every gate injects
        assert (injected[:, :3] == 1).all()  # the gate is always open: the first three tokens
    else:
        assert 0 < injected.sum() < gated.sum()
        # once 3 tokens were injected the gate stays shut for the rest of the row
        after = (injected.cumsum(1) - injected) >= 3
        assert (gated[after] == 0).all()


def test_lambda_is_the_injection_probability_at_gated_positions(tiny_policy):
    model, tok = tiny_policy
    engine = HFEngine(model, tok)
    hook = injection(perturbed(model), threshold=-1.0, mix_lambda=0.3, budget=100)
    gen = engine.generate([PROMPTS[2]] * 200, SamplingParams(max_new_tokens=2), seed=0, intervention=hook)
    rate = gen.token["injected_mask"].sum() / gen.token["gate_mask"].sum()
    assert abs(float(rate) - 0.3) < 0.06  # 400 Bernoulli(0.3) draws: 4 standard deviations


# -- the plug-in in the trainer --------------------------------------------------------------------


@pytest.fixture
def prior_dir(tmp_path, tiny_policy):
    model, tok = tiny_policy
    path = tmp_path / "prior"
    perturbed(model, scale=0.1).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def make_trainer(tmp_path, tiny_policy, name, loss="eapo", advantage="grpo", **eapo_settings):
    from tests.trainer.helpers import tiny_config
    from tether.trainer import Trainer

    methods = {"eapo": eapo_settings} if eapo_settings else {}
    cfg = tiny_config(tmp_path / name, algorithm={"policy_loss": loss, "advantage": advantage}, methods=methods)
    model, tok = tiny_policy
    trainer = Trainer(cfg, policy=copy.deepcopy(model), tokenizer=tok)
    batches = []
    collect = trainer.collector.collect

    def keep(*args):
        batch, metrics = collect(*args)
        batches.append(batch)
        return batch, metrics

    trainer.collector.collect = keep
    return trainer, batches


@pytest.mark.parametrize("knob", [{"budget": 0}, {"mix_lambda": 0.0}])
def test_budget_0_or_lambda_0_trains_exactly_like_grpo(tmp_path, tiny_policy, prior_dir, knob):
    grpo, grpo_batches = make_trainer(tmp_path, tiny_policy, "grpo", loss="ppo")
    guided, guided_batches = make_trainer(tmp_path, tiny_policy, "eapo", prior=str(prior_dir), threshold=-1.0,
                                          **knob)
    for _ in range(2):
        a, b = grpo.train_step(), guided.train_step()
        assert a["actor/pg_loss"] == b["actor/pg_loss"] and a["actor/grad_norm"] == b["actor/grad_norm"]
    for x, y in zip(grpo_batches, guided_batches, strict=True):
        for name in ("response_ids", "response_mask", "sample_log_probs", "rewards"):
            assert torch.equal(getattr(x, name), getattr(y, name)), name
        assert torch.equal(x.token["advantages"], y.token["advantages"])
    for p, q in zip(grpo.policy.parameters(), guided.policy.parameters(), strict=True):
        assert torch.equal(p, q)
    assert b["eapo/injected_token_frac"] == 0 and b["eapo/is_weight_mean"] == 1


def test_cosine_schedule_switches_the_prior_off(tmp_path, tiny_policy, prior_dir):
    trainer, _ = make_trainer(tmp_path, tiny_policy, "cos", prior=str(prior_dir), threshold=-1.0,
                              schedule="cosine", decay_steps=2)
    lambdas, injected = [], []
    for _ in range(3):
        metrics = trainer.train_step()
        lambdas.append(metrics["eapo/lambda"])
        injected.append(metrics["eapo/injected_token_frac"])
    assert lambdas == [1.0, 0.5, 0.0] and injected[0] > 0 and injected[2] == 0
    assert trainer.methods[0].intervention(trainer.hook_context()).passive  # the prior no longer runs


def test_guided_training_step(tmp_path, tiny_policy, prior_dir):
    trainer, batches = make_trainer(tmp_path, tiny_policy, "eapo", advantage="clean_baseline", prior=str(prior_dir),
                                    budget=2, threshold_mode="quantile", quantile=0.5, floor=0.0)
    method = trainer.methods[0]
    assert method.threshold == 0.0  # quantile mode starts at the floor
    metrics = trainer.train_step()
    batch = batches[-1]
    injected = batch.token["injected_mask"] * batch.response_mask
    assert injected.sum() > 0 and (injected.sum(1) <= 2).all()
    for key in ("eapo/gated_token_frac", "eapo/injected_token_frac", "eapo/injected_rollouts_frac",
                "eapo/injection_rel_pos", "eapo/js_gated", "eapo/lambda", "eapo/threshold",
                "eapo/is_weight_mean", "eapo/is_weight_max", "eapo/is_ess", "eapo/is_trunc_frac",
                "eapo/clean_baseline_frac"):
        assert key in metrics and metrics[key] == metrics[key], key
    assert metrics["eapo/is_weight_max"] <= 2.0  # the default cap
    # the threshold moved to the median (quantile 0.5, floor 0) of this step's non-injected JS values: for an even
    # count the mean of the two middle values (torch.median would take the lower one)
    clean = (batch.response_mask > 0) & (batch.token["injected_mask"] == 0)
    stats = batch.token["eapo_gate_stat"][clean].float().double().sort().values
    n = stats.numel()
    assert n % 2 == 0 and stats[n // 2 - 1] < stats[n // 2], "this batch no longer tells quantile from median"
    median = float(stats[n // 2 - 1] + stats[n // 2]) / 2
    assert method.threshold == pytest.approx(median, rel=1e-12) and median > 0
    # no gradient ever reaches the prior
    assert all(not p.requires_grad and p.grad is None for p in method.prior.parameters())
    assert not batch.sample_log_probs.requires_grad
    state = method.state_dict()
    fresh = METHODS["eapo"](method.settings)
    fresh.load_state_dict(state)
    assert fresh.threshold == method.threshold


def test_vocabulary_mismatch_stops_the_trainer(tmp_path, tiny_policy, tokenizer):
    small, _ = tiny_model(seed=1, tokenizer=tokenizer, vocab_size=1000)
    small.save_pretrained(tmp_path / "small")
    tokenizer.save_pretrained(tmp_path / "small")
    with pytest.raises(ValueError, match="1000-token output layer"):
        make_trainer(tmp_path, tiny_policy, "bad", prior=str(tmp_path / "small"))


def test_weights_of_real_guided_rollouts_never_exceed_the_cap(tiny_policy):
    model, tok = tiny_policy
    engine = HFEngine(model, tok)
    gen = engine.generate(PROMPTS * 2, SAMPLE, seed=6,
                          intervention=injection(perturbed(model, scale=0.3), threshold=-1.0, budget=3))
    mask = gen.response_mask
    old = engine.score(PROMPTS * 2, gen.response_ids, mask, temperature=SAMPLE.temperature)
    adv = torch.randn(6, 1, generator=torch.Generator().manual_seed(0)).expand_as(mask).contiguous()
    inputs = LossInputs(log_probs=old.clone().requires_grad_(), old_log_probs=old, advantages=adv,
                        response_mask=mask, behaviour_log_probs=gen.sample_log_probs,
                        tokens={k: gen.token[k] for k in ("gate_mask", "injected_mask")})
    for correction in ("seq_gated", "token"):
        out = eapo(inputs, correction=correction, cap=1.5)
        assert out.metrics["eapo/is_weight_max"] <= 1.5
    assert torch.isfinite(eapo(inputs, correction="none").loss) and torch.isfinite(ppo(inputs).loss)


def test_settings_that_cannot_work_together_fail_or_warn(tmp_path, tiny_policy, prior_dir, capsys):
    with pytest.raises(ConfigError, match=r"algorithm\.advantage=clean_baseline needs the per-row injected.*"
                                          r"methods\.eapo.*allowed here: dr_grpo, episode, grpo, qae, rloo$"):
        make_trainer(tmp_path, tiny_policy, "clean", loss="ppo", advantage="clean_baseline")
    with pytest.raises(ConfigError, match=r"advantage_grouping=non_injected goes with algorithm\.advantage grpo or "
                                          r"dr_grpo, got rloo"):
        make_trainer(tmp_path, tiny_policy, "rloo", advantage="rloo", prior=str(prior_dir),
                     advantage_grouping="non_injected")
    make_trainer(tmp_path, tiny_policy, "ppo", loss="ppo", prior=str(prior_dir))
    assert "warning: methods.eapo with algorithm.policy_loss='ppo': injected tokens are then treated as on-policy" \
        in capsys.readouterr().err


def test_log_injections_writes_each_injected_token_with_its_context(tmp_path, tiny_policy, prior_dir):
    trainer, batches = make_trainer(tmp_path, tiny_policy, "log", prior=str(prior_dir), threshold=-1.0, budget=2,
                                    log_injections=3)
    trainer.train_step()
    batch, tok = batches[-1], trainer.tokenizer
    rows = [json.loads(line) for line in (trainer.run_dir / "eapo_injections.jsonl").read_text().splitlines()]
    injected = ((batch.token["injected_mask"] > 0) & (batch.response_mask > 0)).nonzero().tolist()
    assert len(rows) == min(3, len(injected)) > 0
    for r, (row, t) in zip(rows, injected, strict=False):
        ids = batch.response_ids[row].tolist()
        assert (r["row"], r["position"], r["step"]) == (row, t, 0)
        assert r["token"] == tok.decode(ids[t:t + 1])
        assert r["before"] == tok.decode(ids[:t], skip_special_tokens=True)
        assert r["prompt"] == batch.info["item"][row].prompt


def test_with_lora_the_prior_injects_and_only_the_adapters_train(tmp_path, tiny_policy, prior_dir):
    pytest.importorskip("peft", reason="peft is not installed (pip install -e '.[lora]')")
    from tests.trainer.helpers import tiny_config
    from tether.models.lora import BaseModelView
    from tether.trainer import Trainer

    cfg = tiny_config(tmp_path, "model.lora.rank=4", algorithm={"policy_loss": "eapo"},
                      methods={"eapo": {"prior": str(prior_dir), "threshold": -1.0, "budget": 2}})
    model, tok = tiny_policy
    base = copy.deepcopy(model.state_dict())
    trainer = Trainer(cfg, policy=model, tokenizer=tok)
    metrics = trainer.train_step()
    assert metrics["eapo/injected_token_frac"] > 0
    kept = BaseModelView(trainer.policy).state_dict()
    assert all(torch.equal(kept[k], base[k]) for k in base)  # the base weights did not move
    assert any(p.abs().sum() > 0 for n, p in trainer.policy.named_parameters() if "lora_B" in n)  # the adapters did


def test_with_armor_anchors_eapo_metrics_and_quantile_read_only_the_rows_sampled_with_the_prior(
        tmp_path, tiny_policy, prior_dir):
    """ARMOR's anchors come from the reference engine, without the prior: their gate statistics are the zeros the
    batch fills in, not values of the gate. They were counted: the threshold became the median of the on-policy
    values and those zeros (0.1875 instead of 0.1921 here), and eapo/accuracy_clean took in the anchors, correct by
    construction (0.5 instead of the clean on-policy rows' 0.333)."""
    from tests.trainer.helpers import tiny_config
    from tether.trainer import Trainer

    cfg = tiny_config(tmp_path, algorithm={"policy_loss": "eapo"}, rollout={"max_gen_batches": 30},
                      methods={"armor": {"ref_n": 4},
                               "eapo": {"prior": str(prior_dir), "threshold_mode": "quantile", "quantile": 0.5,
                                        "floor": 0.0, "budget": 1, "mix_lambda": 0.05}})
    model, tok = tiny_policy
    trainer = Trainer(cfg, policy=copy.deepcopy(model), tokenizer=tok)
    batches = []
    collect = trainer.collector.collect
    trainer.collector.collect = lambda *args: batches.append(collect(*args)) or batches[-1]
    metrics = trainer.train_step()
    batch = batches[-1][0]
    anchor, mask = batch.source == 1, batch.response_mask > 0
    assert anchor.any()
    on, stat = ~anchor, batch.token["eapo_gate_stat"]
    injected_rows = ((batch.token["injected_mask"] > 0) & mask).any(1)
    clean_on = on & ~injected_rows
    assert clean_on.any() and (injected_rows & on).any()
    assert metrics["eapo/accuracy_clean"] == pytest.approx(batch.correct[clean_on].float().mean().item())
    assert metrics["eapo/injected_rollouts_frac"] == pytest.approx(injected_rows[on].float().mean().item())
    assert metrics["eapo/gate_stat_mean"] == pytest.approx(stat[mask & on[:, None]].mean().item())
    clean_tokens = mask & (batch.token["injected_mask"] == 0)
    want = torch.quantile(stat[clean_tokens & on[:, None]].double(), 0.5).item()
    assert want != torch.quantile(stat[clean_tokens].double(), 0.5).item()  # the anchors' zeros would move it
    assert trainer.methods[1].threshold == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("model_name", ["tiny-qwen2.5-vl", "tiny-idefics3"])
def test_a_vision_language_prior_equal_to_the_policy_gives_its_distribution(tmp_path, model_name):
    """A VLM policy comes with a processor, which has no get_vocab: setup raised AttributeError. And the prior
    decoded with plain 1-D positions where Qwen's multimodal RoPE needs the engine's, so a prior equal to the policy
    gave JS 0.0034 and weights up to 1.27 instead of 0 and 1."""
    from tests.rollout.helpers import agent_config
    from tether.models import load_policy
    from tether.trainer import Trainer

    env = {"name": "sokoban_visual", "kwargs": {"max_solution_steps": 4}} if "qwen" in model_name else \
        {"name": "ezpoints", "kwargs": {}}
    cfg = agent_config(tmp_path, "rollout.prompts_per_step=1", "rollout.group_size=2", "rollout.max_new_tokens=6",
                       "env.max_turns=2", "env.history=1", model={"name": model_name}, env=env,
                       algorithm={"policy_loss": "eapo"},
                       methods={"eapo": {"prior": model_name, "threshold": -1.0, "budget": 2}})
    policy, processor = load_policy(model_name)
    trainer = Trainer(cfg, policy=policy, tokenizer=processor)
    prior = trainer.methods[0].prior.state_dict()
    assert all(torch.equal(v, prior[k]) for k, v in trainer.policy.state_dict().items())  # the same weights
    metrics = trainer.train_step()
    assert metrics["eapo/injected_token_frac"] > 0
    assert metrics["eapo/js_gated"] < 1e-5  # float rounding of two forwards over the same inputs
    assert metrics["eapo/is_weight_max"] == pytest.approx(1.0, abs=1e-4)


def clean_baseline_reference(rewards, group_ids, clean, eps=1e-6):
    """docs/methods/eapo.md's clean baseline, row by row in float64: each group's rows against the mean (and std,
    when there are two unequal ones) of its ``clean`` rows."""
    adv = torch.zeros(len(rewards), dtype=torch.float64)
    for gid in group_ids.unique():
        rows = group_ids == gid
        r, c = rewards[rows].double(), clean[rows]
        if len(r) < 2 or r.max() == r.min():
            continue
        mean = r[c].mean() if c.any() else r.mean()
        std = r[c].std() if c.sum() >= 2 and r[c].max() > r[c].min() else r.std()
        adv[rows] = (r - mean) / (std + eps)
    return adv


def test_with_armor_anchors_the_loss_metrics_and_clean_baseline_count_only_the_rows_the_policy_sampled(
        tmp_path, tiny_policy, prior_dir):
    """ARMOR's anchors come from the reference, never gated by the prior, correct by construction. The loss's
    eapo/gated_frac, injected_frac and is_* counted them (weight 1, nothing gated), and clean_baseline took them
    into the clean rows' mean, the baseline of what the policy reaches alone. One row per micro-batch, so some
    micro-batches hold an anchor alone."""
    from tests.trainer.helpers import tiny_config
    from tether.trainer import Trainer

    cfg = tiny_config(tmp_path, "optim.micro_batch_size=1",
                      algorithm={"policy_loss": "eapo", "advantage": "clean_baseline"},
                      rollout={"max_gen_batches": 30},
                      methods={"armor": {"ref_n": 4}, "eapo": {"prior": str(prior_dir), "threshold": 0.05,
                                                               "budget": 1, "mix_lambda": 0.1}})
    model, tok = tiny_policy
    trainer = Trainer(cfg, policy=copy.deepcopy(model), tokenizer=tok)
    seen = {}
    update = trainer.update

    def keep(batch):  # pi_old: the policy before its one optimiser step
        seen["batch"], seen["old"] = batch, trainer.log_probs(trainer.policy, batch).double()
        return update(batch)

    trainer.update = keep
    metrics = trainer.train_step()
    batch, old = seen["batch"], seen["old"]
    mask = batch.response_mask > 0
    on = (batch.source == 0)[:, None] & mask
    gated, injected = batch.token["gate_mask"] > 0, batch.token["injected_mask"] > 0
    assert (batch.source == 1).any() and (gated & on).any()
    assert metrics["eapo/gated_frac"] == pytest.approx(((gated & on).sum() / on.sum()).item(), abs=1e-6)
    assert metrics["eapo/injected_frac"] == pytest.approx(((injected & on).sum() / on.sum()).item(), abs=1e-6)
    log_w = torch.where(gated & on, old - batch.sample_log_probs.double(), torch.zeros_like(old)).sum(1)
    rows = on.any(1)
    assert metrics["eapo/is_weight_mean"] == pytest.approx(log_w[rows].exp().clamp(max=2.0).mean().item(), abs=1e-5)
    assert metrics["eapo/is_trunc_frac"] == pytest.approx((log_w[rows].exp() > 2.0).double().mean().item(), abs=1e-6)

    injected_rows = (injected & mask).any(1)
    clean = (batch.source == 0) & ~injected_rows
    assert injected_rows.any() and clean.any()
    want = clean_baseline_reference(batch.rewards, batch.group_ids, clean)
    with_anchors = clean_baseline_reference(batch.rewards, batch.group_ids, ~injected_rows)
    assert (want - with_anchors).abs().max() > 0.1  # the anchors would move the baseline
    got = batch.token["advantages"].double()[:, 0]  # every row has a first response token
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
