"""The ``dataset`` task: Hugging Face ``datasets`` sources built here (no Hub), column mapping, format functions,
conversational prompts, splits that never overlap, and one-line errors before any model loads."""

from __future__ import annotations

import json
from dataclasses import replace

import datasets
import pytest

from tests.trainer.helpers import tiny_config
from tether.checks import check_config, load_checked_config
from tether.config import ConfigError
from tether.tasks import make_task
from tether.tasks.dataset_task import DatasetTask

FMT = "tests.tasks.dataset_formats"


def qa_rows(n: int) -> list[dict]:
    return [{"question": f"What is {i} + 1?", "solution": str(i + 1), "topic": "sum"} for i in range(n)]


def chats(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"Say {i}."}], "target": str(i)} for i in range(n)]


@pytest.fixture
def saved(tmp_path):
    """A DatasetDict saved with save_to_disk: train (20 chats) and test (6 chats)."""
    path = tmp_path / "chats"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(chats(20)),
                          "test": datasets.Dataset.from_list(chats(26)[20:])}).save_to_disk(str(path))
    return path


def write_jsonl(file, rows: list[dict]) -> None:
    file.write_text("".join(json.dumps(row) + "\n" for row in rows))


def ids(items):
    return [item.id for item in items]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_files_map_columns_and_carve_three_splits_that_never_overlap(tmp_path, suffix):
    table = datasets.Dataset.from_list(qa_rows(30))
    file = tmp_path / f"qa{suffix}"
    {".jsonl": table.to_json, ".csv": table.to_csv, ".parquet": table.to_parquet}[suffix](str(file))
    task = make_task("dataset", path=str(file), prompt_field="question", answer_field="solution", val_size=5,
                     report_size=4, prompt_template="Q: {question}")
    prompts = {name: {item.prompt for item in items} for name, items in task.splits.items()}
    assert {name: len(p) for name, p in prompts.items()} == {"report": 4, "val": 5, "train": 21}
    assert not (prompts["train"] & prompts["val"]) and not (prompts["train"] & prompts["report"])
    assert not (prompts["val"] & prompts["report"])
    item = task.train[0]
    assert item.prompt.startswith("Q: What is") and item.answer == str(int(item.prompt.split()[3]) + 1)
    assert item.meta["columns"]["topic"] == "sum" and "question" not in item.meta["columns"]
    assert task.score(item, f"<answer>{item.answer}</answer>").correct
    again = make_task("dataset", path=str(file), prompt_field="question", answer_field="solution", val_size=5,
                      report_size=4, prompt_template="Q: {question}")
    assert [i.prompt for i in again.val] == [i.prompt for i in task.val]  # seeded


@pytest.mark.parametrize("task", ["dataset", "jsonl"])
def test_duplicate_prompts_of_held_out_rows_leave_train(tmp_path, task):
    # the second copy differs only in spaces around it, which the template strips: one prompt to the model
    rows = qa_rows(10) + [{**row, "question": f"  {row['question']}\n"} for row in qa_rows(10)]
    file = tmp_path / "dup.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = make_task(task, path=str(file), prompt_field="question", answer_field="solution", val_size=3)
    assert not {i.prompt for i in task.train} & {i.prompt for i in task.val}
    assert task.num_overlap_dropped == 3 and len(task.train) == 20 - 3 - 3


def test_a_saved_dataset_dict_with_a_held_out_split_and_a_format_function(saved):
    task = DatasetTask(path=str(saved), val_split="test", val_size=4, report_size=2, format_fn=f"{FMT}:to_chat",
                       system_prompt="Be brief.")
    assert len(task.train) == 20 and len(task.val) == 4 and len(task.splits["report"]) == 2
    item = task.train[0]
    assert item.prompt[0] == {"role": "system", "content": "Be brief."} and item.prompt[1]["role"] == "user"
    assert task.system_prompt is None  # the conversation carries it
    assert item.meta["columns"]["answer"] == item.answer
    held = {json.dumps(i.prompt) for i in task.val + task.splits["report"]}
    assert len(held) == 6 and not held & {json.dumps(i.prompt) for i in task.train}


