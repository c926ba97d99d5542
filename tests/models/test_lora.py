"""LoRA adapters on a tiny random Llama: what trains, what the reference is, what engines and checkpoints receive."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft", reason="peft is not installed (pip install -e '.[lora]')")

from tether.config import LoraSettings
from tether.models import load_policy
from tether.models.forward import response_log_probs
from tether.models.lora import (
    BaseModelView,
    adapters_disabled,
    add_lora,
    load_adapter,
    save_adapter,
    serving_state_dict,
)

IDS = torch.tensor([[5, 9, 13, 2, 7, 11]])


def trained_lora(model, seed: int = 1, base_name: str | None = None):
    """``model`` with adapters whose B is random (as after training), so the policy differs from its base."""
    model = add_lora(model, LoraSettings(rank=4, alpha=8), base_name=base_name)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_only_adapter_parameters_train_and_the_policy_starts_as_the_base(tiny_policy):
    model, _ = tiny_policy
    base = logits(model)
    model = add_lora(model, LoraSettings(rank=4, alpha=8))
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 7 * model.config.num_hidden_layers  # A and B of every projection of every layer
    torch.testing.assert_close(logits(model), base, rtol=0, atol=0)  # B starts at zero


def test_a_local_base_is_recorded_by_its_absolute_path(tmp_path, monkeypatch):
    """``model.name=sft/checkpoint`` went into adapter_config.json as written: `tether eval` from another directory
    looked for the base there, then on the Hub, and blamed the checkpoint."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sft" / "checkpoint").mkdir(parents=True)
    model, _ = load_policy("tiny-64x2")
    local = add_lora(model, LoraSettings(rank=4, alpha=8), base_name="sft/checkpoint")
    assert local.peft_config["default"].base_model_name_or_path == str(tmp_path / "sft" / "checkpoint")
    alias = add_lora(load_policy("tiny-64x2")[0], LoraSettings(rank=4, alpha=8), base_name="tiny-64x2")
    assert alias.peft_config["default"].base_model_name_or_path == "tiny-64x2"  # an alias or a Hub id as it is


def test_the_reference_view_is_the_base_model_and_leaves_the_adapters_on(tiny_policy):
    model, _ = tiny_policy
    base = logits(model)
    prompt, response = [[5, 9, 13]], torch.tensor([[2, 7, 11]])
    base_lp, _ = response_log_probs(model, prompt, response, torch.ones_like(response))
    model = trained_lora(model)
    view = BaseModelView(model)
    assert not torch.allclose(logits(model), base)  # the adapters change the policy
    torch.testing.assert_close(logits(view), base, rtol=0, atol=0)
    view_lp, _ = response_log_probs(view, prompt, response, torch.ones_like(response))
    torch.testing.assert_close(view_lp, base_lp, rtol=0, atol=0)
    assert not torch.allclose(response_log_probs(model, prompt, response, torch.ones_like(response))[0], base_lp)
    assert all(p.requires_grad for n, p in model.named_parameters() if ".lora_" in n)  # back on after each call


def test_nested_disabling_restores_the_state_on_entry(tiny_policy):
    model = trained_lora(tiny_policy[0])
    policy = logits(model)
    with adapters_disabled(model):
        base = logits(model)
        with adapters_disabled(model):
            pass
        torch.testing.assert_close(logits(model), base)  # still off after the inner exit
    torch.testing.assert_close(logits(model), policy)


def test_engines_receive_the_merged_weights_under_plain_names(tiny_policy, _tiny_policy_master):
    model = trained_lora(tiny_policy[0])
    plain, _ = _tiny_policy_master
    merged = type(plain)(plain.config)
    merged.load_state_dict(serving_state_dict(model), strict=True)
    torch.testing.assert_close(logits(merged), logits(model), rtol=1e-5, atol=1e-5)
    merged.load_state_dict(BaseModelView(model).state_dict(), strict=True)
    torch.testing.assert_close(logits(merged), logits(plain), rtol=0, atol=0)


def test_saved_adapters_load_into_a_hugging_face_model_with_peft(tiny_policy, _tiny_policy_master, tmp_path):
    from peft import PeftModel

    base_dir = tmp_path / "base"
    _tiny_policy_master[0].save_pretrained(base_dir)
    _tiny_policy_master[1].save_pretrained(base_dir)
    model = trained_lora(tiny_policy[0], base_name=str(base_dir))
    (tmp_path / "adapters").mkdir()
    save_adapter(model, tmp_path / "adapters")
    base, _ = load_policy(str(base_dir))
    peft_model = PeftModel.from_pretrained(base, str(tmp_path / "adapters"))
    torch.testing.assert_close(logits(peft_model), logits(model), rtol=0, atol=0)
    merged, _ = load_policy(str(tmp_path / "adapters"))  # tether eval of a LoRA checkpoint: base + adapters
    torch.testing.assert_close(logits(merged), logits(model), rtol=1e-5, atol=1e-5)


def test_adapters_of_another_rank_are_refused(tiny_policy, _tiny_policy_master, tmp_path):
    import copy

    save_adapter(trained_lora(tiny_policy[0]), tmp_path)
    other = add_lora(copy.deepcopy(_tiny_policy_master[0]), LoraSettings(rank=8, alpha=8))
    with pytest.raises(ValueError, match="do not fit"):
        load_adapter(other, tmp_path)
