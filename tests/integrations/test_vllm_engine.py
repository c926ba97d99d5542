"""The vLLM engine against the HF model it serves: its intervention error always; the engine itself where vLLM can run
(a GPU, or vLLM's CPU build: ``make test-vllm`` installs it in ``.venv-vllm`` and runs this module).

A tiny random Llama (head size 64, which vLLM's CPU attention supports) is saved to disk, served by vLLM in float32,
and compared with the same weights in Hugging Face: sampled log-probs, scores, greedy tokens, pushed weights, and a
whole trainer whose rollouts come from vLLM. A tiny random Qwen2.5-VL, saved with its full processor (which needs
torchvision), is compared the same way on prompts with images. The requests themselves are checked without vLLM in
tests/engine/test_vllm_requests.py.
"""

from __future__ import annotations

import pytest
import torch

from tether.engine.base import EngineUnavailableError, InterventionUnsupportedError, SamplingParams
from tether.engine.hf import HFEngine
from tether.engine.vllm import VLLMEngine, check_vllm_available, row_seeds, separate_cpu_copies
from tether.models import tiny_model

SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]


def vllm_missing() -> str | None:
    try:
        check_vllm_available()
    except EngineUnavailableError as err:
        return str(err)
    return None


needs_vllm = pytest.mark.skipif(vllm_missing() is not None, reason=f"{vllm_missing()} (make test-vllm runs it)")


def test_intervention_raises_a_clear_error_without_building_vllm():
    engine = VLLMEngine.__new__(VLLMEngine)  # no vllm.LLM needed for the check
    with pytest.raises(InterventionUnsupportedError, match="HFEngine"):
        engine.generate([[1]], SamplingParams(), intervention=object())


def test_weights_for_vllm_are_cpu_copies_in_storages_of_their_own():
    model, _ = tiny_model(seed=0)  # tied embeddings: lm_head.weight is embed_tokens.weight
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    copies = separate_cpu_copies(state)
    assert copies.keys() == state.keys() and all(torch.equal(copies[k], state[k]) for k in state)
    assert len({t.untyped_storage().data_ptr() for t in copies.values()}) == len(copies)
    assert not {t.data_ptr() for t in copies.values()} & {t.data_ptr() for t in state.values()}


def test_row_seeds_differ_by_row_and_follow_the_call_seed():
    seeds = row_seeds(7, 4)
    assert len(set(seeds)) == 4 and seeds == row_seeds(7, 4) and seeds != row_seeds(8, 4)
    assert row_seeds(None, 2) == [None, None]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer):
    """(vLLM engine, the HF model it loaded, the model's directory)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the CPU build's default takes 4
    path = tmp_path_factory.mktemp("vllm") / "model"
    model, tok = tiny_model(seed=0, tokenizer=tokenizer, **SHAPE)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    engine = VLLMEngine(str(path), tok, enable_sleep_mode=False, dtype="float32", max_model_len=256)
    yield engine, model, path
    mp.undo()


@needs_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_are_those_of_the_sampling_distribution(served, temperature):
    engine, model, _ = served
    gen = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=temperature), seed=0)
    want = HFEngine(model, engine.tokenizer).score(PROMPTS, gen.response_ids, gen.response_mask,
                                                   temperature=temperature)
    assert gen.response_mask.sum() > len(PROMPTS)
    torch.testing.assert_close(gen.sample_log_probs, want * gen.response_mask, rtol=0, atol=1e-4)


@needs_vllm
def test_rows_of_one_prompt_get_different_samples_and_a_seed_repeats_them(served):
    engine, _, _ = served
    group = [[1, 2, 3]] * 4  # a GRPO group
    gen = engine.generate(group, SamplingParams(max_new_tokens=8), seed=5)
    assert len({tuple(r) for r in gen.response_ids.tolist()}) == 4
    assert torch.equal(engine.generate(group, SamplingParams(max_new_tokens=8), seed=5).response_ids, gen.response_ids)


@needs_vllm
def test_score_and_greedy_tokens_match_the_hf_model(served):
    engine, model, _ = served
    hf = HFEngine(model, engine.tokenizer)
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    gen, want = engine.generate(PROMPTS, greedy), hf.generate(PROMPTS, greedy)
    assert torch.equal(gen.response_ids, want.response_ids)
    torch.testing.assert_close(engine.score(PROMPTS, gen.response_ids, gen.response_mask),
                               hf.score(PROMPTS, gen.response_ids, gen.response_mask), rtol=0, atol=1e-4)


@needs_vllm
def test_pushed_weights_replace_the_served_ones(served, tokenizer):
    engine, model, _ = served
    new, _ = tiny_model(seed=1, tokenizer=tokenizer, **SHAPE)
    # prompts longer than a KV block: where vLLM reuses cached prefixes (its CPU build here did not:
    # num_cached_tokens stayed 0), sampling after the push would read stale blocks without the cache reset
    prompts = [list(range(100 + i, 164 + i)) for i in range(3)]
    gen = engine.generate(prompts, SamplingParams(max_new_tokens=8), seed=3)
    before = engine.score(prompts, gen.response_ids, gen.response_mask)
    engine.load_weights(new.state_dict())
    try:
        after = engine.score(prompts, gen.response_ids, gen.response_mask)
        want = HFEngine(new, tokenizer).score(prompts, gen.response_ids, gen.response_mask)
        torch.testing.assert_close(after, want, rtol=0, atol=1e-4)
        assert (after - before).abs().max() > 0.1  # the new weights, not the old ones
        # sampling after the push, from prompts it has seen before the push
        again = engine.generate(prompts, SamplingParams(max_new_tokens=8), seed=4)
        want = HFEngine(new, tokenizer).score(prompts, again.response_ids, again.response_mask)
        torch.testing.assert_close(again.sample_log_probs, want * again.response_mask, rtol=0, atol=1e-4)
    finally:
        engine.load_weights(model.state_dict())


def vllm_trainer(path, run_dir, **sections):
    from tether.config import load_config
    from tether.trainer import Trainer

    data = {"run_dir": str(run_dir), "model": {"name": str(path)}, "task": {"name": "parity", "kwargs": {}},
            "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8, "engine": "vllm",
                        "engine_kwargs": {"max_model_len": 256}, "max_gen_batches": 10},
            "optim": {"lr": 1e-2}, "val": {"every": 0}, "train": {"steps": 2, "resume": False},
            "logging": {"tensorboard": False, "progress": False}, **sections}
    return Trainer(load_config(data=data))


def samples_like(engine, model, start: dict[str, torch.Tensor]) -> None:
    """``engine`` samples with ``model``'s current weights, which differ from ``start``."""
    from tether.models.forward import response_log_probs

    gen = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8), seed=1)
    now_weights = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        now, _ = response_log_probs(model, PROMPTS, gen.response_ids, gen.response_mask)
        model.load_state_dict(start)
        then, _ = response_log_probs(model, PROMPTS, gen.response_ids, gen.response_mask)
    model.load_state_dict(now_weights)
    torch.testing.assert_close(gen.sample_log_probs, now * gen.response_mask, rtol=0, atol=1e-4)
    assert ((now - then) * gen.response_mask).abs().max() > 1e-3  # the updates moved the weights


