"""task.rewards: TRL-signature reward functions added to (or replacing) a task's score, faults contained."""

from __future__ import annotations

import json

import pytest

from tether.config import ConfigError, RewardTermConfig, TaskConfig
from tether.files import read_jsonl
from tether.rewards import RewardedTask, RewardTerm, build_task, check_reward_terms, item_columns
from tether.tasks import Score, TaskItem

M = "tests.rewards.user_rewards"


def term(fn: str, **spec) -> RewardTerm:
    return RewardTerm(RewardTermConfig(fn=f"{M}:{fn}", **spec), "task.rewards[0]")


class Exact:
    """A task scoring 1 for the exact gold answer, with a gold answer or not."""

    name, system_prompt = "exact", None

    def score(self, item, text):
        ok = item.answer is not None and text == item.answer
        return Score(float(ok), ok, text)


ITEMS = [TaskItem("q0", "a", meta={"columns": {"topic": "x"}}, id="0"), TaskItem("q1", None, id="1")]


def test_columns_are_keyword_lists_with_the_gold_answer():
    assert item_columns(ITEMS) == {"topic": ["x", None], "answer": ["a", None]}


def test_the_gold_answer_wins_over_a_column_named_answer_and_a_row_without_gold_keeps_it():
    # GSM8K with answer_field: final: its own "answer" column is the worked solution, not the gold
    worked = TaskItem("q0", "4", meta={"columns": {"answer": "2 + 2 = 4 #### 4", "final": "4"}}, id="0")
    no_gold = TaskItem("q1", None, meta={"columns": {"answer": "a reference text"}}, id="1")
    assert item_columns([worked, no_gold]) == {"answer": ["4", "a reference text"], "final": ["4", None]}


def test_terms_are_added_to_the_task_score_with_their_weights_and_components():
    task = RewardedTask(Exact(), [term("length_reward", weight=0.5), term("echo_answer", weight=2.0)])
    first, second = task.score_batch(ITEMS, ["a", "xyz"])
    # row 0: task 1 + 0.5 * 1 char + 2 * ("a" in "a"); row 1: task 0 + 0.5 * 3 + 2 * (None -> 0)
    assert first.reward == pytest.approx(1 + 0.5 + 2) and first.correct
    assert first.components == {"task": 1.0, "length_reward": 0.5, "echo_answer": 2.0}
    assert second.reward == pytest.approx(1.5) and not second.fault
    assert second.components == {"task": 0.0, "length_reward": 1.5, "echo_answer": 0.0}


def test_score_false_drops_the_task_reward_but_keeps_its_verdict():
    task = RewardedTask(Exact(), [term("length_reward")], keep_score=False)
    with_gold, without = task.score_batch(ITEMS, ["wrong", "xyz"])
    assert with_gold.reward == 5.0 and not with_gold.correct  # the verifier still judges the gold row
    assert without.reward == 3.0 and without.correct and without.extracted == "xyz"  # no gold: positive = success
    assert with_gold.components == {"length_reward": 5.0}


def test_a_class_is_built_once_with_its_kwargs_and_called_per_batch():
    counter = term("Counter", kwargs={"bonus": 0.25})
    task = RewardedTask(Exact(), [counter])
    task.score_batch(ITEMS, ["a", "b"])
    scores = task.score_batch(ITEMS, ["a", "b"])
    assert counter.fn.calls == 2 and scores[1].components["Counter"] == 0.25


def test_a_function_without_kwargs_gets_only_the_columns_it_names():
    scores = RewardedTask(Exact(), [term("scaled", kwargs={"scale": 3.0})]).score_batch(ITEMS, ["a", "b"])
    assert [s.reward for s in scores] == [4.0, 3.0]


def test_functions_are_called_by_keyword_as_trl_calls_them():
    """``def f(completions, **kwargs)`` (TRL's examples) and ``def f(completions, solution, **kwargs)`` (TRL's
    accuracy_reward): refused, and given the prompts as completions, when tether called positionally."""
    check_reward_terms([RewardTermConfig(fn=f"{M}:completions_only"), RewardTermConfig(fn=f"{M}:solution_match")])
    items = [TaskItem("q0", None, meta={"columns": {"solution": "yes"}}, id="0"),
             TaskItem("q1", None, meta={"columns": {"solution": "no"}}, id="1")]
    task = RewardedTask(Exact(), [term("completions_only"), term("solution_match")], keep_score=False)
    scores = task.score_batch(items, ["yes", "nope"])
    assert [s.fault for s in scores] == [False, False]
    assert [s.components for s in scores] == [{"completions_only": 3.0, "solution_match": 1.0},
                                              {"completions_only": 4.0, "solution_match": 0.0}]


