"""HFEngine on a tiny random Llama: determinism, padding, log-probs, stopping, interventions."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.distributed.helpers import fixed_batch
from tests.trainer.helpers import tiny_config
from tether.engine import (
    HFEngine,
    Intervention,
    InterventionStep,
    RolloutEngine,
    SamplingParams,
    process_logits,
    sample_tokens,
)
from tether.engine import hf as hf_engine
from tether.models import response_log_probs, tiny_model
from tether.trainer import Trainer

PROMPTS = [[1, 4093, 198, 1780, 314, 216, 39], [1, 4093, 198, 57, 2, 198, 1, 520, 9531, 198], [1, 520, 9531]]
SAMPLE = SamplingParams(max_new_tokens=12, temperature=0.8)
GREEDY = SamplingParams(max_new_tokens=12, greedy=True)


def _assert_same(a, b):
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.sample_log_probs, b.sample_log_probs) and torch.equal(a.truncated, b.truncated)
    assert a.texts == b.texts


def test_is_a_rollout_engine(tiny_policy):
    assert isinstance(HFEngine(*tiny_policy), RolloutEngine)


def test_fixed_seed_is_deterministic_and_leaves_global_rng_alone(tiny_policy):
    engine = HFEngine(*tiny_policy)
    state = torch.random.get_rng_state()
    a = engine.generate(PROMPTS, SAMPLE, seed=7)
    b = engine.generate(PROMPTS, SAMPLE, seed=7)
    c = engine.generate(PROMPTS, SAMPLE, seed=8)
    assert torch.equal(torch.random.get_rng_state(), state)
    _assert_same(a, b)
    assert not torch.equal(a.response_ids, c.response_ids)
    assert a.response_ids.shape == (3, 12) and a.response_mask.all() and a.truncated.all()
    assert engine.generate(PROMPTS, SAMPLE).response_ids.shape[0] == 3  # seed=None works


def test_left_padding_does_not_change_a_prompt(tiny_policy):
    engine = HFEngine(*tiny_policy)
    alone = engine.generate([PROMPTS[2]], GREEDY)
    batched = engine.generate(PROMPTS, GREEDY)
    assert torch.equal(alone.response_ids[0], batched.response_ids[2])
    torch.testing.assert_close(alone.sample_log_probs[0], batched.sample_log_probs[2], rtol=0, atol=1e-5)


def test_a_repeated_prompt_is_prefilled_once_with_the_same_samples(tiny_policy, monkeypatch):
    model, tok = tiny_policy
    grouped = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[2], PROMPTS[0], PROMPTS[1]]
    engine = HFEngine(model, tok)
    sizes = []
    forward = engine.decoder.next_logits
    engine.decoder.next_logits = lambda ids, *a: sizes.append(tuple(ids.shape)) or forward(ids, *a)
    shared = engine.generate(grouped, SAMPLE, seed=3)
    assert sizes[0] == (3, len(PROMPTS[1])) and sizes[1] == (6, 1)  # 3 distinct prompts, then 6 rows
    monkeypatch.setattr(hf_engine, "distinct_prompts", lambda p: ([list(x) for x in p], list(range(len(p)))))
    sizes.clear()
    per_row = engine.generate(grouped, SAMPLE, seed=3)
    assert sizes[0] == (6, len(PROMPTS[1]))
    assert torch.equal(shared.response_ids, per_row.response_ids) and shared.texts == per_row.texts
    torch.testing.assert_close(shared.sample_log_probs, per_row.sample_log_probs, rtol=0, atol=1e-5)
    scored = engine.score(grouped, shared.response_ids, shared.response_mask, temperature=SAMPLE.temperature)
    torch.testing.assert_close(scored, shared.sample_log_probs, rtol=0, atol=1e-4)


def test_sample_log_probs_equal_score(tiny_policy):
    engine = HFEngine(*tiny_policy)
    gen = engine.generate(PROMPTS, SAMPLE, seed=1)
    scored = engine.score(PROMPTS, gen.response_ids, gen.response_mask, temperature=SAMPLE.temperature)
    torch.testing.assert_close(scored, gen.sample_log_probs, rtol=0, atol=1e-4)
    lp, ent = engine.score(PROMPTS, gen.response_ids, gen.response_mask, temperature=0.8, with_entropy=True)
    assert torch.equal(lp, scored) and (ent > 0).all()


def test_score_applies_the_head_in_the_configs_chunks(tiny_policy, tmp_path, monkeypatch):
    """train.logprob_chunk_tokens bounds the [chunk, vocabulary] logits of the engine's scoring too, as of every
    trainer forward; it used to score with the default 1,024 tokens whatever the config said."""
    model, tok = tiny_policy
    engine = Trainer(tiny_config(tmp_path, "train.logprob_chunk_tokens=5"), policy=model, tokenizer=tok).engine
    gen = engine.generate(PROMPTS, SAMPLE, seed=1)
    chunks, real = [], hf_engine.response_log_probs
    monkeypatch.setattr(hf_engine, "response_log_probs",
                        lambda *a, **k: chunks.append(k.get("chunk_size", "default")) or real(*a, **k))
    scored = engine.score(PROMPTS, gen.response_ids, gen.response_mask, temperature=SAMPLE.temperature)
    assert chunks == [5] and gen.response_mask.sum() > 5  # 36 response tokens: 8 head calls
    whole = response_log_probs(model, PROMPTS, gen.response_ids, gen.response_mask, temperature=SAMPLE.temperature,
                               chunk_size=10**6)[0]  # the head in one call
    torch.testing.assert_close(scored, whole, rtol=0, atol=1e-6)


def test_score_runs_in_the_trainers_precision(tiny_policy, tmp_path):
    """Under model.bf16_autocast the engine scores in the trainer's precision (tether.models.autocast, as it decodes):
    row by row, its log-probs are the trainer's scoring of the same rows. It scored in float32."""
    model, tok = tiny_policy
    trainer = Trainer(tiny_config(tmp_path, "model.bf16_autocast=true", "optim.micro_batch_size=1",
                                  "rollout.engine_kwargs.score_rows=1"), policy=model, tokenizer=tok)
    batch = fixed_batch()
    scored = trainer.engine.score(batch.prompt_ids, batch.response_ids, batch.response_mask,
                                  temperature=trainer.cfg.rollout.temperature)
    torch.testing.assert_close(scored, trainer.log_probs(trainer.policy, batch), rtol=0, atol=0)


