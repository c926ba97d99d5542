"""tether.files: the one JSONL reader and its writers (whole file, atomically; rows appended)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tether.files import append_jsonl, jsonl_line, numbered_jsonl, read_jsonl, write_jsonl, write_text_atomic

ROWS = [{"prompt": "2+2", "response": "4"}, {"prompt": "é ✓", "response": "", "nested": {"a": [1, 2.5, None]}}]


def test_write_then_read_gives_the_rows_back(tmp_path):
    path = write_jsonl(tmp_path / "deep" / "data.jsonl", ROWS)  # the folder is made
    assert read_jsonl(path, "k") == ROWS
    assert path.read_text(encoding="utf-8").count("\n") == len(ROWS)


def test_append_adds_rows_after_the_existing_ones(tmp_path):
    path = tmp_path / "log" / "code.jsonl"
    append_jsonl(path, ROWS[:1])
    append_jsonl(path, ROWS[1:])
    append_jsonl(path, [])
    assert read_jsonl(path, "k") == ROWS


def test_an_append_after_a_torn_last_line_keeps_every_new_row(tmp_path):
    """A kill tears at most the last line; the next append used to join its first row onto it, losing that row too."""
    path = tmp_path / "code.jsonl"
    path.write_text('{"a": 1}\n{"what": "ev')
    append_jsonl(path, ROWS)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[:2] == ['{"a": 1}', '{"what": "ev']
    assert [json.loads(line) for line in lines[2:]] == ROWS


def test_a_line_is_one_object_and_a_newline_non_finite_floats_included():
    line = jsonl_line({"loss": math.nan, "x": math.inf})
    assert line.endswith("\n") and line.count("\n") == 1
    back = json.loads(line)
    assert math.isnan(back["loss"]) and back["x"] == math.inf
    assert json.loads(jsonl_line({"p": Path("a")}, default=str)) == {"p": "a"}
    with pytest.raises(TypeError):
        jsonl_line({"p": Path("a")})


def test_the_whole_file_write_replaces_the_file_or_leaves_it(tmp_path, monkeypatch):
    """A failure while writing the new text leaves the old file whole and no temporary beside it... and success
    replaces it in one os.replace (the new file is never visible half written)."""
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    before = path.read_text()

    def broken(row, default=None):
        raise RuntimeError("disk full")

    monkeypatch.setattr("tether.files.jsonl_line", broken)
    with pytest.raises(RuntimeError):
        write_jsonl(path, [{"a": 1}])
    assert path.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]
    monkeypatch.undo()

    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        replaced.append((Path(src).name, Path(src).read_text(), Path(dst).read_text()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_jsonl(path, [{"a": 1}])
    assert replaced == [(".d.jsonl.tmp." + str(os.getpid()), '{"a": 1}\n', before)]  # old text until the swap
    assert read_jsonl(path, "k") == [{"a": 1}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]


def test_write_text_atomic_overwrites(tmp_path):
    path = write_text_atomic(tmp_path / "a" / "t.txt", "one")
    write_text_atomic(path, "two")
    assert path.read_text() == "two"


def test_the_reader_names_the_key_file_and_line_of_the_first_bad_row(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "p", "response": "r"}\n\n[1]\n')
    with pytest.raises(ValueError, match=r"sft.path: .*bad.jsonl line 3 is list, not an object"):
        read_jsonl(path, "sft.path")
    path.write_text('{"prompt": "p"}\n')
    with pytest.raises(ValueError, match=r"line 1 has no 'response' field \(fields: prompt\)"):
        read_jsonl(path, "sft.path", ("prompt", "response"))
    path.write_text('{"prompt": \n')
    with pytest.raises(ValueError, match="line 1 is not JSON"):
        read_jsonl(path, "k")
    path.write_text("\n\n")
    with pytest.raises(ValueError, match="holds no rows"):
        read_jsonl(path, "k")
    path.write_text('\n{"a": 1}\n')
    assert numbered_jsonl(path, "k") == [(2, {"a": 1})]


def test_the_nearest_path_guess_of_a_file_where_a_folder_was_meant_is_another_entry(tmp_path, monkeypatch):
    """`tether eval runs/q/checkpoints/latest` (the pointer file) was told "did you mean runs/q/checkpoints/latest
    ...?": the path that had just failed."""
    from tether.files import nearest_path_guess

    monkeypatch.chdir(tmp_path)
    Path("ckpts").mkdir()
    Path("ckpts/latest").write_text("step_000003\n")
    Path("ckpts/step_000003").mkdir()
    assert "ckpts/latest" not in nearest_path_guess("ckpts/latest")
    assert nearest_path_guess("ckpts/step_000002") == "; did you mean ckpts/step_000003?"
