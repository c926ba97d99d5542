"""Token round trip: the trainer refuses rows whose ids or loss mask differ from what the engine sampled."""

from __future__ import annotations

import pytest
import torch

from tests.rollout.helpers import agent_config
from tests.trainer.helpers import tiny_config
from tether.health import HealthMonitor, RecordingEngine, RoundTripError, check_round_trip
from tether.health.round_trip import describe_mismatch
from tether.rollout.batch import RolloutBatch
from tether.trainer import Trainer


def one_row(prompt: list[int], response: list[int], width: int | None = None, source: int = 0) -> RolloutBatch:
    width = width or len(response)
    ids = torch.zeros(1, width, dtype=torch.long)
    ids[0, :len(response)] = torch.tensor(response)
    mask = torch.zeros(1, width)
    mask[0, :len(response)] = 1.0
    return RolloutBatch(prompt_ids=[prompt], response_ids=ids, response_mask=mask,
                        sample_log_probs=torch.zeros(1, width), group_ids=torch.zeros(1, dtype=torch.long),
                        rewards=torch.zeros(1), correct=torch.zeros(1, dtype=torch.bool),
                        source=torch.tensor([source]))


def test_rows_are_checked_against_what_was_sampled(tokenizer):
    hello = tokenizer("Hello there, how are you", add_special_tokens=False).input_ids
    answer = [*tokenizer(" fine thanks", add_special_tokens=False).input_ids, tokenizer.eos_token_id]
    samples = {(tuple(hello), tuple(answer))}
    check_round_trip(one_row(hello, answer, width=len(answer) + 3), samples, tokenizer)  # padding is not trained
    check_round_trip(one_row(hello, [5, 6], source=1), samples, tokenizer)  # anchors come from another engine

    with pytest.raises(RoundTripError, match=r"mask covers 2 tokens where the engine sampled 3: it is off by -1"):
        check_round_trip(one_row(hello, answer[:-1]), samples, tokenizer)  # EOS left out of the loss
    with pytest.raises(RoundTripError, match=r"trained <end>, engine .<\|im_end\|>."):
        check_round_trip(one_row(hello, answer[:-1]), samples, tokenizer)
    with pytest.raises(RoundTripError, match=r"off by \+1"):
        check_round_trip(one_row(hello, [*answer, 0]), samples, tokenizer)  # a pad token inside the mask

    drifted = [*hello[:2], *tokenizer(" th", add_special_tokens=False).input_ids, *hello[3:]]
    assert drifted != hello
    with pytest.raises(RoundTripError) as err:
        check_round_trip(one_row(drifted, answer), samples, tokenizer)
    message = str(err.value)
    assert "the prompt the trainer would train on is not what the engine was given" in message
    assert "prompt token 2 (after ...'Hello there')" in message and "re-tokenised" in message


def test_nothing_recorded_is_named_as_such(tokenizer):
    assert "sampled nothing through trainer.engine" in describe_mismatch(0, ((1,), (2,)), set(), tokenizer)


def test_the_recording_engine_is_the_engine_plus_a_record(tiny_policy):
    from tether.engine.base import SamplingParams
    from tether.engine.hf import HFEngine

    model, tok = tiny_policy
    engine = HFEngine(model, tok)
    samples: set = set()
    recording = RecordingEngine(engine, samples)
    gen = recording.generate([[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=3), seed=0)
    assert recording.model is model and recording.eos_token_ids == engine.eos_token_ids
    lengths = gen.response_mask.sum(1).long().tolist()
    assert samples == {((1, 2, 3), tuple(gen.response_ids[0, :lengths[0]].tolist())),
                       ((4, 5), tuple(gen.response_ids[1, :lengths[1]].tolist()))}


def test_the_trainer_wraps_each_engine_once_in_a_named_call(tmp_path, tiny_policy, monkeypatch):
    """The recorder goes round the run's engine in ``Trainer.use_engine``, the one call that sets it. It was the
    hidden work of a property setter on ``trainer.engine``: building ran it twice (the engine, then the engine
    :func:`~tether.rollout.asynchronous.asynchronous` returned, the same one), and a plain-looking assignment
    replaced what the collector samples with."""
    wrapped, wrap = [], HealthMonitor.wrap
    monkeypatch.setattr(HealthMonitor, "wrap", lambda self, engine: wrapped.append(engine) or wrap(self, engine))
    model, tok = tiny_policy
    trainer = Trainer(tiny_config(tmp_path), policy=model, tokenizer=tok)
    assert wrapped == [trainer.engine]
    assert isinstance(trainer.sampling_engine, RecordingEngine) and trainer.sampling_engine.engine is trainer.engine
    other = object()
    trainer.use_engine(other)
    assert wrapped[1:] == [other] and trainer.engine is other and trainer.sampling_engine.engine is other
    with pytest.raises(AttributeError):  # no second way in that skips the recorder
        trainer.engine = object()


def agent_trainer(tmp_path, tiny_policy) -> Trainer:
    model, tok = tiny_policy
    return Trainer(agent_config(tmp_path, "rollout.max_new_tokens=6", "env.max_turns=2"), policy=model, tokenizer=tok)


def test_agent_turns_train_on_the_sampled_ids(tmp_path, tiny_policy):
    trainer = agent_trainer(tmp_path, tiny_policy)
    engine = trainer.engine
    trainer.train_step()
    assert trainer.engine is engine  # the recorder is gone after collection
    assert len(trainer.health.samples) > 0


def test_agent_turns_retokenised_from_text_are_refused(tmp_path, tiny_policy, monkeypatch):
    """A collector that rebuilds each turn's response from its decoded text, as chat-template round trips do."""
    trainer = agent_trainer(tmp_path, tiny_policy)
    tok, to_batch = trainer.tokenizer, trainer.collector.to_batch

    def retokenised(rows):
        for r in rows:
            ids = [*tok(r["text"], add_special_tokens=False).input_ids, tok.eos_token_id]
            r["response_ids"], r["sample_log_probs"] = torch.tensor(ids), torch.zeros(len(ids))
        return to_batch(rows)

    monkeypatch.setattr(trainer.collector, "to_batch", retokenised)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    with pytest.raises(RoundTripError, match="the response the trainer would train on is not what the engine sampled"):
        trainer.train_step()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters(), strict=True))  # no update


def test_the_check_can_be_switched_off(tmp_path, tiny_policy, monkeypatch):
    model, tok = tiny_policy
    trainer = Trainer(agent_config(tmp_path, "rollout.max_new_tokens=6", "env.max_turns=2",
                                   "health.round_trip.enabled=false"), policy=model, tokenizer=tok)
    to_batch = trainer.collector.to_batch

    def eos_dropped(rows):
        batch = to_batch(rows)
        batch.response_mask[:, 0] = 0.0
        return batch

    monkeypatch.setattr(trainer.collector, "to_batch", eos_dropped)
    trainer.train_step()