@pytest.mark.parametrize("fn, expected", [("as_array", [0.5, 2.0]), ("as_tensor", [1.0, 4.0]),
                                          ("as_generator", [1.0, 4.0])])
def test_any_iterable_of_values_is_taken_as_trl_takes_it(fn, expected):
    """A numpy array, a tensor or a generator of values (TRL iterates what comes back): every row faulted before."""
    scores = RewardedTask(Exact(), [term(fn)], keep_score=False).score_batch(ITEMS, ["a", "bbbb"])
    assert [s.fault for s in scores] == [False, False] and [s.reward for s in scores] == expected


def test_a_single_array_value_for_the_batch_faults_every_row():
    with pytest.warns(UserWarning, match="returned ndarray for 2 completions"):
        scores = RewardedTask(Exact(), [term("scalar_array")]).score_batch(ITEMS, ["a", "b"])
    assert [s.fault for s in scores] == [True, True]


def test_async_functions_are_awaited_on_one_loop_and_their_faults_contained():
    """TRL awaits an ``async def`` reward function; tether faulted every row ('returned coroutine')."""
    from tests.rewards import user_rewards

    user_rewards.LOOPS.clear()
    task = RewardedTask(Exact(), [term("async_length")], keep_score=False)
    first, second = task.score_batch(ITEMS, ["a", "bbbb"]), task.score_batch(ITEMS, ["ccc", "dd"])
    assert [s.reward for s in first + second] == [1.0, 4.0, 3.0, 2.0] and not any(s.fault for s in first + second)
    assert len(user_rewards.LOOPS) == 2 and user_rewards.LOOPS[0] is user_rewards.LOOPS[1]  # a client made once works
    with pytest.warns(UserWarning, match="ConnectionError: judge unreachable"):
        scores = RewardedTask(Exact(), [term("async_broken")]).score_batch(ITEMS, ["a", "b"])
    assert [s.fault for s in scores] == [True, True]


def test_conversational_prompts_get_message_completions():
    items = [TaskItem([{"role": "user", "content": "hi"}], None, id="c")]
    assert RewardedTask(Exact(), [term("length_reward")]).score_batch(items, ["four"])[0].reward == 4.0


@pytest.mark.parametrize("fn, faulted", [("broken", [True, True]), ("short_list", [True, True]),
                                         ("nan_on_first", [True, False])])
def test_faults_are_contained_and_get_the_lowest_clean_reward(tmp_path, fn, faulted):
    log = tmp_path / "health" / "reward_faults.jsonl"
    task = RewardedTask(Exact(), [term(fn)], fault_log=log)
    with pytest.warns(UserWarning, match="faulted"):
        scores = task.score_batch(ITEMS, ["a", "b"])
    assert [s.fault for s in scores] == faulted
    clean = [s.reward for s in scores if not s.fault]
    for s in scores:
        if s.fault:
            assert s.reward == (min(clean) if clean else 0.0) and not s.correct and fn in s.error
    task.score_batch(ITEMS, ["a", "b"])  # a second fault writes nothing more
    [row] = read_jsonl(log, "fault log", ("term", "error", "traceback"))
    assert row["term"] == fn and row["error"] == scores[0 if faulted[0] else 1].error.removeprefix(f"{fn}: ")
    if fn == "broken":  # raised: its traceback
        assert row["error"] == "RuntimeError: reward server down" and \
            row["traceback"].rstrip().endswith("RuntimeError: reward server down")
    else:  # returned a bad value: nothing raised
        assert row["traceback"] is None


def test_build_task_applies_the_config(tmp_path):
    cfg = TaskConfig(name="parity", rewards=[{"fn": f"{M}:length_reward", "weight": 0.0}])
    task = build_task(cfg, tmp_path)
    assert isinstance(task, RewardedTask) and task.name == "parity" and len(task.train) == 12
    assert task.fault_log.path == tmp_path / "health" / "reward_faults.jsonl"
    assert build_task(TaskConfig(name="parity")).__class__.__name__ == "ParityTask"


@pytest.mark.parametrize("spec, message", [
    ({"fn": f"{M}:no_completions"}, "takes no 'completions'; a reward function is called by keyword"),
    ({"fn": f"{M}:positional_only"}, "requires 'prompts' positionally"),
    ({"fn": f"{M}:scaled", "kwargs": {"scael": 2}}, r"takes no keyword 'scael'; did you mean scale\? it takes: scale"),
    ({"fn": f"{M}:lenght_reward"}, "did you mean 'length_reward'"),
    ({"fn": f"{M}:NOT_CALLABLE"}, "not a function or class"),
    ({"fn": "no_such_module_x:f"}, "does not import"),
    ({"fn": f"{M}:Counter", "kwargs": {"bonsu": 1}}, r"takes no such argument; did you mean bonus\? it takes: bonus"),
    ({"fn": f"{M}:NoCall"}, "a class without __call__"),
    ({"fn": f"{M}:needs_ids"}, "requires 'completion_ids', which TRL passes and tether does not"),
])
def test_bad_reward_functions_are_one_line_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_reward_terms([RewardTermConfig(**spec)])
    assert "\n" not in str(err.value) and str(err.value).startswith("task.rewards[0]")