def test_texts_and_conversations_in_one_task_are_refused(tmp_path):
    # a system prompt would reach the conversations only: the texts' went with the task-level one, then None
    rows = [{"prompt": f"Say {i}.", "answer": str(i)} for i in range(6)]
    rows[4]["prompt"] = [{"role": "user", "content": "Say 4."}]
    file = tmp_path / "mixed.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="mix texts and conversations"):
        DatasetTask(path=str(file), val_size=2, system_prompt="Be brief.")
    with pytest.raises(ValueError, match=r"mixes texts \(row 0 of .*\) and conversations \(row 4 of"):
        DatasetTask.check_inputs(path=str(file))  # before any model loads


def test_a_conversational_column_is_used_as_it_is(saved):
    task = DatasetTask(path=str(saved), split="train", prompt_field="messages", answer_field="target", val_size=2)
    assert task.train[0].prompt == [{"role": "user", "content": task.train[0].prompt[0]["content"]}]


def test_text_parts_are_accepted(tmp_path, tokenizer):
    """A message content of text parts (the OpenAI / Hugging Face multi-part format) was refused ("has content parts
    (text)"); it is kept as it is, and encoded as its texts joined by a newline by SmolLM2's template (which raises
    on a list). Image parts: tests/tasks/test_dataset_images.py."""
    from tether.models import encode_chat

    def prompt(i: int) -> list[dict]:
        return [{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": f"{i}."}]}]

    file = tmp_path / "parts.jsonl"
    file.write_text("".join(json.dumps({"prompt": prompt(i), "answer": str(i)}) + "\n" for i in range(6)))
    assert DatasetTask.check_inputs(path=str(file)) == []
    item = DatasetTask(path=str(file), val_size=2).train[0]
    assert item.prompt == prompt(int(item.answer)) and item.images == ()
    assert encode_chat(tokenizer, item.prompt) == encode_chat(tokenizer, f"Say\n{item.answer}.")
    rows = [{"prompt": [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "Say 1."}]}],
             "answer": "1"}] * 3
    write_jsonl(file, rows)
    with pytest.raises(ValueError, match=r"message 0 has content parts \(audio, text\): a dataset prompt's content"):
        DatasetTask.check_inputs(path=str(file))


def test_the_collector_encodes_conversations_with_the_chat_template(saved, tokenizer):
    from tether.models import encode_chat

    task = DatasetTask(path=str(saved), prompt_field="messages", answer_field="target", val_size=2,
                       system_prompt="Be brief.")
    text = tokenizer.decode(encode_chat(tokenizer, task.train[0].prompt, system=task.system_prompt))
    assert "Be brief." in text and task.train[0].prompt[-1]["content"] in text


def test_no_answer_column_needs_rewards(tmp_path):
    file = tmp_path / "p.jsonl"
    file.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(6)))
    task = DatasetTask(path=str(file), answer_field=None, val_size=2)
    score = task.score(task.train[0], "anything")
    assert score.reward == 0.0 and not score.correct and score.extracted == "anything" and not score.fault


@pytest.mark.parametrize("name", ["dataset", "jsonl"])
@pytest.mark.parametrize("size", [-1, 0])
def test_train_size_below_one_is_refused_not_sliced(tmp_path, name, size):
    """train_size=-1 kept every training row but the last (a Python slice), silently."""
    file = tmp_path / "p.jsonl"
    file.write_text("".join(json.dumps({"prompt": f"p{i}", "answer": str(i)}) + "\n" for i in range(6)))
    with pytest.raises(ConfigError, match=rf"^task.kwargs: train_size={size} must be at least 1 \(or null: every "
                                          r"training row\)$"):
        check_config(tiny_config(tmp_path, task={"name": name, "kwargs": {"path": str(file), "val_size": 2,
                                                                           "train_size": size}}), policy=False)
    with pytest.raises(ValueError, match=rf"^train_size={size} must be at least 1"):  # the Python API too
        make_task(name, path=str(file), val_size=2, train_size=size)


@pytest.mark.parametrize("name, problem", [
    ("dataset", "column 'prompt' is NoneType, not a string nor a non-empty list of \\{role, content\\} messages"),
    ("jsonl", "field 'prompt' must be a string, got NoneType"),
])
def test_a_bad_prompt_past_the_rows_checked_first_names_its_row(tmp_path, name, problem):
    """The first rows are checked before the task is built; a bad prompt later was found by the build without its
    row: `column 'prompt' is NoneType, ...` in a file of thousands."""
    file = tmp_path / "p.jsonl"
    rows = [{"prompt": None if i == 130 else f"p{i}", "answer": str(i)} for i in range(150)]
    file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ConfigError, match=rf"^task.kwargs: row 130 of .*p\.jsonl: {problem}$"):
        check_config(tiny_config(tmp_path, task={"name": name, "kwargs": {"path": str(file), "val_size": 5}}),
                     policy=False)


