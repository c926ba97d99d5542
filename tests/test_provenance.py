"""The code a process runs (tether/provenance.py): the checkout's commit and changes from one git call, nothing where
there is no checkout or no git."""

from __future__ import annotations

import subprocess

import pytest

from tether.provenance import git_state


def git(root, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).write_text(f"{name} = 1\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "one")
    return tmp_path


def test_git_state_reads_the_commit_and_every_kind_of_change_in_one_git_call(repo, monkeypatch):
    head = git(repo, "rev-parse", "HEAD")
    assert git_state(repo) == (head, [])
    (repo / "a.py").write_text("changed\n")
    git(repo, "mv", "b.py", "renamed b.py")  # a space in the name: the path is the rest of the line
    (repo / "new.py").write_text("")
    calls = []
    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a) or real_run(*a, **k))
    state = git_state(repo)
    assert state.commit == head and sorted(state.changed) == ["a.py", "new.py", "renamed b.py"]
    assert len(calls) == 1


def test_no_commit_where_tether_is_not_the_top_of_a_checkout(repo, tmp_path_factory, monkeypatch):
    """An installed tether's site-packages may sit inside another checkout (a virtualenv in a project): git would
    answer with that project's commit, which is not the code that runs."""
    inside = repo / "venv" / "site-packages"
    inside.mkdir(parents=True)
    assert git(inside, "rev-parse", "HEAD")  # git itself would name the enclosing checkout
    assert git_state(inside) is None
    assert git_state(tmp_path_factory.mktemp("plain")) is None
    monkeypatch.setenv("PATH", "")  # no git on this machine
    assert git_state(repo) is None