def test_top_k_1_and_tiny_top_p_are_greedy(tiny_policy):
    engine = HFEngine(*tiny_policy)
    greedy = engine.generate(PROMPTS, GREEDY)
    top_k = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, top_k=1), seed=3)
    top_p = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, top_p=1e-6, temperature=1.5), seed=4)
    assert torch.equal(top_k.response_ids, greedy.response_ids)
    assert torch.equal(top_p.response_ids, greedy.response_ids)
    assert torch.equal(top_k.sample_log_probs, torch.zeros(3, 12))  # sampled from a point mass
    assert (greedy.sample_log_probs < 0).all()  # greedy records the temperature-1 policy log-prob


def test_process_logits_filters():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = process_logits(logits, SamplingParams(top_p=0.75)).exp()
    torch.testing.assert_close(kept, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    kept = process_logits(logits, SamplingParams(top_k=3, temperature=0.5)).exp()
    expected = torch.tensor([0.25, 0.09, 0.0225, 0.0])
    torch.testing.assert_close(kept, (expected / expected.sum())[None])


def test_sample_tokens_follows_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.0, 0.15, 0.05])
    draws = sample_tokens(probs.log().expand(40_000, -1), torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5) / 40_000.0
    assert freq[2] == 0
    torch.testing.assert_close(freq, probs, rtol=0, atol=0.01)