@needs_vllm
def test_trainer_rollouts_come_from_the_policy_after_each_update(served, tmp_path):
    trainer = vllm_trainer(served[2], tmp_path / "run")
    assert type(trainer.engine).__name__ == "VLLMEngine"
    start = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    trainer.fit()
    samples_like(trainer.engine, trainer.policy, start)


@needs_vllm
def test_armor_anchors_come_from_a_reference_engine_that_follows_resets(served, tmp_path):
    trainer = vllm_trainer(served[2], tmp_path / "armor", algorithm={"policy_loss": "armor"},
                           methods={"armor": {"ref_n": 2, "reset": "every", "tau": 1}})
    (armor,) = trainer.methods
    assert type(armor.ref_engine).__name__ == "VLLMEngine"
    start = {k: v.clone() for k, v in trainer.ref_policy.state_dict().items()}
    metrics = trainer.fit()
    assert metrics["armor/anchor_rows"] > 0 and metrics["armor/ref_reset"] == 1.0
    samples_like(armor.ref_engine, trainer.ref_policy, start)  # the reset reached the reference's vLLM engine


@pytest.fixture(scope="module")
def served_vlm(tmp_path_factory):
    """(vLLM engine over a tiny random Qwen2.5-VL, the HF model, its processor)."""
    pytest.importorskip("torchvision", reason="Qwen2.5-VL's full processor (its video part) needs torchvision")
    from transformers import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    from tether.models.vision import tiny_vlm

    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    model, tiny = tiny_vlm("qwen2_5_vl", seed=0)
    # vLLM loads the processor with AutoProcessor: the full class, with the tiny one's image settings
    processor = Qwen2_5_VLProcessor(image_processor=tiny.image_processor, tokenizer=tiny.tokenizer,
                                    video_processor=Qwen2VLVideoProcessor(), chat_template=tiny.chat_template)
    path = tmp_path_factory.mktemp("vllm_vlm") / "model"
    model.save_pretrained(path)
    processor.save_pretrained(path)
    engine = VLLMEngine(str(path), processor, enable_sleep_mode=False, dtype="float32", max_model_len=1024)
    yield engine, model, processor
    mp.undo()


@needs_vllm
def test_visual_prompts_sample_and_score_as_the_hf_model_on_the_same_images(served_vlm):
    from tether.envs import make_env
    from tether.models.forward import response_log_probs
    from tether.models.vision import encode_vision_chat

    engine, model, processor = served_vlm
    env = make_env("sokoban_visual")
    a, b = (env.reset(seed).observation.images[0] for seed in (0, 1))
    rows = [encode_vision_chat(processor, "Where is the box? <image>", [a]),
            encode_vision_chat(processor, "Compare <image> and <image>.", [a, b])]
    gen = engine.generate(rows, SamplingParams(max_new_tokens=6), seed=0)
    with torch.no_grad():
        want, _ = response_log_probs(model, rows, gen.response_ids, gen.response_mask)
    assert gen.response_mask.sum() > len(rows)
    torch.testing.assert_close(gen.sample_log_probs, want * gen.response_mask, rtol=0, atol=1e-3)
    torch.testing.assert_close(engine.score(rows, gen.response_ids, gen.response_mask), want * gen.response_mask,
                               rtol=0, atol=1e-3)
