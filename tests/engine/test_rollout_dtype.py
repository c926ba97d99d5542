"""rollout.dtype: the in-process engine samples from a reduced-precision copy that every update refreshes, vLLM gets
the dtype, and what cannot take it is refused (or warned about) before any model loads."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.helpers import tiny_config
from tether.checks import check_config
from tether.config import ConfigError
from tether.engine import hf, vllm
from tether.trainer import Trainer


def cast_equal(engine_model: torch.nn.Module, policy: torch.nn.Module, dtype: torch.dtype) -> bool:
    theirs = dict(policy.named_parameters())
    return all(p.dtype == dtype and torch.equal(p, theirs[name].detach().to(dtype))
               for name, p in engine_model.named_parameters())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_engine_samples_from_a_cast_copy_refreshed_after_every_update(tmp_path, tiny_policy, dtype):
    model, tok = tiny_policy
    cfg = tiny_config(tmp_path, f"rollout.dtype={dtype}", "rollout.correction.mode=tis", "optim.lr=0.05",
                      "health.parity.patience=0")
    trainer = Trainer(cfg, policy=model, tokenizer=tok)
    sampler = trainer.engine.model
    assert sampler is not trainer.policy
    assert cast_equal(sampler, trainer.policy, getattr(torch, dtype))
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    for _ in range(2):
        metrics = trainer.train_step()
        assert trainer.engine.model is sampler  # the same copy, refreshed in place
        assert cast_equal(sampler, trainer.policy, getattr(torch, dtype))
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters(), strict=True))
    assert all(p.dtype == torch.float32 for p in trainer.policy.parameters())  # the trainer keeps its precision
    # the engine's log-probs are the reduced-precision model's: a real gap, which the correction measures
    assert metrics["rollout_corr/kl_k3"] > 0 and metrics["health/logprob_diff_mean"] > 1e-4


def test_unset_or_the_policys_own_dtype_shares_the_policy(tmp_path, tiny_policy):
    model, tok = tiny_policy
    for extra in ((), ("rollout.dtype=float32",)):
        trainer = Trainer(tiny_config(tmp_path, *extra), policy=model, tokenizer=tok)
        assert trainer.engine.model is trainer.policy


def test_vllm_is_given_the_dtype(tmp_path, monkeypatch, tiny_policy):
    seen = {}
    monkeypatch.setattr(vllm, "check_vllm_available", lambda: None)
    monkeypatch.setattr(vllm, "VLLMEngine", lambda path, tokenizer, **kwargs: seen.update(kwargs))
    model, tok = tiny_policy
    model.name_or_path = "/some/checkpoint"
    cfg = tiny_config(tmp_path)
    vllm.build_vllm_engine(model, tok, cfg.model, dtype="bfloat16")
    assert seen["dtype"] == "bfloat16"
    vllm.build_vllm_engine(model, tok, cfg.model)
    assert seen["dtype"] == "float32"  # unset: the policy's own, as before


@pytest.mark.parametrize(("overrides", "match"), [
    (("rollout.engine=ray", "rollout.dtype=bfloat16"),
     "rollout.dtype=bfloat16: rollout.engine=ray samples in the policy's own dtype; engines that take a sampling "
     "dtype: hf, vllm"),
    (("rollout.dtype=bfloat16", "model.lora.rank=4"), "which is not built with model.lora"),
    (("rollout.engine_kwargs.dtype=bfloat16",), "rollout.engine_kwargs.dtype: set rollout.dtype instead"),
    (("rollout.engine_kwargs.logprob_chunk_tokens=64",),
     "rollout.engine_kwargs.logprob_chunk_tokens: set train.logprob_chunk_tokens instead"),
    (("rollout.dtype=bf16",), "rollout.dtype"),
])
def test_a_dtype_the_engine_cannot_take_is_refused_before_any_model_loads(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        tiny_config(tmp_path, *overrides)


@pytest.mark.parametrize("native", [True, False])
def test_bfloat16_on_a_cpu_without_native_support_warns(tmp_path, monkeypatch, native):
    monkeypatch.setattr(hf, "native_bfloat16_cpu", lambda: native)
    cfg = tiny_config(tmp_path, "rollout.dtype=bfloat16", "train.device=cpu")
    warnings = check_config(cfg, machine=False)
    assert any("without native bfloat16" in w for w in warnings) == (not native)


def test_the_cpu_flags_are_read(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert hf.native_bfloat16_cpu(str(info)) is False
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert hf.native_bfloat16_cpu(str(info)) is True
    assert hf.native_bfloat16_cpu(str(tmp_path / "missing")) is None
    assert hf.speed_flags(str(info)) == ["avx2", "avx512_bf16", "avx512f"]  # fpu is not recorded
    assert hf.speed_flags(str(tmp_path / "missing")) == []