def test_eos_ends_a_row_and_is_kept_in_the_mask(tiny_policy):
    model, tok = tiny_policy
    free = HFEngine(model, tok).generate(PROMPTS, GREEDY)
    eos = int(free.response_ids[0, 2])
    gen = HFEngine(model, tok, eos_token_ids=[eos]).generate(PROMPTS, GREEDY)
    first = (free.response_ids == eos).float().argmax(1)  # each row stops at its first eos, if any
    for i in range(3):
        n = int(first[i]) + 1 if (free.response_ids[i] == eos).any() else 12
        assert gen.response_mask[i].sum() == n and gen.response_mask[i, :n].all()
        assert torch.equal(gen.response_ids[i, :n], free.response_ids[i, :n])
        assert (gen.response_ids[i, n:] == tok.pad_token_id).all()
        assert (gen.sample_log_probs[i, n:] == 0).all()
        assert bool(gen.truncated[i]) == (n == 12 and not (free.response_ids[i] == eos).any())
    assert not gen.truncated[0]


def test_ignore_eos_samples_every_row_to_the_limit(tiny_policy):
    """With EOS and a stop string that would end every row at its first token, ``ignore_eos`` samples as an engine
    with no EOS at all: the same tokens and log-probs, every row to max_new_tokens and truncated."""
    model, tok = tiny_policy
    free = HFEngine(model, tok, eos_token_ids=[]).generate(PROMPTS, SAMPLE, seed=3)
    everything_ends = HFEngine(model, tok, eos_token_ids=free.response_ids.flatten().tolist())
    assert everything_ends.generate(PROMPTS, SAMPLE, seed=3).response_mask.sum(1).tolist() == [1.0, 1.0, 1.0]
    text = free.texts[0][:1]
    gen = everything_ends.generate(PROMPTS, dataclasses.replace(SAMPLE, stop=(text,), ignore_eos=True), seed=3)
    _assert_same(gen, free)
    assert gen.response_mask.all() and gen.truncated.all() and gen.response_ids.shape[1] == SAMPLE.max_new_tokens


def test_stops_early_when_every_row_is_done(tiny_policy):
    model, tok = tiny_policy
    free = HFEngine(model, tok).generate(PROMPTS, GREEDY)
    gen = HFEngine(model, tok, eos_token_ids=free.response_ids[:, 1].tolist()).generate(PROMPTS, GREEDY)
    assert gen.response_ids.shape[1] <= 2 and not gen.truncated.any()


def _staggered(model, tok, prompts):
    """An engine whose EOS set makes the rows finish at different steps, and the forward batch sizes."""
    free = HFEngine(model, tok).generate(prompts, GREEDY)
    engine = HFEngine(model, tok, eos_token_ids=[int(free.response_ids[i, i + 1]) for i in range(4)])
    sizes = []
    forward = engine.decoder.next_logits
    engine.decoder.next_logits = lambda ids, *a: sizes.append(ids.shape[0]) or forward(ids, *a)
    return engine, sizes


def test_finished_rows_are_dropped_without_changing_results(tiny_policy):
    model, tok = tiny_policy
    prompts = PROMPTS + [p[1:] for p in PROMPTS]
    engine, sizes = _staggered(model, tok, prompts)
    dropped = engine.generate(prompts, GREEDY)
    assert min(sizes) < len(prompts) and dropped.response_mask.sum(1).min() < 12
    engine.compact_below = 0.0
    sizes.clear()
    kept = engine.generate(prompts, GREEDY)
    assert set(sizes) == {len(prompts)}
    assert torch.equal(dropped.response_ids, kept.response_ids) and dropped.texts == kept.texts
    assert torch.equal(dropped.response_mask, kept.response_mask)
    torch.testing.assert_close(dropped.sample_log_probs, kept.sample_log_probs, rtol=0, atol=1e-5)
    # sampling, with an intervention that ends rows 0-3 at steps 1-4: rows keep their identity after dropping
    hook = EndRows(eos=7, rows=4)
    engine = HFEngine(model, tok, eos_token_ids=[7])
    sampled = engine.generate(prompts, SAMPLE, seed=2, intervention=hook)
    assert sampled.response_mask.sum(1).tolist() == [2, 3, 4, 5, 12, 12]
    # [N, V] for the hook throughout; rows leave in fours: 4 rows decoded once only 4 are going (after step 2)
    assert hook.widths == [6] * 3 + [4] * 9
    scored = engine.score(prompts, sampled.response_ids, sampled.response_mask, temperature=SAMPLE.temperature)
    torch.testing.assert_close(sampled.sample_log_probs, scored, rtol=0, atol=1e-4)
    assert torch.equal(torch.stack(hook.seen, 1), sampled.response_ids)


