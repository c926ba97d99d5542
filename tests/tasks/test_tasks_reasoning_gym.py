"""The reasoning_gym task on real generated items: scoring, splits, rewards, faults."""

import pytest

from tether.tasks import ReasoningGymTask, Task, make_task
from tether.tasks.base import task_split

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
         "allow_negation": False, "allow_parentheses": False}


@pytest.fixture(scope="module")
def task():
    return make_task("reasoning_gym", dataset="basic_arithmetic", dataset_kwargs=SMALL, train_size=60,
                     val_size=20, seed=3)


def tagged(answer):
    return f"Let me think. <answer>{answer}</answer>"


def test_follows_protocol(task):
    assert isinstance(task, Task)
    assert task.name == "reasoning_gym/basic_arithmetic"
    assert (len(task.train), len(task.val)) == (60, 20)
    assert task.val[0].id == "basic_arithmetic/val/0"
    assert task.val[0].prompt.endswith("Give only the final answer inside <answer></answer>.")


def test_gold_answer_scores_one(task):
    for item in task.val + task.train[:10]:
        score = task.score(item, tagged(item.answer))
        assert (score.reward, score.correct, score.extracted, score.fault) == (1.0, True, item.answer, False)


def test_wrong_answer_scores_zero(task):
    item = task.val[0]
    wrong = next(d for d in "0123456789" if d not in item.answer)  # gold is no substring: no partial credit
    score = task.score(item, tagged(wrong))
    assert (score.reward, score.correct) == (0.0, False)


def test_missing_answer_is_wrong_not_a_fault(task):
    score = task.score(task.val[0], "I don't know")
    assert (score.reward, score.correct, score.extracted, score.fault) == (0.0, False, None, False)


def test_partial_credit_is_not_correct(task):
    # reasoning-gym's default scorer gives len(gold)/len(answer) when the gold is a substring.
    item = next(i for i in task.val if not i.answer.startswith("-"))
    score = task.score(item, tagged(item.answer + "0"))
    assert 0.0 < score.reward < 1.0
    assert not score.correct


def test_splits_are_disjoint(task):
    train_q = {i.meta["question"] for i in task.train}
    val_q = [i.meta["question"] for i in task.val]
    assert not train_q & set(val_q)
    assert len(set(val_q)) == len(val_q)  # val questions are unique


def test_deterministic_per_seed(task):
    again = make_task("reasoning_gym", dataset="basic_arithmetic", dataset_kwargs=SMALL, train_size=60,
                      val_size=20, seed=3)
    assert [i.prompt for i in again.train] == [i.prompt for i in task.train]
    assert [i.prompt for i in again.val] == [i.prompt for i in task.val]
    other = make_task("reasoning_gym", dataset="basic_arithmetic", dataset_kwargs=SMALL, train_size=60,
                      val_size=20, seed=4)
    assert [i.prompt for i in other.train] != [i.prompt for i in task.train]


def test_val_does_not_depend_on_train_size_and_val_seed_pins_it(task):
    bigger = make_task("reasoning_gym", dataset="basic_arithmetic", dataset_kwargs=SMALL, train_size=90,
                       val_size=20, seed=3)
    assert [i.prompt for i in bigger.val] == [i.prompt for i in task.val]
    a = make_task("reasoning_gym", dataset="chain_sum", train_size=5, val_size=5, seed=0, val_seed=7)
    b = make_task("reasoning_gym", dataset="chain_sum", train_size=5, val_size=5, seed=1, val_seed=7)
    assert [i.prompt for i in a.val] == [i.prompt for i in b.val]


def test_a_report_split_is_held_out_from_both_and_leaves_val_as_it_was(task):
    two_digit = {**SMALL, "max_digits": 2}
    plain = make_task("reasoning_gym", dataset="basic_arithmetic", dataset_kwargs=two_digit, train_size=60,
                      val_size=20, seed=3)
    assert "report" not in plain.splits
    with_report = make_task("reasoning_gym", dataset="basic_arithmetic", dataset_kwargs=two_digit, train_size=60,
                            val_size=20, seed=3, report_size=40)
    report = [i.meta["question"] for i in task_split(with_report, "report")]
    assert len(report) == len(set(report)) == 40
    assert [i.prompt for i in with_report.val] == [i.prompt for i in plain.val]
    assert not set(report) & {i.meta["question"] for i in with_report.val}
    assert not set(report) & {i.meta["question"] for i in with_report.train}
    assert {i.id.split("/")[1] for i in task_split(with_report, "report")} == {"report"}
    # report_size 0 draws train exactly as before the option existed
    zero = make_task("reasoning_gym", dataset="basic_arithmetic", dataset_kwargs=two_digit, train_size=60,
                     val_size=20, seed=3, report_size=0)
    assert [i.prompt for i in zero.train] == [i.prompt for i in plain.train]
    with pytest.raises(ValueError, match="has no split 'report'"):
        task_split(zero, "report")
    with pytest.raises(ValueError, match="report_size must be >= 0"):
        ReasoningGymTask.check_config(dataset="basic_arithmetic", report_size=-1)


