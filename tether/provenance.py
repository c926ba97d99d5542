"""Which code runs: the git commit of the checkout tether is imported from, and what differs from it.

:func:`git_state` is the one reader of a checkout (the lab's code record, ``tether.lab.experiment.code_state``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import NamedTuple

CODE_ROOT = Path(__file__).resolve().parents[1]  # the checkout (or site-packages) this process imports tether from


class GitState(NamedTuple):
    """A checkout's ``commit`` and its ``changed`` paths: tracked files with a change and untracked files outside
    .gitignore, each an import away from the run (empty: a clean tree)."""

    commit: str
    changed: list[str]


def git_state(root: Path = CODE_ROOT) -> GitState | None:
    """The commit checked out at ``root`` and what differs from it, read with one ``git status`` (a few ms).

    None when ``root`` is not the top of a git checkout (an installed tether: its site-packages may sit inside some
    other checkout, whose commit is not this code's), git is absent or fails, or the checkout has no commit yet.
    """
    if not (root / ".git").exists():  # a directory, or a file in a worktree
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "status", "--porcelain=v2", "--branch"], capture_output=True,
                             text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    commit, changed = None, []
    for line in out.splitlines():
        if line.startswith("# branch.oid "):
            commit = line.split()[2]
        elif not line.startswith("#"):
            changed.append(_changed_path(line))
    return GitState(commit, changed) if commit and commit != "(initial)" else None


def _changed_path(line: str) -> str:
    """The path of one entry of ``git status --porcelain=v2``: after 8 fields (``1``: changed), 9 (``2``: renamed,
    then ``path<TAB>original``), 10 (``u``: unmerged), or 1 (``?``: untracked)."""
    fields = {"1": 8, "2": 9, "u": 10}.get(line[0], 1)
    return line.split(" ", fields)[fields].split("\t")[0]

