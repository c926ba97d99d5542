"""What a run records of the code that made it (tether/provenance.py): the checkout's commit and changes from one git
call, nothing where there is no checkout or no git, and the versions of tether and its libraries."""

from __future__ import annotations

import json
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version

import pytest
import torch
import transformers

from tether import provenance
from tether.provenance import code_provenance, git_state, record_provenance


@pytest.fixture
def checkout_read_again():
    """The checkout is read once per process: each test reads it afresh and leaves it to be read afresh."""
    provenance._imported_checkout.cache_clear()
    yield
    provenance._imported_checkout.cache_clear()


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


def installed_optional() -> dict[str, str]:
    """peft and vllm as pip knows them: recorded where installed, whether or not a test before imported them (the
    entry named peft only after some test had loaded it)."""
    found = {}
    for name in ("peft", "vllm"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def test_code_provenance_names_the_versions_and_the_commit(repo, monkeypatch, checkout_read_again):
    monkeypatch.setattr(provenance, "CODE_ROOT", repo)
    (repo / "a.py").write_text("changed\n")
    assert code_provenance() == {
        "tether": version("tether"), "commit": git(repo, "rev-parse", "HEAD"), "clean": False,
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        **installed_optional(),
    }
    git(repo, "checkout", "a.py")
    assert code_provenance()["clean"] is False  # read once per process: the tree the run imported had the change


def test_without_git_the_commit_is_none_and_nothing_fails(repo, monkeypatch, tmp_path, checkout_read_again):
    monkeypatch.setattr(provenance, "CODE_ROOT", repo)
    monkeypatch.setenv("PATH", "")
    record_provenance(tmp_path, 0)
    (entry,) = json.loads((tmp_path / "provenance.json").read_text())
    assert (entry["commit"], entry["clean"], entry["from_step"]) == (None, None, 0)
    assert entry["tether"] == version("tether") and entry["torch"] == torch.__version__