class EndRows:
    """Forces token ``eos`` in row i at step i + 1 (i < rows), drawn from the policy's own distribution."""

    def __init__(self, eos: int, rows: int) -> None:
        self.eos, self.rows = eos, rows

    def start(self, prompt_ids):
        self.t, self.seen, self.widths = 0, [], []

    def step(self, policy_log_probs, active):
        assert policy_log_probs.shape[0] == len(active) == 6
        self.widths.append(int((policy_log_probs.std(1) > 1e-6).sum()))  # rows dropped are uniform
        forced = torch.full((6,), -1)
        if 1 <= self.t <= self.rows:
            forced[self.t - 1] = self.eos
        return InterventionStep(behaviour_log_probs=policy_log_probs, forced_tokens=forced)

    def advance(self, tokens):
        self.seen.append(tokens.clone())
        self.t += 1

    def finish(self):
        return {}


def test_stop_string_cuts_text_and_mask(tiny_policy):
    model, tok = tiny_policy
    engine = HFEngine(model, tok)
    params = SamplingParams(max_new_tokens=20, greedy=True)
    free = engine.generate(PROMPTS[:1], params)
    ids = free.response_ids[0].tolist()
    full = tok.decode(ids, skip_special_tokens=False)
    stop = full[len(tok.decode(ids[:6], skip_special_tokens=False)):][:2]  # text right after token 6
    gen = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=20, greedy=True, stop=("never", stop)))
    n = next(k for k in range(1, 21) if stop in tok.decode(ids[:k], skip_special_tokens=False))
    assert int(gen.response_mask.sum()) == n and gen.response_ids[0, :n].tolist() == ids[:n]
    assert gen.texts[0].endswith(stop) and free.texts[0].startswith(gen.texts[0])
    assert gen.texts[0].count(stop) == 1 and not gen.truncated[0]


class ForceAtStep:
    """Forces ``token`` at step ``at`` for row 0 from a made-up behaviour distribution; records a gate."""

    def __init__(self, token: int, at: int = 2) -> None:
        self.token, self.at = token, at

    def start(self, prompt_ids):
        self.t, self.gate, self.seen = 0, [], []

    def step(self, policy_log_probs, active):
        n = policy_log_probs.shape[0]
        gate = torch.zeros(n, dtype=torch.bool)
        self.gate.append(gate)
        if self.t != self.at:
            return None
        gate[0] = True
        behaviour = policy_log_probs.clone()
        behaviour[0] = torch.log_softmax(torch.arange(behaviour.shape[1], dtype=torch.float32) * 1e-4, -1)
        self.behaviour = behaviour
        forced = torch.full((n,), -1)
        forced[0] = self.token
        return InterventionStep(behaviour_log_probs=behaviour, forced_tokens=forced)

    def advance(self, tokens):
        self.seen.append(tokens.clone())
        self.t += 1

    def finish(self):
        return {"gate_mask": torch.stack(self.gate, 1).float(), "too_wide": torch.ones(3, 50)}


