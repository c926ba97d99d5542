"""Docs that run: every `tether` command in a shell block of README.md and docs/ names a real subcommand with real
options, and every config it names exists and passes `tether validate` (config-only when the command reads another
run's output: a `runs/` path on the line, or a config whose `# written by:` lines name the command that writes its
inputs; those commands are checked here too, where they appear). No model loads: validate never loads one."""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path

import click
import pytest
import typer

from tether.checks import check_config
from tether.cli import app
from tether.config import config_command, first_line_command, load_command_config
from tether.lab.protocol import arm_config, load_protocol

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = ("bash", "sh", "shell", "console")
FENCE = re.compile(r"^\s*```(\w*)\s*$")
INVOCATION = re.compile(r"^(?:\S*/)?tether\s+|^python -m tether\s+")
# configs for a GPU machine (CUDA, vLLM, torchrun): only their schema can be checked here
GPU_ONLY = ("configs/gpu/", "configs/armor/gpu/")


def shell_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, command) of every shell block of ``page``; continuation lines joined, ``$ `` prompts dropped."""
    found, lang, pending, first = [], None, "", 0
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if fence and lang is None:
            lang = fence.group(1) or "text"
            continue
        if fence and not fence.group(1) and lang is not None:
            lang = None
            continue
        if lang not in SHELL:
            continue
        first = first or number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = (pending + line).strip().removeprefix("$ ")
        found.append((first, command))
        pending, first = "", 0
    return found


INLINE = re.compile(r"`(tether [^`]+)`")


def inline_commands(page: Path) -> list[tuple[int, str]]:
    """(line number, command) of every tether command the prose writes in backticks (`tether eval CKPT val.split=x`),
    code blocks left out (shell blocks are read by :func:`shell_lines`)."""
    found, fenced = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            found += [(number, command) for command in INLINE.findall(line)]
    return found


def tether_commands(page: Path) -> list[tuple[int, list[str]]]:
    """(line, argv after ``tether``) of each tether invocation, comments and chained commands split off."""
    out = []
    for number, line in [*shell_lines(page), *inline_commands(page)]:
        for part in re.split(r"&&|;|\|", line):
            part = part.strip()
            if INVOCATION.match(part):
                words = shlex.split(INVOCATION.sub("", part), comments=True)
                out.append((number, words))
    return out


SCRIPT = re.compile(r"(?:^|\s)((?:\./)?scripts/[\w/.-]+\.(?:sh|py))")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_script_a_shell_block_runs_exists(page):
    missing = [f"{page.relative_to(ROOT)}:{number}: {script}" for number, line in shell_lines(page)
               for script in SCRIPT.findall(line.split("#", 1)[0]) if not (ROOT / script).is_file()]
    assert missing == []


def is_placeholder(word: str) -> bool:
    return any(mark in word for mark in ("[", "$", "...", "<")) or Path(word).stem.isupper()


def command_at(words: list[str]) -> tuple[object, list[str]]:
    """The (sub)command ``words`` name and the words after it (typer's click command objects)."""
    command = typer.main.get_command(app)
    while hasattr(command, "commands") and words and words[0] in command.commands:
        command, words = command.commands[words[0]], words[1:]
    return command, words


def documented() -> list[tuple[str, list[str]]]:
    return [(f"{page.relative_to(ROOT)}:{number}", words) for page in PAGES
            for number, words in tether_commands(page)]


COMMANDS = documented()


def test_the_pages_hold_commands():
    assert len(COMMANDS) > 50 and any(where.startswith("README.md") for where, _ in COMMANDS)


@pytest.mark.parametrize("where, words", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_a_documented_command_exists_with_its_options(where, words):
    command, rest = command_at(list(words))
    named = not rest or rest[0].startswith("-")  # a group by name (`tether recipe`) or its options (`tether -h`)
    assert not hasattr(command, "commands") or named, f"{where}: `tether {' '.join(words)}`: no such subcommand"
    context = click.Context(command, **getattr(command, "context_settings", {}))  # -h as well as --help
    options = {name for param in command.get_params(context) if param.param_type_name == "option"
               for name in param.opts}
    for word in rest:
        if word.startswith("-") and not is_placeholder(word):
            assert word.split("=")[0] in options, f"{where}: `tether {' '.join(words)}`: no option {word}"


def config_uses(words: list[str]) -> list[tuple[str, list[str]]]:
    """(config, overrides) each command runs a config with: train, sft, seed-sft, validate (the first argument),
    eval (--config), recipe armor (both stages), experiment (its protocol). Each is checked against its command's
    schema (validate: the one the file's first line names; a protocol: its own, and each arm's config)."""
    command, rest = command_at(list(words))
    overrides = [w for w in rest if "=" in w and not w.startswith("-") and not is_placeholder(w)]
    yamls = [w for w in rest if w.endswith(".yaml") and not is_placeholder(w)]
    if command.name == "eval":
        return [(w, overrides) for w in yamls if w.startswith("configs/")]
    if command.name == "armor":
        return [(w, []) for w in yamls]
    if command.name == "experiment":
        return [(w, []) for w in yamls[:1]]
    if command.name in ("train", "sft", "seed-sft", "validate"):
        return [(w, overrides) for w in yamls[:1]]
    return []


USES = sorted({(config, tuple(overrides), where) for where, words in COMMANDS
               for config, overrides in config_uses(words)})


@cache
def validated(config: str, overrides: tuple[str, ...], full: bool) -> None:
    cfg = load_command_config(config_command(ROOT / config), ROOT / config, list(overrides))
    check_config(cfg, machine=full)


@pytest.mark.parametrize("config, overrides, where", USES, ids=[f"{w} {c}" for c, _, w in USES])
def test_a_documented_config_exists_and_validates(config, overrides, where):
    path = ROOT / config
    assert path.is_file(), f"{where}: {config} does not exist"
    if first_line_command(path) == "experiment":
        protocol = load_protocol(path)  # each arm's config with its overrides; the machine checks of check_protocol
        for arm in protocol.arms:       # take seconds an arm (tests/lab runs them on one protocol)
            arm_config(protocol, arm, protocol.seeds[0])
        return
    written_by = load_command_config(config_command(path), path).written_by
    reads_a_run = any("runs/" in o for o in overrides) or bool(written_by)
    gpu = config.startswith(GPU_ONLY)
    validated(config, overrides, not (reads_a_run or gpu))
