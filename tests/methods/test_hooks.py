"""MethodSet: every method's hooks called in config order, and the rules enforced in one place."""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace

import pytest
import torch

from tether.algos import LossOutput
from tether.methods.base import Method, MethodSettings
from tether.methods.hooks import MethodSet

CTX = SimpleNamespace(step=3)  # a StepContext stand-in: the set passes it through untouched


class Recorder(Method):
    """A method that records each hook call in ``calls`` and answers with what it was given."""

    name = "recorder"

    def __init__(self, tag: str, calls: list, *, intervene: bool = False, loss: float | None = None,
                 tokens: frozenset[str] = frozenset()) -> None:
        super().__init__(MethodSettings())
        self.name, self.tag, self.calls, self.intervene, self.loss = tag, tag, calls, intervene, loss
        self.loss_tokens = tokens
        self.restored: dict | None = None

    def intervention(self, ctx):
        self.calls.append((self.tag, "intervention", ctx.step))
        return f"hook of {self.tag}" if self.intervene else None

    def on_generation(self, batch, ctx):
        self.calls.append((self.tag, "on_generation", ctx.step))
        return [*batch, self.tag], {f"{self.tag}/rows": float(len(batch) + 1)}

    def on_advantages(self, batch, ctx):
        batch.token["advantages"].mul_(1.0)  # reading (even in place) keeps the trainer's tensor
        return {f"{self.tag}/adv": float(batch.token["advantages"].sum())}

    def extra_loss(self, inputs, micro, ctx):
        if self.loss is None:
            return None
        return LossOutput(loss=torch.tensor(self.loss), metrics={f"{self.tag}/loss": torch.tensor(self.loss)})

    def state_dict(self):
        return {"tag": self.tag}

    def load_state_dict(self, state):
        self.restored = state


def test_hooks_run_in_config_order_with_the_phase_context():
    calls: list = []
    methods = MethodSet([Recorder("a", calls), Recorder("b", calls)])
    hooks = methods.generation_hooks(CTX)
    batch, metrics = hooks.on_generation(["row"])
    assert batch == ["row", "a", "b"] and metrics == {"a/rows": 2.0, "b/rows": 3.0}
    assert hooks.intervention() is None
    assert calls == [("a", "on_generation", 3), ("b", "on_generation", 3), ("a", "intervention", 3),
                     ("b", "intervention", 3)]


class Counting(Method):
    """Generation metrics of each batch it sees: a mean over rows, one over its hits, a total, a maximum."""

    name = "counting"
    generation_totals = frozenset({"counting/hits"})
    generation_units = MappingProxyType({"counting/hit_value": "counting/hits"})

    def __init__(self) -> None:
        super().__init__(MethodSettings())

    def on_generation(self, batch, ctx):
        hits = [v for v in batch if v > 0]
        return batch[:1], {"counting/mean": sum(batch) / len(batch), "counting/value_max": max(batch),
                           "counting/hits": float(len(hits)), "counting/hit_value": sum(hits) / max(len(hits), 1)}


def test_generation_metrics_fold_over_the_step_by_rows_generated_or_their_units():
    batches = [[3.0, 0.0, 0.0, 1.0], [5.0, 0.0], [0.0, 0.0, 0.0]]  # of 4, 2 and 3 rows: unequal weights
    hooks = MethodSet([Counting()]).generation_hooks(CTX)
    for batch in batches:
        _, metrics = hooks.on_generation(batch)
    rows = [v for batch in batches for v in batch]
    hits = [v for v in rows if v > 0]
    assert metrics == pytest.approx({"counting/mean": sum(rows) / len(rows), "counting/value_max": 5.0,
                                     "counting/hits": 3.0, "counting/hit_value": sum(hits) / len(hits)})
    # a new step's hooks start afresh
    assert MethodSet([Counting()]).generation_hooks(CTX).on_generation([2.0])[1]["counting/mean"] == 2.0