def test_intervention_forces_a_token_with_its_behaviour_log_prob(tiny_policy):
    engine = HFEngine(*tiny_policy)
    hook = ForceAtStep(token=4242)
    assert isinstance(hook, Intervention)
    gen = engine.generate(PROMPTS, SAMPLE, seed=5, intervention=hook)
    assert gen.response_ids[0, 2] == 4242
    assert gen.sample_log_probs[0, 2] == hook.behaviour[0, 4242]
    assert torch.equal(torch.stack(hook.seen, 1), gen.response_ids)
    assert gen.token["gate_mask"].shape == (3, 12) and gen.token["gate_mask"][0, 2] == 1
    assert gen.token["gate_mask"].sum() == 1 and gen.token["too_wide"].shape == (3, 12)
    # the other rows at step 2, and every row elsewhere, carry the policy's own log-probs
    scored = engine.score(PROMPTS, gen.response_ids, gen.response_mask, temperature=SAMPLE.temperature)
    off = torch.ones(3, 12, dtype=torch.bool)
    off[0, 2] = False
    torch.testing.assert_close(gen.sample_log_probs[off], scored[off], rtol=0, atol=1e-4)


def test_intervention_returning_none_changes_nothing(tiny_policy):
    engine = HFEngine(*tiny_policy)
    hook = ForceAtStep(token=4242, at=99)
    with_hook = engine.generate(PROMPTS, SAMPLE, seed=5, intervention=hook)
    _assert_same(with_hook, engine.generate(PROMPTS, SAMPLE, seed=5))


class MixWithPrior:
    """The worked example of docs/engine.md: with probability eps, a step's token comes from a prior."""

    def __init__(self, prior_log_probs: torch.Tensor, eps: float, seed: int = 0) -> None:
        self.prior, self.eps = prior_log_probs, eps  # prior: [V] log-probs
        self.generator = torch.Generator().manual_seed(seed)

    def start(self, prompt_ids):
        self.injected = []

    def step(self, policy_log_probs, active):
        n = policy_log_probs.shape[0]
        inject = (torch.rand(n, generator=self.generator) < self.eps) & active
        self.injected.append(inject)
        forced = torch.full((n,), -1)
        if inject.any():
            draws = sample_tokens(self.prior.expand(int(inject.sum()), -1), self.generator)
            forced[inject] = draws
        # Each row's token is drawn from the mixture mu = (1 - eps) pi + eps q: record log mu.
        mu = torch.logaddexp(policy_log_probs + math.log1p(-self.eps), self.prior + math.log(self.eps))
        return InterventionStep(behaviour_log_probs=mu, forced_tokens=forced)

    def advance(self, tokens):
        pass

    def finish(self):
        return {"injected_mask": torch.stack(self.injected, 1).float()}


def test_docs_example_mix_with_prior(tiny_policy):
    engine = HFEngine(*tiny_policy)
    prior = torch.full((49152,), -math.inf)
    prior[[100, 200]] = math.log(0.5)
    gen = engine.generate(PROMPTS, SAMPLE, seed=0, intervention=MixWithPrior(prior, eps=0.999999))
    assert set(gen.response_ids.flatten().tolist()) <= {100, 200}
    torch.testing.assert_close(gen.sample_log_probs, torch.full((3, 12), math.log(0.5)), rtol=0, atol=1e-5)
    gen = engine.generate(PROMPTS, SAMPLE, seed=0, intervention=MixWithPrior(prior, eps=0.3))
    injected = gen.token["injected_mask"].bool()
    assert 0 < injected.sum() < injected.numel()
    assert torch.isin(gen.response_ids[injected], torch.tensor([100, 200])).all()
    scored = engine.score(PROMPTS, gen.response_ids, gen.response_mask, temperature=SAMPLE.temperature)
    assert (gen.sample_log_probs >= scored + math.log(0.7) - 1e-4).all()  # mu >= (1 - eps) pi


def test_training_mode_is_restored(tiny_policy):
    model, tok = tiny_policy
    model.train()
    engine = HFEngine(model, tok)
    gen = engine.generate(PROMPTS, SamplingParams(max_new_tokens=3))
    engine.score(PROMPTS, gen.response_ids, gen.response_mask)
    assert model.training


def test_load_weights(tiny_policy, tokenizer):
    model, tok = tiny_policy
    engine = HFEngine(model, tok)
    engine.load_weights(model.state_dict())  # its own tensors: nothing to copy
    other, _ = tiny_model(seed=1, tokenizer=tokenizer)
    engine.load_weights(other.state_dict())
    _assert_same(engine.generate(PROMPTS, GREEDY), HFEngine(other, tok).generate(PROMPTS, GREEDY))


