"""The jsonl task: local files through ``datasets``, math-verify scoring, fault containment."""

import json
import threading

import pytest
from math_verify.errors import TimeoutException

from tether.tasks import JsonlTask, make_task, math_equal
from tether.tasks import jsonl_task as jsonl_module

ROWS = [{"question": f"What is {i} + {i}?", "solution": str(2 * i)} for i in range(10)]
ROWS += [{"question": "Half of one?", "solution": "1/2"},
         {"question": "Square of x+1?", "solution": "(x+1)^2"}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("data") / "arith.jsonl", ROWS)


@pytest.fixture(scope="module")
def task(data_file):
    return make_task("jsonl", path=data_file, val_size=4, seed=0, prompt_field="question",
                     answer_field="solution")


def by_answer(task, answer):
    return next(i for i in task.train + task.val if i.answer == answer)


def test_seeded_split_is_disjoint_and_deterministic(task, data_file):
    assert (len(task.train), len(task.val)) == (8, 4)
    assert not {i.prompt for i in task.train} & {i.prompt for i in task.val}
    assert task.name == "jsonl/arith"
    again = make_task("jsonl", path=data_file, val_size=4, seed=0, prompt_field="question",
                      answer_field="solution")
    assert [i.prompt for i in again.val] == [i.prompt for i in task.val]
    other = make_task("jsonl", path=data_file, val_size=4, seed=1, prompt_field="question",
                      answer_field="solution")
    assert [i.prompt for i in other.val] != [i.prompt for i in task.val]


def test_math_verify_equivalences(task):
    half = by_answer(task, "1/2")
    assert task.score(half, "<answer>0.5</answer>").correct
    assert task.score(half, r"so \boxed{\frac{1}{2}}").correct  # auto falls back to boxed
    assert not task.score(half, "<answer>0.25</answer>").correct
    square = by_answer(task, "(x+1)^2")
    assert task.score(square, "<answer>x^2+2x+1</answer>").correct
    six = by_answer(task, "6")
    assert task.score(six, "3 + 3 = 6").reward == 1.0  # last-number fallback
    score = task.score(six, "<answer>7</answer>")
    assert (score.reward, score.correct, score.extracted, score.fault) == (0.0, False, "7", False)


def test_math_verify_failures_are_faults(task, monkeypatch):
    def timeout(*args, **kwargs):
        raise TimeoutException("Operation timed out!")

    monkeypatch.setattr(jsonl_module, "math_equal", timeout)
    score = task.score(task.val[0], "<answer>1</answer>")
    assert (score.reward, score.correct, score.fault) == (0.0, False, True)
    assert score.error.startswith("TimeoutException")


def test_unusable_gold_is_a_fault(tmp_path):
    rows = [{"prompt": "a", "answer": ""}, {"prompt": "b", "answer": None}, {"prompt": "c", "answer": "1"}]
    task = JsonlTask(path=write_jsonl(tmp_path / "bad.jsonl", rows), val_size=1, reward_wrong=-1.0)
    for prompt in ("a", "b"):
        item = next(i for i in task.train + task.val if i.meta["question"] == prompt)
        score = task.score(item, "<answer>1</answer>")
        assert (score.reward, score.correct, score.fault) == (-1.0, False, True)


def test_math_equal_off_the_main_thread():
    results = []
    worker = threading.Thread(target=lambda: results.append(math_equal("1/2", "0.5")))
    worker.start()
    worker.join()
    assert results == [True]


def test_train_val_files_parquet_and_overlap(tmp_path):
    import datasets

    train = tmp_path / "train.parquet"
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(6)]
    datasets.Dataset.from_list(rows).to_parquet(str(train))
    val_rows = [{"prompt": "q0", "answer": "0"}, {"prompt": "z", "answer": "9"}]
    val = write_jsonl(tmp_path / "val.jsonl", val_rows)
    task = make_task("jsonl", train_path=str(train), val_path=val, train_size=3)
    assert task.num_overlap_dropped == 1  # q0 is held out
    assert len(task.train) == 3 and "q0" not in {i.meta["question"] for i in task.train}
    assert [i.meta["question"] for i in task.val] == ["q0", "z"]


def test_bad_configuration_is_explained(tmp_path, data_file):
    with pytest.raises(ValueError, match=r"either path=\.\.\. .* or both train_path"):
        make_task("jsonl", path=data_file, val_path=data_file)
    with pytest.raises(KeyError, match=r"no prompt field 'prompt'.*set prompt_field"):
        make_task("jsonl", path=data_file, val_size=2)
    with pytest.raises(FileNotFoundError):
        make_task("jsonl", path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="val_size=50"):
        make_task("jsonl", path=data_file, val_size=50, prompt_field="question", answer_field="solution")


def test_a_list_gold_accepts_any_of_its_answers_and_is_checked_per_answer(tmp_path):
    """A JSONL row's list gold was kept as its text, "['5', '55', '}{']", which math-verify found equal to neither
    5 nor 55: every such row was incorrect. The gold-parse check read that text too, so a list none of whose answers
    parses, or an empty list, passed without a warning."""
    rows = [{"prompt": f"Name {i}.", "answer": [str(i), str(i + 50), "}{"]} for i in range(3, 7)]
    rows.append({"prompt": "Count.", "answer": 4})  # a number stays one: reward functions get it as the data has it
    listed = JsonlTask(path=write_jsonl(tmp_path / "lists.jsonl", rows), val_size=1)
    golds = {row["prompt"]: row["answer"] for row in rows}
    for item in listed.train + listed.val:
        gold = golds[item.meta["question"]]
        if gold == 4:
            assert listed.score(item, "\\boxed{4}").correct
            continue
        first, second, unread = gold  # "}{": math-verify cannot read it, so it is passed over
        verdicts = [listed.score(item, f"\\boxed{{{text}}}") for text in (first, second, "99", unread)]
        assert [(score.correct, score.reward, score.fault) for score in verdicts] == \
            [(True, 1.0, False), (True, 1.0, False), (False, 0.0, False), (False, 0.0, False)]
    assert sorted(map(str, golds.values())) == sorted(str(item.meta["gold"]) for item in listed.train + listed.val)
    assert {type(item.meta["gold"]) for item in listed.train + listed.val} == {list, int}
    unreadable = [{"prompt": "a", "answer": ["}{", "}"]}, {"prompt": "b", "answer": []},
                  {"prompt": "c", "answer": ["}{", "1/2"]}]
    file = tmp_path / "unreadable.jsonl"
    assert JsonlTask.check_inputs(path=write_jsonl(file, unreadable)) == [
        f"path: 1 of 3 rows checked in {file} have an empty 'answer' (the first: line 2); they are never scored "
        "correct",
        f"path: 1 of 2 gold answers sampled from {file} cannot be parsed by math-verify (the first: line 1, "
        "answer=['}{', '}']); such rows are scored as faults (reward/faults), never correct"]
