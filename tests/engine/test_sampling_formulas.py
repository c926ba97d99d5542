"""The decoding decisions test_hf_engine.py leaves open, each against a hand-computed or brute-force reference:
temperature is applied before top-p, greedy decoding ignores temperature (and records temperature-1 log-probs), a
stop string that spans several tokens is found, and a response is cut at the earliest stop string it contains."""

from __future__ import annotations

import math

import torch

from tether.engine import HFEngine, SamplingParams, process_logits
from tether.engine.decoding import response_texts

PROBS = [0.5, 0.3, 0.15, 0.05]
PROMPTS = [[1, 4093, 198, 1780, 314, 216, 39], [1, 520, 9531]]


def test_temperature_reshapes_the_distribution_before_top_p_cuts_it():
    logits = torch.tensor([PROBS]).log()
    got = process_logits(logits, SamplingParams(temperature=2.0, top_p=0.75)).exp()
    # temperature 2: q_i ~ sqrt(p_i) = [.3790, .2936, .2076, .1198]; the mass before the third token is .6726 < .75,
    # before the fourth .8802 >= .75: three tokens stay, renormalised (top-p first would have kept two)
    roots = [math.sqrt(p) for p in PROBS]
    want = [r / sum(roots[:3]) for r in roots[:3]] + [0.0]
    torch.testing.assert_close(got, torch.tensor([want]), rtol=0, atol=1e-6)


def test_greedy_ignores_temperature_top_k_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 1.0, 1.0]])
    got = process_logits(logits, SamplingParams(greedy=True, temperature=0.5, top_k=1, top_p=0.1))
    want = logits - logits.exp().sum(-1, keepdim=True).log()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_greedy_records_the_temperature_1_log_prob_whatever_the_temperature(tiny_policy):
    engine = HFEngine(*tiny_policy)
    cold = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, greedy=True, temperature=0.5))
    plain = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, greedy=True))
    assert torch.equal(cold.response_ids, plain.response_ids)
    scored = engine.score(PROMPTS, cold.response_ids, cold.response_mask, temperature=1.0)
    torch.testing.assert_close(cold.sample_log_probs, scored, rtol=0, atol=1e-4)


def test_a_stop_string_spanning_three_tokens_ends_the_row(tiny_policy):
    model, tok = tiny_policy
    engine = HFEngine(model, tok, eos_token_ids=[])
    free = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12, greedy=True))
    ids = free.response_ids[0].tolist()
    pieces = [tok.decode([i]) for i in ids]
    # the end of one token, the whole next one and the start of the one after: no one or two tokens hold it
    i = next(i for i in range(len(ids) - 2) if len(pieces[i]) >= 2 and pieces[i + 1] and pieces[i + 2]
             and (pieces[i][-2:] + pieces[i + 1] + pieces[i + 2][:1]) not in tok.decode(ids[:i + 2]))
    stop = pieces[i][-2:] + pieces[i + 1] + pieces[i + 2][:1]
    assert all(stop not in tok.decode(ids[j:j + 2]) for j in range(len(ids) - 1))
    n = next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k]))  # brute force: the first prefix
    assert n == i + 3
    gen = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12, greedy=True, stop=(stop,)))
    assert int(gen.response_mask.sum()) == n and gen.response_ids[0, :n].tolist() == ids[:n]
    assert gen.texts[0] == tok.decode(ids[:n]).split(stop)[0] + stop and not gen.truncated[0]


def test_a_stopped_response_is_cut_at_the_earliest_stop_string_it_contains(tokenizer):
    text = "hello world, hello"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    tokens = torch.tensor([ids, ids])
    mask = torch.ones_like(tokens, dtype=torch.float32)
    # "o w" ends at character 7, "lo" at 5: the cut is after "hello"; a row not stopped by a string is not cut
    texts = response_texts(tokenizer, tokens, mask, torch.tensor([True, False]), ("o w", "lo"))
    assert texts == ["hello", text]
