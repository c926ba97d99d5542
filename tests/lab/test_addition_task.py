"""The lab's addition task: carries, scratchpad, splits that never overlap (tether/tasks/addition.py)."""

from __future__ import annotations

import pytest

from tether.tasks import make_task, task_split
from tether.tasks.addition import carries_of, demonstration, extract_final, response_mode, scratchpad
from tether.tasks.metrics import feature_metrics


def _direct_carries(a: int, b: int) -> int:
    """Carries by comparing digit sums: a column carries when its digits plus the carry in reach 10."""
    count = carry = 0
    for x, y in zip(str(a).zfill(10)[::-1], str(b).zfill(10)[::-1], strict=True):
        carry = int(int(x) + int(y) + carry >= 10)
        count += carry
    return count


@pytest.mark.parametrize(("a", "b"), [(478, 356), (999, 999), (123, 456), (500, 500), (5, 95), (1, 9)])
def test_carries_match_a_direct_count(a, b):
    assert carries_of(a, b) == _direct_carries(a, b)


def test_scratchpad_format_and_final_answer():
    assert scratchpad(478, 356) == "8+6=14:4,7+5+1=13:34,4+3+1=8:834#834"
    assert scratchpad(999, 999) == "9+9=18:8,9+9+1=19:98,9+9+1=19:1998#1998"
    for a in range(100, 1000, 37):
        for b in range(100, 1000, 53):
            text = scratchpad(a, b)
            assert extract_final(text) == str(a + b)
            # the growing suffix of the last column is the answer
            assert text.split("#")[0].rsplit(":", 1)[1] == str(a + b)
    assert demonstration(12, 34, "direct") == "#46"
    with pytest.raises(ValueError, match="mode"):
        demonstration(1, 2, "verbose")


@pytest.mark.parametrize(("text", "want"), [("#46", "46"), ("1+2=3:3#3 ", "3"), ("no answer", None),
                                            ("#", None), ("#12x", "12"), ("#1#77", "77")])
def test_extract_final(text, want):
    assert extract_final(text) == want


def test_splits_are_disjoint_deterministic_and_stable_under_resizing():
    kwargs = dict(digits=3, train_size=64, val_size=64, report_size=128, sft_size=200, seed=3)
    task = make_task("addition", **kwargs)
    pairs = {name: {(i.meta["a"], i.meta["b"]) for i in task_split(task, name)} for name in task.splits}
    names = list(pairs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not pairs[a] & pairs[b], (a, b)
    again = make_task("addition", **kwargs)
    assert [i.prompt for i in again.train] == [i.prompt for i in task.train]
    bigger = make_task("addition", **{**kwargs, "train_size": 128, "sft_size": 10})
    assert [i.prompt for i in bigger.splits["report"]] == [i.prompt for i in task.splits["report"]]
    assert [i.prompt for i in bigger.val] == [i.prompt for i in task.val]


def test_carry_mix_is_drawn_per_split_and_reported():
    task = make_task("addition", digits=3, train_size=400, val_size=400, report_size=400, sft_size=400,
                     carries={0: 0.5, 2: 0.5}, sft_carries={0: 0.9, 1: 0.1}, sft_scratchpad=0.25, seed=0)
    features = task.features()
    assert set(features["train"]) == {"carries=0", "carries=2"}
    assert abs(features["train"]["carries=2"] - 0.5) < 0.08
    assert set(features["sft"]) >= {"carries=0", "carries=1"} and features["sft"]["carries=1"] < 0.2
    assert abs(features["sft"]["mode=direct"] - 0.75) < 0.08
    assert all(carries_of(i.meta["a"], i.meta["b"]) in (0, 2) for i in task.train)


def test_train_carries_change_the_training_split_only():
    kwargs = {"digits": 3, "train_size": 50, "val_size": 50, "report_size": 50, "carries": {0: 0.5, 2: 0.5}}
    plain = make_task("addition", **kwargs)
    biased = make_task("addition", **kwargs, train_carries={1: 1.0})
    assert all(i.meta["carries"] == 1 for i in biased.train)
    assert biased.val == plain.val and biased.splits["report"] == plain.splits["report"]


def test_scoring_reads_only_the_final_answer():
    task = make_task("addition", digits=2, train_size=4, val_size=4, report_size=0, seed=0)
    item = task.train[0]
    a, b = item.meta["a"], item.meta["b"]
    assert task.score(item, scratchpad(a, b)).correct
    assert task.score(item, f"#{a + b}").reward == 1.0
    wrong = task.score(item, f"#{a + b + 1}")
    assert not wrong.correct and wrong.reward == 0.0 and wrong.extracted == str(a + b + 1)
    assert task.score(item, "I do not know").extracted is None


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"carries": {5: 1.0}}, "carry counts 0..3"),
    ({"carries": {0: -1.0, 1: 1.0}}, "weights >= 0"),
    ({"sft_scratchpad": 1.5}, "share"),
    ({"sft_recall": -1}, "0 or more"),
    ({"digits": 0}, "1 to 9"),
    ({"train_size": 0}, "at least one"),
])
def test_bad_arguments_are_one_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_task("addition", **{"digits": 3, **kwargs})


def test_unknown_split_names_the_ones_that_exist():
    task = make_task("addition", digits=2, train_size=2, val_size=2, report_size=2)
    with pytest.raises(ValueError, match="has: report, val, train, sft"):
        task_split(task, "test")
    reasoning = make_task("parity")
    assert task_split(reasoning, "val") == reasoning.val
    with pytest.raises(ValueError, match="has: train, val"):
        task_split(reasoning, "report")