def test_two_terms_may_not_share_a_name():
    with pytest.raises(ConfigError, match="is taken"):
        check_reward_terms([RewardTermConfig(fn=f"{M}:scaled"), RewardTermConfig(fn=f"{M}:scaled")])


def test_score_false_needs_a_reward():
    with pytest.raises(ValueError, match="leaves no reward"):
        TaskConfig(name="parity", score=False)


def test_training_logs_each_term_and_counts_faults(tmp_path):
    from tests.trainer.helpers import tiny_config
    from tether.models import tiny_model
    from tether.trainer import Trainer

    cfg = tiny_config(tmp_path, task={"rewards": [{"fn": f"{M}:length_reward", "weight": 0.01},
                                                  {"fn": f"{M}:nan_on_first"}]})
    model, tok = tiny_model(seed=0)
    with pytest.warns(UserWarning, match="nan_on_first"):
        Trainer(cfg, policy=model, tokenizer=tok).fit()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "train/reward_mean" in r)
    assert {"reward/component/task", "reward/component/length_reward", "reward/component/nan_on_first"} <= set(step)
    assert step["reward/faults"] >= 1  # the first row of each 64-row scoring chunk
    assert [row["term"] for row in read_jsonl(tmp_path / "run" / "health" / "reward_faults.jsonl", "fault log")] == \
        ["nan_on_first"]


class Composite(Exact):
    """A composite score: accuracy plus a length bonus, its components by name."""

    def score(self, item, text):
        ok = item.answer is not None and text == item.answer
        return Score(ok + len(text) / 100, ok, text, components={"accuracy": float(ok), "len": len(text) / 100})


def test_a_term_named_like_a_component_of_the_task_adds_to_the_tasks_reward_not_to_its_other_components():
    """The reward was the sum of the components, so a term named `len` replaced the task's `len` component in the
    reward itself: the task's length bonus dropped out of what the policy optimised."""
    first, second = RewardedTask(Composite(), [term("length_reward", name="len")]).score_batch(ITEMS, ["a", "xyz"])
    assert first.reward == pytest.approx(1.01 + 1.0) and second.reward == pytest.approx(0.03 + 3.0)


def test_a_users_task_whose_components_clash_or_do_not_sum_to_its_reward_is_refused():
    from tether.rewards.task import check_task_score

    class Items(Composite):
        train, val = ITEMS[:1], ITEMS[1:]

    class Unsummed(Items):
        def score(self, item, text):
            return Score(1.0, True, text, components={"chars": len(text) + 1.0})

    clash = TaskConfig(name="composite", rewards=[RewardTermConfig(fn=f"{M}:length_reward", name="len")])
    with pytest.raises(ConfigError, match=r"^task.rewards\[0\]: its name 'len' is also a component of the task's "
                                          r"score \(accuracy, len\); give it another name \(name: \.\.\.\)$"):
        check_task_score(Items(), clash)
    assert check_task_score(Items(), TaskConfig(name="composite", rewards=[RewardTermConfig(
        fn=f"{M}:length_reward")])) == []
    with pytest.raises(ConfigError, match=r"gave components \{'chars': 2\.0\} that sum to 2\.0, not its reward 1\.0; "):
        check_task_score(Unsummed(), TaskConfig(name="unsummed"))


@pytest.mark.parametrize("keyword, what", [("completions", "the batch's own argument"),
                                           ("topic", "a column of the task's rows")])
def test_a_keyword_named_like_a_batch_argument_or_a_column_is_refused(keyword, what):
    """A keyword named like a column replaced the column's values in every call, and one named `completions` was
    dropped for the batch's own, both silently."""
    from tether.rewards import check_reward_columns

    spec = RewardTermConfig(fn=f"{M}:scaled", kwargs={"scale": 2.0, keyword: 1})
    with pytest.raises(ConfigError, match=rf"^task.rewards\[0\].kwargs: '{keyword}' is also {what}, which a keyword "
                                          "of that name would hide"):
        check_reward_columns([spec], item_columns(ITEMS))
    check_reward_columns([RewardTermConfig(fn=f"{M}:scaled", kwargs={"scale": 2.0})], item_columns(ITEMS))