def test_no_answer_column_without_rewards_is_refused():
    """answer_field: null scores every row wrong: without task.rewards every group's rewards were equal."""
    from tether.config import TaskConfig

    with pytest.raises(ValueError, match=r"task.kwargs.answer_field=null \(no gold answer\) leaves no reward; add "
                                         r"task.rewards or name the answer column"):
        TaskConfig(name="dataset", kwargs={"path": "p.jsonl", "answer_field": None})


def config_with(tmp_path, **kwargs):
    return tiny_config(tmp_path, task={"name": "dataset", "kwargs": kwargs})


@pytest.mark.parametrize("kwargs, message", [
    ({"prompt_field": "question"}, r"prompt_field: no column 'question' in row 0 of .* \(columns: messages, target\)$"),
    ({"prompt_field": "mesages"},  # a misspelt column named the columns but not the one meant, as a format_fn's does
     r"prompt_field: no column 'mesages' in row 0 of .* \(did you mean messages\? columns: messages, target\)$"),
    ({"prompt_field": "messages", "answer_field": "nope"}, "answer_field: no column 'nope'"),
    ({"prompt_field": "target", "answer_field": "target", "format_fn": f"{FMT}:bad_messages"},
     "message 0 is 'hello', not"),
    ({"format_fn": f"{FMT}:one_message"},  # a message not in a list: the line said only "is dict, not ..."
     r"of row 0 of .* is dict, not a string nor a non-empty list of \{role, content\} messages; a single message\? "
     r"put it in a list, \[\{role, content\}\]$"),
    ({"format_fn": f"{FMT}:sharegpt"},
     r"message 0 is \{'from': 'human', 'value': 'Say 0.'\}, not \{'role': str, 'content': str or text/image "
     r"parts\}; ShareGPT's \{from, value\} messages: map them to \{role, content\} with a format_fn$"),
    ({"format_fn": f"{FMT}:with_image"},  # the line held the image's 50 KB of bytes
     r"^task.kwargs: row 0 of .*: content parts: image 0: its 'bytes' holds str, not bytes$"),
    ({"format_fn": f"{FMT}:to_chta"}, "did you mean 'to_chat'"),
    ({"format_fn": f"{FMT}:no_args"}, "must take one argument"),
    ({"format_fn": f"{FMT}:not_a_dict"}, "returned list for row 0"),
    ({"format_fn": f"{FMT}:misspelt_column"},  # said only "(KeyError: 'mesages')", not what the row holds
     r"failed on row 0 \(KeyError: 'mesages'; did you mean messages\? "
     r"the row's top-level columns: messages, target\)$"),
    ({"split": "validation"}, "split='validation'"),
])
def test_bad_data_is_one_line_before_any_model_loads(tmp_path, saved, kwargs, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_config(config_with(tmp_path, path=str(saved), **kwargs), policy=False)
    assert "\n" not in str(err.value) and str(err.value).startswith("task.kwargs")


def warnings_naming(tmp_path, file, word: str) -> list[str]:
    """The warnings of the config checks of a dataset task on ``file`` that contain ``word``."""
    return [w for w in check_config(config_with(tmp_path, path=str(file), val_size=2), policy=False) if word in w]


def test_rows_without_a_gold_answer_are_a_warning_before_any_model_loads(tmp_path):
    """A JSON row without the answer key (datasets reads it as null) passed silently and faulted whenever sampled."""
    file = tmp_path / "gaps.jsonl"
    rows = [{"prompt": f"p{i}", **({} if i in (2, 5) else {"answer": str(i)})} for i in range(8)]
    write_jsonl(file, rows)
    assert warnings_naming(tmp_path, file, "answer_field") == [
        f"task.kwargs: path: 2 of 8 rows checked in {file} have an empty 'answer' (the first: row 2); they are never "
        "scored correct: give them an answer, or set answer_field: null when only task.rewards score"]
    task = DatasetTask(path=str(file), val_size=2)
    assert sum(task.score(item, "1").fault for item in task.train + task.val) == 2  # what the warning foretells
    rows[2]["answer"] = rows[5]["answer"] = "x"
    write_jsonl(file, rows)
    assert not warnings_naming(tmp_path, file, "answer_field")


def test_gold_answers_math_verify_cannot_parse_are_the_jsonl_warning_before_any_model_loads(tmp_path):
    """The dataset task's check reported only null golds: a source whose golds math-verify cannot read passed
    silently and each such row faulted whenever sampled. A list gold warns only when none of its answers parses; rows
    past the first 100 are left to the run (tether validate stays fast)."""
    file = tmp_path / "golds.jsonl"

    def gold(i: int) -> str | list[str]:  # i % 4: parses; a list none of whose answers parses; one that does; not
        return [str(i), ["}{", "}"], ["}{", str(i)], "}"][i % 4] if i < 100 else "}"

    rows = [{"prompt": f"p{i}", "answer": gold(i)} for i in range(140)]
    write_jsonl(file, rows)
    assert warnings_naming(tmp_path, file, "math-verify") == [
        f"task.kwargs: path: 50 of 100 gold answers sampled from {file} cannot be parsed by math-verify (the first: "
        "row 1, answer=['}{', '}']); such rows are scored as faults (reward/faults), never correct"]
    task = DatasetTask(path=str(file), val_size=2)
    faults = {item.meta["question"] for item in task.train + task.val if task.score(item, "\\boxed{1}").fault}
    assert faults == {f"p{i}" for i in range(140) if i >= 100 or i % 4 in (1, 3)}  # what the warning foretells


def test_a_missing_local_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        check_config(config_with(tmp_path, path=str(tmp_path / "none.jsonl")), policy=False)


@pytest.mark.parametrize(("name", "text", "task", "kwargs", "message"), [
    ("bad.jsonl", '{"prompt": "1+1", "answer": "2"}\n{not json\n', "dataset", {"val_size": 1},
     r"^task\.kwargs: data file: .*bad\.jsonl line 2 is not JSON \(Expecting property name"),
    ("bad.jsonl", '{"prompt": "1+1", "answer": "2"}\n{not json\n', "dataset",
     {"val_size": 1, "path": "json", "data_files": "FILE"},
     r"^task\.kwargs: json \(data_files='.*bad\.jsonl'\) could not be read \(ArrowInvalid: JSON parse error"),
    ("bad.csv", 'prompt,answer\n"1+1,2\n3,4\n', "jsonl", {},
     r"^task\.kwargs: .*bad\.csv could not be read \(ParserError: Error tokenizing data\. C error: EOF inside string"),
    ("bad.json", '[{"prompt": "1"}, ', "jsonl", {},
     r"^task\.kwargs: .*bad\.json could not be read \(ValueError: Expected object or value at position 17\)$"),
])
def test_a_data_file_its_parser_refuses_is_one_line_naming_file_and_error(tmp_path, name, text, task, kwargs, message):
    """datasets' DatasetGenerationError ("an error occurred while generating the dataset") ended validate and train
    with a traceback of about 280 lines."""
    file = tmp_path / name
    file.write_text(text)
    kwargs = {"path": str(file), **{k: str(file) if v == "FILE" else v for k, v in kwargs.items()}}
    with pytest.raises(ConfigError, match=message) as err:
        check_config(tiny_config(tmp_path, task={"name": task, "kwargs": kwargs}), policy=False)
    assert "\n" not in str(err.value)


def test_a_hub_id_is_left_to_the_run(tmp_path):
    check_config(config_with(tmp_path, path="openai/gsm8k", config="main"), policy=False)


def test_a_chat_template_file_must_compile(tmp_path):
    good, bad = tmp_path / "good.jinja", tmp_path / "bad.jinja"
    good.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    bad.write_text("line one\n{% for m in messages %}{{ m['content'] }")
    check_config(tiny_config(tmp_path, f"model.chat_template={good}"), policy=False)
    with pytest.raises(ConfigError, match=r"^model.chat_template: .*bad.jinja:2: not a valid Jinja template"):
        check_config(tiny_config(tmp_path, f"model.chat_template={bad}"), policy=False)
    with pytest.raises(ConfigError, match="is not a file"):
        check_config(tiny_config(tmp_path, f"model.chat_template={tmp_path / 'none.jinja'}"), policy=False)


def test_the_chat_template_replaces_the_tokenizers(tmp_path, tokenizer):
    import copy

    from tether.models import encode_chat
    from tether.models.chat_template import apply_chat_template

    file = tmp_path / "plain.jinja"
    file.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] ")
    tok = copy.deepcopy(tokenizer)
    apply_chat_template(tok, str(file))
    assert tok.decode(encode_chat(tok, "hi", system="sys")) == "[system] sys\n[user] hi\n[assistant] "


