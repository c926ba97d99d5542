"""make_task errors and fault containment for user tasks."""

import pytest

from tether.tasks import Score, TaskItem, make_task, register_task, safe_score, task_names, unregister_task


@pytest.fixture
def toy_task():
    @register_task("toy")
    class Toy:
        def __init__(self, *, size: int = 2, broken: bool = False) -> None:
            self.name, self.system_prompt = "toy", None
            self.train = [TaskItem(prompt=f"q{i}", answer=str(i), id=f"toy/train/{i}") for i in range(size)]
            self.val = [TaskItem(prompt="v", answer="0", id="toy/val/0")]
            self.broken = broken

        def score(self, item, response_text):
            if self.broken:
                raise KeyError("oops")
            ok = response_text == item.answer
            return Score(float(ok), ok, response_text)

    yield Toy
    unregister_task("toy")


def test_builtin_tasks_are_registered():
    assert {"reasoning_gym", "jsonl", "parity"} <= set(task_names())


def test_parity_rewards_even_length_responses_and_keeps_splits_apart():
    task = make_task("parity", train_size=3, val_size=2)
    assert (len(task.train), len(task.val)) == (3, 2)
    assert not {i.prompt for i in task.train} & {i.prompt for i in task.val}
    assert task.score(task.train[0], "ab") == Score(1.0, True, "ab")  # the whole response is the answer
    assert task.score(task.train[0], "abc") == Score(0.0, False, "abc")


def test_unknown_task_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown task 'gsm9k'; known: .*jsonl.*reasoning_gym.*, or module:Name of"):
        make_task("gsm9k")


def test_unknown_kwarg_names_it_the_nearest_and_the_allowed_ones():
    """A misspelt argument gets the guess a misspelt config key gets (it got none: `prompt_feild` listed 22)."""
    with pytest.raises(TypeError, match=r"unknown argument\(s\) train_sise; did you mean train_size\? "
                                        r"allowed: dataset, dataset_kwargs, train_size"):
        make_task("reasoning_gym", dataset="chain_sum", train_sise=3)
    with pytest.raises(TypeError, match=r"dataset_kws; did you mean dataset_kwargs or dataset\? allowed"):
        make_task("reasoning_gym", dataset="chain_sum", dataset_kws={})
    with pytest.raises(TypeError, match=r"unknown argument\(s\) colour; allowed: dataset"):  # nothing near: no guess
        make_task("reasoning_gym", dataset="chain_sum", colour="red")


def test_missing_required_kwarg():
    with pytest.raises(TypeError, match=r"missing required argument.*dataset"):
        make_task("reasoning_gym")


def test_user_task_and_duplicate_name(toy_task):
    task = make_task("toy", size=3)
    assert len(task.train) == 3
    with pytest.raises(ValueError, match="already registered"):
        register_task("toy")(toy_task)


def test_safe_score_contains_a_raising_task(toy_task):
    task = make_task("toy", broken=True)
    score = safe_score(task, task.val[0], "0", fault_reward=-1.0)
    assert (score.reward, score.correct, score.fault) == (-1.0, False, True)
    assert score.error.startswith("KeyError")
    fine = make_task("toy")
    assert safe_score(fine, fine.val[0], "0") == Score(1.0, True, "0")
