"""The character tokenizer and the char-<hidden>x<layers> model family (tether/models/char.py)."""

from __future__ import annotations

import pytest
import torch

from tether.engine.base import SamplingParams
from tether.engine.hf import HFEngine
from tether.models import encode_chat, load_policy
from tether.models.char import ALPHABET, char_model_config, char_tokenizer, parse_char_alias


def test_every_symbol_is_one_token_and_round_trips():
    tok = char_tokenizer()
    assert len(tok) == 100 and len(ALPHABET) == 96
    ids = tok(ALPHABET, add_special_tokens=False).input_ids
    assert len(ids) == len(ALPHABET) and len(set(ids)) == len(ALPHABET)
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == ALPHABET
    for ch in ALPHABET:
        assert tok.decode(tok(ch, add_special_tokens=False).input_ids) == ch


def test_unknown_characters_become_unk_and_specials_are_single_tokens():
    tok = char_tokenizer()
    assert tok("é", add_special_tokens=False).input_ids == [tok.unk_token_id]
    assert tok("</s>", add_special_tokens=False).input_ids == [tok.eos_token_id]
    five, six = tok.convert_tokens_to_ids(["5", "6"])
    assert tok.decode([five, tok.eos_token_id, six], skip_special_tokens=True) == "56"


def test_chat_template_is_short_and_ends_where_the_answer_begins():
    tok = char_tokenizer()
    ids = encode_chat(tok, "12+34")
    assert tok.decode(ids) == "<s>Q:12+34\nA:"
    assert len(ids) == 1 + len("Q:12+34\nA:")
    with_system = tok.decode(encode_chat(tok, "1+1", system="add"))
    assert with_system == "<s>add\nQ:1+1\nA:"


def test_alias_parsing_and_shapes():
    assert parse_char_alias("char-256x4") == (256, 4)
    assert parse_char_alias("char-256") is None and parse_char_alias("smollm2-135m-instruct") is None
    config = char_model_config(256, 4, char_tokenizer())
    assert (config.num_attention_heads, config.num_key_value_heads, config.intermediate_size) == (4, 2, 704)
    with pytest.raises(ValueError, match="multiple of 64"):
        char_model_config(100, 2, char_tokenizer())


@pytest.fixture
def char_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TETHER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_alias_is_created_once_cached_and_loads_like_any_hf_directory(char_cache, tmp_path):
    model, tok = load_policy("char-64x1")
    assert (char_cache / "models" / "char-64x1" / "config.json").is_file()
    again, _ = load_policy("char-64x1")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(),
                                                  strict=True))
    model.save_pretrained(tmp_path / "copy")
    tok.save_pretrained(tmp_path / "copy")
    loaded, loaded_tok = load_policy(str(tmp_path / "copy"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values(),
                                                  strict=True))
    assert loaded_tok.decode(loaded_tok("9+9=18", add_special_tokens=False).input_ids) == "9+9=18"
    assert loaded_tok.padding_side == "left" and loaded_tok.pad_token_id == 0


def test_generation_through_the_engine_and_a_training_step(char_cache):
    model, tok = load_policy("char-64x1")
    engine = HFEngine(model, tok)
    prompts = [encode_chat(tok, "12+34"), encode_chat(tok, "5+6")]
    gen = engine.generate(prompts, SamplingParams(max_new_tokens=5, temperature=1.0), seed=0)
    assert gen.response_ids.shape[0] == 2 and all(isinstance(t, str) for t in gen.texts)
    # the recorded log-probs are those of a direct forward over prompt + response
    from tether.models import response_log_probs

    direct, _ = response_log_probs(model, prompts, gen.response_ids, gen.response_mask)
    mask = gen.response_mask.bool()
    torch.testing.assert_close(direct[mask], gen.sample_log_probs[mask], atol=1e-4, rtol=1e-4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = -(direct * gen.response_mask).sum() / gen.response_mask.sum()
    loss.backward()
    optimizer.step()
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_tiny_alias_builds_the_earlier_studies_model_once(char_cache):
    from tether.models import tiny_model

    model, tok = load_policy("tiny-64x2")
    assert (char_cache / "models" / "tiny-64x2" / "config.json").is_file()
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.vocab_size) == (64, 2, 2, 1, 128, len(tok))
    direct, _ = tiny_model(0, tokenizer=tok, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, initializer_range=0.02)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), direct.state_dict().values(),
                                                  strict=True))