@pytest.mark.parametrize(("dataset", "kwargs"), [
    ("chain_sum", {"max_terms": 3, "max_digits": 1}),
    ("leg_counting", {"min_animals": 1, "max_animals": 2, "max_instances": 3}),
    ("number_sorting", {"min_numbers": 3, "max_numbers": 3, "max_decimals": 0}),
])
def test_other_datasets_score_their_gold(dataset, kwargs):
    task = make_task("reasoning_gym", dataset=dataset, dataset_kwargs=kwargs, train_size=4, val_size=4)
    for item in task.val:
        assert task.score(item, tagged(item.answer)).correct
        assert not task.score(item, tagged("no idea")).correct


def test_reward_mappings():
    binary = ReasoningGymTask(dataset="basic_arithmetic", dataset_kwargs=SMALL, train_size=4, val_size=8,
                              reward="binary", reward_correct=1.0, reward_wrong=-1.0)
    item = next(i for i in binary.val if not i.answer.startswith("-"))
    assert binary.score(item, tagged(item.answer)).reward == 1.0
    assert binary.score(item, tagged(item.answer + "0")).reward == -1.0  # partial credit -> wrong
    assert binary.score(item, "nothing").reward == -1.0
    scaled = ReasoningGymTask(dataset="basic_arithmetic", dataset_kwargs=SMALL, train_size=4, val_size=8,
                              reward="score", reward_correct=1.0, reward_wrong=-1.0)
    half = scaled.score(item, tagged(item.answer + "0"))  # raw score len(gold)/len(answer)
    assert half.reward == pytest.approx(-1.0 + 2.0 * len(item.answer) / (len(item.answer) + 1))


def test_scorer_fault_is_contained(task, monkeypatch):
    def boom(answer, entry):
        raise RuntimeError("scorer bug")

    monkeypatch.setattr(task._generator, "score_answer", boom)
    score = task.score(task.val[0], tagged("3"))
    assert (score.reward, score.correct, score.fault) == (0.0, False, True)
    assert score.error == "RuntimeError: scorer bug"
    assert score.extracted == "3"


def test_too_small_question_space_is_explained():
    with pytest.raises(ValueError, match="question space is too small"):
        make_task("reasoning_gym", dataset="count_bits", dataset_kwargs={"min_n": 1, "max_n": 7},
                  train_size=4, val_size=10)


def test_bad_settings_are_explained():
    with pytest.raises(ValueError, match="Did you mean basic_arithmetic"):
        make_task("reasoning_gym", dataset="basic_arithmetc")
    with pytest.raises(TypeError, match=r"Allowed: .*max_digits"):
        make_task("reasoning_gym", dataset="chain_sum", dataset_kwargs={"digits": 1})
    with pytest.raises(ValueError, match="use the task's seed"):
        make_task("reasoning_gym", dataset="chain_sum", dataset_kwargs={"seed": 1})
    with pytest.raises(ValueError, match="invalid dataset_kwargs"):
        make_task("reasoning_gym", dataset="chain_sum", dataset_kwargs={"min_terms": 3, "max_terms": 2})
    with pytest.raises(ValueError, match="extract="):
        make_task("reasoning_gym", dataset="chain_sum", extract="regex")
    with pytest.raises(ValueError, match="reward="):
        make_task("reasoning_gym", dataset="chain_sum", reward="dense")


def test_response_features_match_their_expressions_and_feed_validation_metrics(task):
    from tether.tasks.metrics import feature_metrics

    featured = make_task("reasoning_gym", dataset="basic_arithmetic", dataset_kwargs=SMALL, train_size=60,
                         val_size=20, seed=3, features={"working": "=", "tagged": "<answer>"})
    item = featured.val[0]
    assert featured.response_features(item, "3 + 4 = 7, so 7") == {"working": True, "tagged": False}
    assert featured.response_features(item, "<answer>7</answer>") == {"working": False, "tagged": True}
    texts = ["1 + 1 = 2", "2", "2 = 2", "<answer>2</answer>"]
    metrics = feature_metrics(featured, [item] * 4, texts, [True, False, False, True], "val")
    assert metrics["val/working/share"] == 0.5
    assert metrics["val/working/accuracy"] == 0.5  # one of the two responses with working is right
    assert metrics["val/tagged/share"] == 0.25 and metrics["val/tagged/accuracy"] == 1.0
    assert feature_metrics(task, [item], ["1 = 1"], [True], "val") == {}  # no features configured: no metrics


def test_a_feature_that_is_not_a_regular_expression_is_refused_before_any_generation():
    with pytest.raises(ValueError, match=r"features.working: '\(' is not a regular expression"):
        ReasoningGymTask.check_config(dataset="basic_arithmetic", dataset_kwargs=SMALL, features={"working": "("})