@pytest.mark.parametrize("text, want", [
    (scratchpad(478, 356), "scratchpad"), ("#834", "direct"), ("8+6=14:4#834", "scratchpad"),
    ("834", "direct"), ("", "direct"), ("#8=3", "direct"),  # an '=' after the final '#' is not working
])
def test_response_mode(text, want):
    assert response_mode(text) == want


def test_feature_metrics_give_each_modes_share_and_accuracy():
    task = make_task("addition", train_size=4, val_size=4, report_size=4, sft_size=0)
    item = task.val[0]
    a, b = item.meta["a"], item.meta["b"]
    texts = [scratchpad(a, b), scratchpad(a, b)[:-1] + "0", f"#{a + b}", "#0"]
    if texts[1] == texts[0]:  # the sum ends in 0: make the second one wrong another way
        texts[1] = texts[0][:-1] + "1"
    correct = [task.score(item, t).correct for t in texts]
    assert correct == [True, False, True, False]
    texts.append("#0")
    correct.append(False)
    got = feature_metrics(task, [item] * 5, texts, correct, "val")
    assert got == pytest.approx({"val/mode/scratchpad/share": 2 / 5, "val/mode/scratchpad/accuracy": 1 / 2,
                                 "val/mode/direct/share": 3 / 5, "val/mode/direct/accuracy": 1 / 3})
    only_direct = feature_metrics(task, [item], ["#0"], [False], "rollout")
    assert "rollout/mode/scratchpad/accuracy" not in only_direct  # no scratchpad answer: no accuracy to report
    assert only_direct["rollout/mode/scratchpad/share"] == 0.0
    assert feature_metrics(object(), [item], ["#0"], [False], "val") == {}  # a task without features


def test_sft_recall_adds_direct_answers_to_the_training_sums_only():
    task = make_task("addition", train_size=5, val_size=4, report_size=4, sft_size=10, sft_scratchpad=1.0,
                     sft_recall=2)
    items = task.sft_items(limit=6)
    assert len(items) == 6 + 2 * 5 and items[:6] == task.splits["sft"][:6]
    recalled = items[6:]
    assert [i.prompt for i in recalled] == [i.prompt for i in task.train] * 2
    assert all(task.demonstration(i) == f"#{i.answer}" for i in recalled)
    assert all("=" in task.demonstration(i) for i in items[:6])  # the sft split keeps its own (scratchpad) mode
    assert not {i.prompt for i in task.val} & {i.prompt for i in items}  # nothing of the selection split
    assert make_task("addition", train_size=5, val_size=4, sft_size=10).sft_items() == \
        make_task("addition", train_size=5, val_size=4, sft_size=10).splits["sft"]


def test_overflow_weights_draw_sums_with_a_new_leading_digit_per_split():
    task = make_task("addition", digits=3, train_size=300, val_size=300, report_size=300, sft_size=300,
                     overflow={0: 0.5, 1: 0.5}, sft_overflow={0: 1.0}, seed=0)
    for split in ("train", "val", "report"):
        flags = [int(i.meta["a"] + i.meta["b"] >= 1000) for i in task.splits[split]]
        assert flags == [i.meta["overflow"] for i in task.splits[split]]
        assert 0.4 < sum(flags) / len(flags) < 0.6
        assert abs(task.features()[split]["overflow=1"] - sum(flags) / len(flags)) < 1e-12
    assert all(i.meta["a"] + i.meta["b"] < 1000 for i in task.splits["sft"])
    item = next(i for i in task.val if i.meta["overflow"])
    assert task.response_features(item, "#1") == {"mode/scratchpad": False, "mode/direct": True, "overflow": True}


def test_inner_carries_with_overflow_give_sums_whose_only_carry_is_the_overflow():
    task = make_task("addition", digits=3, train_size=200, val_size=200, report_size=200, sft_size=200,
                     inner_carries={0: 1.0}, overflow={0: 0.5, 1: 0.5}, sft_inner_carries={1: 1.0}, seed=0)
    for split in ("train", "val", "report"):
        items = task.splits[split]
        assert all(i.meta["carries"] == i.meta["overflow"] for i in items)  # no carry but the top column's
        assert 0.35 < sum(i.meta["overflow"] for i in items) / len(items) < 0.65
    assert all(carries_of(i.meta["a"], i.meta["b"]) - (i.meta["a"] + i.meta["b"] >= 1000) == 1
               for i in task.splits["sft"])


REPORT_HEAD = ["430+870", "975+709", "991+371"]  # read from the code before overflow weights were added


def test_overflow_weights_leave_a_task_without_them_unchanged():
    kwargs = {"digits": 3, "train_size": 20, "val_size": 20, "report_size": 20, "sft_size": 20,
              "carries": {0: 0.5, 2: 0.5}}
    plain = make_task("addition", **kwargs)
    assert "overflow=0" not in plain.features()["train"]
    assert set(plain.response_features(plain.val[0], "#1")) == {"mode/scratchpad", "mode/direct"}
    # the draws of the earlier studies' splits: fixed before overflow weights existed
    assert [i.prompt for i in plain.splits["report"][:3]] == REPORT_HEAD


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"overflow": {2: 1.0}}, "overflow flags 0..1"),
    ({"sft_overflow": {0: 0.0}}, "positive sum"),
    ({"carries": {0: 1.0}, "overflow": {1: 1.0}}, "needs at least one carry"),
    ({"inner_carries": {3: 1.0}}, "carry counts below the top column 0..2"),
    ({"carries": {2: 1.0}, "inner_carries": {0: 1.0}}, "carries = inner_carries \\+ overflow"),
])
def test_bad_overflow_weights_are_one_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_task("addition", **{"digits": 3, "train_size": 4, "val_size": 4, "report_size": 4, **kwargs})
