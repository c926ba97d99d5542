"""``train.gradient_checkpointing: auto``: each micro-batch whose estimated activations exceed
``train.activation_memory_budget_gb`` recomputes its decoder layers and its LM head's logits in backward, the others
keep them, and the gradient is the same either way (float64, right-padded rows as in
tests/trainer/test_token_budget.py)."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.test_token_budget import float64_trainer, update
from tether.models import forward, layers

SMALL_MICRO_BATCHES = "optim.micro_batch_size=3"  # the fixed batch's 10 rows in 4 micro-batches of 3, 3, 3 and 1


def checkpointed_update(policy, path, monkeypatch, *overrides: str, setup=None):
    """(gradient, metrics, each micro-batch's (estimated GiB, layers checkpointed, head logits kept), decoder-layer
    recomputations)."""
    calls = []

    def counting(fn, *args, **kwargs):
        calls.append(fn)
        return torch.utils.checkpoint.checkpoint(fn, *args, **kwargs)

    monkeypatch.setattr(layers, "checkpoint", counting)
    kept = []  # keep_logits of each LM-head chunk under autograd (one chunk per micro-batch here)
    fused = forward.linear_log_probs

    def recording(hidden, *args, keep_logits, **kwargs):
        if hidden.requires_grad:
            kept.append(keep_logits)
        return fused(hidden, *args, keep_logits=keep_logits, **kwargs)

    monkeypatch.setattr(forward, "linear_log_probs", recording)
    trainer = float64_trainer(policy, path, SMALL_MICRO_BATCHES, *overrides)
    if setup is not None:
        setup(trainer)
    choices = []
    choose = trainer._choose_checkpointing
    trainer._choose_checkpointing = lambda *a: choices.append(choose(*a)) or choices[-1]
    grad, metrics, _ = update(trainer)
    # the loss pass's head did as chosen (a head that never runs linear_log_probs is never counted as keeping)
    assert kept == [keep for _, _, keep in choices] if kept else not any(keep for _, _, keep in choices)
    assert not any(on and keep for _, on, keep in choices)  # recomputed layers: the head recomputes too
    return grad, metrics, choices, len(calls)


def test_auto_checkpoints_the_micro_batches_above_the_budget(tiny_policy, tmp_path, monkeypatch):
    monkeypatch.setattr(forward, "_can_pack", lambda model: False)
    want, _, _, none = checkpointed_update(tiny_policy, tmp_path / "off", monkeypatch,
                                           "train.gradient_checkpointing=false")
    assert none == 0
    under, metrics, choices, calls = checkpointed_update(tiny_policy, tmp_path / "under", monkeypatch,
                                                         "train.activation_memory_budget_gb=1000")
    assert calls == 0 and not any(on for _, on, _ in choices) and metrics["perf/checkpointed_micro_batches"] == 0
    assert metrics["perf/head_logits_kept"] == 1
    estimates = sorted({gb for gb, _, _ in choices})
    assert len(estimates) > 1  # micro-batches of different padded sizes
    assert metrics["perf/activation_gb"] == pytest.approx(estimates[-1])
    budget = (estimates[0] + estimates[-1]) / 2
    mixed, metrics, choices, calls = checkpointed_update(tiny_policy, tmp_path / "mixed", monkeypatch,
                                                         f"train.activation_memory_budget_gb={budget}")
    assert [on for _, on, _ in choices] == [gb > budget for gb, _, _ in choices]
    assert 0 < metrics["perf/checkpointed_micro_batches"] < 1
    assert calls == 2 * sum(on for _, on, _ in choices)  # each of the 2 decoder layers once per checkpointed forward
    over, metrics, _, _ = checkpointed_update(tiny_policy, tmp_path / "over", monkeypatch,
                                              "train.activation_memory_budget_gb=1e-9")
    assert metrics["perf/checkpointed_micro_batches"] == 1
    assert want.abs().max() > 1e-3
    for got in (under, mixed, over):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)


def test_true_and_false_keep_their_meaning(tiny_policy, tmp_path, monkeypatch):
    """true recomputes the layers and the head, false never the layers; under false the head keeps its logits
    where the budget fits them (a tiny one here) and recomputes them where it does not (1e-9 GiB)."""
    for setting, budget, checkpointed, kept in (("true", 4, 1, 0), ("false", 4, 0, 1), ("false", 1e-9, 0, 0)):
        _, metrics, _, _ = checkpointed_update(tiny_policy, tmp_path / f"{setting}{budget}", monkeypatch,
                                               f"train.gradient_checkpointing={setting}",
                                               f"train.activation_memory_budget_gb={budget}")
        assert metrics["perf/checkpointed_micro_batches"] == checkpointed
        assert metrics["perf/head_logits_kept"] == kept


def test_a_head_called_as_a_module_is_not_counted_as_keeping(tiny_policy, tmp_path, monkeypatch):
    """A hooked head ignores keep_head_logits (it is called, checkpointed): the metric says so."""
    def hooked(trainer):
        trainer.policy.get_output_embeddings().register_forward_hook(lambda *_: None)

    _, metrics, choices, _ = checkpointed_update(tiny_policy, tmp_path, monkeypatch,
                                                 "train.gradient_checkpointing=false", setup=hooked)
    assert choices and not any(keep for _, _, keep in choices)
    assert metrics["perf/head_logits_kept"] == 0


def test_the_estimates_of_the_decoder_and_the_head_and_what_auto_does_between_them(tiny_policy, tmp_path,
                                                                                   monkeypatch):
    """Decoder tokens x hidden x layers x 19.5 x 8 bytes (float64), and response tokens x vocabulary x 8 for the
    head's kept logits: a budget that fits the layers but not the head as well keeps the layers and recomputes
    the head, with the same gradient."""
    monkeypatch.setattr(forward, "_can_pack", lambda model: False)
    c = tiny_policy[0].config
    sizes = []  # (decoder GiB, head GiB) of each micro-batch, written out

    def written_out(trainer):
        choose = trainer._choose_checkpointing

        def spy(micro, response_tokens):
            assert response_tokens == int(micro.response_mask.sum())  # prefix masks here: exact
            tokens = len(micro) * (micro.width + max(len(p) for p in micro.prompt_ids))  # right-padded rows
            sizes.append((tokens * c.hidden_size * c.num_hidden_layers * layers.ACTIVATION_FACTOR * 8 / 2**30,
                          response_tokens * c.vocab_size * 8 / 2**30))
            return choose(micro, response_tokens)
        trainer._choose_checkpointing = spy

    want, _, choices, _ = checkpointed_update(tiny_policy, tmp_path / "all", monkeypatch, setup=written_out)
    assert len(choices) == len(sizes) == 4
    for (gb, _, _), (decoder, _) in zip(choices, sizes, strict=True):
        assert gb == pytest.approx(decoder, rel=1e-12)
    largest = max(sizes, key=sum)
    assert largest[1] > 0.1 * largest[0]  # a head term that can decide
    budget = largest[0] + largest[1] / 2  # the layers fit; with the head's logits, the largest micro-batch does not
    sizes.clear()
    got, metrics, choices, calls = checkpointed_update(tiny_policy, tmp_path / "between", monkeypatch,
                                                       f"train.activation_memory_budget_gb={budget}",
                                                       setup=written_out)
    assert calls == 0 and metrics["perf/checkpointed_micro_batches"] == 0
    assert [keep for _, _, keep in choices] == [decoder + head <= budget for decoder, head in sizes]
    assert 0 < metrics["perf/head_logits_kept"] < 1
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