def test_at_most_one_method_intervenes():
    calls: list = []
    assert MethodSet([Recorder("a", calls), Recorder("b", calls, intervene=True)]).intervention(CTX) == "hook of b"
    both = MethodSet([Recorder("a", calls, intervene=True), Recorder("b", calls, intervene=True)])
    with pytest.raises(RuntimeError, match="methods a and b want to intervene in sampling; at most one may"):
        both.intervention(CTX)


def test_a_method_that_replaces_the_advantages_is_stopped_by_name():
    class Replacer(Recorder):
        def on_advantages(self, batch, ctx):
            batch.token["advantages"] = batch.token["advantages"] * 2
            return {}

    batch = SimpleNamespace(token={"advantages": torch.ones(2, 3)})
    assert MethodSet([Recorder("a", [])]).on_advantages(batch, CTX) == {"a/adv": 6.0}
    with pytest.raises(RuntimeError, match=r"methods\.swap replaced the advantages"):
        MethodSet([Recorder("a", []), Replacer("swap", [])]).on_advantages(batch, CTX)



def test_a_method_that_writes_into_the_advantages_is_stopped_by_name():
    """The same tensor with other values passed the identity check: the loss then trained on zeros for row 0."""
    class Writer(Recorder):
        def on_advantages(self, batch, ctx):
            batch.token["advantages"][0] = 0.0
            return {}

    batch = SimpleNamespace(token={"advantages": torch.tensor([[1.0, float("nan")], [2.0, 3.0]])})
    assert "a/adv" in MethodSet([Recorder("a", [])]).on_advantages(batch, CTX)  # reads, in place too: NaN stays NaN
    with pytest.raises(RuntimeError, match=r"methods\.zero wrote into the advantages"):
        MethodSet([Recorder("a", []), Writer("zero", [])]).on_advantages(batch, CTX)

def test_only_declared_tokens_reach_the_loss():
    methods = MethodSet([Recorder("a", [], tokens=frozenset({"t2", "t1"})),
                         Recorder("b", [], tokens=frozenset({"t1"}))])
    assert methods.loss_tokens == ["t1", "t2"]
    micro = SimpleNamespace(token={"t1": torch.zeros(1), "secret": torch.ones(1)})  # t2 absent from this batch
    assert list(methods.loss_token_inputs(micro)) == ["t1"]


def test_extra_terms_add_to_the_loss_in_order_with_their_metrics():
    methods = MethodSet([Recorder("a", [], loss=0.5), Recorder("none", []), Recorder("b", [], loss=0.25)])
    out = methods.extra_loss(torch.tensor(1.0, dtype=torch.float64), None, None, CTX)
    assert out.loss.item() == 1.75 and sorted(out.metrics) == ["a/loss", "b/loss"]


def test_state_round_trips_by_method_name():
    methods = MethodSet([Recorder("a", []), Recorder("b", [])])
    state = methods.state_dict()
    assert state == {"a": {"tag": "a"}, "b": {"tag": "b"}}
    methods.load_state_dict({"a": {"tag": "a"}})  # a checkpoint from before "b" was configured
    assert methods[0].restored == {"tag": "a"} and methods[1].restored == {}


def test_the_state_keys_a_checkpoint_of_an_older_tether_lacks_are_named_and_the_rest_restored():
    """A method's state key added after a checkpoint was written: the method supplies it (the resume warns with these
    names, RunState.resume), and every key the checkpoint has is restored."""
    from tether.methods import build_methods

    methods = MethodSet(build_methods({"eapo": {"threshold_mode": "quantile", "prior": "x", "gate": "entropy"},
                                       "armor": {}}))
    assert methods.load_state_dict({"eapo": {}, "armor": {"resets": 2}}) == ["methods.eapo.threshold",
                                                                             "methods.armor.last_reset"]
    assert methods.state_dict()["armor"] == {"resets": 2, "last_reset": 0}
    assert methods.load_state_dict(methods.state_dict()) == []