def test_one_word_hub_ids_are_accepted(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr("tether.checks.machine.hub_unreachable", lambda: None)  # the Hub answers, without a network
    from tether.checks.machine import check_model

    check_model("model.name", "gpt2")
    with pytest.raises(ConfigError, match="nor a Hub id"):
        check_model("model.name", "gpt 2")


def verl_rows(start: int, n: int) -> list[dict]:
    return [{"data_source": "toy", "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"index": i}}
            for i in range(start, start + n)]


def test_verl_train_and_val_files_with_a_format_function(tmp_path):
    train, val = tmp_path / "train.parquet", tmp_path / "test.parquet"
    datasets.Dataset.from_list(verl_rows(0, 12)).to_parquet(str(train))
    datasets.Dataset.from_list(verl_rows(100, 5)).to_parquet(str(val))
    task = DatasetTask(path=str(train), val_path=str(val), val_size=5, format_fn=f"{FMT}:verl_row")
    assert len(task.train) == 12 and len(task.val) == 5
    assert {i.answer for i in task.val} == {str(i + 1) for i in range(100, 105)}
    assert task.train[0].meta["columns"]["data_source"] == "toy"
    check_config(config_with(tmp_path, path=str(train), val_path=str(val), val_size=5, format_fn=f"{FMT}:verl_row"),
                 policy=False)
    with pytest.raises(ConfigError, match=r"val_path: .*missing\.parquet' does not exist"):
        check_config(config_with(tmp_path, path=str(train), val_path=str(tmp_path / "missing.parquet"),
                                 format_fn=f"{FMT}:verl_row"), policy=False)
    with pytest.raises(ValueError, match="has only 5 rows"):
        DatasetTask(path=str(train), val_path=str(val), val_size=6, format_fn=f"{FMT}:verl_row")


def write_rows(path, rows):
    """``rows`` as ``path``, in the format its suffix names (what a TRL or verl user has on disk)."""
    data = datasets.Dataset.from_list(rows)
    {".jsonl": data.to_json, ".csv": data.to_csv, ".parquet": data.to_parquet}[path.suffix](str(path))
    return path


@pytest.mark.parametrize("builder, suffix", [("json", ".jsonl"), ("csv", ".csv"), ("parquet", ".parquet")])
def test_the_datasets_builder_idiom_reads_data_files_per_split(tmp_path, builder, suffix):
    """TRL's ``load_dataset("json", data_files={...})`` as task kwargs: ``data_files`` was an unknown argument, and
    ``path: json`` alone passed validate as a Hub id (then read whatever json files the working directory held)."""
    rows = qa_rows(14)
    train = write_rows(tmp_path / f"train{suffix}", rows[:10])
    test = write_rows(tmp_path / f"test{suffix}", rows[10:])
    task = DatasetTask(path=builder, data_files={"train": str(train), "test": str(test)}, val_split="test",
                       val_size=4, prompt_field="question", answer_field="solution")
    assert sorted(item.answer for item in task.val) == [row["solution"] for row in rows[10:]]
    assert sorted(item.answer for item in task.train) == sorted(row["solution"] for row in rows[:10])
    assert task.name == "dataset/train" and task.train[0].meta["columns"]["topic"] == "sum"
    one_file = DatasetTask(path=builder, data_files=str(train), val_size=3, prompt_field="question",
                           answer_field="solution")  # a str or list of files is datasets' "train" split
    assert sorted(item.answer for item in one_file.train + one_file.val) == sorted(r["solution"] for r in rows[:10])
    cfg = config_with(tmp_path, path=builder, data_files={"train": str(train), "test": str(test)}, val_split="test",
                      val_size=4, prompt_field="question", answer_field="solution")
    check_config(cfg, policy=False)


def test_a_held_out_split_of_the_same_path_is_named_val_split_in_its_warnings(tmp_path):
    """A warning about ``val_split`` of ``path`` named the setting ``val_path``, which the config does not have."""
    rows = qa_rows(14)
    rows[11]["solution"] = ""
    train = write_rows(tmp_path / "train.jsonl", rows[:10])
    test = write_rows(tmp_path / "test.jsonl", rows[10:])
    cfg = config_with(tmp_path, path="json", data_files={"train": str(train), "test": str(test)}, val_split="test",
                      val_size=4, prompt_field="question", answer_field="solution")
    assert [w for w in check_config(cfg, policy=False) if "empty" in w] == [
        "task.kwargs: val_split 'test': 1 of 4 rows checked in json have an empty 'solution' (the first: row 1); "
        "they are never scored correct: give them an answer, or set answer_field: null when only task.rewards score"]


def test_the_builder_arguments_reach_load_dataset_as_written(monkeypatch):
    """``config`` (or datasets' word, ``name``), ``data_files``, ``split`` and ``revision`` are load_dataset's."""
    calls = []

    def load_dataset(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        return datasets.Dataset.from_list(qa_rows(6))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    files = {"train": "data/train-*.parquet", "test": "data/test-*.parquet"}
    DatasetTask(path="org/data", name="main", data_files=files, revision="v1.0", split="train", val_split="test",
                val_size=2, prompt_field="question", answer_field="solution")
    assert calls == [("org/data", "main", {"split": split, "data_files": files, "revision": "v1.0"})
                     for split in ("train", "test")]


@pytest.mark.parametrize("kwargs, message", [
    ({"path": "json"}, r"path: 'json' is datasets' json builder: give data_files"),
    ({"path": "json", "data_files": "none.jsonl"},
     r"^task.kwargs: data_files: 'none.jsonl' does not exist here \(relative to the working directory .*\)$"),
    ({"path": "csv", "data_files": {"train": "tr*.csv"}}, r"data_files.train: 'tr\*.csv' matches no file here"),
    ({"path": "json", "data_files": "{train}", "split": "test"}, r"json \(config=None, split='test'\): Unknown split"),
    ({"path": "json", "data_files": "{train}", "revision": "main"}, "only a Hub dataset has revisions"),
    ({"path": "{train}", "data_files": "{train}"}, "give the file as path alone, or path: json with data_files"),
    ({"path": "org/data", "config": "a", "name": "b"}, "name is datasets' word for config; give one"),
    ({"path": "{train}", "val_path": "json"}, "val_path: 'json' is a datasets builder"),
])
def test_builder_mistakes_are_one_line_before_any_model_loads(tmp_path, kwargs, message):
    train = write_rows(tmp_path / "train.jsonl", qa_rows(8))
    kwargs = {key: value.format(train=train) if isinstance(value, str) else value for key, value in kwargs.items()}
    with pytest.raises(ConfigError, match=message) as err:
        check_config(config_with(tmp_path, prompt_field="question", answer_field="solution", val_size=2, **kwargs),
                     policy=False)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("task, kwargs", [
    ("dataset", {"path": "qa.jsonl"}),
    ("dataset", {"path": "json", "data_files": {"train": "qa.jsonl"}}),
    ("jsonl", {"path": "qa.jsonl"}),
])
def test_a_data_path_beside_the_config_but_not_here_names_the_path_to_write(tmp_path, monkeypatch, task, kwargs):
    """Data paths are read from the working directory (imports: from the config's folder): run from elsewhere, the
    error said only "does not exist here"; now it names the path to write, and the folder to run from instead."""
    folder = tmp_path / "proj"
    folder.mkdir()
    write_rows(folder / "qa.jsonl", [{"prompt": f"p{i}", "answer": str(i)} for i in range(8)])
    config = folder / "run.yaml"
    config.write_text(json.dumps({"task": {"name": task, "kwargs": {**kwargs, "val_size": 2}},
                                  "logging": {"tensorboard": False}}))
    monkeypatch.chdir(tmp_path)
    key = "task.kwargs.data_files.train" if "data_files" in kwargs else "task.kwargs.path"
    with pytest.raises(ConfigError, match=rf"does not exist.*; the config file's folder {folder} has it: write "
                                          rf"{key}: proj/qa.jsonl, or run from {folder}$") as err:
        check_config(load_checked_config(config), policy=False)
    assert "\n" not in str(err.value)
    monkeypatch.chdir(folder)  # from the config's folder the same config reads its file
    check_config(load_checked_config(config), policy=False)


def test_a_data_path_in_the_working_directory_wins_over_one_beside_the_config(tmp_path, monkeypatch):
    """The base stays the working directory, so no existing config changes meaning; both there: this one is read."""
    folder = tmp_path / "proj"
    folder.mkdir()
    write_rows(folder / "qa.jsonl", [{"prompt": f"beside {i}", "answer": str(i)} for i in range(8)])
    write_rows(tmp_path / "qa.jsonl", [{"prompt": f"here {i}", "answer": str(i)} for i in range(8)])
    config = folder / "run.yaml"
    config.write_text(json.dumps({"task": {"name": "dataset", "kwargs": {"path": "qa.jsonl", "val_size": 2}}}))
    monkeypatch.chdir(tmp_path)
    check_config(load_checked_config(config), policy=False)
    cfg = load_checked_config(config)
    task = make_task(cfg.task.name, **cfg.task.kwargs)
    assert sorted(item.prompt for item in task.train + task.val) == [f"here {i}" for i in range(8)]


VERL_SCORE = '''
CALLS = []


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    CALLS.append({"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth,
                  "extra_info": extra_info})
    answers = ground_truth if isinstance(ground_truth, list) else [ground_truth]
    return float(solution_str.strip() in [str(answer) for answer in answers])
'''


@pytest.mark.parametrize("ground_truth", [lambda i: str(i + 1), lambda i: i + 1, lambda i: [str(i + 1), f"n{i + 1}"]],
                         ids=["str", "int", "list"])
def test_a_verl_parquet_reaches_compute_score_as_verl_passes_it(tmp_path, ground_truth):
    """verl's RL parquet (written with pandas, as verl's data preprocessing scripts write it) through the documented
    mapping: the chat prompt as it is, reward_model.ground_truth the gold, and data_source, ground_truth and
    extra_info reaching compute_score as verl passes them: the values of the row, in their own types."""
    import pandas as pd

    from tether.config import TaskConfig
    from tether.rewards.task import build_task

    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": ground_truth(i)},
             "extra_info": {"split": "train", "index": i}} for i in range(10)]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    (tmp_path / "score.py").write_text(VERL_SCORE)
    task_cfg = {"name": "dataset", "kwargs": {"path": str(tmp_path / "train.parquet"), "val_size": 2,
                                             "format_fn": f"{FMT}:verl_row"},
                "score": False, "rewards": [{"fn": "tether.rewards:VerlScore",
                                             "kwargs": {"path": str(tmp_path / "score.py")}}]}
    check_config(tiny_config(tmp_path, task=task_cfg), policy=False)
    task = build_task(TaskConfig.model_validate(task_cfg))
    items = sorted(task.train + task.val, key=lambda item: item.meta["columns"]["extra_info"]["index"])
    assert [item.prompt for item in items] == [row["prompt"] for row in rows]
    scores = task.score_batch(items, [str(i + 1) if i % 2 else "0" for i in range(10)])
    assert [score.reward for score in scores] == [float(i % 2) for i in range(10)]
    calls = task.terms[0].fn.compute_score.__globals__["CALLS"]
    assert calls == [{"data_source": "toy", "solution_str": str(i + 1) if i % 2 else "0",
                      "ground_truth": ground_truth(i), "extra_info": {"split": "train", "index": i}}
                     for i in range(10)]


@pytest.mark.parametrize("conversational", [False, True], ids=["standard", "conversational"])
def test_trl_prompt_only_datasets_validate_and_train_a_step(tmp_path, monkeypatch, conversational):
    """TRL's prompt-only formats, standard (a prompt string) and conversational (a list of messages), with the
    columns TRL passes its reward functions (solution, a reference completion), through `tether validate` and one
    step of `tether train` on a tiny model: each reward reads its column, and only the functions score (TRL)."""
    from typer.testing import CliRunner

    from tether.cli import app

    def prompt(i):
        text = f"What is {i} + 2?"
        return [{"role": "user", "content": text}] if conversational else text

    write_rows(tmp_path / "data.jsonl", [{"prompt": prompt(i), "solution": "2", "completion": "abc"} for i in range(8)])
    config = tmp_path / "trl.yaml"
    config.write_text(json.dumps({
        "model": {"name": "tiny-64x2"}, "run_dir": str(tmp_path / "run"),
        "task": {"name": "dataset", "kwargs": {"path": "data.jsonl", "answer_field": None, "val_size": 2},
                 "score": False, "rewards": [{"fn": f"{FMT}:solution_reward"},
                                             {"fn": f"{FMT}:completion_reward", "weight": 0.1}]},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "val": {"every": 0}, "train": {"steps": 1, "save_every_s": 0},
        "logging": {"tensorboard": False, "progress": False}}))
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    validated = runner.invoke(app, ["validate", str(config)])
    assert validated.exit_code == 0 and validated.output.startswith("ok: "), validated.output
    trained = runner.invoke(app, ["train", str(config), "train.steps=1"])
    assert trained.exit_code == 0, trained.output
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (step,) = [row for row in rows if "actor/pg_loss" in row]
    solution = 2.0 + 0.5 * conversational  # solution_reward: the column's 2, +0.5 for a conversational completion
    assert step["reward/faults"] == 0.0
    assert step["train/reward_mean"] == pytest.approx(solution + 0.1 * len("abc"), rel=1e-6)
    assert step["reward/component/solution_reward"] == pytest.approx(solution / (solution + 0.3), rel=1e-6)


def test_a_list_gold_accepts_any_of_its_answers(tmp_path):
    """A list of accepted answers (verl's ground_truth, TRL data with several correct forms) was compared as its
    text, "['3', '53']", which math-verify found equal to neither 3 nor 53: every row was incorrect. A string that
    reads like a list (an interval) stays one answer."""
    rows = [{"prompt": f"Name {i}.", "answer": [str(i), str(i + 50), "}{"]} for i in range(3, 9)]
    listed = DatasetTask(path=str(write_rows(tmp_path / "lists.jsonl", rows)), val_size=2)
    for item in listed.train + listed.val:
        first, second, unread = item.meta["gold"]  # "}{": math-verify cannot read it, so it is passed over
        verdicts = [listed.score(item, f"\\boxed{{{text}}}") for text in (first, second, "99", unread)]
        assert [(score.correct, score.reward, score.fault) for score in verdicts] == \
            [(True, 1.0, False), (True, 1.0, False), (False, 0.0, False), (False, 0.0, False)]
    item = listed.val[0]
    assert listed.score(replace(item, meta={**item.meta, "gold": ("4", "5")}), "\\boxed{5}").correct
    for gold, error in ((["}{"], "cannot be parsed"), ([], "list of accepted answers is empty")):
        score = listed.score(replace(item, meta={**item.meta, "gold": gold}), "\\boxed{5}")
        assert (score.correct, score.fault) == (False, True) and error in score.error
    texts = [{"prompt": f"Solve {i}.", "answer": gold} for i, gold in enumerate(["[3, 4]", "['3', '4']"] * 2)]
    whole = DatasetTask(path=str(write_rows(tmp_path / "texts.jsonl", texts)), val_size=1)
    for item in whole.train + whole.val:
        assert item.meta["gold"] == item.answer
        assert [whole.score(item, f"\\boxed{{{text}}}").correct for text in ("3", "4")] == [False, False]
    interval = next(item for item in whole.train + whole.val if item.answer == "[3, 4]")
    assert whole.score(interval, "\\boxed{[3,4]}").correct


def test_a_data_file_held_out_by_val_split_is_read_once_for_the_checks(tmp_path, monkeypatch):
    """A data file is one split (``load_split`` ignores the name), so ``val_split`` of one holds out rows of the same
    file. The checks' source lists took it for a second source: ``check_inputs`` and ``longest_prompts`` each read
    the file twice, and the latter ranked every row twice, so its 3 longest were 2 rows."""
    import tether.tasks.dataset_task as dataset_task

    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"prompt": "q" * (i + 1), "answer": "1"}) + "\n" for i in range(5)))
    reads, load_split = [], dataset_task.load_split
    monkeypatch.setattr(dataset_task, "load_split", lambda *a, **k: reads.append(a[0]) or load_split(*a, **k))
    found = DatasetTask.longest_prompts(3, path=str(path), val_split="test")
    assert [entry[:2] for entry in found] == [(f"row {i} of {path}", "q" * (i + 1)) for i in (4, 3, 2)]
    assert reads == [str(path)]
    reads.clear()
    assert DatasetTask.check_inputs(path=str(path), val_split="test") == []
    assert reads == [str(path)]


def test_a_misspelt_format_fn_names_its_key_once(tmp_path, saved):
    """The line read "task.kwargs: task.kwargs.format_fn: ...": the task check put its key in front of an error
    that already named the one inside it."""
    with pytest.raises(ConfigError) as err:
        check_config(config_with(tmp_path, path=str(saved), format_fn=f"{FMT}:to_chta"), policy=False)
    assert str(err.value) == (f"task.kwargs.format_fn: '{FMT}:to_chta': '{FMT}' has no 'to_chta'; "
                              "did you mean 'to_chat'?")
