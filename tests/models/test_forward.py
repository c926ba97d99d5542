"""response_log_probs: the sliced, chunked forward against a naive full-logits float64 computation."""

from __future__ import annotations

import copy

import pytest
import torch

from tether.models import forward
from tether.models.forward import pack_prompt_response, response_log_probs
from tether.models.layers import checkpoint_layers

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]


def _responses(lengths, width=6, pad=2):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 5000, (len(lengths), width), generator=g)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).float()
    return ids.masked_fill(mask == 0, pad), mask


def _naive(model, prompts, ids, mask, temperature=1.0):
    """One unpadded row at a time, full logits, float64."""
    lps, ents = torch.zeros(ids.shape, dtype=torch.float64), torch.zeros(ids.shape, dtype=torch.float64)
    for i, p in enumerate(prompts):
        n = int(mask[i].sum())
        seq = torch.tensor([p + ids[i, :n].tolist()])
        logits = model(input_ids=seq).logits[0, len(p) - 1:len(p) - 1 + n].double() / temperature
        logp = logits.log_softmax(-1)
        lps[i, :n] = logp.gather(1, ids[i, :n, None]).squeeze(1)
        ents[i, :n] = -(logp.exp() * logp).sum(-1)
    return lps, ents


def test_pack_layout():
    ids, mask = torch.tensor([[7, 8, 0], [9, 0, 0]]), torch.tensor([[1.0, 1, 0], [1, 0, 0]])
    input_ids, attn, pos, index = pack_prompt_response([[1, 2], [3]], ids, mask, pad_id=0)
    assert input_ids.tolist() == [[1, 2, 7, 8, 0], [3, 9, 0, 0, 0]]
    assert attn.tolist() == [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    assert pos[:, :4].tolist() == [[0, 1, 2, 3], [0, 1, 1, 1]]
    assert index.tolist() == [[1, 2, 3], [0, 1, 2]]


def test_matches_naive_float64_values_and_gradients(tiny_policy, temperature=0.7):
    model64 = copy.deepcopy(tiny_policy[0]).double()
    ids, mask = _responses([6, 3, 0])
    ref_lp, ref_ent = _naive(model64, PROMPTS, ids, mask, temperature)
    ref_lp.mul(mask).sum().backward()
    ref_grads = [p.grad.clone() for p in model64.parameters()]
    model64.zero_grad()

    # float64 model: the sliced, chunked (and checkpointed) path is exact
    lp, ent = response_log_probs(model64, PROMPTS, ids, mask, temperature=temperature, with_entropy=True,
                                 chunk_size=4)
    assert lp.dtype == torch.float64 and lp.requires_grad
    torch.testing.assert_close(lp, ref_lp * mask, rtol=0, atol=1e-10)
    torch.testing.assert_close(ent, ref_ent * mask, rtol=0, atol=1e-10)
    lp.sum().backward()
    for p, g in zip(model64.parameters(), ref_grads, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-7, atol=1e-10)

    # float32 model, as training runs
    lp32, _ = response_log_probs(tiny_policy[0], PROMPTS, ids, mask, temperature=temperature)
    assert lp32.dtype == torch.float32
    torch.testing.assert_close(lp32.double(), ref_lp * mask, rtol=0, atol=2e-4)


def test_full_logits_fallback_agrees(tiny_policy, monkeypatch):
    model = tiny_policy[0]
    ids, mask = _responses([4, 6, 1])
    with torch.no_grad():
        sliced = response_log_probs(model, PROMPTS, ids, mask, with_entropy=True)
        monkeypatch.setattr(forward, "PLAIN_HEAD_MODEL_TYPES", frozenset())
        full = response_log_probs(model, PROMPTS, ids, mask, with_entropy=True)
    torch.testing.assert_close(sliced[0], full[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(sliced[1], full[1], rtol=0, atol=1e-5)


def test_empty_responses(tiny_policy):
    empty = torch.zeros(3, 0, dtype=torch.long)
    lp, ent = response_log_probs(tiny_policy[0], PROMPTS, empty, empty.float(), with_entropy=True)
    assert lp.shape == ent.shape == (3, 0)


# GRPO-shaped batch: rows repeat their prompt (groups of 3 and 2, one singleton), interleaved
GROUPED = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[0]]


def test_distinct_prompts_order_and_inverse():
    unique, inverse = forward.distinct_prompts(GROUPED)
    assert unique == [PROMPTS[0], PROMPTS[1], PROMPTS[2]]
    assert inverse == [0, 1, 0, 2, 1, 0]


def test_pack_rows_layout():
    """Each distinct prompt once, then each of its responses but the last token, at the positions it has alone."""
    prompts = [[1, 2, 3], [4, 5], [1, 2, 3]]
    ids = torch.tensor([[10, 11, 12], [20, 0, 0], [30, 31, 0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 0, 0], [1, 1, 0]])
    packed = forward.pack_rows(prompts, ids, mask)
    assert packed.input_ids.tolist() == [[1, 2, 3, 10, 11, 30], [4, 5, 0, 0, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 0, 0, 0, 0]]
    assert packed.row.tolist() == [[0, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert packed.col[:, 0].tolist() == [2, 1, 2]  # y_0 is predicted by the prompt's last token
    assert packed.col[0, 1:].tolist() == [3, 4] and packed.col[2, 1].item() == 5
    allowed = packed.allowed[0].int().tolist()
    assert allowed[3] == [1, 1, 1, 1, 0, 0]  # 10: the prompt and itself
    assert allowed[4] == [1, 1, 1, 1, 1, 0]  # 11: the prompt, 10 and itself
    assert allowed[5] == [1, 1, 1, 0, 0, 1]  # 30: the prompt and itself, not the other response
    assert packed.allowed[1, 1].int().tolist() == [1, 1, 0, 0, 0, 0]  # no real token sees padding


def test_pack_rows_repeat_a_prompt_past_the_capacity():
    prompts = [[1, 2]] * 3
    ids, mask = _responses([4, 4, 4], width=4)
    packed = forward.pack_rows(prompts, ids, mask, capacity=8)  # 2 + 3 + 3 fits, the third row does not
    assert packed.row[:, 0].tolist() == [0, 0, 1]
    assert packed.input_ids[1, :5].tolist() == [1, 2, *ids[2, :3].tolist()]
    assert forward.pack_rows([[1, 2, 3, 4, 5, 6, 7, 8, 9]], ids[:1], mask[:1], capacity=4).input_ids.shape == (1, 12)


# Hugging Face's eager attention takes its softmax in float32 even in a float64 model (``softmax(..., dtype=
# torch.float32)``), and a packed row's softmax runs over more keys (the masked ones exactly zero) than the row alone:
# the float32 sums round differently with the CPU's vector width (up to 1.3e-7 on an AVX2-only CPU, none on an
# AVX-512 one). SDPA stays in float64.
ATOL = {"sdpa": 1e-10, "eager": 1e-6}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_match_naive_float64_values_and_gradients(tiny_policy, monkeypatch, attention, temperature=0.7):
    """One pass over the packed rows against one unpadded row at a time: same values and gradients."""
    model64 = copy.deepcopy(tiny_policy[0]).double()
    monkeypatch.setattr(model64.config, "_attn_implementation", attention)
    ids, mask = _responses([6, 3, 1, 5, 0, 6])
    ref_lp, ref_ent = _naive(model64, GROUPED, ids, mask, temperature)
    ref_lp.mul(mask).sum().backward()
    ref_grads = [p.grad.clone() for p in model64.parameters()]
    model64.zero_grad()

    calls = []
    model64.model.register_forward_pre_hook(lambda _m, _a, kw: calls.append(kw["input_ids"].shape),
                                            with_kwargs=True)
    lp, ent = response_log_probs(model64, GROUPED, ids, mask, temperature=temperature, with_entropy=True)
    assert calls == [(3, 15)]  # one pass, a row per distinct prompt: 5 + 5 + 0 + 5, 2 + 2 + 0, 3 + 4
    torch.testing.assert_close(lp, ref_lp * mask, rtol=0, atol=ATOL[attention])
    torch.testing.assert_close(ent, ref_ent * mask, rtol=0, atol=ATOL[attention])
    lp.sum().backward()
    # HF's RMSNorm runs in float32 even in a float64 model, so gradients summed over a prompt's rows in a
    # different order agree to float32 precision (1e-6 here); a wrong mask or position is off by far more.
    for p, g in zip(model64.parameters(), ref_grads, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-5)


def test_packed_rows_agree_with_padded_rows_float32(tiny_policy):
    model = tiny_policy[0]
    ids, mask = _responses([1, 4, 6, 2, 3, 6])
    with torch.no_grad():
        packed = response_log_probs(model, GROUPED, ids, mask, with_entropy=True)
        padded = response_log_probs(model, GROUPED, ids, mask, with_entropy=True, pack=False)
    torch.testing.assert_close(packed[0], padded[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(packed[1], padded[1], rtol=0, atol=1e-5)


def test_a_mask_with_a_hole_runs_padded_rows(tiny_policy):
    # pack_rows reads a row's tokens from its mask's sum: a dropped token mid-response must not shift them
    model = tiny_policy[0]
    ids, mask = _responses([1, 4, 6, 2, 3, 6])
    mask[2, 1] = 0.0
    assert forward._prefix_masks(mask[:2]) and not forward._prefix_masks(mask)
    with torch.no_grad():
        packed = response_log_probs(model, GROUPED, ids, mask, with_entropy=True)
        padded = response_log_probs(model, GROUPED, ids, mask, with_entropy=True, pack=False)
    assert torch.equal(packed[0], padded[0]) and torch.equal(packed[1], padded[1])
    assert packed[0][2, 2] != 0 and packed[0][2, 1] == 0


def test_decoder_tokens_count_the_layout_the_forward_runs(tiny_policy, monkeypatch):
    model = tiny_policy[0]
    ids, mask = _responses([1, 4, 6, 2, 3, 6])
    packed = forward.pack_rows(GROUPED, ids, mask).input_ids.numel()
    padded = len(GROUPED) * (max(len(p) for p in GROUPED) + ids.shape[1])
    assert forward.decoder_tokens(model, GROUPED, mask) == packed < padded
    holed = mask.clone()
    holed[2, 1] = 0.0
    assert forward.decoder_tokens(model, GROUPED, holed) == padded  # such a mask runs right-padded
    monkeypatch.setattr(forward, "_can_pack", lambda model: False)
    assert forward.decoder_tokens(model, GROUPED, mask) == padded


def test_packing_needs_a_4d_mask_kernel_and_runs_under_layer_checkpointing(tiny_policy, monkeypatch):
    model64 = copy.deepcopy(tiny_policy[0]).double()
    ids, mask = _responses([6, 3, 1, 5, 0, 6])

    def grads():
        model64.zero_grad()
        response_log_probs(model64, GROUPED, ids, mask)[0].sum().backward()
        return [p.grad.clone() for p in model64.parameters()]

    plain = grads()
    switch = checkpoint_layers(model64, on=True)  # recomputed layers see the same mask and positions
    assert forward._can_pack(model64)
    for got, want in zip(grads(), plain, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    switch.on = False
    monkeypatch.setattr(model64.config, "_attn_implementation", "flash_attention_2")
    assert not forward._can_pack(model64)


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_token_chunks_equal_the_full_logits_path_values_and_gradients(tiny_policy, monkeypatch, chunk):
    """Chunks of real response tokens across rows against the full [N, T, V] logits, in float64: one rounding of
    the same sums (1e-12), for values, entropies and every parameter's gradient, the head's logits recomputed in
    backward or kept (the same arithmetic: equal)."""
    model64 = copy.deepcopy(tiny_policy[0]).double()
    ids, mask = _responses([6, 3, 0, 5, 6, 1])

    def run(**kwargs):
        model64.zero_grad()
        # prompts not shared: the full-logits path packs every row, and HF's float32 RMSNorm would round a shared
        # prompt's gradient sums differently (see the test above)
        lp, ent = response_log_probs(model64, GROUPED, ids, mask, temperature=0.7, with_entropy=True,
                                     pack=False, **kwargs)
        (lp.sum() + 0.3 * ent.sum()).backward()
        return lp.detach(), ent.detach(), [p.grad.clone() for p in model64.parameters()]

    shapes, keeps = [], []
    fused = forward.linear_log_probs

    def recording(hidden, *a, keep_logits, **k):
        shapes.append(hidden.shape)
        keeps.append(keep_logits)
        return fused(hidden, *a, keep_logits=keep_logits, **k)

    monkeypatch.setattr(forward, "linear_log_probs", recording)
    chunked = run(chunk_size=chunk)
    tokens = int(mask.sum())  # 21 real response tokens: padding never reaches the head
    assert [s[0] for s in shapes] == [min(chunk, tokens - s) for s in range(0, tokens, chunk)]
    assert not any(keeps)
    keeps.clear()
    kept = run(chunk_size=chunk, keep_head_logits=True)  # one matmul less, the same numbers
    assert keeps and all(keeps)  # the flag reached every chunk
    for got, want in zip(kept, chunked, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    monkeypatch.setattr(forward, "PLAIN_HEAD_MODEL_TYPES", frozenset())  # the full-logits path, one chunk
    full = run(chunk_size=ids.shape[1])
    torch.testing.assert_close(chunked[0], full[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(chunked[1], full[1], rtol=0, atol=1e-12)
    for got, want in zip(chunked[2], full[2], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_a_hooked_head_is_called_and_gives_the_same_numbers(tiny_policy):
    """A forward hook on the LM head (an interpretability probe, an adapter) must run: such a head is called,
    through the checkpointed chunk, instead of having its weight read by linear_log_probs."""
    model = copy.deepcopy(tiny_policy[0]).double()
    ids, mask = _responses([6, 3, 2])

    def run():
        model.zero_grad()
        lp, ent = response_log_probs(model, PROMPTS, ids, mask, temperature=0.7, with_entropy=True, chunk_size=4)
        (lp.sum() + 0.3 * ent.sum()).backward()
        return [lp.detach(), ent.detach(), *(p.grad.clone() for p in model.parameters())]

    plain = run()
    calls = []
    model.lm_head.register_forward_hook(lambda *_: calls.append(1))
    hooked = run()
    assert len(calls) == 2 * 3  # 11 tokens in chunks of 4: each chunk forward, and again in backward
    for got, want in zip(hooked, plain, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_a_pass_without_response_tokens_still_has_a_graph(tiny_policy):
    """A lock-step pass over rows with no response token runs backward through the head (0 gradient)."""
    model = tiny_policy[0]
    ids, mask = _responses([0, 0, 0])
    lp, _ = response_log_probs(model, PROMPTS, ids, mask)
    assert torch.equal(lp, torch.zeros_like(lp)) and lp.requires_grad
    (lp.sum() * 0.0).backward()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def _tiny_config(model_type: str):
    import transformers

    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
             "vocab_size": 500}
    return {"gpt2": lambda: transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=500, n_positions=64),
            "gpt_neox": lambda: transformers.GPTNeoXConfig(**small),
            "qwen2": lambda: transformers.Qwen2Config(**small, num_key_value_heads=1),
            "qwen3": lambda: transformers.Qwen3Config(**small, num_key_value_heads=1, head_dim=16),
            "mistral": lambda: transformers.MistralConfig(**small, num_key_value_heads=1),
            "phi3": lambda: transformers.Phi3Config(**small, num_key_value_heads=1, pad_token_id=0),
            "olmo2": lambda: transformers.Olmo2Config(**small)}[model_type]()


@pytest.mark.parametrize("model_type", ["gpt2", "gpt_neox", "qwen2", "qwen3", "mistral", "phi3", "olmo2"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_match_naive_float64_on_other_plain_head_architectures(model_type, attention):
    """Each architecture takes the packed rows' 4D mask and positions as given (learned or rotary positions)."""
    from transformers import AutoModelForCausalLM

    assert model_type in forward.PLAIN_HEAD_MODEL_TYPES
    config = _tiny_config(model_type)
    config._attn_implementation = attention
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).double().eval()
    ids, mask = _responses([6, 3, 1, 5, 0, 6], pad=2)
    ids = ids % 500
    with torch.no_grad():
        lp, _ = response_log_probs(model, GROUPED, ids, mask)
        ref, _ = _naive(model, GROUPED, ids, mask)
    torch.testing.assert_close(lp, ref * mask, rtol=0, atol=ATOL[attention])