def test_bf16_autocast_runs(tiny_policy):
    gen = HFEngine(*tiny_policy, bf16_autocast=True).generate(PROMPTS, SAMPLE, seed=0)
    assert gen.sample_log_probs.dtype == torch.float32 and torch.isfinite(gen.sample_log_probs).all()


# -- finished rows leave the batch; static cache --------------------------------------------------------------

MIXED = PROMPTS * 3 + [p[1:] for p in PROMPTS] + [PROMPTS[0]] * 4  # 16 rows, repeated prompts
EARLY_EOS = list(range(3000))  # a fifth of the vocabulary ends a row: lengths from 1 to max_new_tokens
TAIL_CASES = {
    "top-k/top-p": (SamplingParams(max_new_tokens=30, temperature=0.7, top_k=50, top_p=0.9), None),
    "stop strings": (SamplingParams(max_new_tokens=30, stop=("a", "e ")), None),
    "intervention": (SamplingParams(max_new_tokens=30), 0.2),
}


def _tail_run(engine, params, eps):
    prior = torch.log_softmax(torch.randn(engine.model.config.vocab_size, generator=torch.Generator().manual_seed(1)),
                              -1)
    hook = None if eps is None else MixWithPrior(prior, eps=eps)
    return engine.generate(MIXED, params, seed=4, intervention=hook)


def _assert_bit_identical(a, b):
    _assert_same(a, b)
    assert a.token.keys() == b.token.keys() and all(torch.equal(a.token[k], b.token[k]) for k in a.token)


@pytest.mark.parametrize("case", TAIL_CASES)
def test_dropping_finished_rows_keeps_tokens_and_log_probs_bit_identical(tiny_policy, case):
    model, tok = tiny_policy
    params, eps = TAIL_CASES[case]
    sizes = []
    dropping = HFEngine(model, tok, eos_token_ids=EARLY_EOS)
    forward = dropping.decoder.next_logits
    dropping.decoder.next_logits = lambda ids, *a: sizes.append(ids.shape[0]) or forward(ids, *a)
    dropped = _tail_run(dropping, params, eps)
    kept = _tail_run(HFEngine(model, tok, eos_token_ids=EARLY_EOS, compact_below=0), params, eps)
    lengths = kept.response_mask.sum(1)
    assert lengths.min() < lengths.max() and min(sizes) < len(MIXED)  # uneven lengths; the batch shrank
    assert all(s % 4 == 0 for s in sizes[1:])  # after the prefill (of the distinct prompts)
    _assert_bit_identical(dropped, kept)


@pytest.mark.parametrize("case", TAIL_CASES)
def test_static_cache_samples_what_the_dynamic_cache_samples(tiny_policy, case):
    model, tok = tiny_policy
    params, eps = TAIL_CASES[case]
    dynamic = _tail_run(HFEngine(model, tok, eos_token_ids=EARLY_EOS), params, eps)
    engine = HFEngine(model, tok, eos_token_ids=EARLY_EOS, decode="static")
    static = _tail_run(engine, params, eps)
    _assert_bit_identical(static, _tail_run(engine, params, eps))  # a second call resets and reuses the cache
    assert torch.equal(dynamic.response_ids, static.response_ids) and dynamic.texts == static.texts
    assert torch.equal(dynamic.response_mask, static.response_mask)
    # attention over the whole pre-allocated width sums in another order: float32 rounding only
    torch.testing.assert_close(dynamic.sample_log_probs, static.sample_log_probs, rtol=0, atol=1e-5)


def test_compiled_decoding_is_refused_off_a_gpu_before_any_work(tiny_policy):
    with pytest.raises(ValueError, match=r"decode='compiled'\) needs a CUDA GPU .* the model is on cpu"):
        HFEngine(*tiny_policy, decode="compiled")
    with pytest.raises(ValueError, match="unknown decode mode 'fast'"):
        HFEngine(*tiny_policy, decode="fast")
