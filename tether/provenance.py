"""Which code made a run: tether's version, the git commit of its checkout, and the versions of the libraries.

:func:`code_provenance` is written into a run directory at each start (``provenance.json``: one entry per start or
resume, :func:`record_provenance`), into each checkpoint's ``trainer_state.pt`` (its ``provenance`` key) and into the
config the metric sinks record, so a run or a checkpoint read weeks later names the code that wrote it.
:func:`git_state` is the one reader of a checkout: the lab's code record (``tether.lab.experiment.code_state``) uses it
too.
"""

from __future__ import annotations

import functools
import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NamedTuple

from tether.files import write_text_atomic

CODE_ROOT = Path(__file__).resolve().parents[1]  # the checkout (or site-packages) this process imports tether from
PROVENANCE = "provenance.json"
# libraries a run may not use: recorded where installed (their metadata, no import), so every entry of a run names
# them alike whatever the process had imported when it wrote one (peft loads with the model, after provenance.json)
OPTIONAL = ("peft", "vllm")


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


@functools.cache
def _imported_checkout() -> GitState | None:
    """Read once per process: what a process runs is what it imported when it started, whatever the tree holds by
    its next checkpoint."""
    return git_state(CODE_ROOT)


def tether_version() -> str | None:
    """tether's installed version; None for a source tree on ``PYTHONPATH`` that was never installed."""
    try:
        return version("tether")
    except PackageNotFoundError:
        return None


def _library_version(name: str) -> str | None:
    module = sys.modules.get(name)
    if module is not None and isinstance(getattr(module, "__version__", None), str):
        return str(module.__version__)  # a plain str in provenance.json (torch's is a TorchVersion)
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def code_provenance() -> dict[str, Any]:
    """The code this process runs: ``tether`` (its version), ``commit`` and ``clean`` (None outside a git checkout),
    ``python``, ``torch``, ``transformers``, and ``peft`` / ``vllm`` where installed."""
    git = _imported_checkout()
    return {
        "tether": tether_version(), "commit": git.commit if git else None, "clean": not git.changed if git else None,
        "python": platform.python_version(), "torch": _library_version("torch"),
        "transformers": _library_version("transformers"),
        **{name: found for name in OPTIONAL if (found := _library_version(name)) is not None},
    }


def describe(provenance: dict[str, Any] | None) -> str:
    """``tether 0.1.0 (commit 1a2b3c4d, uncommitted changes)`` for a provenance entry; an entry without one, or none,
    reads as tether of no recorded version."""
    provenance = provenance or {}
    text = f"tether {provenance.get('tether') or '(no recorded version)'}"
    if provenance.get("commit"):
        text += f" (commit {provenance['commit'][:8]}{'' if provenance.get('clean') else ', uncommitted changes'})"
    return text


def read_provenance(run_dir: Path) -> list[dict[str, Any]]:
    """The entries of ``run_dir/provenance.json``, first start first; none for a run before it or an unreadable
    file."""
    try:
        entries = json.loads((Path(run_dir) / PROVENANCE).read_text())
    except (OSError, ValueError):
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def history(run_dir: Path) -> str:
    """Which code made the run in ``run_dir``, for ``tether show``: a line per start or resume of
    ``provenance.json`` (its time, the step it resumed from, :func:`describe`), or one line saying it recorded none.
    """
    entries = read_provenance(run_dir)
    if not entries:
        return f"code: none recorded (no {PROVENANCE}: a run before tether wrote one)"
    lines = [f"code ({PROVENANCE}, one line per start or resume):"]
    for entry in entries:
        when = f"resume at step {entry['from_step']}" if entry.get("from_step") else "start"
        lines.append(f"  {entry.get('at', '(no time)')}  {when}: {describe(entry)}")
    return "\n".join(lines)


def record_provenance(run_dir: Path, from_step: int) -> None:
    """Append this start's code to ``run_dir/provenance.json`` (``from_step``: 0 for a start, the checkpoint's step
    for a resume), so a resumed run lists every code that trained it."""
    entry = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "from_step": from_step,
             **code_provenance()}
    write_text_atomic(Path(run_dir) / PROVENANCE, json.dumps([*read_provenance(run_dir), entry], indent=1) + "\n")
